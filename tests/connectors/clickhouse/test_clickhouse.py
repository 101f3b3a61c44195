"""format("clickhouse") against a real ClickHouse server: types both ways, modes, retries, bad input, secrets."""

import datetime as dt
import uuid
from decimal import Decimal

import pytest

import sluice
from tests.faults import dies_once_at

pytestmark = pytest.mark.spark

ALL_TYPES = ("id Int64, i8 Int8, u16 UInt16, u64 UInt64, f32 Float32, f64 Float64, s String, ns Nullable(String), "
             "d Date, ts DateTime, dec Decimal(18, 4), big Decimal(38, 2), ni Nullable(Int32), flag UInt8")


def test_the_classic_types_round_trip_through_arrow_writes_and_split_reads(spark, ch):
    table = ch.table(ALL_TYPES)
    # Multi-byte UTF-8 in a 20,070-character value, and below, the characters a text format would have to escape
    # (tab, line break, quotes) and `\N`, NULL in ClickHouse's text formats: Arrow carries each as it is, both ways.
    long = "é" * 70 + "x" * 20_000
    strings = ["", "a\tb\n\"c\"", long, "\\N"]
    rows = [(i, (i % 256) - 128, i % 65536, Decimal(2**64 - 1 - i), i / 4, i / 3, strings[i % 4],
             None if i % 5 == 0 else f"n{i}", dt.date(1970, 1, 1) + dt.timedelta(days=i * 7),
             dt.datetime(2020, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i * 3601),
             Decimal(i) / 7 if i % 2 else Decimal("-12345678901234.1234"), Decimal(10) ** 35 + i,
             None if i % 3 == 0 else -i, i % 2 == 0)
            for i in range(500)]
    schema = ("id long, i8 int, u16 int, u64 decimal(20,0), f32 float, f64 double, s string, ns string, d date, "
              "ts timestamp, dec decimal(18,4), big decimal(38,2), ni int, flag boolean")
    df = spark.createDataFrame([(*r[:10], r[10].quantize(Decimal("0.0001")), *r[11:]) for r in rows], schema)
    sluice.write(df.repartition(3), "clickhouse", ch.opts(table))
    back = spark.read.format("clickhouse").options(**ch.opts(table, partitions="3")).load()
    assert back.rdd.getNumPartitions() == 3
    assert back.schema.simpleString() == (
        "struct<id:bigint,i8:tinyint,u16:int,u64:decimal(20,0),f32:float,f64:double,s:string,ns:string,d:date,"
        "ts:timestamp,dec:decimal(18,4),big:decimal(38,2),ni:int,flag:smallint>")
    got = {r.id: r for r in back.collect()}
    assert len(got) == 500
    for want in df.collect():
        have = got[want.id].asDict()
        expected = {**want.asDict(), "flag": int(want.flag)}
        assert have == expected, (want.id, {k: (have[k], v) for k, v in expected.items() if have[k] != v})


def test_append_is_at_least_once_across_a_killed_python_worker(spark, ch, tmp_path):
    table = ch.table("id Int64, pad String")
    marker = tmp_path / "die"
    marker.touch()
    df = spark.range(0, 20_000, 1, 2).selectExpr("id", "repeat('x', 100) AS pad") \
        .mapInArrow(dies_once_at(15_000, str(marker)), "id long, pad string")
    sluice.write(df, "clickhouse", ch.opts(table, **{"sink.batch.max-size": "1000"}))
    assert not marker.exists(), "the worker did not die: the test proved nothing"
    total, distinct = ch.rows(f"SELECT count(), uniqExact(id) FROM {table}")[0]
    assert int(distinct) == 20_000 and int(total) >= 20_000  # nothing lost; the retried task's rows again


