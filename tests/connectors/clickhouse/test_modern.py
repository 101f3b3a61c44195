"""What ClickHouse of this decade adds: its types through Arrow both ways, deletes through ReplacingMergeTree(ver,
is_deleted), exactly-once through insert_deduplication_token, async inserts, and which errors are retried."""

import datetime as dt
import ipaddress
import uuid
from decimal import Decimal

import pytest

import sluice
from tests.faults import dies_once_when_stored

pytestmark = pytest.mark.spark

MODERN = ("id Int64, flag Bool, u UUID, d32 Date32, t64 DateTime64(3, 'Asia/Tokyo'), big Decimal(76, 10), "
          "lc LowCardinality(String), nlc LowCardinality(Nullable(String)), arr Array(Int32), "
          "nested Array(Nullable(String)), m Map(String, Int64), tup Tuple(a Int32, b String), "
          "color Enum8('red' = 1, 'green' = 2), ip4 IPv4, ip6 IPv6, j JSON, wide UInt128, fs FixedString(3)")
SPARK = ("id long, flag boolean, u string, d32 date, t64 timestamp, big decimal(38,10), lc string, nlc string, "
         "arr array<int>, nested array<string>, m map<string,long>, tup struct<a:int,b:string>, color string, "
         "ip4 string, ip6 string, j string, wide decimal(38,0), fs string")


def modern_rows(n: int) -> list[tuple]:
    return [(i, i % 2 == 0, str(uuid.UUID(int=i * 7919)), dt.date(1900, 1, 1) + dt.timedelta(days=i * 301),
             dt.datetime(1960, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i * 86_399, milliseconds=i % 1000),
             Decimal(f"{(-1) ** i * 10 ** 27 + i}.{i:03d}"), f"lc{i % 3}", None if i % 4 == 0 else f"n{i}",
             list(range(i % 5)), [None if k % 2 else f"s{k}" for k in range(i % 3)], {f"k{i % 2}": i},
             (i, f"t{i}"), ("red", "green")[i % 2], f"10.0.{i // 256}.{i % 256}", f"2001:db8::{i:x}",
             f'{{"a":{{"b":{i}}},"c":"x{i}"}}', Decimal(10 ** 37 + i), f"f{i % 10}x")
            for i in range(300)]


def test_every_modern_type_round_trips_and_is_stored_as_clickhouse_reads_it(spark, ch):
    table = ch.table(MODERN)
    df = spark.createDataFrame(modern_rows(300), SPARK)
    sluice.write(df.repartition(2), "clickhouse", ch.opts(table))
    # Stored as ClickHouse itself reads the values, not merely as sluice reads them back.
    assert ch.rows(f"SELECT flag, u, d32, t64, big, nlc, nested, m, tup, color, ip4, ip6, toString(j), wide, fs "
                   f"FROM {table} WHERE id = 7") == [[
                       "false", str(uuid.UUID(int=7 * 7919)), "1905-10-09", "1960-01-08 08:59:53.007",
                       "-999999999999999999999999993.007", "n7", "['s0']", "{'k1':7}", "(7,'t7')",
                       "green", "10.0.0.7", "2001:db8::7", '{"a":{"b":7},"c":"x7"}', str(10 ** 37 + 7), "f7x"]]
    back = spark.read.format("clickhouse").options(**ch.opts(table)).load()
    assert back.schema.simpleString() == (
        "struct<id:bigint,flag:boolean,u:string,d32:date,t64:timestamp,big:string,lc:string,nlc:string,arr:array<int>,"
        "nested:array<string>,m:map<string,bigint>,tup:struct<a:int,b:string>,color:string,ip4:string,ip6:string,"
        "j:string,wide:string,fs:string>")
    got = {r.id: r.asDict(recursive=True) for r in back.collect()}
    assert len(got) == 300
    for want in df.collect():
        expected = want.asDict(recursive=True)
        expected.update(big=expected["big"], wide=str(expected["wide"]), ip6=str(ipaddress.ip_address(want.ip6)))
        have = got[want.id]
        have["big"] = Decimal(have["big"])  # Decimal(76, 10) reads as its text: Spark's decimals end at 38 digits
        assert have == expected, {k: (have[k], v) for k, v in expected.items() if have[k] != v}


