"""sluice.lookup(df, "postgres", ...) on a real server: left and inner joins, duplicate and non-unique keys, a
streaming DataFrame, the partial cache and its negative control, a stopped server, and bad input named."""

import json
import threading
import time
import urllib.request
import uuid

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import sluice
import sluice.metrics
from sluice.connectors.postgres._client import PostgresError
from sluice.metrics._lookups import LookupTally
from sluice.source._lookup_cache import cache_for
from sluice.source._lookup_dataframe import plan_lookup
from sluice.source._lookup_join import enrich
from sluice.source._lookup_requests import observe_requests
from sluice.testing import LocalPostgres

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def users(pg):
    """id 1: one row; id 2: two rows (a non-unique key); id 3: none."""
    table = pg.table("users")
    pg.sql(f'CREATE TABLE "{table}" (id integer, name text, score numeric(5,2), tags int[])')
    pg.sql(f"CREATE INDEX ON \"{table}\" (id)")
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'ann', 1.5, '{{1,2}}'), (2, 'bo', 2, NULL), (2, 'bea', 3, '{{}}')")
    return table


def test_left_and_inner_give_a_row_per_match_typed_as_the_batch_read_types_them(spark, pg, users):
    df = spark.createDataFrame([(1, "a"), (1, "b"), (2, "c"), (3, "d"), (None, "e")], "id long, event string")
    left = sluice.lookup(df, "postgres", pg.opts(users), on="id", columns=["name", "score", "tags"])
    read = spark.read.format("postgres").options(**pg.opts(users)).load()
    assert left.schema.fields[2:] == [f for f in read.schema.fields if f.name != "id"]
    rows = sorted((r.event, r.name, r.tags) for r in left.collect())
    assert rows == [("a", "ann", [1, 2]), ("b", "ann", [1, 2]), ("c", "bea", []), ("c", "bo", None),
                    ("d", None, None), ("e", None, None)]
    inner = sluice.lookup(df, "postgres", pg.opts(users), on="id", how="inner", columns=["name"])
    assert sorted((r.event, r.name) for r in inner.collect()) == [("a", "ann"), ("b", "ann"), ("c", "bea"),
                                                                   ("c", "bo")]


def test_infinite_dates_and_timestamps_are_looked_up_as_the_batch_read_gives_them(spark, pg):
    table = pg.table("spans")
    pg.sql(f'CREATE TABLE "{table}" (id int, d date, ts timestamp, tz timestamptz)')
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'infinity', '-infinity', 'infinity'), "
           "(2, '-infinity', 'infinity', '-infinity'), (3, '2026-12-06', '2026-12-06 10:00', '2026-12-06 10:00+00')")
    df = spark.createDataFrame([(1,), (2,), (3,)], "id int")
    # As numbers: Python's datetime cannot hold Spark's first instant in every zone (collect() would fail on it).
    as_numbers = "id, unix_date(d) AS d, unix_micros(CAST(ts AS timestamp)) AS ts, unix_micros(tz) AS tz"
    looked_up = sluice.lookup(df, "postgres", pg.opts(table), on="id").selectExpr(*as_numbers.split(", "))
    read = spark.read.format("postgres").options(**pg.opts(table)).load().selectExpr(*as_numbers.split(", "))
    rows = sorted(tuple(r) for r in looked_up.collect())
    assert rows == sorted(tuple(r) for r in read.collect())
    assert rows[0][1:] == (2932896, -62135596800000000, 253402300799999999)  # 9999-12-31, first and last instant


def test_a_composite_key_is_looked_up_through_unnest(spark, pg):
    table = pg.table("pairs")
    pg.sql(f'CREATE TABLE "{table}" (tenant text, id bigint, v text, PRIMARY KEY (tenant, id))')
    pg.sql(f"INSERT INTO \"{table}\" VALUES ('a', 1, 'a1'), ('b', 1, 'b1')")
    df = spark.createDataFrame([("a", 1), ("b", 1), ("a", 2)], "tenant string, id int")
    out = sluice.lookup(df, "postgres", pg.opts(table), on=["tenant", "id"])
    assert sorted((r.tenant, r.id, r.v) for r in out.collect()) == [("a", 1, "a1"), ("a", 2, None), ("b", 1, "b1")]