def test_replacing_merge_tree_upserts_keep_the_last_change_per_key_across_retries(spark, ch, tmp_path):
    table = ch.table("id Int64, seq Int64, v String", "ReplacingMergeTree() ORDER BY id")
    marker = tmp_path / "die"
    marker.touch()
    # 40 keys, 250 changes each, in seq order; the last change of key k has seq 249.
    changes = spark.range(0, 10_000, 1, 1).selectExpr("id AS n", "id % 40 AS id", "id DIV 40 AS seq")
    df = changes.mapInArrow(dies_once_at(6_000, str(marker)), "n long, id long, seq long").selectExpr(
        "id", "seq", "concat('v', seq) AS v")
    sluice.write(df, "clickhouse", ch.opts(table, **{"sink.batch.max-size": "100"}))  # partition-ordered by id
    assert sluice.last_write_summary("clickhouse")["records"] >= 10_000
    assert not marker.exists(), "the worker did not die: the test proved nothing"
    final = ch.rows(f"SELECT id, seq, v FROM {table} FINAL ORDER BY id")
    assert final == [[str(k), "249", "v249"] for k in range(40)]
    ch.sql(f"OPTIMIZE TABLE {table} FINAL")
    assert int(ch.rows(f"SELECT count() FROM {table}")[0][0]) == 40  # replays replaced themselves
    back = spark.read.format("clickhouse").options(**ch.opts(table)).load()  # reads use FINAL on these tables
    assert sorted((r.id, r.seq) for r in back.collect()) == [(k, 249) for k in range(40)]


def test_unordered_upserts_into_a_replacing_table_without_version_are_refused(spark, ch):
    table = ch.table("id Int64, v String", "ReplacingMergeTree() ORDER BY id")
    df = spark.createDataFrame([(1, "a")], "id long, v string")
    with pytest.raises(Exception, match=r"sink.mode=unordered into ReplacingMergeTree table default\.\S+ \(no version "
                                        r"column\): the last inserted row of a key wins"):
        sluice.write(df, "clickhouse", ch.opts(table, **{"sink.mode": "unordered"}))
    versioned = ch.table("id Int64, v String, ver UInt64", "ReplacingMergeTree(ver) ORDER BY id")
    rows = spark.createDataFrame([(1, "new", 2), (1, "old", 1)], "id long, v string, ver long")
    sluice.write(rows, "clickhouse", ch.opts(versioned, **{"sink.mode": "unordered"}))  # the version decides
    assert ch.rows(f"SELECT v FROM {versioned} FINAL") == [["new"]]
    # Explicitly partition-ordered without sink.partition-key: the table's sorting key is the key.
    sluice.write(spark.createDataFrame([(2, "x")], "id long, v string"), "clickhouse",
                 ch.opts(table, **{"sink.mode": "partition-ordered", "sink.parallelism": "4"}))
    assert ch.rows(f"SELECT id, v FROM {table} FINAL") == [["2", "x"]]


@pytest.mark.parametrize(("extra", "message"), [
    ({"sink.transactional": "true", "sink.mode": "global-ordered"},
     r"sink.transactional=true: ClickHouse has no transaction.*use insert.deduplicate=true.*ReplacingMergeTree"),
    ({"tabel": "x"}, r"unknown option 'tabel'.*Did you mean 'table'"),
    ({"url": "http://u:p@127.0.0.1:1"}, r"url must not carry a user, password or query string"),
    ({"connections-per-task": "0"}, r"connections-per-task' must be >= 1"),
])
def test_bad_options_fail_before_any_write(spark, ch, extra, message):
    table = ch.table("id Int64")
    with pytest.raises(Exception, match=message):
        sluice.write(spark.range(5), "clickhouse", {**ch.opts(table), **extra})
    assert ch.rows(f"SELECT count() FROM {table}") == [["0"]]