def test_values_a_modern_column_cannot_hold_are_refused_before_anything_is_sent(spark, ch):
    table = ch.table("id Int64, color Enum8('red' = 1), arr Array(Int32), d32 Date32")
    cases = [
        (spark.createDataFrame([(1, "blue", [1], dt.date(2000, 1, 1))], "id long, color string, arr array<int>, "
                               "d32 date"),
         r"value 'blue' of column 'color' is not one of its Enum8's names \['red'\] \(the row with sorting key "
         r"\{'id': 1\}; 1 row\(s\)\)\. Those rows were not sent"),
        (spark.createDataFrame([(2, "red", [1, None], dt.date(2000, 1, 1))], "id long, color string, arr array<int>, "
                               "d32 date"),
         r"column 'arr' of default\.\S+ holds a NULL in an element \(the array's type is Array\(Int32\)\), which is "
         r"not Nullable"),
        (spark.createDataFrame([(3, "red", [1], dt.date(1800, 1, 1))], "id long, color string, arr array<int>, "
                               "d32 date"),
         r"value 1800-01-01 of column 'd32' is outside the range of its ClickHouse type Date32"),
    ]
    for df, message in cases:
        with pytest.raises(Exception, match=message):
            sluice.write(df.coalesce(1), "clickhouse", ch.opts(table))
    tuples = ch.table("id Int64, tup Tuple(a Int32, b String)")
    with pytest.raises(Exception, match=r"column 'tup' is a struct of fields \['a', 'c'\] but the table's Tuple\(`a` "
                                        r"Int32, `b` String\) has elements \['a', 'b'\]: name the struct's fields"):
        sluice.write(spark.createDataFrame([(1, (1, "x"))], "id long, tup struct<a:int,c:string>"), "clickhouse",
                     ch.opts(tuples))
    assert ch.rows(f"SELECT count() FROM {table}") == [["0"]]


DELETES = "id Int64, ver UInt64, v String, is_deleted UInt8"


def test_op_column_deletes_keys_of_a_replacing_merge_tree_with_is_deleted(spark, ch):
    table = ch.table(DELETES, "ReplacingMergeTree(ver, is_deleted) ORDER BY id")
    opts = ch.opts(table, **{"upsert.op-column": "op"})
    upserts = spark.createDataFrame([(k, 1, f"v{k}", "u") for k in range(10)], "id long, ver long, v string, op string")
    sluice.write(upserts, "clickhouse", opts)
    # Deletes carry the key and a newer version; their other columns may be NULL.
    changes = spark.createDataFrame([(k, 2, None, "d") for k in range(0, 10, 2)] + [(1, 3, "new", "u")],
                                    "id long, ver long, v string, op string")
    sluice.write(changes, "clickhouse", opts)
    back = spark.read.format("clickhouse").options(**ch.opts(table)).load()  # FINAL: deleted keys are gone
    assert sorted((r.id, r.v) for r in back.collect()) == [(1, "new"), (3, "v3"), (5, "v5"), (7, "v7"), (9, "v9")]
    assert ch.rows(f"SELECT count() FROM {table} WHERE is_deleted = 1") == [["5"]]
    # Without op-column the same rows would be written as they are: the negative control of the mapping.
    plain = ch.table(DELETES, "ReplacingMergeTree(ver, is_deleted) ORDER BY id")
    sluice.write(changes.selectExpr("id", "ver", "coalesce(v, '') AS v", "0 AS is_deleted"), "clickhouse",
                 ch.opts(plain))
    assert int(ch.rows(f"SELECT count() FROM {plain} FINAL")[0][0]) == 6


def test_op_column_needs_a_table_with_is_deleted_and_the_key_and_version(spark, ch):
    df = spark.createDataFrame([(1, 1, "a", "d")], "id long, ver long, v string, op string")
    versioned = ch.table("id Int64, ver UInt64, v String", "ReplacingMergeTree(ver) ORDER BY id")
    with pytest.raises(Exception, match=r"upsert.op-column needs a table whose engine marks deletes, "
                                        r"ReplacingMergeTree\(ver, is_deleted\); default\.\S+ is ReplacingMergeTree "
                                        r"without an is_deleted column"):
        sluice.write(df, "clickhouse", ch.opts(versioned, **{"upsert.op-column": "op"}))
    table = ch.table(DELETES, "ReplacingMergeTree(ver, is_deleted) ORDER BY id")
    with pytest.raises(Exception, match=r"a delete must carry the sorting key and the version of default\.\S+, but "
                                        r"the DataFrame has no column \['ver'\]"):
        sluice.write(df.drop("ver"), "clickhouse", ch.opts(table, **{"upsert.op-column": "op"}))
    with pytest.raises(Exception, match=r"column 'v' is not Nullable .* 1 row\(s\) have no value for it \(the row "
                                        r"with sorting key \{'id': 2\}\)"):
        sluice.write(spark.createDataFrame([(2, 1, None, "u")], "id long, ver long, v string, op string"),
                     "clickhouse", ch.opts(table, **{"upsert.op-column": "op"}))  # an upsert needs its values


