"""format("s2") / format("s2_upsert") against the local S2 server, in real Spark."""

import asyncio
import json
import uuid

import pytest
import s2_sdk
from pyspark.errors import AnalysisException

import sluice
from sluice.s2local import LocalS2
from tests.connectors.s2.conftest import list_streams, read_stream

pytestmark = pytest.mark.spark


def orders(spark, n=300, partitions=2):
    return spark.range(0, n, 1, partitions).selectExpr(
        "id", "CASE WHEN id % 3 = 0 THEN 'eu' WHEN id % 3 = 1 THEN 'us' ELSE 'apac' END AS region",
        "CAST(id AS DOUBLE) / 4 AS amount", "concat('c', CAST(id % 7 AS STRING)) AS customer")


def test_append_json_writes_one_compact_object_per_row(spark, s2_local, s2_opts):
    orders(spark, 200).write.format("s2").options(**s2_opts).mode("append").save()
    records = read_stream(s2_local, s2_opts["s2.basin"], "s")
    rows = sorted((json.loads(r.body) for r in records), key=lambda r: r["id"])
    assert len(rows) == 200 and rows[5] == {"id": 5, "region": "apac", "amount": 1.25, "customer": "c5"}
    first = next(r for r in records if json.loads(r.body)["id"] == 4)
    assert first.body == b'{"id":4,"region":"us","amount":1.0,"customer":"c4"}' and first.headers == []
    summary = sluice.last_write_summary("s2")
    assert summary["records"] == 200 and summary["tasks"] == 2


def test_raw_format_with_headers_and_timestamp_columns(spark, s2_local, s2_opts):
    df = spark.sql("SELECT CAST(id AS STRING) AS body, map('source', 'test', 'n', CAST(id AS STRING)) AS headers, "
                   "1700000000000 + id AS timestamp FROM range(5)")
    df.write.format("s2").options(**s2_opts).option("format", "raw").mode("append").save()
    records = sorted(read_stream(s2_local, s2_opts["s2.basin"], "s"), key=lambda r: int(r.body))
    assert [r.body for r in records] == [b"0", b"1", b"2", b"3", b"4"]
    assert records[3].headers == [(b"source", b"test"), (b"n", b"3")]
    assert records[3].timestamp == 1700000000003


def test_split_streams_route_each_row_by_template(spark, s2_local, s2_opts):
    opts = {**s2_opts, "s2.stream": "orders/{region}"}
    orders(spark, 90).write.format("s2").options(**opts).mode("append").save()
    assert list_streams(s2_local, s2_opts["s2.basin"]) == ["orders/apac", "orders/eu", "orders/us"]
    for region in ("eu", "us", "apac"):
        rows = [json.loads(r.body) for r in read_stream(s2_local, s2_opts["s2.basin"], f"orders/{region}")]
        assert len(rows) == 30 and {r["region"] for r in rows} == {region}


def test_upsert_records_match_flink_connector_s2_byte_for_byte(spark, s2_local, s2_opts):
    df = spark.createDataFrame(
        [("265", "first", 4, "u"), ("266", "x", 1, "u"), ("265", "second", 5, "u"), ("266", None, None, "d")],
        "index string, content string, n int, op string").coalesce(1)
    opts = {**s2_opts, "primary-key": "index", "upsert.op-column": "op", "upsert.reduce": "false",
            "sink.mode": "global-ordered"}  # one request at a time: total order, to compare record by record
    sluice.write(df, "s2_upsert", opts)
    records = read_stream(s2_local, s2_opts["s2.basin"], "s")
    assert [r.headers for r in records] == [
        [(b"@key", b'{"index":"265"}'), (b"@action", b"u")],
        [(b"@key", b'{"index":"266"}'), (b"@action", b"u")],
        [(b"@key", b'{"index":"265"}'), (b"@action", b"u")],
        [(b"@key", b'{"index":"266"}'), (b"@action", b"d")],
    ]
    assert [r.body for r in records] == [b'{"content":"first","n":4}', b'{"content":"x","n":1}',
                                         b'{"content":"second","n":5}', b""]


def test_upsert_reduces_each_batch_to_the_last_change_per_key_keeping_key_order(spark, s2_local, s2_opts):
    rows = [(k, v) for v in range(5) for k in ("a", "b", "c")]  # a0 b0 c0 a1 b1 c1 ... a4 b4 c4
    df = spark.createDataFrame(rows, "k string, v int").coalesce(1)
    sluice.write(df, "s2_upsert", {**s2_opts, "primary-key": "k", "sink.mode": "global-ordered"})
    records = read_stream(s2_local, s2_opts["s2.basin"], "s")
    assert [(json.loads(r.headers[0][1])["k"], json.loads(r.body)["v"]) for r in records] == [
        ("a", 4), ("b", 4), ("c", 4)]


