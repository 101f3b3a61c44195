"""spark.read.format("postgres") against a real server: splits, types, pushdown, one consistent snapshot."""

import datetime as dt
import threading
from decimal import Decimal

import pytest
from pyspark.errors import AnalysisException

import sluice
from sluice.connectors.postgres._source import column_exprs, filter_sql
from sluice.spark import _compat

if _compat.HAS_FILTER_PUSHDOWN:  # Spark 4.1+
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, IsNull, LessThan, Not, StringStartsWith

pytestmark = pytest.mark.spark


def read(spark, pg, **opts):
    reader = spark.read.format("postgres").option("url", pg.url)
    for key, value in opts.items():
        reader = reader.option(key.replace("_", "-"), str(value))
    return reader.load()


@pytest.mark.pg_versions
def test_a_keyed_table_is_read_in_key_ranges(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, name text)')
    pg.sql(f"INSERT INTO \"{table}\" SELECT g, 'n' || g FROM generate_series(1, 10000) g")
    pg.sql(f'INSERT INTO "{table}" VALUES (-5, NULL)')
    df = read(spark, pg, table=table, num_partitions=5)
    assert df.rdd.getNumPartitions() == 5
    rows = df.collect()
    assert sorted(r.id for r in rows) == [-5, *range(1, 10001)]
    sizes = df.rdd.glom().map(len).collect()
    assert len(sizes) == 5 and min(sizes) > 1500, sizes


def test_analyzed_keys_are_cut_by_their_histogram_so_a_gap_in_the_keys_leaves_no_split_empty(spark, pg):
    """Two clusters of 20,000 keys far apart, by the integer key and by a timestamp column. Negative control:
    before ANALYZE the keys are taken as spread evenly, and the two middle splits of four are empty."""
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, at timestamptz) WITH (autovacuum_enabled = false)')
    for first in (1, 50_000_001):
        pg.sql(f"INSERT INTO \"{table}\" SELECT g, timestamptz '2026-01-01 00:00+00' + g * interval '1 second' "
               f"FROM generate_series({first}, {first + 19_999}) g")

    def sizes():
        return [read(spark, pg, table=table, num_partitions=4, **column).rdd.glom().map(len).collect()
                for column in ({}, {"partition_column": "at"})]

    assert all(sorted(s)[:2] == [0, 0] and sum(s) == 40_000 for s in sizes()), "evenly spread keys: two empty"
    pg.sql(f'ANALYZE "{table}"')
    for by_key in sizes():
        assert sum(by_key) == 40_000 and min(by_key) > 6_000 and max(by_key) < 14_000, by_key