def test_a_streaming_dataframe_is_enriched_micro_batch_by_micro_batch_and_counted(spark, pg, users, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "0.json").write_text("\n".join(json.dumps({"id": i, "seq": n}) for n, i in enumerate([1, 2, 3])))
    stream = spark.readStream.schema("id long, seq int").json(str(events))
    with sluice.metrics.serve() as server:
        query = (sluice.lookup(stream, "postgres", pg.opts(users, **{"lookup.cache": "partial"}), on="id",
                               columns=["name"])
                 .writeStream.format("memory").queryName("lookup_stream").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        query.awaitTermination()
        assert query.exception() is None
        # The task's final report: 3 rows in, 4 out (id 2 has two rows); each of the 3 distinct keys a hit or a
        # miss (which one depends on the worker process a task lands on), and each miss asked of the store.
        assert server.lookups.wait_for(lambda snapshot: snapshot.get("postgres", {}).get("records_in") == 3, 30)
        counted = server.lookups.snapshot()["postgres"]
        text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
    assert counted["records_out"] == 4 and counted["hits"] + counted["misses"] == 3
    assert counted["keys_loaded"] == counted["misses"] and counted["records_loaded"] <= 4
    assert 'sluice_lookup_numRecordsIn_total{format="postgres"} 3.0' in text
    assert 'sluice_lookup_hitCount_total{format="postgres"}' in text
    rows = sorted((r.seq, r.name) for r in spark.table("lookup_stream").collect())
    assert rows == [(0, "ann"), (1, "bea"), (1, "bo"), (2, None)]


SCHEMA = StructType([StructField("id", LongType()), StructField("event", StringType())])


def run(plan, ids, tally=None):
    """One Arrow batch through the workers' code, in this process (the cache is this process's)."""
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "event": [str(i) for i in ids]})
    return enrich(plan, batch, cache_for(plan.lookup_id, plan.cache), tally or LookupTally()).to_pydict()


@pytest.mark.parametrize("cache", ["partial", "none"])
def test_the_partial_cache_answers_without_the_store_and_with_it_off_the_store_is_asked_again(pg, cache):
    """A row changed in the store after it was looked up: the cache serves the value it read (hits counted); the
    negative control, lookup.cache=none, reads the new value."""
    table = pg.table("cached")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, name text)')
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'old'), (2, 'two')")
    plan, _ = plan_lookup(SCHEMA, "postgres", pg.opts(table, **{"lookup.cache": cache}), "id", "left", None)
    tally = LookupTally()  # what the task reports to the metrics
    try:
        assert run(plan, [1, 2, 9], tally)["name"] == ["old", "two", None]
        pg.sql(f"UPDATE \"{table}\" SET name = 'new' WHERE id = 1")
        pg.sql(f"INSERT INTO \"{table}\" VALUES (9, 'nine')")
        again = run(plan, [1, 1, 9], tally)["name"]
    finally:
        plan.reader.close(clean=True)
    stats = cache_for(plan.lookup_id, plan.cache)
    if cache == "partial":
        assert again == ["old", "old", None]  # the missing key 9 was cached too (cache-missing-key's default)
        assert (stats.hits, stats.misses, stats.evictions) == (2, 3, 0)
        assert (tally.hits, tally.misses, tally.loads, tally.keys_loaded) == (2, 3, 1, 3)
    else:
        assert again == ["new", "new", "nine"] and stats is None
        assert (tally.hits, tally.misses, tally.loads, tally.keys_loaded) == (0, 5, 2, 5)