def test_partition_ordered_upsert_keeps_every_keys_changes_in_order(spark, s2_local, s2_opts):
    df = spark.range(0, 3000, 1, 1).selectExpr("id % 50 AS k", "id AS v")
    opts = {**s2_opts, "primary-key": "k", "upsert.reduce": "false", "sink.batch.max-size": "20",
            "sink.parallelism": "8"}
    sluice.write(df, "s2_upsert", opts, num_partitions=3)
    per_key = {}
    for r in read_stream(s2_local, s2_opts["s2.basin"], "s"):
        per_key.setdefault(json.loads(r.headers[0][1])["k"], []).append(json.loads(r.body)["v"])
    assert len(per_key) == 50
    for key, values in per_key.items():
        assert values == sorted(values) and len(values) == 60, key
    assert sluice.last_write_summary("s2_upsert")["peak_inflight"] > 1  # buckets really were concurrent


@pytest.mark.parametrize("mode", ["unordered", "global-ordered"])
def test_batch_modes_deliver_every_row(spark, s2_local, s2_opts, mode):
    orders(spark, 500, 3).write.format("s2").options(**s2_opts).option("sink.mode", mode) \
        .option("sink.batch.max-size", "50").mode("append").save()
    ids = sorted(json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], "s"))
    assert ids == list(range(500))


def test_global_ordered_with_one_writer_keeps_arrival_order(spark, s2_local, s2_opts):
    df = spark.range(0, 2000, 1, 1).selectExpr("id")
    df.write.format("s2").options(**s2_opts).option("sink.mode", "global-ordered") \
        .option("sink.batch.max-size", "37").mode("append").save()
    assert [json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], "s")] == list(range(2000))


def test_stamp_writer_adds_writer_and_sequence_headers(spark, s2_local, s2_opts):
    spark.range(0, 10, 1, 1).write.format("s2").options(**s2_opts).option("s2.stamp-writer", "true") \
        .mode("append").save()
    records = read_stream(s2_local, s2_opts["s2.basin"], "s")
    writers = {dict(r.headers)[b"@writer"] for r in records}
    assert len(writers) == 1 and next(iter(writers)).endswith(b"/0/0")
    assert [int(dict(r.headers)[b"@wseq"]) for r in records] == list(range(10))


def test_streaming_write_in_every_mode(spark, s2_local, s2_opts, tmp_path):
    src = tmp_path / "in"
    spark.range(0, 600, 1, 2).selectExpr("id", "id % 4 AS k").write.parquet(str(src))
    for mode, extra in [("unordered", {}), ("partition-ordered", {"sink.partition-key": "k"}),
                        ("global-ordered", {"sink.transactional": "true"})]:
        stream = f"stream-{mode}"
        query = (spark.readStream.schema("id long, k long").parquet(str(src)).writeStream.format("s2")
                 .options(**{**s2_opts, "s2.stream": stream, "sink.mode": mode, **extra})
                 .option("checkpointLocation", str(tmp_path / f"ck-{mode}")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
        ids = sorted(json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], stream))
        assert ids == list(range(600)), mode


def test_sql_through_a_temporary_view(spark, s2_local, s2_opts):
    quoted = ", ".join(f"`{k}` '{v}'" for k, v in s2_opts.items())
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW s2_sql (id BIGINT, word STRING) USING s2 OPTIONS ({quoted})")
    spark.sql("INSERT INTO s2_sql SELECT 1 AS id, 'hello' AS word")
    assert [r.body for r in read_stream(s2_local, s2_opts["s2.basin"], "s")] == [b'{"id":1,"word":"hello"}']


def test_catalog_table_without_options_explains_the_spark_limitation(spark, s2_opts):
    spark.sql("CREATE TABLE IF NOT EXISTS s2_catalog (id BIGINT) USING s2")
    with pytest.raises(AnalysisException, match=r"CREATE TEMPORARY VIEW name \(columns\) USING s2"):
        spark.sql("INSERT INTO s2_catalog VALUES (1)")


