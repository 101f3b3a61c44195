"""Snapshots on demand while a change stream runs (format("postgres_changes"), _backfill.py): a table new to the
capture and a signal table's requests, read in primary-key chunks between the changes, on a real server. The tests
drive the stream reader as Spark's micro-batch loop does (latestOffset, partitions, read, commit), without Spark, and
apply every batch to a keyed replica as an upsert sink does; the replica must equal the source."""

import json
import random
import threading

import psycopg
import pyarrow as pa
import pytest

from sluice.connectors.postgres.changes import _backfill
from sluice.connectors.postgres.changes._backfill import SignalError
from tests.connectors.postgres.test_changes import batch, new_table, sql, stream


def apply(replica, rows, table):
    """`rows` of `table` applied to {id: row} in order, as an upsert sink keyed by id applies a micro-batch: a delete
    removes the key, any other row sets it, keeping the stored value of a column the row names unchanged."""
    for r in rows.to_pylist():
        if r["_table"] != table:
            continue
        if r["_op"] == "delete":
            replica.pop(r["id"], None)
            continue
        kept = replica.get(r["id"], {})
        replica[r["id"]] = {c: kept.get(c) if c in (r["_unchanged"] or ()) else r[c] for c in ("n", "doc")}
    return replica


def source_rows(url, table):
    return {i: {"n": n, "doc": doc} for i, n, doc in sql(url, f"SELECT id, n, doc FROM {table}")}


def chunk_last(rows):
    """The batch with its chunk's rows moved after its changes: where a chunk goes without regard to the changes
    its snapshot did not see (no watermark)."""
    ops = rows.column("_op").to_pylist()
    order = [i for i, op in enumerate(ops) if op != "read"] + [i for i, op in enumerate(ops) if op == "read"]
    return rows.take(pa.array(order, pa.int64()))


def run_until_done(reader, at, rows_out):
    """Micro-batches, each committed, until no snapshot on demand is left; returns the last offset."""
    for _ in range(200):
        end, rows = batch(reader, at)
        rows_out.append(rows)
        reader.commit(end)
        at = end
        if not end.get("backfill", {}).get("queue") and not end.get("backfill", {}).get("signals"):
            return at
    raise AssertionError("the snapshot on demand did not finish in 200 micro-batches")


class Writer(threading.Thread):
    """Up to 3,000 writes on `table`, or fewer when stopped: 80% updates, 10% deletes and 10% inserts of keys from
    first_new on; the test thread gets any error."""

    def __init__(self, url, table, first_new):
        super().__init__()
        self.url, self.table, self.next_id = url, table, first_new
        self.stop, self.errors, self.writes = threading.Event(), [], 0
        self.some = threading.Event()

    def run(self):
        rng = random.Random(7)
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stop.is_set() and self.writes < 3000:
                    k = rng.randrange(self.next_id)
                    step = rng.random()
                    if step < 0.8:
                        conn.execute(f"UPDATE {self.table} SET n = n + 1 WHERE id = %s", (k,))
                    elif step < 0.9:
                        conn.execute(f"DELETE FROM {self.table} WHERE id = %s", (k,))
                    else:
                        conn.execute(f"INSERT INTO {self.table} VALUES (%s, 0, 'new')", (self.next_id,))
                        self.next_id += 1
                    self.writes += 1
                    if self.writes == 50:
                        self.some.set()
        except Exception as e:  # handed to the test thread
            self.errors.append(e)
            raise


BIG = "z" * 20_000  # stored out of line (TOAST), left out of updates that do not change it


def added_table(url, name, rows):
    t = new_table(url, name, "id int PRIMARY KEY, n int, doc text")
    sql(url, f"ALTER TABLE {t} ALTER COLUMN doc SET STORAGE EXTERNAL",
        f"INSERT INTO {t} SELECT g, 0, CASE WHEN g % 100 = 0 THEN '{BIG}' ELSE 'old' END "
        f"FROM generate_series(0, {rows - 1}) g")
    return t