def test_a_table_without_a_key_is_read_in_page_ranges_and_a_query_by_partition_column(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (x int, at timestamptz)')
    pg.sql(f"INSERT INTO \"{table}\" SELECT g, timestamptz '2026-01-01 00:00+00' + g * interval '1 minute' "
           "FROM generate_series(1, 50000) g")
    pg.sql(f'ANALYZE "{table}"')
    df = read(spark, pg, table=table, num_partitions=4)
    assert df.rdd.getNumPartitions() == 4
    assert df.count() == 50000 and df.selectExpr("sum(x)").first()[0] == sum(range(1, 50001))
    q = read(spark, pg, query=f'SELECT x, at FROM "{table}" WHERE x % 2 = 0', partition_column="at",
             num_partitions=3)
    assert q.rdd.getNumPartitions() == 3
    assert sorted(r.x for r in q.collect()) == list(range(2, 50001, 2))


@pytest.mark.pg_versions
def test_types_round_trip_through_write_and_read(spark, pg):
    table = pg.table()
    schema = ("id long, price decimal(12,3), at timestamp, day date, tags array<string>, nums array<int>, "
              "note string, raw binary, ok boolean, ratio double, small short")
    rows = [
        (1, Decimal("12345.678"), dt.datetime(2026, 3, 1, 12, 30, 15, 123456), dt.date(2026, 3, 1),
         ["a", "ü", None], [1, None, 3], "grüße, 世界 🚀 'quoted' \"double\"", b"\x00\xffbin", True, 0.25, 7),
        (2, None, None, None, None, None, None, None, None, None, None),
        (3, Decimal("-0.001"), dt.datetime(1999, 12, 31, 23, 59, 59), dt.date(1970, 1, 1), [], [], "", b"",
         False, -1e300, -32768),
    ]
    df = spark.createDataFrame(rows, schema)
    sluice.write(df, "postgres", pg.opts(table, **{"create-table": "true", "primary-key": "id"}))
    back = read(spark, pg, table=table)
    assert back.schema.simpleString() == df.schema.simpleString().replace("tags:array<string>,", "tags:array<string>,")
    assert sorted(back.collect()) == sorted(df.collect())
    stored = pg.sql(f'SELECT at AT TIME ZONE \'UTC\' FROM "{table}" WHERE id = 1')[0][0]
    expected_utc = df.selectExpr("to_utc_timestamp(at, current_timezone())").first()[0]
    assert stored == expected_utc, "timestamps are stored as the same instant (timestamptz)"


@pytest.mark.lines
def test_pushed_filters_become_sql_and_give_the_same_rows(spark, pg, capability):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id int PRIMARY KEY, name text, code varchar(5), amount numeric(6,2), '
           "day date, u uuid)")
    pg.sql(f"INSERT INTO \"{table}\" SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE 'n''' || g END, "
           "'c' || (g % 3), g / 4.0, date '2026-01-01' + g, md5(g::text)::uuid FROM generate_series(1, 300) g")
    if not _compat.HAS_FILTER_PUSHDOWN:  # Spark 4.0 never calls pushFilters: the option is refused, not ignored
        with pytest.raises(AnalysisException, match=r"option 'pushdown' needs filter pushdown .* Spark 4\.1 added; "
                                                    r"this Spark is 4\.0\.\d+\. Remove it"):
            read(spark, pg, table=table, pushdown="true").collect()
        assert read(spark, pg, table=table).filter("id < 3").count() == 2  # without it Spark filters the rows
        capability("filter pushdown", "refused, naming Spark 4.1")
        return
    exprs = column_exprs([("id", "integer"), ("name", "text"), ("u", "uuid")])
    assert filter_sql(EqualTo(("name",), "n'5"), exprs) == "q.\"name\" COLLATE \"C\" = 'n''5'"
    assert filter_sql(Not(In(("id",), (1, 2))), exprs) == "NOT (q.\"id\" IN (1, 2))"
    assert filter_sql(StringStartsWith(("u",), "c4"), exprs) == "starts_with(q.\"u\"::text, 'c4')"
    assert filter_sql(GreaterThan(("id",), dt.datetime(2026, 1, 1)), exprs) is None  # stays with Spark
    assert filter_sql(IsNull(("nested", "field")), exprs) is None
    assert filter_sql(LessThan(("id",), float("nan")), exprs) is None
    cases = {
        "name = \"n'5\"": [5],
        "name IS NULL AND id < 35": [10, 20, 30],
        "id IN (3, 4, 400) OR id = 9": [3, 4, 9],
        "amount >= 74.5 AND NOT (id = 299)": [298, 300],
        "code = 'c1' AND id BETWEEN 1 AND 10": [1, 4, 7, 10],
        "name LIKE 'n''29%' AND id > 290": [291, 292, 293, 294, 295, 296, 297, 298, 299],
        "day < DATE'2026-01-04'": [1, 2],
        "endswith(name, '99') AND contains(name, '2')": [299],
    }
    for condition, expected in cases.items():
        df = read(spark, pg, table=table, num_partitions=3, pushdown="true")  # a new DataFrame per query
        assert sorted(r.id for r in df.filter(condition).collect()) == expected, condition
    # Pushed means pushed: Spark trusts the source and drops its own Filter; a filter kept back stays in the plan.
    def plan(condition):
        df = read(spark, pg, table=table, pushdown="true").filter(condition)
        return df._jdf.queryExecution().executedPlan().toString()

    assert " Filter " not in plan("id < 3 AND name = 'x'")
    assert " Filter " in plan("u IS NOT NULL AND day > current_date() - 5000 AND id % 2 = 0")
    capability("filter pushdown", "yes")