@pytest.mark.parametrize(("extra", "message"), [
    ({"s2.stream-name": "x"}, r"unknown option 's2.stream-name'.*Did you mean 's2.stream'"),
    ({"s2.basin": "Bad_Basin"}, r"s2.basin 'Bad_Basin' is not a basin name"),
    ({"s2.endpoints.basin": None}, r"set both s2.endpoints.account and s2.endpoints.basin"),
    ({"s2.stream": "orders/{nope}"}, r"template 'orders/\{nope\}' names column\(s\) \['nope'\]"),
    ({"sink.transactional": "true"}, r"sink.transactional=true needs sink.mode=global-ordered"),
    ({"sink.mode": "global-ordered", "sink.transactional": "true", "s2.append-retry-policy": "ALL"},
     r"exactly-once cannot allow"),
    ({"sink.batch.max-size": "5000", "sink.requests.max-buffered": "9000"},
     r"sink.batch.max-size=5000 exceeds s2's limit of 1000"),
    ({"format": "raw"}, r"format=raw needs one data column"),
])
def test_bad_options_fail_before_any_write(spark, s2_local, s2_opts, extra, message):
    opts = {k: v for k, v in {**s2_opts, **extra}.items() if v is not None}
    with pytest.raises(AnalysisException, match=message):
        orders(spark, 10).write.format("s2").options(**opts).mode("append").save()
    assert list_streams_or_none(s2_local, s2_opts["s2.basin"]) in (None, [])


def list_streams_or_none(server, basin):
    """The basin's streams, or None when the basin was never created (nothing was written). Asks the account for
    its basins first, so that any error from listing (a server that is down, a broken basin) fails the test."""
    async def basins():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            return {b.name async for b in client.list_all_basins()}

    if basin not in asyncio.run(basins()):
        return None
    return list_streams(server, basin)


def test_overwrite_is_refused_because_streams_are_append_only(spark, s2_opts):
    with pytest.raises(AnalysisException, match="S2 streams are append-only"):
        orders(spark, 10).write.format("s2").options(**s2_opts).mode("overwrite").save()


def test_bad_rows_name_the_column(spark, s2_opts):
    df = spark.createDataFrame([(None, 1)], "k string, v int")
    with pytest.raises(Exception, match="primary-key column 'k' has 1 null value"):
        df.write.format("s2_upsert").options(**s2_opts).option("primary-key", "k").mode("append").save()
    with pytest.raises(Exception, match=r"primary-key column\(s\) \['key'\] are not in the DataFrame"):
        df.write.format("s2_upsert").options(**s2_opts).option("primary-key", "key").mode("append").save()
    routed = spark.createDataFrame([(1, None)], "id int, region string")
    with pytest.raises(Exception, match="column 'region' routes rows to streams"):
        routed.write.format("s2").options(**s2_opts).option("s2.stream", "o/{region}").mode("append").save()


def test_a_wrong_token_is_a_clear_401_naming_the_basin_without_a_retry_storm(spark, s2_opts):
    with LocalS2(token="the-right-token") as secured:
        # A retry would wait ten minutes, past the test's timeout: a 401 is not retried.
        opts = {**s2_opts, "s2.endpoints.account": secured.url, "s2.endpoints.basin": secured.url,
                "s2.auth-token": "a-wrong-token", "s2.create-basin": "false", "s2.create-streams": "false",
                "sink.max-retries": "5", "sink.retry-delay-ms": "600000"}
        with pytest.raises(Exception) as failure:
            orders(spark, 10, 1).write.format("s2").options(**opts).mode("append").save()
        text = str(failure.value)
    assert f"S2 refused 'append' on basin '{s2_opts['s2.basin']}', stream 's' (HTTP 401" in text
    assert "a-wrong-token" not in text and "the-right-token" not in text


def test_the_token_never_appears_in_errors(spark, s2_opts):
    opts = {**s2_opts, "s2.endpoints.account": "http://127.0.0.1:9", "s2.endpoints.basin": "http://127.0.0.1:9",
            "s2.auth-token": "sekrit-token-value", "s2.max-retries": "0", "sink.max-retries": "0"}
    with pytest.raises(Exception) as failure:
        orders(spark, 5, 1).write.format("s2").options(**opts).mode("append").save()
    assert "sekrit-token-value" not in str(failure.value)
    assert "cannot reach S2 at http://127.0.0.1:9" in str(failure.value)
    assert "s2.endpoints.account / s2.endpoints.basin" in str(failure.value)
    connection = {k: v for k, v in opts.items() if k.startswith(("s2.basin", "s2.endpoints", "s2.auth"))}
    reader = spark.read.format("s2").options(**connection)
    with pytest.raises(Exception, match=r"cannot reach S2 at http://127\.0\.0\.1:9 for 'check-tail or read'"):
        reader.option("s2.streams", "s").load().collect()
    from sluice.connectors.s2._client import Connection
    from sluice.connectors.s2._options import APPEND_SPEC

    parsed = APPEND_SPEC.parse(opts)
    assert "sekrit" not in repr(parsed) and "sekrit" not in repr(Connection.from_options(parsed))