def test_a_table_added_to_the_capture_is_read_in_chunks_under_writes_and_the_replica_equals_the_source(lpg,
                                                                                                     monkeypatch):
    """Table b joins the publication between two runs while a writer keeps changing it. The restarted stream reads its
    existing rows in chunks, one per micro-batch, between its changes; the replica ends equal to the source, the
    unchanged TOASTed values included. One key is updated after each chunk's snapshot was taken and before the batch's
    end was read: the update the chunk does not see. Negative control: the same batches with each chunk after the
    batch's changes (no watermark) leave those keys stale."""
    a = new_table(lpg.url, "bf_a")
    b = added_table(lpg.url, "bf_b", 3000)
    sql(lpg.url, f"CREATE PUBLICATION bf_pub FOR TABLE {a}")
    options = {"publication": "bf_pub", "slot": "sluice_test_bf_new", "snapshot": "false",
               "snapshot.chunk-size": "500"}
    first = stream(lpg.url, **options)
    start = first.initialOffset()
    sql(lpg.url, f"INSERT INTO {a} VALUES (1, 'x')")
    at, rows = batch(first, start)
    first.commit(at)
    first.stop()
    assert at["tables"] == ["public.bf_a"] and rows.num_rows == 1

    sql(lpg.url, f"ALTER PUBLICATION bf_pub ADD TABLE {b}")
    touched, bounds = [], []
    take, upper = _backfill.late_transactions, _backfill.Backfiller._upper_bound

    def recording(self, pg, request, after):
        bounds.append(-1 if after is None else int(after[0]))
        return upper(self, pg, request, after)

    def a_write_the_snapshot_misses(pg, snapshot, unseen):
        # Committed after the chunk's snapshot was taken and before the batch's end is read: the chunk's first key.
        with psycopg.connect(lpg.url, autocommit=True) as conn:
            key = conn.execute(f"SELECT min(id) FROM {b} WHERE id > %s", (bounds[-1],)).fetchone()[0]
            conn.execute(f"UPDATE {b} SET n = -1000 - n WHERE id = %s", (key,))
        touched.append(key)
        return take(pg, snapshot, unseen)

    monkeypatch.setattr(_backfill.Backfiller, "_upper_bound", recording)
    monkeypatch.setattr(_backfill, "late_transactions", a_write_the_snapshot_misses)
    writer = Writer(lpg.url, b, 3000)
    writer.start()
    writer.some.wait(30)
    restarted = stream(lpg.url, **options)  # Spark hands the restarted query its last committed offset
    batches = []
    try:
        at = run_until_done(restarted, at, batches)
    finally:
        writer.stop.set()
        writer.join()
    assert not writer.errors
    monkeypatch.undo()
    end, rest = batch(restarted, at)  # the writes after the last chunk
    batches.append(rest)
    restarted.commit(end)
    restarted.stop()

    reads = [rows.column("_op").to_pylist().count("read") for rows in batches]
    assert sum(1 for n in reads if n) >= 5 and max(reads) <= 500, f"a chunk of <= 500 rows per micro-batch: {reads}"
    assert len(touched) >= 5 and writer.writes >= 50
    replica = {}
    for rows in batches:
        apply(replica, rows, "public.bf_b")
    expected = source_rows(lpg.url, b)
    assert replica == expected, "every key of the added table as the source has it"
    assert sum(1 for v in replica.values() if v["doc"] == BIG) >= 20, "unchanged TOASTed values kept from the chunk"

    naive = {}
    for rows in batches:
        apply(naive, chunk_last(rows), "public.bf_b")
    stale = [k for k in touched if naive.get(k) != expected.get(k)]
    assert stale, "a chunk placed after the changes its snapshot missed overwrites them"


