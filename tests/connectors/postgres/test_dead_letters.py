"""Rows PostgreSQL refuses go aside with errors.tolerance=all, in every write path: exactly-once (the staging table
carries the table's CHECK constraints) across a killed worker, the temporary-table paths (a refused batch rolls back
whole before it is split), the sink's own chunk checks, and errors.max-ratio. Each has its negative control."""

import json
import threading
import time
from urllib.parse import urlsplit

import pytest

import sluice
from tests.faults import held_at, kill_python_workers

pytestmark = pytest.mark.spark

BAD = [i * 1000 + 7 for i in range(10)]  # the rows whose v violates CHECK (v >= 0)


def staged_rows(pg) -> int:
    tables = pg.sql("SELECT relname FROM pg_class WHERE relname LIKE 'sluice_stage_%%' AND relkind = 'r'")
    return sum(pg.sql(f'SELECT count(*) FROM "{name}"')[0][0] for (name,) in tables)


def letters_in_tablestore(tmp_path, name: str) -> dict[str, str]:
    return {"errors.deadletter.format": "tablestore", "errors.deadletter.table": name,
            "errors.deadletter.warehouse": str(tmp_path / "warehouse"),
            "errors.deadletter.meta": str(tmp_path / "meta.db")}


def tablestore_rows(spark, tmp_path, name: str) -> list:
    if not (tmp_path / "warehouse" / name).exists():
        return []
    return spark.read.format("tablestore").options(table=name, warehouse=str(tmp_path / "warehouse"),
                                                   meta=str(tmp_path / "meta.db")).load().collect()


def exactly_once(pg, table: str, **more: str) -> dict[str, str]:
    return pg.opts(table, **{"sink.mode": "global-ordered", "sink.transactional": "true",
                             "sink.batch.max-size": "500", "sink.flush-buffer.timeout": "50", **more})


def test_exactly_once_rows_violating_a_check_go_aside_once_across_a_killed_worker(spark, pg, small_arrow_batches,
                                                                                  tmp_path):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint, v bigint CONSTRAINT v_nonneg CHECK (v >= 0), pad text)')
    # The input stops at id 6000 until the worker is killed; it comes slowly enough that the task writes the dead
    # letters of the rows refused so far (a task writes them from its thread as input arrives) before it stops.
    hold = tmp_path / "hold"
    hold.touch()
    df = spark.range(0, 10_000, 1, 1).selectExpr("id", "CASE WHEN id % 1000 = 7 THEN -1 ELSE id END AS v",
                                                 "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(6000, str(hold), 50, 0.02), "id long, v long, pad string")
    seen = {}

    def letter_files():
        return list((tmp_path / "warehouse").rglob("*.parquet"))

    def strike():
        try:
            deadline = time.monotonic() + 120
            # 3,000 rows staged: the killed attempt had refused rows 7, 1007 and 2007 (in order: global-ordered),
            # and its dead letters reached their file (a Parquet file of the dead-letter table, never committed).
            while (staged_rows(pg) < 3000 or not letter_files()) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["staged"], seen["letter files"] = staged_rows(pg), len(letter_files())
            seen["workers"] = kill_python_workers(int(urlsplit(pg.url).port))
        finally:
            hold.unlink()  # the retried task runs through (and a failed strike does not hang the write)

    striker = threading.Thread(target=strike)
    striker.start()
    options = {**exactly_once(pg, table), "errors.tolerance": "all", **letters_in_tablestore(tmp_path, "dl")}
    df.write.format("postgres").options(**options).mode("append").save()
    striker.join()
    assert seen["workers"] >= 1 and 3000 <= seen["staged"] < 10_000 and seen["letter files"] >= 1, seen
    ids = [r[0] for r in pg.sql(f'SELECT id FROM "{table}"')]
    assert len(ids) == 9990 and set(ids) == set(range(10_000)) - set(BAD), "9,990 rows, each once"
    assert staged_rows(pg) == 0, "the killed attempt's staged rows were discarded"
    assert sluice.last_write_summary("postgres")["dead_letters"] == 10
    letters = tablestore_rows(spark, tmp_path, "dl")
    assert sorted(json.loads(r.record)["id"] for r in letters) == BAD, "the 10 refused rows, each once"
    for r in letters:
        assert json.loads(r.record) == {"id": json.loads(r.record)["id"], "v": -1, "pad": "x" * 1000}
        assert r.error_class == "RecordError"
        assert 'violates check constraint "v_nonneg"' in r.error_message and "DETAIL: Failing row" in r.error_message
        assert r.connector == "postgres" and r.target.endswith(f"public.{table}")
        assert r.write_id and r.task == 0 and r.micro_batch is None and r.failed_at is not None
    assert len({r.write_id for r in letters}) == 1


def test_without_tolerance_the_same_exactly_once_write_fails_and_commits_nothing(spark, pg, tmp_path):
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint, v bigint CONSTRAINT v_nonneg CHECK (v >= 0))')
    df = spark.range(0, 10_000, 1, 1).selectExpr("id", "CASE WHEN id % 1000 = 7 THEN -1 ELSE id END AS v")
    with pytest.raises(Exception, match=r'(?s)violates check constraint "v_nonneg".*errors\.tolerance=all'):
        df.write.format("postgres").options(**exactly_once(pg, table)).mode("append").save()
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(0,)]
    assert staged_rows(pg) == 0
    assert tablestore_rows(spark, tmp_path, "dl") == []