def test_token_and_endpoints_come_from_the_environment(monkeypatch):
    """Resolved on the driver (Spark's planner worker, which inherits the environment the session started with)."""
    from sluice.connectors.s2._client import Connection
    from sluice.connectors.s2._options import APPEND_SPEC

    monkeypatch.setenv("S2_ACCESS_TOKEN", "from-env")
    monkeypatch.setenv("S2_ACCOUNT_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("S2_BASIN_ENDPOINT", "http://127.0.0.1:1")
    conn = Connection.from_options(APPEND_SPEC.parse({"s2.basin": "env-basin", "s2.stream": "s"}))
    assert (conn.token, conn.account_endpoint, conn.basin_endpoint) == ("from-env", "http://127.0.0.1:1",
                                                                       "http://127.0.0.1:1")
    explicit = Connection.from_options(APPEND_SPEC.parse({"s2.basin": "env-basin", "s2.stream": "s",
                                                          "s2.auth-token": "opt"}))
    assert explicit.token == "opt"  # an option wins over the environment
    monkeypatch.delenv("S2_BASIN_ENDPOINT")
    with pytest.raises(sluice.OptionError, match="must be set together"):
        Connection.from_options(APPEND_SPEC.parse({"s2.basin": "env-basin", "s2.stream": "s"}))


def test_a_token_without_the_permission_fails_at_once_naming_the_operation_basin_and_stream(spark, s2_local,
                                                                                              s2_opts):
    basin = s2_opts["s2.basin"]

    async def issue():
        async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as admin:
            await admin.create_basin(basin)
            await admin.basin(basin).create_stream("s")
            read = await admin.issue_access_token(f"ro-{basin}", scope=s2_sdk.AccessTokenScope(
                basins=s2_sdk.ExactMatch(basin),
                op_groups=s2_sdk.OperationGroupPermissions(stream=s2_sdk.Permission.READ)))
            write = await admin.issue_access_token(f"wo-{basin}", scope=s2_sdk.AccessTokenScope(
                basins=s2_sdk.ExactMatch(basin), ops=[s2_sdk.Operation.APPEND]))
            return read, write

    read_only, write_only = asyncio.run(issue())
    opts = {**s2_opts, "s2.auth-token": read_only, "s2.create-basin": "false", "s2.create-streams": "false",
            "sink.max-retries": "5", "sink.retry-delay-ms": "60000"}  # a retry would take minutes
    with pytest.raises(Exception, match=rf"S2 refused 'append' on basin '{basin}', stream 's' \(HTTP 403"):
        spark.range(3).write.format("s2").options(**opts).mode("append").save()
    assert read_stream(s2_local, basin, "s") == []
    connection = {k: v for k, v in s2_opts.items() if k.startswith(("s2.basin", "s2.endpoints"))}
    with pytest.raises(Exception, match=rf"S2 refused 'check-tail or read' on basin '{basin}', stream 's'"):
        spark.read.format("s2").options(**connection).option("s2.auth-token", write_only) \
            .option("s2.streams", "s").load().collect()


def test_encrypted_basins_are_written_and_read_with_the_key_which_never_shows(spark, s2_local, s2_opts, capsys):
    import base64
    import os

    basin = s2_opts["s2.basin"]
    key = base64.b64encode(os.urandom(32)).decode()

    async def create():
        async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as admin:
            await admin.create_basin(basin, config=s2_sdk.BasinConfig(stream_cipher=s2_sdk.Encryption.AES_256_GCM))

    asyncio.run(create())
    opts = {**s2_opts, "s2.create-basin": "false", "s2.encryption-key": key}
    orders(spark, 20, 2).write.format("s2").options(**opts).mode("append").save()
    connection = {k: v for k, v in opts.items() if k.startswith(("s2.basin", "s2.endpoints", "s2.auth", "s2.encr"))}
    reader = spark.read.format("s2").options(**connection).option("s2.streams", "s")
    assert reader.load().count() == 20
    reader.load().explain()
    assert key not in capsys.readouterr().out
    with pytest.raises(Exception, match=r"encrypted.*set \.option\('s2.encryption-key'") as missing:
        orders(spark, 5, 1).write.format("s2").options(**{**opts, "s2.encryption-key": None}).mode("append").save()
    assert key not in str(missing.value)
    with pytest.raises(Exception, match=r"s2\.encryption-key must be the base64 of a 32-byte key") as bad:
        orders(spark, 5, 1).write.format("s2").options(**{**opts, "s2.encryption-key": "not-a-key"}) \
            .mode("append").save()
    assert "not-a-key" not in str(bad.value)


def test_a_write_routed_over_1200_streams_lands_every_row_on_its_stream(spark, s2_local, s2_opts):
    """Past what used to break it: > 1,000 requests on one HTTP/2 connection while hundreds of append sessions
    are open on it (hypercorn's default ended such a connection), more streams than a task keeps append sessions
    for (s2.max-append-sessions), per-stream batches."""
    n, rows = 1200, 24_000
    df = spark.range(0, rows, 1, 2).selectExpr(f"id % {n} AS k", "id")
    # A small buffer makes small per-stream batches: many appends per stream, so busy streams get sessions.
    df.write.format("s2").options(**{**s2_opts, "s2.stream": "st/{k}", "sink.requests.max-buffered": "3000",
                                     "s2.max-append-sessions": "900"}).mode("append").save()
    basin = s2_opts["s2.basin"]
    names = list_streams(s2_local, basin)
    assert len(names) == n
    for k in (0, 1, 599, 1199):
        ids = sorted(json.loads(r.body)["id"] for r in read_stream(s2_local, basin, f"st/{k}"))
        assert ids == list(range(k, rows, n))
    assert sluice.last_write_summary("s2")["records"] == rows


def append_ops(server, basin):
    """How many appends the server took into `basin` (its append-ops metric)."""
    async def scenario():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            (appends,) = await client.basin_metrics(basin, set=s2_sdk.BasinMetricSet.APPEND_OPS)
            return int(appends.values[-1][1])

    return asyncio.run(scenario())


def test_sluice_write_routed_over_many_streams_appends_each_streams_rows_at_once(spark, s2_local, s2_opts, monkeypatch):
    """sluice.write puts a routed stream's rows side by side in its task (S2's write_order): a buffer far smaller than
    the task's rows still cuts each stream's batch whole, one append per stream. Negative control: the same write
    without the order interleaves the streams, and the full buffer cuts each stream's rows into several appends."""
    from sluice.connectors.s2._datasource import S2DataSource

    n, rows = 400, 8000
    df = spark.range(0, rows, 1, 2).selectExpr(f"id % {n} AS k", "id")
    opts = {**s2_opts, "s2.stream": "st/{k}", "sink.requests.max-buffered": "2000"}
    unordered = f"sink-{uuid.uuid4().hex[:12]}"
    # A task's rows reach the sink in Arrow batches of 500, so its buffer fills before it has seen all of them.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        sluice.write(df, "s2", opts)
        monkeypatch.setattr(S2DataSource, "write_order", lambda self, opts, schema: ())  # the driver lays rows out
        sluice.write(df, "s2", {**opts, "s2.basin": unordered})
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert append_ops(s2_local, s2_opts["s2.basin"]) == n
    assert sorted(json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], "st/7")) == \
        list(range(7, rows, n))
    assert append_ops(s2_local, unordered) > 1.5 * n


