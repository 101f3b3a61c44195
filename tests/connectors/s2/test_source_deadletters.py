"""format("s2") with format=json and errors.tolerance=all: a record whose body does not parse goes to the dead-letter
target with its reason, and the stream goes on without it."""

import json

import pytest
from pyspark.errors import AnalysisException

from tests.connectors.s2.conftest import read_stream
from tests.connectors.s2.test_source import append

pytestmark = pytest.mark.spark


@pytest.fixture
def read_opts(s2_opts):
    return {k: v for k, v in s2_opts.items() if k not in ("s2.stream", "s2.create-streams", "s2.create-basin")}


@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_body_that_does_not_parse_goes_to_the_dead_letters_and_the_stream_goes_on(spark, s2_local, s2_opts,
                                                                                     read_opts, tmp_path, tolerance):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "in/a", [b'{"id": 1}', b"not json", b'{"id": 2}'])
    append(s2_local, basin, "in/b", [b'{"id": "x"}', b'{"id": 3}'])
    letters = {}
    if tolerance == "all":  # two read tasks (a stream each) send aside to one S2 stream
        letters = {"errors.tolerance": "all", "errors.deadletter.format": "s2",
                   "errors.deadletter.s2.stream": "dead", "errors.deadletter.s2.create-streams": "true",
                   **{f"errors.deadletter.{k}": v for k, v in read_opts.items()}}
    query = (spark.readStream.format("s2").options(**read_opts, **letters).option("s2.discovery-prefix", "in/")
             .option("format", "json").schema("stream string, seq_num long, id long").load()
             .writeStream.format("memory").queryName(f"json_{tolerance}").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    query.awaitTermination(120)
    assert query.exception() is None
    got = sorted((r.stream, r.seq_num, r.id) for r in spark.table(f"json_{tolerance}").collect())
    good = [("in/a", 0, 1), ("in/a", 2, 2), ("in/b", 1, 3)]
    if tolerance == "none":  # PERMISSIVE: the bad bodies come as rows of nulls
        assert got == sorted([*good, ("in/a", 1, None), ("in/b", 0, None)])
        return
    assert got == good
    dead = sorted((json.loads(r.body) for r in read_stream(s2_local, basin, "dead")), key=lambda d: d["target"])
    assert [d["target"] for d in dead] == ["in/a", "in/b"]
    records = [json.loads(d["record"]) for d in dead]
    assert [(r["stream"], r["seq_num"], r["body"]) for r in records] == [("in/a", 1, "not json"),
                                                                         ("in/b", 0, '{"id": "x"}')]
    assert all(d["error_class"] == "BodyError" and d["connector"] == "s2" and d["micro_batch"] == 0 for d in dead)
    assert "record 1 of stream 'in/a' is not a JSON object of the schema" in dead[0]["error_message"]


def test_a_target_committed_on_the_driver_is_refused_for_a_read_of_several_tasks(spark, read_opts, tmp_path):
    with pytest.raises(AnalysisException, match=r"errors.deadletter.format=tablestore commits on the driver.*"
                                                r"would keep only the first task's"):
        spark.read.format("s2").options(**read_opts).options(**{
            "s2.streams": "a", "format": "json", "errors.tolerance": "all", "errors.deadletter.format": "tablestore",
            "errors.deadletter.table": "dl", "errors.deadletter.warehouse": str(tmp_path / "wh"),
            "errors.deadletter.meta": str(tmp_path / "meta.db")}).schema("id long").load().collect()


def test_a_read_task_past_errors_max_records_fails(spark, s2_local, read_opts):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "bounded", [b'{"id": 1}', b"not json", b"nor this"])
    letters = {"errors.tolerance": "all", "errors.deadletter.format": "s2", "errors.deadletter.s2.stream": "dead",
               "errors.deadletter.s2.create-streams": "true",
               **{f"errors.deadletter.{k}": v for k, v in read_opts.items()}}

    def read(bound):
        return spark.read.format("s2").options(**read_opts, **letters, **bound).option("s2.streams", "bounded") \
            .option("format", "json").schema("id long").load().collect()

    assert [r.id for r in read({"errors.max-records": "2"})] == [1]  # the negative control: within the bound
    with pytest.raises(Exception, match=r"2 records were refused, more than errors.max-records=1"):
        read({"errors.max-records": "1"})