@pytest.mark.parametrize("concurrency", [3, 1])
def test_a_batch_split_into_statements_has_them_in_flight_together_with_one_statements_rows(pg, users, concurrency):
    """8 distinct keys, 2 a statement: 4 statements. With the table locked, the server shows 3 of them waiting on
    the lock at once (pg_stat_activity); the negative control, max-concurrent-requests=1, shows one, the others not
    sent. The rows are those of one statement, in the batch's order (not the order the statements complete in)."""
    ids = [3, 1, 2, 5, 2, 7, 1, 4, 6, 8]
    whole, _ = plan_lookup(SCHEMA, "postgres", pg.opts(users), "id", "left", None)
    split, _ = plan_lookup(SCHEMA, "postgres", pg.opts(users, **{"lookup.max-keys-per-request": "2",
                           "lookup.max-concurrent-requests": str(concurrency)}), "id", "left", None)
    answer: dict[str, object] = {}
    with psycopg.connect(pg.url) as locker, observe_requests() as counter:
        locker.execute(f'LOCK TABLE "{users}" IN ACCESS EXCLUSIVE MODE')  # held until the commit below
        worker = threading.Thread(target=lambda: answer.update(rows=run(split, ids)))
        worker.start()
        try:
            waiting = waiting_on_the_lock(pg, users, concurrency, worker)
            assert (waiting, counter.open, counter.sent) == (concurrency, concurrency, concurrency)
        finally:
            locker.commit()
            worker.join()
        seen = (counter.sent, counter.peak)
    try:
        assert answer["rows"] == run(whole, ids)
        assert sorted(map(str, answer["rows"]["name"])) == sorted(map(str, [None, "ann", "bo", "bea", None, "bo",
                                                                        "bea", None, "ann", None, None, None]))
        assert seen == (4, concurrency)
    finally:
        split.reader.close(clean=True)
        whole.reader.close(clean=True)


def waiting_on_the_lock(pg, table, count, worker):
    """Lookup statements on `table` the server shows waiting on a lock, once `count` are or the worker has ended
    (a round trip a look; 60 s at most)."""
    waiting = 0
    with psycopg.connect(pg.url, autocommit=True) as watcher:
        deadline = time.monotonic() + 60
        while waiting < count and worker.is_alive() and time.monotonic() < deadline:
            waiting = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                                      "query LIKE %s", (f'%"{table}"%= ANY(%',)).fetchone()[0]
    return waiting


def two_rows(pg, concurrency, shared, **options):
    """A table of ids 1 and 2, and a plan that looks up 1 key a statement, `concurrency` at once, its statements
    sharing a batch's snapshot or not (`shared`, the negative control's switch)."""
    table = pg.table("snapshot")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, name text)')
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'one'), (2, 'two')")
    plan, _ = plan_lookup(SCHEMA, "postgres", pg.opts(table, **{"lookup.max-keys-per-request": "1",
                          "lookup.max-concurrent-requests": str(concurrency), **options}), "id", "left", None)
    plan.reader._one_snapshot = shared
    return table, plan


@pytest.mark.parametrize("shared", [True, False])
def test_a_row_committed_between_a_batchs_statements_is_not_seen_by_the_second(pg, shared):
    """2 keys, 1 a statement, one after the other; between them the test commits an UPDATE of the second's row. The
    batch shows it as it was: both statements read the batch's snapshot. Negative control, the sharing off: the new
    value. The next batch sees it, on the same connection, out of any transaction, its prepared statement kept
    (executed 4 times: a ROLLBACK would have made psycopg deallocate it)."""
    table, plan = two_rows(pg, 1, shared)
    reader, statements = plan.reader, []
    request = reader._request

    def between(snapshot, params):  # the reader's per-statement function, as run_requests calls it
        if len(statements) == 1:
            pg.sql(f'UPDATE "{table}" SET name = \'new\' WHERE id = ANY(%s)', [params[0]])
        statements.append(params[0][0])
        return request(snapshot, params)

    reader._request = between
    try:
        names = [dict(zip([1, 2], run(plan, [1, 2])["name"], strict=True)) for _ in range(2)]
        statuses = [lease.conn.info.transaction_status.name for lease in reader._held]
        plans = [lease.conn.execute("SELECT generic_plans + custom_plans FROM pg_prepared_statements WHERE "
                                    "statement LIKE %s", (f"%{table}%",)).fetchall() for lease in reader._held]
    finally:
        reader.close(clean=True)
    updated = {1: "one", 2: "two", statements[1]: "new"}
    assert names == [{1: "one", 2: "two"} if shared else updated, updated] and len(statements) == 4
    assert statuses == ["IDLE"] and plans == [[(4,)]]