def test_without_pushdown_a_reused_dataframe_stays_right_and_the_spark_defect_is_why(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id int PRIMARY KEY)')
    pg.sql(f'INSERT INTO "{table}" SELECT generate_series(1, 20)')
    df = read(spark, pg, table=table)
    assert df.filter("id < 5").count() == 4 and df.count() == 20
    # The Spark 4.3 defect that keeps pushdown off by default: the pushed-down read of the first query is
    # reused by the second query on the same DataFrame. When this assertion fails, Spark has fixed it.
    reused = read(spark, pg, table=table, pushdown="true")
    assert reused.filter("id < 5").count() == 4
    assert reused.count() == 4, "Spark no longer reuses the pushed-down read: pushdown can default to on"


@pytest.mark.pg_versions
def test_every_split_reads_one_snapshot_while_a_writer_commits(spark, pg):
    """Transfers move money between account 1 and account 8 while a parallel read runs, one split per
    account, each split slowed down: every read must see the same total; without the shared snapshot the
    splits see different moments and the totals disagree."""
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id int PRIMARY KEY, balance bigint)')
    pg.sql(f'INSERT INTO "{table}" SELECT g, 1000 FROM generate_series(1, 8) g')
    query = f'SELECT a.id, a.balance FROM "{table}" a, LATERAL (SELECT pg_sleep(0.15)) s'
    stop = threading.Event()

    def transfer():
        import psycopg

        with psycopg.connect(pg.url, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(f'UPDATE "{table}" SET balance = balance + CASE id WHEN 1 THEN -1 ELSE 1 END '
                             "WHERE id IN (1, 8)")

    writer = threading.Thread(target=transfer)
    writer.start()
    try:
        consistent = [read(spark, pg, query=query, partition_column="id", num_partitions=8)
                      .selectExpr("sum(balance)").first()[0] for _ in range(3)]
        torn = [read(spark, pg, query=query, partition_column="id", num_partitions=8, consistent_snapshot="false")
                .selectExpr("sum(balance)").first()[0] for _ in range(3)]
    finally:
        stop.set()
        writer.join()
    assert consistent == [8000, 8000, 8000]
    assert any(total != 8000 for total in torn), f"without the shared snapshot the totals were {torn}"


def test_a_dataframe_can_be_used_by_several_actions(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY)')
    pg.sql(f'INSERT INTO "{table}" SELECT generate_series(1, 100)')
    df = read(spark, pg, table=table, num_partitions=2)
    assert df.count() == 100
    pg.sql(f'INSERT INTO "{table}" SELECT generate_series(101, 150)')
    assert df.count() == 100, "later actions read the same snapshot"
    assert read(spark, pg, table=table).count() == 150


def test_bad_read_options_fail_clearly(spark, pg):
    with pytest.raises(Exception, match="set exactly one of 'table' and 'query'"):
        read(spark, pg).count()
    with pytest.raises(Exception, match=r"table public\.no_such_table does not exist"):
        read(spark, pg, table="no_such_table").count()
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id int, name text)')
    with pytest.raises(Exception, match="partition-column 'name' has type text"):
        read(spark, pg, table=table, partition_column="name").count()
    with pytest.raises(Exception, match="Did you mean 'num-partitions'"):
        read(spark, pg, table=table, num_partition=2).count()
    with pytest.raises(Exception, match="syntax error"):
        read(spark, pg, query="SELEC 1").count()
