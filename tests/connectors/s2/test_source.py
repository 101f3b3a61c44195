"""spark.read / readStream .format("s2") and format("s2_upsert") against the local S2 server."""

import asyncio
import json
import time

import pytest
import s2_sdk
from pyspark.errors import AnalysisException

import sluice
from sluice.spark._compat import HAS_ADMISSION_CONTROL

pytestmark = pytest.mark.spark


def append(server, basin, stream, bodies, *, create=True):
    async def go():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            await client.ensure_basin(basin)
            if create:
                await client.basin(basin).ensure_stream(stream)
            target = client.basin(basin).stream(stream)
            for i in range(0, len(bodies), 1000):
                await target.append(s2_sdk.AppendInput(records=[s2_sdk.Record(body=b) for b in bodies[i:i + 1000]]))

    asyncio.run(go())


def trim(server, basin, stream, to):
    async def go():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            await client.basin(basin).stream(stream).append(s2_sdk.AppendInput(records=[s2_sdk.CommandRecord.trim(to)]))

    asyncio.run(go())


def rows(n, start=0):
    return [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(start, start + n)]


@pytest.fixture
def read_opts(s2_opts):
    return {k: v for k, v in s2_opts.items() if k not in ("s2.stream", "s2.create-streams", "s2.create-basin")}


def test_batch_read_of_many_streams_found_by_prefix(spark, s2_local, read_opts):
    basin = read_opts["s2.basin"]
    for i in range(4):
        append(s2_local, basin, f"logs/{i}", rows(50 + i))
    append(s2_local, basin, "other", rows(5))
    df = spark.read.format("s2").options(**read_opts).option("s2.discovery-prefix", "logs/").load()
    assert df.schema.simpleString() == ("struct<stream:string,seq_num:bigint,timestamp:timestamp,"
                                        "headers:array<struct<name:binary,value:binary>>,body:binary>")
    counts = {r["stream"]: r["count"] for r in df.groupBy("stream").count().collect()}
    assert counts == {"logs/0": 50, "logs/1": 51, "logs/2": 52, "logs/3": 53}
    first = df.where("stream = 'logs/2'").orderBy("seq_num").collect()
    assert [r.seq_num for r in first] == list(range(52)) and json.loads(first[7].body)["id"] == 7


def test_one_stream_cut_into_ranges_reads_in_parallel(spark, s2_local, read_opts):
    append(s2_local, read_opts["s2.basin"], "big", rows(1050))
    df = spark.read.format("s2").options(**read_opts).option("s2.streams", "big") \
        .option("s2.max-records-per-partition", "100").load()
    assert df.rdd.getNumPartitions() == 11
    assert sorted(r.seq_num for r in df.select("seq_num").collect()) == list(range(1050))


def test_json_bodies_parsed_into_the_schema_permissive_and_failfast(spark, s2_local, read_opts):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "j", [b'{"id": 1, "name": "a"}', b"not json", b'{"id": "x"}', b'{"id": 4}'])
    def base():
        return spark.read.format("s2").options(**read_opts).option("s2.streams", "j").option("format", "json")

    got = base().schema("seq_num long, id long, name string, _corrupt_record string").load().orderBy("seq_num") \
        .collect()
    assert [(r.id, r.name, r._corrupt_record) for r in got] == [
        (1, "a", None), (None, None, "not json"), (None, None, '{"id": "x"}'), (4, None, None)]
    with pytest.raises(Exception, match=r"record 1 of stream 'j' is not a JSON object of the schema.*FAILFAST"):
        base().option("mode", "FAILFAST").schema("id long").load().collect()


def test_start_and_end_by_seq_num_and_timestamp(spark, s2_local, read_opts):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "pos", rows(100))
    def base():  # DataFrameReader.option() mutates the reader: a fresh one per case
        return spark.read.format("s2").options(**read_opts).option("s2.streams", "pos")

    assert [r.seq_num for r in base().option("s2.start", "40").option("s2.end", "45").load().collect()] == \
        list(range(40, 45))
    assert base().option("s2.start", "latest").load().count() == 0
    with pytest.raises(Exception, match=r"s2.start=50 is after s2.end=10: the read would return nothing"):
        base().option("s2.start", "50").option("s2.end", "10").load().collect()
    # Positions clamped to the tail: 10 and 2 on a stream of one record both resolve to 1. Refused all the same.
    append(s2_local, basin, "short", rows(1))
    with pytest.raises(Exception, match=r"s2.start=10 is after s2.end=2: the read would return nothing"):
        base().option("s2.streams", "short").option("s2.start", "10").option("s2.end", "2").load().collect()
    with pytest.raises(Exception, match=r"s2.start=timestamp:2000 is after s2.end=timestamp:1000"):
        base().option("s2.start", "timestamp:2000").option("s2.end", "timestamp:1000").load().collect()
    future = int(time.time() * 1000) + 3_600_000
    assert base().option("s2.start", f"timestamp:{future}").load().count() == 0
    with pytest.raises(Exception, match=r"s2.start is after s2.end on stream\(s\) pos \(100 > 10\)"):  # resolved
        base().option("s2.start", f"timestamp:{future}").option("s2.end", "10").load().collect()
    assert base().option("s2.start", "2000-01-01T00:00:00Z").load().count() == 100