DEDUP = "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"


def killed_write(spark, ch, tmp_path, table: str, **extra: str) -> tuple[int, int]:
    """20,000 rows through a Python worker that dies once at id 15,000, after some of its rows are stored: (rows
    stored, distinct ids)."""
    marker = tmp_path / f"die-{table}"
    marker.touch()
    url, password = ch.url, ch.password

    def stored() -> bool:  # the dying task (ids 10,000-19,999) has rows in the table: its retry repeats them
        import base64
        import urllib.request

        request = urllib.request.Request(url, data=f"SELECT count() FROM {table} WHERE id >= 10000".encode())
        request.add_header("Authorization", "Basic " + base64.b64encode(f"default:{password}".encode()).decode())
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.read()) > 0

    df = spark.range(0, 20_000, 1, 2).selectExpr("id", "repeat('x', 100) AS pad") \
        .mapInArrow(dies_once_when_stored(15_000, str(marker), stored), "id long, pad string")
    # Spark hands the writer batches of 500 rows, which it inserts by 1,000 while the dying worker waits.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        sluice.write(df, "clickhouse", ch.opts(table, **{"sink.batch.max-size": "1000", **extra}))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert not marker.exists(), "the worker did not die: the test proved nothing"
    total, distinct = ch.rows(f"SELECT count(), uniqExact(id) FROM {table}")[0]
    return int(total), int(distinct)


def test_insert_deduplicate_makes_a_retried_task_exactly_once(spark, ch, tmp_path):
    exact = killed_write(spark, ch, tmp_path, ch.table("id Int64, pad String", DEDUP), **{"insert.deduplicate": "true"})
    assert exact == (20_000, 20_000)
    # The negative control: the same write into a table that does not deduplicate stores the retried rows twice.
    total, distinct = killed_write(spark, ch, tmp_path, ch.table("id Int64, pad String"))
    assert distinct == 20_000 and total > 20_000


def test_a_rerun_with_the_same_write_id_is_applied_once(spark, ch):
    table = ch.table("id Int64, v Int64", DEDUP)
    df = spark.range(0, 50_000, 1, 3).selectExpr("id", "id * 2 AS v")
    opts = ch.opts(table, **{"insert.deduplicate": "true", "sink.batch.max-size": "7000", "sink.write-id": "job-1"})
    sluice.write(df, "clickhouse", opts)
    sluice.write(df, "clickhouse", {**opts, "sink.flush-buffer.timeout": "1", "connections-per-task": "4"})
    assert ch.rows(f"SELECT count(), uniqExact(id) FROM {table}") == [["50000", "50000"]]
    sluice.write(df, "clickhouse", {**opts, "sink.write-id": "job-2"})  # another write: inserted again
    assert ch.rows(f"SELECT count(), uniqExact(id) FROM {table}") == [["100000", "50000"]]


def test_insert_deduplicate_is_refused_where_it_cannot_work(spark, ch):
    plain = ch.table("id Int64")
    with pytest.raises(Exception, match=r"insert.deduplicate=true: default\.\S+ \(MergeTree\) does not deduplicate "
                                        r"inserts.*MODIFY SETTING non_replicated_deduplication_window"):
        sluice.write(spark.range(3), "clickhouse", ch.opts(plain, **{"insert.deduplicate": "true"}))
    table = ch.table("id Int64", DEDUP)
    with pytest.raises(Exception, match=r"insert.deduplicate=true with insert.async=true"):
        sluice.write(spark.range(3), "clickhouse", ch.opts(table, **{"insert.deduplicate": "true",
                                                                      "insert.async": "true"}))
    with pytest.raises(Exception, match=r"insert.deduplicate=true cuts batches at fixed row positions, which "
                                        r"sink.mode=partition-ordered does not allow"):
        sluice.write(spark.range(3), "clickhouse", ch.opts(table, **{"insert.deduplicate": "true",
                                                                      "sink.mode": "partition-ordered",
                                                                      "sink.partition-key": "id"}))
    assert ch.rows(f"SELECT count() FROM {table}") == [["0"]]