@pytest.mark.parametrize("shared", [True, False])
def test_statements_in_flight_on_two_connections_read_one_snapshot(pg, shared):
    """2 keys, 1 a statement, both in flight: with the table locked, the server shows both waiting (two connections,
    the snapshot's exporter and an importer); the test then updates both rows in the lock's transaction and commits.
    Both statements read the rows as they were. Negative control, the sharing off: both read the new values."""
    table, plan = two_rows(pg, 2, shared)
    answer: dict[str, object] = {}
    with psycopg.connect(pg.url) as locker:
        locker.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        worker = threading.Thread(target=lambda: answer.update(rows=run(plan, [1, 2])))
        worker.start()
        try:
            assert waiting_on_the_lock(pg, table, 2, worker) == 2
            locker.execute(f"UPDATE \"{table}\" SET name = name || '!'")
        finally:
            locker.commit()
            worker.join()
    try:
        assert answer["rows"]["name"] == (["one", "two"] if shared else ["one!", "two!"])
        assert [lease.conn.info.transaction_status.name for lease in plan.reader._held] == ["IDLE", "IDLE"]
    finally:
        plan.reader.close(clean=True)


@pytest.mark.parametrize("retries", [1, 0])
def test_a_connection_lost_between_a_batchs_statements_sends_the_batch_again(pg, retries):
    """2 keys, 1 a statement, one after the other on one connection; before the second, the test ends that
    connection's backend (pg_terminate_backend). The batch is sent again, both statements, in a new snapshot, and
    answers. Negative control, connect.retries=0: the batch fails, naming the table."""
    table, plan = two_rows(pg, 1, True, **{"connect.retries": str(retries)})
    reader, statements = plan.reader, []
    request = reader._request

    def between(snapshot, params):
        if len(statements) == 1:
            pids = [lease.conn.info.backend_pid for lease in reader._held]
            assert pg.sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids]) == [(True,)]
        statements.append(params[0][0])
        return request(snapshot, params)

    reader._request = between
    try:
        if retries:
            assert run(plan, [1, 2])["name"] == ["one", "two"]
        else:
            with pytest.raises(PostgresError, match=rf"looking up 1 key\(s\) in table public\.{table} .*failed"):
                run(plan, [1, 2])
    finally:
        reader.close(clean=False)
    assert len(statements) == (4 if retries else 2)


def test_one_refused_statement_of_a_split_batch_fails_the_batch_never_nulls(pg):
    """4 keys, 1 a statement, 3 in flight: the server refuses the statement of the key that is no UUID while the
    others answer; the batch fails naming the table, never gives that key nulls, and leaves no connection in its
    snapshot's transaction. Negative control: the same plan answers a batch without it."""
    table = pg.table("ids")
    pg.sql(f'CREATE TABLE "{table}" (id uuid, name text)')
    good = [str(uuid.uuid4()) for _ in range(3)]
    pg.sql(f'INSERT INTO "{table}" VALUES (%s, \'a\'), (%s, \'b\'), (%s, \'c\')', good)
    schema = StructType([StructField("id", StringType()), StructField("event", StringType())])
    plan, _ = plan_lookup(schema, "postgres", pg.opts(table, **{"lookup.max-keys-per-request": "1",
                          "lookup.max-concurrent-requests": "3"}), "id", "left", None)

    def lookup(ids):
        return enrich(plan, pa.record_batch({"id": ids, "event": ids}), None, LookupTally()).to_pydict()

    try:
        assert lookup(good)["name"] == ["a", "b", "c"]
        with pytest.raises(PostgresError, match=rf"looking up 1 key\(s\) in table public\.{table} .*uuid"):
            lookup([good[0], "not-a-uuid", good[1], good[2]])
        # The batch's statements shared a snapshot: its connections still open left their transactions.
        assert {lease.conn.info.transaction_status.name for lease in plan.reader._held} == {"IDLE"}
    finally:
        plan.reader.close(clean=False)