def test_empty_and_fully_trimmed_streams_read_as_empty(spark, s2_local, read_opts, tmp_path):
    """S2 answers 416 to a read that would start at the tail (nothing written, everything trimmed); the source
    resolves `earliest` to the tail there instead of failing."""
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "empty", [])
    append(s2_local, basin, "gone", rows(10))
    trim(s2_local, basin, "gone", 11)  # the 10 records and the trim command record itself
    for stream in ("empty", "gone"):
        assert spark.read.format("s2").options(**read_opts).option("s2.streams", stream).load().count() == 0
    query = (spark.readStream.format("s2").options(**read_opts).option("s2.streams", "empty,gone").load()
             .writeStream.format("memory").queryName("empty_streams")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None and spark.table("empty_streams").count() == 0


def test_reading_a_stream_that_does_not_exist_names_the_option(spark, s2_local, read_opts):
    append(s2_local, read_opts["s2.basin"], "there", rows(1))
    with pytest.raises(Exception, match=r"stream 'not-there' of basin '\S+' does not exist.*Check s2.streams"):
        spark.read.format("s2").options(**read_opts).option("s2.streams", "not-there").load().collect()


def test_trimmed_stream_with_and_without_fail_on_data_loss(spark, s2_local, read_opts):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "t", rows(100))
    trim(s2_local, basin, "t", 60)
    def base():
        return spark.read.format("s2").options(**read_opts).option("s2.streams", "t")

    assert base().load().count() == 40  # earliest = the first record still there: no loss
    with pytest.raises(Exception, match=r"records 0..59 of stream 't' were trimmed.*failOnDataLoss"):
        base().option("s2.start", "0").load().collect()
    skipped = base().option("s2.start", "0").option("failOnDataLoss", "false").load()
    assert sorted(r.seq_num for r in skipped.collect()) == list(range(60, 100))