def test_a_batch_is_a_synchronous_insert_unless_insert_async_whatever_the_servers_default(ch):
    from pyspark.sql.types import LongType, StructField, StructType

    from sluice.connectors.clickhouse._datasource import ClickHouseDataSource

    # ClickHouse 26.9 (26.3 on, backported to 26.2) turns async_insert on by default, and insert.deduplicate
    # relies on the synchronous path: the plan must say which one. The stand-in's embedded engine runs every insert
    # synchronously whatever the setting, so what is checked is what each INSERT asks for.
    table = ch.table("id Int64")
    schema = StructType([StructField("id", LongType())])
    for extra, wanted in (({}, {"async_insert": 0}), ({"insert.async": "true"}, {"async_insert": 1,
                                                                                  "wait_for_async_insert": 1})):
        plan = ClickHouseDataSource(ch.opts(table, **extra))._plan(schema, overwrite=False, streaming=False)
        assert {k: plan.insert.settings.get(k) for k in wanted} == wanted, extra


def test_async_inserts_arrive(spark, ch):
    table = ch.table("id Int64")
    sluice.write(spark.range(0, 5_000, 1, 4), "clickhouse", ch.opts(table, **{"insert.async": "true",
                                                                               "sink.batch.max-size": "100"}))
    assert ch.rows(f"SELECT count(), uniqExact(id) FROM {table}") == [["5000", "5000"]]


def test_timeouts_are_retried_and_readonly_is_not(ch):
    from sluice.connectors.clickhouse._client import ClickHouseError, ClickHouseRetryableError, Connection
    from sluice.connectors.clickhouse._options import WRITE_SPEC

    conn = Connection.from_options(WRITE_SPEC.parse(ch.opts("t")))
    with pytest.raises(ClickHouseRetryableError, match=r"answered 408: Code: 159\."):  # TIMEOUT_EXCEEDED
        conn.query("SELECT sleep(1) FROM numbers(3) SETTINGS max_block_size = 1, max_execution_time = 1, "
                   "timeout_before_checking_execution_speed = 0")
    table = ch.table("id Int64")
    with pytest.raises(ClickHouseError, match=r"Code: 164\.") as refused:  # READONLY: a setting, not a passing state
        conn.query(f"INSERT INTO {table} VALUES (1)", readonly=1)
    assert not isinstance(refused.value, ClickHouseRetryableError)


def test_a_replayed_micro_batch_is_applied_once(spark, ch, tmp_path):
    """A streaming query whose last micro-batch reached ClickHouse but not the checkpoint's commit log replays it
    on restart (same query id, batch id and input): with insert.deduplicate its batches are dropped as duplicates;
    into a table that does not deduplicate, its rows are stored twice (the negative control)."""
    src = tmp_path / "src"
    for start in (0, 3000, 6000):
        spark.range(start, start + 3000, 1, 1).write.mode("append").parquet(str(src))

    def run(table: str, checkpoint: str, **extra: str) -> None:
        query = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.format("clickhouse").options(**ch.opts(table, **{"sink.batch.max-size": "1000"}, **extra))
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    def replayed(engine: str, **extra: str) -> list[list[str]]:
        table, checkpoint = ch.table("id Int64", engine), tmp_path / f"checkpoint-{len(extra)}"
        run(table, str(checkpoint), **extra)
        last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        for name in (str(last), f".{last}.crc"):  # the driver died after the sink, before the commit log
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        run(table, str(checkpoint), **extra)
        return ch.rows(f"SELECT count(), uniqExact(id) FROM {table}")

    assert replayed(DEDUP, **{"insert.deduplicate": "true"}) == [["9000", "9000"]]
    total, distinct = replayed("MergeTree ORDER BY id")[0]  # a table that does not deduplicate: the replay shows
    assert distinct == "9000" and int(total) > 9000


def test_a_row_that_leaves_a_column_unchanged_is_refused_naming_its_key_as_a_replacing_row_would_null_it(spark, ch):
    table = ch.table("id Int64, ver UInt64, v Nullable(String)", "ReplacingMergeTree(ver) ORDER BY id")
    opts = ch.opts(table, **{"upsert.unchanged-column": "_unchanged"})
    schema = "id long, ver long, v string, _unchanged array<string>"
    sluice.write(spark.createDataFrame([(1, 1, "long", None)], schema), "clickhouse", opts)
    update = spark.createDataFrame([(1, 2, None, ["v"])], schema)
    with pytest.raises(Exception, match=r"ClickHouse table default\.\S+ cannot keep a stored value: the row with key "
                                        r"\{'id': 1\} leaves column\(s\) \['v'\] unchanged .*REPLICA IDENTITY FULL"):
        sluice.write(update, "clickhouse", opts)
    assert ch.rows(f"SELECT v FROM {table} FINAL") == [["long"]]
    # The negative control: the marker dropped, the replacing row nulls the value.
    sluice.write(update.drop("_unchanged"), "clickhouse", ch.opts(table))
    assert ch.rows(f"SELECT v IS NULL FROM {table} FINAL") == [["1"]]