def test_eviction_and_expiry_send_a_key_back_to_the_store(pg):
    """max-rows=1 keeps one key: the other is evicted and read again (its new value); cache-missing-key=false and
    expire-after-write are the other ways back to the store."""
    table = pg.table("evicted")
    pg.sql(f'CREATE TABLE "{table}" (id bigint, name text)')
    pg.sql(f"INSERT INTO \"{table}\" VALUES (1, 'one'), (2, 'two')")
    options = pg.opts(table, **{"lookup.cache": "partial", "lookup.partial-cache.max-rows": "1",
                                "lookup.partial-cache.cache-missing-key": "false"})
    plan, _ = plan_lookup(SCHEMA, "postgres", options, "id", "left", None)
    try:
        assert run(plan, [1])["name"] == ["one"] and run(plan, [2, 3])["name"] == ["two", None]
        pg.sql(f"UPDATE \"{table}\" SET name = name || '!'")
        pg.sql(f"INSERT INTO \"{table}\" VALUES (3, 'three')")
        assert run(plan, [1, 2, 3])["name"] == ["one!", "two", "three"]  # 1 evicted, 2 cached, 3 not cached
    finally:
        plan.reader.close(clean=True)
    stats = cache_for(plan.lookup_id, plan.cache).stats()
    assert stats.evictions >= 1 and stats.hits == 1 and stats.rows == 1
    expiring = {**options, "lookup.partial-cache.max-rows": "10", "lookup.partial-cache.expire-after-write": "1e-6"}
    plan, _ = plan_lookup(SCHEMA, "postgres", expiring, "id", "left", None)
    try:
        assert run(plan, [1])["name"] == ["one!"]
        pg.sql(f"UPDATE \"{table}\" SET name = 'uno' WHERE id = 1")
        assert run(plan, [1])["name"] == ["uno"]  # a microsecond later, the key read first has expired
    finally:
        plan.reader.close(clean=True)
    assert cache_for(plan.lookup_id, plan.cache).stats().hits == 0


def test_a_stopped_server_fails_the_query_naming_the_store(spark, tmp_path):
    """Negative control: the same lookup answers while the server runs."""
    with LocalPostgres() as server:
        import psycopg

        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE gone (id bigint, name text)")
            conn.execute("INSERT INTO gone VALUES (1, 'one')")
        df = spark.createDataFrame([(1, "a")], "id long, event string")
        enriched = sluice.lookup(df, "postgres", {"url": server.url, "table": "gone", "connect.retries": "0"}, on="id")
        assert [r.name for r in enriched.collect()] == ["one"]
        server.stop()
        with pytest.raises(Exception) as failed:
            enriched.collect()
    message = str(failed.value)
    assert "looking up keys in table public.gone on postgresql://sluice@127.0.0.1" in message, message
    assert "sluice-test-pw" not in message


def test_bad_input_is_named_before_any_work(pg, users):
    def refused(options=None, on="id", schema=SCHEMA, **kw):
        with pytest.raises(sluice.OptionError) as failed:
            plan_lookup(schema, "postgres", {**pg.opts(users), **(options or {})}, on, kw.get("how", "left"),
                        kw.get("columns"))
        return str(failed.value)

    message = refused({"lookup.cach": "partial", "password": "hunter2"})
    assert "unknown option 'lookup.cach'" in message and "Did you mean 'lookup.cache'?" in message
    assert "hunter2" not in message
    assert "key column 'user_id' (on=) is not a DataFrame column" in refused(on="user_id")
    assert f"key column 'event' is not a column of table public.{users}" in refused(on="event")
    assert f"looked-up column 'nope' is not a column of table public.{users}" in refused(columns=["nope"])
    text_keys = StructType([StructField("id", StringType())])
    assert "key column 'id' is string in the DataFrame, but the key id of table" in refused(schema=text_keys)
    assert "is read as int" in refused(schema=text_keys)
    assert "does not exist" in refused({"table": "no_such_table"})
    assert "how='outer'" in refused(how="outer")
    clash = StructType([*SCHEMA.fields, StructField("name", StringType())])
    assert "looked-up column 'name'" in refused(schema=clash)
    with pytest.raises(sluice.OptionError, match=r"format 'sluice_null' has no lookup joins; formats that have: .*"
                                                 r"postgres"):
        plan_lookup(SCHEMA, "sluice_null", {}, "id", "left", None)
