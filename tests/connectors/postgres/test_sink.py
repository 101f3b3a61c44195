"""format("postgres") writes against a real server: every mode, create-table, fit checks, overwrite, injection."""

import datetime as dt
import threading
import time
from decimal import Decimal

import pytest

import sluice
from sluice import OptionError
from sluice.connectors.postgres import PostgresError

pytestmark = pytest.mark.spark


def plan_of(df, options):
    from sluice.connectors.postgres._client import Connection
    from sluice.connectors.postgres._options import WRITE_SPEC, WriteOptions
    from sluice.connectors.postgres._table import prepare_target
    from sluice.spark._compat import to_arrow_schema

    opts = WRITE_SPEC.parse(options)
    return prepare_target(Connection.from_options(opts), WriteOptions.of(opts), df.schema, to_arrow_schema(df.schema),
                          overwrite=False, staged=False)


def ids(pg, table, order="id"):
    return [r[0] for r in pg.sql(f'SELECT id FROM "{table}" ORDER BY {order}')]


@pytest.mark.pg_versions
def test_unordered_append_copies_every_row_into_a_created_table(spark, pg):
    table = pg.table()
    df = spark.range(0, 5000, 1, 3).selectExpr("id", "concat('n', id) AS name", "id / 2 AS amount")
    sluice.write(df, "postgres", pg.opts(table, **{"create-table": "true", "sink.batch.max-size": "700"}))
    assert ids(pg, table) == list(range(5000))
    assert pg.sql(f'SELECT name, amount FROM "{table}" WHERE id = 7') == [("n7", 3.5)]
    assert [r[0] for r in pg.sql(f"SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                                  f"'\"{table}\"'::regclass AND attnum > 0 ORDER BY attnum")] == \
        ["bigint", "text", "double precision"]
    summary = sluice.last_write_summary()
    assert summary["records"] == 5000 and summary["batches"] >= 8  # 3 tasks, batches of at most 700


def test_append_into_narrower_types_goes_through_the_server_casts(spark, pg):
    """bigint -> integer, double -> numeric, string -> varchar: not COPY-identical, so the temp-table path runs."""
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (serial_no bigserial, id integer, amount numeric(8,2), name varchar(10))')
    df = spark.range(0, 1000, 1, 2).selectExpr("id", "id / 4 AS amount", "concat('v', id) AS name")
    df.write.format("postgres").options(**pg.opts(table)).mode("append").save()
    rows = pg.sql(f'SELECT id, amount, name FROM "{table}" ORDER BY id')
    assert len(rows) == 1000 and rows[5] == (5, Decimal("1.25"), "v5")
    plan = plan_of(df, pg.opts(table))
    assert not plan.direct and not plan.csv, "bigint into integer goes through the server's casts"


@pytest.mark.pg_versions
def test_partition_ordered_upserts_keep_the_last_change_of_every_key(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, version bigint, status text)')
    # 200 keys x 30 versions, in version order per key; ops: every 7th version is a delete, re-inserted later
    changes = spark.range(0, 6000, 1, 1).selectExpr(
        "id % 200 AS id", "id DIV 200 AS version", "concat('s', id DIV 200) AS status",
        "CASE WHEN (id DIV 200) % 7 = 6 THEN 'd' ELSE 'u' END AS op")
    sluice.write(changes, "postgres", pg.opts(table, **{
        "primary-key": "id", "upsert.op-column": "op", "sink.batch.max-size": "50", "sink.parallelism": "8"}))
    rows = pg.sql(f'SELECT id, version, status FROM "{table}" ORDER BY id')
    # version 29 is the last for every key (29 % 7 = 1: an update)
    assert rows == [(k, 29, "s29") for k in range(200)]
    summary = sluice.last_write_summary()
    assert summary["records"] == 6000 and summary["batches"] > 100


@pytest.mark.pg_versions
def test_upsert_deletes_when_the_last_change_is_a_delete(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, v text)')
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'old'), (2, 'old'), (3, 'old')")
    df = spark.createDataFrame([(1, "a", "u"), (1, None, "d"), (2, "b", "u"), (4, "x", "-D"), (3, "c", "D"),
                                (3, "again", "u")], "id long, v string, op string")
    sluice.write(df, "postgres", pg.opts(table, **{"primary-key": "id", "upsert.op-column": "op"}))
    assert pg.sql(f'SELECT id, v FROM "{table}" ORDER BY id') == [(2, "b"), (3, "again")]


@pytest.mark.pg_versions
def test_global_ordered_transactional_commits_once_in_task_then_row_order(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (seq bigserial, id bigint, part int)')
    df = spark.range(0, 3000, 1, 3).selectExpr("id", "spark_partition_id() AS part")
    sluice.write(df, "postgres", pg.opts(table, **{
        "sink.mode": "global-ordered", "sink.transactional": "true", "sink.batch.max-size": "200"}))
    assert ids(pg, table, order="seq") == list(range(3000)), "task 0's rows, then task 1's, each in row order"
    log = pg.sql("SELECT target, epoch, rows FROM sluice_commit_log WHERE target = %s", (f"public.{table}",))
    assert log == [(f"public.{table}", -1, 3000)]
    stage = pg.sql("SELECT relname FROM pg_class WHERE relname LIKE 'sluice_stage_%%' AND relkind = 'r'")
    for (name,) in stage:
        assert pg.sql(f'SELECT count(*) FROM "{name}"') == [(0,)], "staged rows are cleared by the commit"


def test_transactional_upsert_applies_the_last_change_per_key(spark, pg):
    table = pg.table()
    df = spark.range(0, 1000, 1, 2).selectExpr("id % 10 AS id", "id AS version",
                                                "CASE WHEN id >= 990 AND id % 10 = 3 THEN 'd' ELSE 'u' END AS op")
    sluice.write(df, "postgres", pg.opts(table, **{
        "create-table": "true", "primary-key": "id", "upsert.op-column": "op", "sink.mode": "global-ordered",
        "sink.transactional": "true"}))
    rows = dict(pg.sql(f'SELECT id, version FROM "{table}"'))
    assert rows == {k: 990 + k for k in range(10) if k != 3}


@pytest.mark.pg_versions
def test_overwrite_replaces_the_table_and_a_concurrent_reader_never_sees_it_empty(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint, pad text)')
    pg.sql(f"INSERT INTO \"{table}\" SELECT g, 'old' FROM generate_series(1, 500) g")
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        import psycopg

        with psycopg.connect(pg.url, autocommit=True) as conn:
            while not stop.is_set():
                seen.append(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        df = spark.range(0, 20000, 1, 2).selectExpr("id", "repeat('n', 50) AS pad")
        df.write.format("postgres").options(**pg.opts(table, **{"sink.batch.max-size": "500"})) \
            .mode("overwrite").save()
        time.sleep(0.2)
    finally:
        stop.set()
        watcher.join()
    assert pg.sql(f'SELECT count(*), min(id), max(id) FROM "{table}"') == [(20000, 0, 19999)]
    assert len(seen) > 20 and set(seen) <= {500, 20000}, f"reader saw counts {sorted(set(seen))}"
    assert seen[0] == 500 and seen[-1] == 20000


def test_hostile_table_and_column_names_are_quoted_not_spliced(spark, pg):
    victim = pg.table("victim")
    pg.sql(f'CREATE TABLE "{victim}" (x int)')
    evil_column = f'v"; DROP TABLE "{victim}"; --'
    df = spark.createDataFrame([(1, "a"), (2, "b")], ["id", evil_column])
    modes = ({}, {"primary-key": "id"}, {"sink.mode": "global-ordered", "sink.transactional": "true"})
    for i, mode in enumerate(modes):
        evil_table = f'evil{i} %s %(x)s %%"; DROP TABLE "{victim}"; --'  # psycopg placeholders too
        quoted = evil_table.replace('"', '""')
        sluice.write(df, "postgres", {"url": pg.url, "table": f'"{quoted}"', "create-table": "true", **mode})
        assert pg.sql(f'SELECT id, "{evil_column.replace(chr(34), chr(34) * 2)}" FROM "{quoted}" ORDER BY id') == \
            [(1, "a"), (2, "b")]
        back = spark.read.format("postgres").option("url", pg.url).option("table", f'"{quoted}"').load()
        assert sorted(tuple(r) for r in back.collect()) == [(1, "a"), (2, "b")]
    assert pg.sql(f'SELECT count(*) FROM "{victim}"') == [(0,)], "the victim table still exists"


def test_a_column_the_table_lacks_fails_before_any_row_is_written(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint, name text)')
    df = spark.createDataFrame([(1, "a", 2.0)], "id long, name string, price double")
    with pytest.raises(Exception, match=r"column 'price' of the DataFrame is not in table public\."):
        sluice.write(df, "postgres", pg.opts(table))
    bad_type = spark.createDataFrame([(1, "a")], "id string, name string")
    with pytest.raises(Exception, match=r'column "id" is of type bigint but expression is of type text'):
        sluice.write(bad_type, "postgres", pg.opts(table))
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(0,)]


def test_options_are_validated_before_anything_happens(spark, pg):
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(Exception, match="Did you mean 'primary-key'"):
        sluice.write(df, "postgres", pg.opts("x", **{"primary_key": "id"}))
    with pytest.raises(Exception, match=r"table public\.nope_missing does not exist; .* create-table=true"):
        sluice.write(df, "postgres", pg.opts("nope_missing"))
    with pytest.raises(Exception, match="no primary key or unique index on exactly these columns"):
        table = pg.table()
        pg.sql(f'CREATE TABLE "{table}" (id bigint)')
        sluice.write(df, "postgres", pg.opts(table, **{"primary-key": "id"}))
    with pytest.raises(OptionError, match=r"primary-key with sink\.mode=unordered"):
        sluice.write(df, "postgres", pg.opts("x", **{"primary-key": "id", "sink.mode": "unordered"}))


def test_unreachable_server_and_wrong_password_fail_clearly_without_the_password(spark, pg):
    df = spark.createDataFrame([(1,)], "id long")
    secret = "s3cr3t-pw-for-test"
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        sluice.write(df, "postgres", {"host": "127.0.0.1", "port": "1", "user": "u", "password": secret,
                                      "table": "t", "connect.retries": "1"})
    assert time.monotonic() - started < 30
    text = str(caught.value)
    assert "cannot connect to postgresql://u@127.0.0.1:1/u after 2 attempt(s)" in text and secret not in text
    wrong = pg.url.replace("sluice-test-pw", secret) if "sluice-test-pw" in pg.url else None
    if wrong:
        with pytest.raises(Exception) as caught:
            sluice.write(df, "postgres", {"url": wrong, "table": "t", "connect.retries": "0"})
        assert "password authentication failed" in str(caught.value) and secret not in str(caught.value)


def test_password_stays_out_of_reprs(pg):
    from sluice.connectors.postgres._client import Connection
    from sluice.connectors.postgres._options import WRITE_SPEC

    opts = WRITE_SPEC.parse({"url": "postgresql://u:hunter2@h/db", "table": "t"})
    conn = Connection.from_options(opts)
    assert conn.password == "hunter2"
    assert "hunter2" not in repr(opts) and "hunter2" not in repr(conn) and "hunter2" not in conn.describe()
    with pytest.raises(PostgresError) as caught:
        Connection.from_options(WRITE_SPEC.parse({"url": "postgresql://u:hunter2@127.0.0.1:1/db", "table": "t",
                                                  "connect.retries": "0"})).connect()
    assert "hunter2" not in str(caught.value)


def test_csv_copy_keeps_every_edge_value(spark, pg):
    """The append path that COPYs CSV: NULL vs empty string, quotes, commas, line breaks, a lone \\. line,
    backslashes, unicode, NaN and infinities, decimals, timestamps with zone, dates, booleans, extremes."""
    table = pg.table()
    texts = [None, "", "a,b", 'q"x', "line\nbreak\r\nnext", "\\.", "\\N", "back\\slash", "grüße 世界 🚀", " pad "]
    rows = [(i, t, f, Decimal(d), ts, day, b, small) for i, (t, f, d, ts, day, b, small) in enumerate(zip(
        texts,
        [0.1, float("nan"), float("inf"), float("-inf"), -0.0, 1e-300, 1 / 3, None, 2.5e300, 7.0],
        ["0.001", "-12345678.901", "0", "1.100", "99999999.999", "-0.001", "3.000", "1", "2", "5"],
        [dt.datetime(2026, 3, 1, 12, 30, 15, 123456), None, dt.datetime(1970, 1, 1), dt.datetime(2000, 2, 29, 23, 59),
         dt.datetime(2026, 11, 22), dt.datetime(1901, 12, 14), dt.datetime(2038, 1, 19, 3, 14, 8), None,
         dt.datetime(2026, 1, 1, 0, 0, 0, 1), dt.datetime(1999, 12, 31)],
        [dt.date(2026, 3, 1), None, dt.date(1, 1, 1), dt.date(9999, 12, 31)] + [dt.date(2020, 2, 29)] * 6,
        [True, False, None] + [True] * 7,
        [-32768, 32767, 0, None, 1, 2, 3, 4, 5, 6],
        strict=True))]
    df = spark.createDataFrame(rows, "id long, t string, f double, d decimal(11,3), ts timestamp, day date, "
                                     "b boolean, small short").repartition(3)
    sluice.write(df, "postgres", pg.opts(table, **{"create-table": "true"}))
    assert plan_of(df, pg.opts(table)).csv, "this test is about the CSV path"
    back = spark.read.format("postgres").option("url", pg.url).option("table", table).load()
    got, want = sorted(back.collect()), sorted(df.collect())
    assert [r.asDict() for r in got][:1] and len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name in w.asDict():
            a, b = g[name], w[name]
            if isinstance(b, float) and b != b:
                assert a != a, (name, g.id)
            else:
                assert a == b, (name, g.id, a, b)


def test_rows_postgresql_would_refuse_mid_copy_are_refused_per_chunk_naming_column_and_key(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, n integer NOT NULL, note text)')
    ok = spark.createDataFrame([(1, 10, "a"), (2, 20, "b")], "id long, n long, note string").coalesce(1)
    sluice.write(ok, "postgres", pg.opts(table, **{"primary-key": "id"}))
    too_big = spark.createDataFrame([(3, 30, "c"), (4, 2**31, "d")], "id long, n long, note string").coalesce(1)
    with pytest.raises(Exception, match=r"value 2147483648 of column 'n' is outside -2147483648\.\.2147483647.*"
                                        r"the row with key \{'id': 4\}.*Refused before anything of its chunk was sent"):
        sluice.write(too_big, "postgres", pg.opts(table, **{"primary-key": "id"}))
    missing = spark.createDataFrame([(5, None, "e")], "id long, n long, note string").coalesce(1)
    with pytest.raises(Exception, match=r"column 'n' is NOT NULL in public\.\S+, but 1 row\(s\) have no value "
                                        r"for it \(row 0 of a chunk of 1\)"):  # an append knows no key: the row
        sluice.write(missing, "postgres", pg.opts(table))
    assert ids(pg, table) == [1, 2]  # row 3, in the refused chunk before row 4, was not written either


def test_strings_longer_than_varchar_and_numbers_too_large_for_numeric_are_refused_per_chunk(spark, pg):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint PRIMARY KEY, code varchar(3), amount numeric(5,2), n numeric(4))')
    schema = "id long, code string, amount decimal(10,3), n long"
    fits = spark.createDataFrame([(1, "abc", Decimal("999.994"), 9999), (2, "é€x", Decimal("-999.99"), -9999)],
                                 schema).coalesce(1)
    sluice.write(fits, "postgres", pg.opts(table, **{"primary-key": "id"}))  # at the limits: written
    long_code = spark.createDataFrame([(3, "ab", Decimal(1), 1), (4, "abcd", Decimal(1), 1)], schema).coalesce(1)
    with pytest.raises(Exception, match=r"a value of column 'code' has 4 characters; the column is varchar\(3\) "
                                        r"in public\.\S+ \(the row with key \{'id': 4\}\)\. Refused before anything"):
        sluice.write(long_code, "postgres", pg.opts(table, **{"primary-key": "id"}))
    big_amount = spark.createDataFrame([(5, "a", Decimal("999.995"), 1)], schema).coalesce(1)
    with pytest.raises(Exception, match=r"value 999\.995 of column 'amount' does not fit numeric\(5,2\) .*"
                                        r"\{'id': 5\}"):
        sluice.write(big_amount, "postgres", pg.opts(table, **{"primary-key": "id"}))
    big_n = spark.createDataFrame([(6, "a", Decimal(1), 10000)], schema).coalesce(1)
    with pytest.raises(Exception, match=r"value 10000 of column 'n' does not fit numeric\(4,0\)"):
        sluice.write(big_n, "postgres", pg.opts(table, **{"primary-key": "id"}))
    assert ids(pg, table) == [1, 2]  # row 3, before row 4 in its chunk, was not written either