def test_a_signal_row_reads_a_streamed_table_again_with_its_filter_and_a_bad_one_is_refused_by_id(lpg):
    t = added_table(lpg.url, "bf_signalled", 1200)
    signals = new_table(lpg.url, "bf_signals", "id text PRIMARY KEY, type text, data jsonb")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_bf_signal",
                    **{"signal.table": signals, "snapshot.chunk-size": "400"})
    at = reader.initialOffset()
    request = {"data-collections": [t], "additional-conditions": [{"data-collection": t, "filter": "id % 2 = 0"}]}
    sql(lpg.url, f"INSERT INTO {signals} VALUES ('s1', 'execute-snapshot', '{json.dumps(request)}')")
    batches = []
    at = run_until_done(reader, at, batches)
    read_ids = [r["id"] for rows in batches for r in rows.to_pylist() if r["_op"] == "read"]
    assert sorted(read_ids) == list(range(0, 1200, 2)), "the filter's rows, each once"
    assert sql(lpg.url, f"SELECT count(*) FROM {signals}") == [(0,)], "the taken signal is deleted once committed"
    assert "backfill" not in at or at["backfill"]["queue"] == []

    sql(lpg.url, f"INSERT INTO {signals} VALUES ('s2', 'execute-snapshot', "
        "'{\"data-collections\": [\"public.not_streamed\"]}')")
    with pytest.raises(SignalError, match=r"row id 's2': table 'public.not_streamed' is not one this query streams"):
        batch(reader, at)
    reader.stop()


def test_a_driver_lost_mid_snapshot_resumes_at_the_last_committed_chunk_and_the_replica_equals_the_source(lpg,
                                                                                                        caplog):
    """The query stops with a chunk's batch planned and read but not committed, its snapshot gone with its driver.
    The restarted query replays that batch (the chunk read in a new snapshot) and goes on from there: the chunks
    committed before are not read again, and the replica ends equal to the source."""
    t = added_table(lpg.url, "bf_killed", 2000)
    signals = new_table(lpg.url, "bf_killed_signals", "id text PRIMARY KEY, type text, data text")
    options = {"table": t, "snapshot": "false", "slot": "sluice_test_bf_killed", "signal.table": signals,
               "snapshot.chunk-size": "500"}
    reader = stream(lpg.url, **options)
    at = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {signals} VALUES ('go', 'execute-snapshot', '{{\"data-collections\": [\"{t}\"]}}')")
    replica, committed_reads = {}, 0
    for _ in range(2):  # two chunks committed
        end, rows = batch(reader, at)
        apply(replica, rows, f"public.{t}")
        committed_reads += rows.column("_op").to_pylist().count("read")
        reader.commit(end)
        at = end
    sql(lpg.url, f"UPDATE {t} SET n = 7 WHERE id BETWEEN 990 AND 1010")
    lost, _ = batch(reader, at)  # planned and read; the driver dies before Spark commits it
    reader.stop()  # its snapshot holders go with it

    restarted = stream(lpg.url, **options)
    replay = [b for p in restarted.partitions(at, lost) for b in restarted.read(p)]
    assert "reads the chunk in a new snapshot" in caplog.text

    replayed = pa.Table.from_batches(replay)
    apply(replica, replayed, f"public.{t}")
    restarted.commit(lost)
    rest = []
    run_until_done(restarted, lost, rest)
    for rows in rest:
        apply(replica, rows, f"public.{t}")
    restarted.stop()
    later_reads = replayed.column("_op").to_pylist().count("read") + sum(
        r.column("_op").to_pylist().count("read") for r in rest)
    assert committed_reads == 1000 and later_reads == 1000, "resumed after the committed chunks, none read twice"
    assert replica == source_rows(lpg.url, t)