def test_bad_tables_and_columns_are_named(spark, ch):
    with pytest.raises(Exception, match=r"table default\.no_such_table does not exist on http://127\.0\.0\.1:\d+; "
                                        r"create it first"):
        sluice.write(spark.range(1), "clickhouse", ch.opts("no_such_table"))
    table = ch.table("id Int64, Name String, tags Array(String), agg AggregateFunction(uniq, UInt64)")
    with pytest.raises(Exception, match=r"column 'name' of the DataFrame is not in table default\.\S+ \(the table has "
                                        r"'Name': names are case-sensitive\)"):
        sluice.write(spark.createDataFrame([(1, "a")], "id long, name string"), "clickhouse", ch.opts(table))
    with pytest.raises(Exception, match=r"column 'agg' has ClickHouse type AggregateFunction\(uniq, UInt64\), which "
                                        r"sluice does not write or read; supported: Int8"):
        sluice.write(spark.createDataFrame([(1, 2)], "id long, agg long"), "clickhouse", ch.opts(table))
    with pytest.raises(Exception, match=r"an element of column 'tags' is int in the DataFrame but String in the table; "
                                        r"cast it first \(it takes binary, string\)"):
        sluice.write(spark.createDataFrame([(1, [2])], "id long, tags array<int>"), "clickhouse", ch.opts(table))
    with pytest.raises(Exception, match=r"column 'Name' is bigint in the DataFrame but String in the table; cast it "
                                        r"first \(it takes binary, string\) \(default\.\S+\)"):
        sluice.write(spark.createDataFrame([(1, 2)], "id long, Name long"), "clickhouse", ch.opts(table))
    with pytest.raises(Exception, match=r"format 'clickhouse' cannot overwrite atomically"):
        spark.range(1).write.format("clickhouse").options(**ch.opts(table)).mode("overwrite").save()


def test_rows_clickhouse_would_refuse_are_refused_per_chunk_naming_column_and_key(spark, ch):
    table = ch.table("id Int64, small Int8, note String")
    bad = spark.createDataFrame([(1, 1, "a"), (2, 300, "b")], "id long, small int, note string").coalesce(1)
    with pytest.raises(Exception, match=r"value 300 of column 'small' is outside the range of its ClickHouse type "
                                        r"Int8 \(the row with sorting key \{'id': 2\}; 1 row\(s\)\)\. Those rows were "
                                        r"not sent"):
        sluice.write(bad, "clickhouse", ch.opts(table))
    missing = spark.createDataFrame([(3, None, "c")], "id long, small int, note string").coalesce(1)
    with pytest.raises(Exception, match=r"column 'small' is not Nullable in default\.\S+ \(Int8\), but 1 row\(s\) "
                                        r"have no value for it \(the row with sorting key \{'id': 3\}\)"):
        sluice.write(missing, "clickhouse", ch.opts(table))
    assert ch.rows(f"SELECT count() FROM {table}") == [["0"]]  # row 1, before row 2 in its chunk, was not sent


def test_the_password_never_shows_and_can_come_from_the_environment(spark, ch, monkeypatch):
    table = ch.table("id Int64")
    wrong = f"wrong-{uuid.uuid4().hex}"
    with pytest.raises(Exception) as failure:
        sluice.write(spark.range(3), "clickhouse", {**ch.opts(table), "password": wrong})
    assert "refused user 'default': wrong user or password" in str(failure.value)
    assert wrong not in str(failure.value)
    from sluice.connectors.clickhouse._options import WRITE_SPEC

    assert ch.password not in repr(WRITE_SPEC.parse(ch.opts(table)))
    plan = spark.read.format("clickhouse").options(**ch.opts(table)).load()._jdf.queryExecution().toString()
    assert ch.password not in plan
    # CLICKHOUSE_PASSWORD is read where Spark plans the write (its planner worker inherits the environment the
    # session started with), and travels to the tasks inside the plan's resolved Connection.
    from sluice.connectors.clickhouse._client import Connection

    monkeypatch.setenv("CLICKHOUSE_PASSWORD", ch.password)
    conn = Connection.from_options(WRITE_SPEC.parse({k: v for k, v in ch.opts(table).items() if k != "password"}))
    assert conn.password == ch.password and ch.password not in repr(conn)
    assert conn.rows("SELECT 1") == [["1"]]


def test_an_unreachable_server_is_named(spark, ch):
    opts = {**ch.opts("t"), "url": "http://127.0.0.1:9", "sink.max-retries": "1", "sink.retry-delay-ms": "10"}
    with pytest.raises(Exception, match=r"ClickHouse at http://127\.0\.0\.1:9 is unreachable"):
        sluice.write(spark.range(3), "clickhouse", opts)