def test_a_check_the_staging_table_cannot_carry_fails_the_commit_whole(spark, pg, tmp_path):
    # The CHECK reads a column the DataFrame does not write (filled by its default): only the commit applies it.
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint, v bigint, cap bigint DEFAULT 0, CONSTRAINT v_cap CHECK (v >= cap))')
    df = spark.range(0, 100, 1, 1).selectExpr("id", "CASE WHEN id % 1000 = 7 THEN -1 ELSE id END AS v")
    options = {**exactly_once(pg, table), "errors.tolerance": "all", **letters_in_tablestore(tmp_path, "dl")}
    with pytest.raises(Exception, match=r'(?s)commit of public\.\S+ .*rolled back.*violates check constraint "v_cap"'):
        df.write.format("postgres").options(**options).mode("append").save()
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(0,)]


@pytest.mark.parametrize("same_database", [True, False])
def test_dead_letters_in_the_same_database_commit_in_the_writes_transaction(spark, pg, same_database):
    # Row 50 is refused when its task stages it (CHECK v >= 0: it goes aside); rows 0..9 pass staging but fail the
    # commit (CHECK v >= cap reads a column the DataFrame does not write): the write commits nothing. Dead letters in
    # the same database commit in the write's transaction, so they are not committed either; the control, in another
    # database, commits them first, on their own.
    table, letters = pg.table(), pg.table("dl")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, v bigint CHECK (v >= 0), cap bigint DEFAULT 10, CHECK (v >= cap))')
    url = pg.url
    if not same_database:
        other = pg.table("db")
        pg.sql(f'CREATE DATABASE "{other}"')
        parts = urlsplit(pg.url)
        url = parts._replace(path=f"/{other}").geturl()
    df = spark.range(0, 100, 1, 2).selectExpr("id", "CASE WHEN id = 50 THEN -1 ELSE id END AS v")
    options = {**exactly_once(pg, table), "errors.tolerance": "all", "errors.deadletter.format": "postgres",
               "errors.deadletter.url": url, "errors.deadletter.table": letters,
               "errors.deadletter.create-table": "true", "errors.deadletter.sink.mode": "global-ordered",
               "errors.deadletter.sink.transactional": "true"}
    with pytest.raises(Exception, match=r'(?s)commit of public\.\S+ .*rolled back'):
        df.write.format("postgres").options(**options).mode("append").save()
    assert pg.sql(f'SELECT count(*) FROM "{table}"') == [(0,)]
    import psycopg

    with psycopg.connect(url) as conn:
        found = conn.execute(f"SELECT record::json->>'id' FROM \"{letters}\"").fetchall()
    assert found == ([] if same_database else [("50",)])


@pytest.mark.parametrize("mode, int_type", [("partition-ordered", "integer"), ("unordered", "integer"),
                                           ("unordered", "bigint")])