@pytest.mark.spark
def test_a_signalled_snapshot_reaches_a_postgres_upsert_sink_through_spark_under_updates(spark, lpg, tmp_path):
    """Through Spark: a signal asks for a table's snapshot while updates that leave its TOASTed column unchanged keep
    coming; the postgres sink applies the `read` rows as upserts and keeps the chunk's TOASTed values. The target
    ends equal to the source."""
    t = added_table(lpg.url, "bf_spark", 900)
    signals = new_table(lpg.url, "bf_spark_signals", "id text PRIMARY KEY, type text, data text")
    sql(lpg.url, "CREATE TABLE bf_spark_copy (id int PRIMARY KEY, n int, doc text)")
    stream(lpg.url, table=t, snapshot="false", slot="sluice_test_bf_spark").initialOffset()
    sql(lpg.url, f"INSERT INTO {signals} VALUES ('all', 'execute-snapshot', '{{\"data-collections\": [\"{t}\"]}}')")
    writer = Writer(lpg.url, t, 900)
    writer.start()
    rows = spark.readStream.format("postgres_changes").options(url=lpg.url, table=t, slot="sluice_test_bf_spark") \
        .option("snapshot", "false").option("signal.table", signals).option("snapshot.chunk-size", "300").load()
    query = rows.select("id", "n", "doc", "_op", "_unchanged").writeStream.format("postgres") \
        .options(url=lpg.url, table="bf_spark_copy", **{"primary-key": "id", "upsert.op-column": "_op",
                                                       "upsert.unchanged-column": "_unchanged"}) \
        .option("checkpointLocation", str(tmp_path / "bf_spark")).start()
    try:
        query.processAllAvailable()
        writer.stop.set()
        writer.join()
        query.processAllAvailable()
    finally:
        writer.stop.set()
        query.stop()
    assert not writer.errors and writer.writes >= 50
    reads = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert len(reads) >= 3, f"the chunks went in micro-batches of their own: {reads}"
    assert source_rows(lpg.url, "bf_spark_copy") == source_rows(lpg.url, t)
    assert sql(lpg.url, f"SELECT count(*) FROM bf_spark_copy WHERE doc = '{BIG}'")[0][0] >= 5
    assert sql(lpg.url, f"SELECT count(*) FROM {signals}") == [(0,)]


def test_a_commit_not_yet_visible_holds_the_chunk_back_until_it_is(lpg, monkeypatch):
    """synchronous_standby_names names a standby that never answers: an UPDATE's commit is in the WAL, so a
    micro-batch streams it, while no snapshot sees it yet. The chunk asked for next waits until it does. Negative
    control: without that check, the chunk's row from before the update comes after it and the replica is stale."""

    def scenario(name):
        t = added_table(lpg.url, name, 10)
        signals = new_table(lpg.url, f"{name}_signals", "id text PRIMARY KEY, type text, data text")
        reader = stream(lpg.url, table=t, snapshot="false", slot=f"sluice_test_{name}", **{"signal.table": signals})
        at = reader.initialOffset()
        sql(lpg.url, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'", "SELECT pg_reload_conf()")
        errors = []

        def update():
            try:
                with psycopg.connect(lpg.url, autocommit=True) as conn:
                    conn.execute(f"UPDATE {t} SET n = 42 WHERE id = 3")  # waits for the standby, committed locally
            except Exception as e:  # handed to the test thread
                errors.append(e)
                raise

        waiting = threading.Thread(target=update)
        try:
            waiting.start()
            with psycopg.connect(lpg.url, autocommit=True) as conn:  # the commit is in the WAL, not yet visible
                while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                                       ).fetchone()[0]:
                    conn.execute("SELECT pg_sleep(0.01)")
            batches = []
            end, rows = batch(reader, at)
            assert [(r["_op"], r["id"], r["n"]) for r in rows.to_pylist()] == [("update", 3, 42)]
            reader.commit(end)
            batches.append(rows)
            with psycopg.connect(lpg.url, autocommit=True) as conn:
                conn.execute("SET synchronous_commit = local")
                conn.execute(f"INSERT INTO {signals} VALUES ('s', 'execute-snapshot', "
                             f"'{{\"data-collections\": [\"{t}\"]}}')")
            at, rows = batch(reader, end)
            batches.append(rows)
        finally:
            sql(lpg.url, "ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
            waiting.join()
        assert not errors
        reader.commit(at)
        run_until_done(reader, at, batches)
        reader.stop()
        replica = {}
        for rows in batches:
            apply(replica, rows, f"public.{t}")
        return batches, replica, source_rows(lpg.url, t)

    batches, replica, source = scenario("bf_late")
    assert batches[1].column("_op").to_pylist().count("read") == 0, "the chunk waited a micro-batch"
    assert replica == source and source[3]["n"] == 42

    monkeypatch.setattr(_backfill, "late_transactions", lambda pg, snapshot, unseen: 0)
    batches, replica, source = scenario("bf_late_unchecked")
    assert batches[1].column("_op").to_pylist().count("read") == 10
    assert replica[3]["n"] == 0 and source[3]["n"] == 42, "the chunk's row from before the update came after it"
