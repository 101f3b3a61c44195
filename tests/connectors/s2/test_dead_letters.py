"""format("s2") with errors.tolerance=all: a record over S2's 1 MiB record limit goes to an S2 dead-letter stream
(errors.deadletter.format=s2: each dead letter one record, its body the whole dead letter as JSON), the rest is
appended; negative control: the default errors.tolerance=none fails the write as before."""

import json

import pytest

import sluice
from tests.connectors.s2.conftest import read_stream

pytestmark = pytest.mark.spark


def test_a_record_over_the_limit_goes_to_an_s2_dead_letter_stream(spark, s2_local, s2_opts):
    # Row 3's body is 1.5 MiB of text; the others are small.
    df = spark.sql("SELECT CASE WHEN id = 3 THEN repeat('é', 786432) ELSE CAST(id AS STRING) END AS body "
                   "FROM range(6)").coalesce(1)
    raw = {**s2_opts, "format": "raw"}
    with pytest.raises(Exception, match=r"over the store's limit of 1048576 bytes per record"):
        df.write.format("s2").options(**raw).mode("append").save()  # negative control: the write fails as before
    aside = {"errors.tolerance": "all", "errors.deadletter.format": "s2",
             **{f"errors.deadletter.{k}": v for k, v in {**s2_opts, "s2.stream": "dead"}.items()}}
    df.write.format("s2").options(**{**raw, "s2.stream": "kept", **aside}).mode("append").save()
    assert sorted(r.body for r in read_stream(s2_local, s2_opts["s2.basin"], "kept")) == [b"0", b"1", b"2", b"4", b"5"]
    letters = [json.loads(r.body) for r in read_stream(s2_local, s2_opts["s2.basin"], "dead")]
    assert len(letters) == 1
    letter = letters[0]
    assert (letter["error_class"], letter["connector"], letter["target"]) == (
        "RecordTooLargeError", "s2", f"{s2_opts['s2.basin']}/kept")
    assert "over the store's limit of 1048576 bytes per record" in letter["error_message"]
    record = json.loads(letter["record"])
    assert record["stream"] == "kept" and record["body_bytes"] == 1572864 and record["body_truncated"] is True
    assert record["body"] == "é" * 32768, "the first 64 KiB of the body, as text"
    assert sluice.last_write_summary("s2")["dead_letters"] == 1