def test_the_other_write_paths_split_a_refused_batch_and_apply_nothing_of_it_twice(spark, pg, mode, int_type):
    # partition-ordered: upserts (INSERT ... ON CONFLICT from a temporary table); unordered into integer columns fed
    # by longs: INSERT ... SELECT from a temporary table (a refused batch rolls back whole); into bigint columns:
    # COPY straight into the table (one statement). Each refused batch is split until its refused row is alone.
    table, letters = pg.table(), pg.table("dl")
    pg.sql(f'CREATE TABLE "{table}" (id {int_type} PRIMARY KEY, v {int_type} CONSTRAINT v_nonneg CHECK (v >= 0))')
    df = spark.range(0, 2000, 1, 2).selectExpr("id", "CASE WHEN id % 500 = 7 THEN -1 ELSE id END AS v")
    options = pg.opts(table, **{"sink.mode": mode, "sink.batch.max-size": "100"})
    if mode == "partition-ordered":
        options["primary-key"] = "id"
    with pytest.raises(Exception, match=r'violates check constraint "v_nonneg"'):
        df.write.format("postgres").options(**options).mode("append").save()
    pg.sql(f'TRUNCATE "{table}"')  # the control: what the failed write stored before it failed goes
    df.write.format("postgres").options(**options).options(**{
        "errors.tolerance": "all", "errors.deadletter.format": "postgres", "errors.deadletter.url": pg.url,
        "errors.deadletter.table": letters, "errors.deadletter.create-table": "true"}).mode("append").save()
    refused = [7, 507, 1007, 1507]
    rows = pg.sql(f'SELECT id, v FROM "{table}" ORDER BY id')
    assert rows == [(i, i) for i in range(2000) if i not in refused], "every other row once, none half-applied"
    got = pg.sql(f'SELECT record, error_message FROM "{letters}"')
    assert sorted(json.loads(record)["id"] for record, _ in got) == refused
    assert all('violates check constraint "v_nonneg"' in message for _, message in got)


def test_values_the_sink_refuses_before_sending_go_aside(spark, pg):
    table, letters = pg.table(), pg.table("dl")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, n smallint, code varchar(3))')
    df = spark.createDataFrame([(1, 1, "a"), (2, 40_000, "b"), (3, 3, "toolong"), (4, 4, "d"), (5, -40_000, "e")],
                               "id long, n long, code string").coalesce(1)
    options = pg.opts(table, **{"errors.tolerance": "all", "errors.deadletter.format": "postgres",
                                "errors.deadletter.url": pg.url, "errors.deadletter.table": letters,
                                "errors.deadletter.create-table": "true"})
    df.write.format("postgres").options(**options).mode("append").save()
    assert pg.sql(f'SELECT id FROM "{table}" ORDER BY id') == [(1,), (4,)]
    got = {json.loads(record)["id"]: message
           for record, message in pg.sql(f'SELECT record, error_message FROM "{letters}"')}
    assert sorted(got) == [2, 3, 5]
    assert "is outside -32768..32767" in got[2] and "and 1 more row(s)" in got[2] and "varchar(3)" in got[3]


@pytest.mark.parametrize("ratio, commits", [("0.05", False), ("0.2", True)])
def test_max_ratio_fails_a_transactional_write_past_it_and_commits_nothing(spark, pg, ratio, commits):
    table, letters = pg.table(), pg.table("dl")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, v bigint CONSTRAINT v_nonneg CHECK (v >= 0))')
    pg.sql(f'CREATE TABLE "{letters}" (record text, error_class text, error_message text, connector text, '
           'target text, write_id text, micro_batch bigint, task integer, failed_at timestamptz)')
    df = spark.range(0, 100, 1, 2).selectExpr("id", "CASE WHEN id % 10 = 3 THEN -1 ELSE id END AS v")  # 10%
    options = {**exactly_once(pg, table), "errors.tolerance": "all", "errors.max-ratio": ratio,
               "errors.deadletter.format": "postgres", "errors.deadletter.url": pg.url,
               "errors.deadletter.table": letters, "errors.deadletter.sink.mode": "global-ordered",
               "errors.deadletter.sink.transactional": "true"}
    write = df.write.format("postgres").options(**options).mode("append")
    if commits:
        write.save()
    else:
        with pytest.raises(Exception, match=r"10 of 100 records \(10\.00%\) were refused, more than "
                                            r"errors\.max-ratio=0\.05"):
            write.save()
    counts = pg.sql(f'SELECT (SELECT count(*) FROM "{table}"), (SELECT count(*) FROM "{letters}")')
    assert counts == ([(90, 10)] if commits else [(0, 0)])
    assert staged_rows(pg) == 0
