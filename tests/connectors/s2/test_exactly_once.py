"""Exactly-once S2 writes (global-ordered + transactional) when a Python worker dies mid-task and when a
streaming query is killed mid-batch and restarted from its checkpoint. Counts duplicates and missing rows."""

import json
from collections import Counter

import pytest
import s2_sdk
from pyspark.errors import StreamingQueryException

from tests.connectors.s2.conftest import read_stream
from tests.faults import dying_stream, held_at, kill_python_workers, poll_until

pytestmark = pytest.mark.spark


def records_in(server, basin, stream) -> int:
    """The stream's records so far; 0 while the sink has not created it or its basin yet."""
    try:
        return len(read_stream(server, basin, stream))
    except s2_sdk.S2ServerError as error:
        if error.code not in ("basin_not_found", "stream_not_found"):
            raise
        return 0


def wait_for_records(server, basin, stream, at_least: int, timeout: float = 60) -> int:
    return poll_until(lambda: (n := records_in(server, basin, stream)) >= at_least and n, timeout,
                      f"{at_least} records reaching {stream}")


def eo_options(s2_opts, stream):
    return {**s2_opts, "s2.stream": stream, "sink.mode": "global-ordered", "sink.transactional": "true",
            "sink.batch.max-size": "50", "sink.flush-buffer.timeout": "50"}


def test_exactly_once_across_a_killed_python_worker(spark, s2_local, s2_opts, small_arrow_batches, tmp_path):
    import threading

    basin = s2_opts["s2.basin"]
    # ~3 s of input, reaching the writer as it is produced (padded rows: see small_arrow_batches); it stops at id
    # 1500 until the worker is killed
    hold = tmp_path / "hold"
    hold.touch()
    df = spark.range(0, 3000, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(1500, str(hold), 50, 0.05), "id long, pad string")
    killed = {}

    def strike():
        try:
            killed["at"] = wait_for_records(s2_local, basin, "eo", 300)
            killed["workers"] = kill_python_workers(s2_local.port)
            killed["after"] = len(read_stream(s2_local, basin, "eo"))
        finally:
            hold.unlink()  # the retried task runs through (and a failed strike does not hang the write)

    striker = threading.Thread(target=strike)
    striker.start()
    df.write.format("s2").options(**eo_options(s2_opts, "eo")).mode("append").save()
    striker.join()
    assert killed["workers"] >= 1 and killed["at"] >= 300 and killed["after"] < 3000, killed
    records = read_stream(s2_local, basin, "eo", include_commands=True)
    fences = [r.body for r in records if r.is_command_record()]
    data = [json.loads(r.body)["id"] for r in records if not r.is_command_record()]
    dupes = [k for k, c in Counter(data).items() if c > 1]
    assert len(fences) == 3 and fences[-1].startswith(b"sluice-commit "), \
        "the task should have run twice (killed once, retried once; a fence each), then the write committed"
    assert not dupes and sorted(data) == list(range(3000)), f"{len(dupes)} duplicated, {3000 - len(set(data))} missing"
    assert data == list(range(3000)), "exactly once, and in order"


def test_exactly_once_across_a_streaming_restart_from_checkpoint(spark, s2_local, s2_opts, tmp_path,
                                                                small_arrow_batches):
    basin = s2_opts["s2.basin"]
    stream, marker, checkpoint = dying_stream(spark, tmp_path, 0.05)

    def start():
        return (stream.writeStream.format("s2").options(**eo_options(s2_opts, "eo-stream"))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    query = start()
    with pytest.raises(StreamingQueryException, match="Python worker exited unexpectedly"):
        query.awaitTermination(180)  # micro-batch 1 dies in both task attempts: the query is killed
    before = [json.loads(r.body)["id"] for r in read_stream(s2_local, basin, "eo-stream")]
    assert sorted(set(before)) == before[: len(set(before))] and 1000 < max(before) < 2000, \
        "micro-batch 1 should have been partly written when the query died"
    marker.unlink()
    query = start()  # restart from the checkpoint: micro-batch 1 is replayed, then 2 runs
    query.awaitTermination(180)
    assert query.exception() is None
    data = [json.loads(r.body)["id"] for r in read_stream(s2_local, basin, "eo-stream")]
    counts = Counter(data)
    dupes = sum(c - 1 for c in counts.values() if c > 1)
    missing = 3000 - len(counts)
    assert (dupes, missing) == (0, 0), f"{dupes} duplicates, {missing} missing"
    assert data == list(range(3000)), "each micro-batch is one file and one task: input order throughout"


def test_a_failed_batch_write_rerun_with_its_write_id_finishes_without_duplicates(spark, s2_local, s2_opts,
                                                                                    tmp_path, small_arrow_batches):
    """The failure sink.write-id fixes: a batch write failed with part of its records on the stream; re-running it gave
    those records twice. With sink.write-id the re-run resumes each writer after what it had written."""
    import sluice
    from tests.faults import fails_while

    marker = tmp_path / "fail"
    marker.touch()
    # Rows padded to ~1 KB, so the writer receives batches before the failure (see small_arrow_batches).
    rows = spark.range(0, 3000, 1, 1).select(fails_while(marker, 2500)("id").alias("id")) \
        .selectExpr("id", "repeat('x', 1000) AS pad")
    opts = {**s2_opts, "s2.stream": "eo", "sink.mode": "global-ordered", "sink.transactional": "true",
            "sink.batch.max-size": "200", "sink.write-id": "backfill-1"}
    with pytest.raises(Exception, match="injected failure at id 2500"):
        sluice.write(rows, "s2", opts)
    partial = len(read_stream(s2_local, s2_opts["s2.basin"], "eo"))
    assert 0 < partial < 3000, partial  # the failure left part of the write on the stream
    marker.unlink()
    sluice.write(rows, "s2", opts)
    ids = [json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], "eo")]
    assert Counter(ids) == Counter(range(3000)), "each row exactly once"
    sluice.write(rows, "s2", {**opts, "sink.write-id": "backfill-2"})  # negative control: a new write
    assert len(read_stream(s2_local, s2_opts["s2.basin"], "eo")) == 6000