@pytest.mark.lines
def test_streaming_discovers_new_streams_and_bounds_each_micro_batch(spark, s2_local, read_opts, tmp_path):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "ev/a", rows(250))
    query = (spark.readStream.format("s2").options(**read_opts).option("s2.discovery-prefix", "ev/")
             .option("s2.discovery-interval-ms", "0").option("max-records-per-trigger", "100").load()
             .selectExpr("stream", "seq_num").writeStream.format("memory").queryName("discovery")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while spark.table("discovery").count() < 250 and time.monotonic() < deadline:
            time.sleep(0.2)
        append(s2_local, basin, "ev/b", rows(30))  # created while the query runs
        while spark.table("discovery").count() < 280 and time.monotonic() < deadline:
            time.sleep(0.2)
        progress = query.recentProgress
    finally:
        query.stop()
    got = spark.table("discovery").collect()
    assert sorted((r.stream, r.seq_num) for r in got) == \
        [("ev/a", i) for i in range(250)] + [("ev/b", i) for i in range(30)]
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert max(sizes) <= 100 and len(sizes) >= 3, sizes


@pytest.mark.lines
def test_bytes_per_trigger_and_available_now_and_restart_from_checkpoint(spark, s2_local, read_opts, tmp_path,
                                                                          capability):
    basin = read_opts["s2.basin"]
    append(s2_local, basin, "an", rows(300))
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run():
        query = (spark.readStream.format("s2").options(**read_opts).option("s2.streams", "an")
                 .option("max-bytes-per-trigger", "3000").load().selectExpr("seq_num")
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    sizes = run()
    # A record here is 8 + ~25 metered bytes: 3000 bytes admit about 90 per micro-batch.
    assert max(sizes) <= 100, sizes
    if HAS_ADMISSION_CONTROL:
        assert len(sizes) >= 3 and sum(sizes) == 300, sizes  # AvailableNow runs to the end in capped batches
        capability("per-trigger caps", "Spark's admission control")
        capability("available-now with a cap", "to the end, in capped micro-batches")
    else:  # Spark 4.0/4.1 run AvailableNow as one micro-batch: the reader caps it; each run reads one cap
        assert len(sizes) == 1, sizes
        for _ in range(10):
            if sum(sizes) >= 300:
                break
            more = run()
            assert len(more) == 1, more
            sizes += more
        assert len(sizes) >= 3 and sum(sizes) == 300, sizes
        capability("per-trigger caps", "sluice caps latestOffset()")
        capability("available-now with a cap", "one capped micro-batch per run (warned)")
    append(s2_local, basin, "an", rows(50, 300), create=False)
    run()  # restarted from the checkpoint: only the 50 new records
    seqs = sorted(r.seq_num for r in spark.read.parquet(str(out)).collect())
    assert seqs == list(range(350)), "no duplicate and no missing record across the restart"
    capability("restart from a checkpoint", "yes")


def test_upsert_round_trip_materializes_latest_rows_without_deletes(spark, s2_local, s2_opts, read_opts):
    changes = spark.createDataFrame(
        [(1, "new", 10.0, "u"), (2, "new", 20.0, "u"), (3, "new", 30.0, "u"), (2, "paid", 21.0, "u"),
         (3, None, None, "d"), (4, "new", 40.0, "u")],
        "id long, status string, amount double, op string").coalesce(1)
    sluice.write(changes, "s2_upsert", {**s2_opts, "s2.stream": "orders", "primary-key": "id",
                                        "upsert.op-column": "op", "upsert.reduce": "false"})
    state = spark.read.format("s2_upsert").options(**read_opts).option("s2.streams", "orders") \
        .option("primary-key", "id").schema("id long, status string, amount double").load().orderBy("id").collect()
    assert [tuple(r) for r in state] == [(1, "new", 10.0), (2, "paid", 21.0), (4, "new", 40.0)]
    with pytest.raises(AnalysisException, match="needs a schema of the key and value columns"):
        spark.read.format("s2_upsert").options(**read_opts).option("s2.streams", "orders") \
            .option("primary-key", "id").load()


def test_upsert_streaming_read_yields_the_changelog_with_op(spark, s2_local, s2_opts, read_opts, tmp_path):
    changes = spark.createDataFrame([(1, 5.0, "u"), (1, None, "d")], "id long, amount double, op string").coalesce(1)
    sluice.write(changes, "s2_upsert", {**s2_opts, "s2.stream": "cl", "primary-key": "id",
                                        "upsert.op-column": "op", "upsert.reduce": "false"})
    query = (spark.readStream.format("s2_upsert").options(**read_opts).option("s2.streams", "cl")
             .option("primary-key", "id").schema("id long, amount double, _op string").load()
             .writeStream.format("memory").queryName("changelog")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert [tuple(r) for r in spark.table("changelog").collect()] == [(1, 5.0, "u"), (1, None, "d")]


@pytest.mark.parametrize(("extra", "message"), [
    ({}, r"set exactly one of s2.streams \(a list\) or s2.discovery-prefix"),
    ({"s2.streams": "a", "s2.discovery-prefix": "b"}, r"set exactly one of s2.streams"),
    ({"s2.streams": "a", "s2.start": "yesterday"}, r"s2.start='yesterday': use earliest, latest"),
    ({"s2.streams": "a", "s2.stream": "x"}, r"unknown option 's2.stream'.*Did you mean 's2.streams'"),
])
def test_bad_read_options(spark, read_opts, extra, message):
    with pytest.raises(AnalysisException, match=message):
        spark.read.format("s2").options(**read_opts).options(**extra).load().collect()


def test_binary_format_rejects_unknown_columns(spark, read_opts):
    with pytest.raises(AnalysisException, match=r"column\(s\) \['id'\] are not S2 record columns"):
        spark.read.format("s2").options(**read_opts).option("s2.streams", "a").schema("id long").load().collect()


def test_explain_does_not_show_the_token(spark, read_opts, capsys):
    df = spark.read.format("s2").options(**{**read_opts, "s2.auth-token": "tok-hidden-123"}) \
        .option("s2.streams", "nothing-here").load()
    df.explain(True)
    assert "tok-hidden-123" not in capsys.readouterr().out