def test_a_basin_created_for_a_write_creates_streams_on_append_and_an_existing_basin_is_left_as_it_is(
        spark, s2_local, s2_opts):
    """s2.create-basin + s2.create-streams: a new basin is set to create streams on append (no request per stream);
    an existing basin's configuration is never changed, its streams are created one by one instead."""
    rows = spark.range(0, 300, 1, 1).selectExpr("id % 3 AS k", "id")
    rows.write.format("s2").options(**{**s2_opts, "s2.stream": "st/{k}"}).mode("append").save()

    async def config(basin):
        async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as client:
            return await client.get_basin_config(basin)

    assert asyncio.run(config(s2_opts["s2.basin"])).create_stream_on_append is True
    assert sorted(list_streams(s2_local, s2_opts["s2.basin"])) == ["st/0", "st/1", "st/2"]

    existing = f"kept-{uuid.uuid4().hex[:12]}"

    async def create():
        async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as client:
            await client.create_basin(existing, config=s2_sdk.BasinConfig(create_stream_on_read=True))

    asyncio.run(create())
    rows.write.format("s2").options(**{**s2_opts, "s2.basin": existing, "s2.stream": "st/{k}"}).mode("append").save()
    kept = asyncio.run(config(existing))
    assert (kept.create_stream_on_append, kept.create_stream_on_read) == (False, True)
    assert sorted(list_streams(s2_local, existing)) == ["st/0", "st/1", "st/2"]
    assert sorted(json.loads(r.body)["id"] for r in read_stream(s2_local, existing, "st/1")) == list(range(1, 300, 3))
