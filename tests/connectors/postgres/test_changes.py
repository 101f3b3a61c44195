"""format("postgres_changes"): change capture over logical replication (pgoutput) on a real server with
wal_level=logical. Most tests drive the stream reader the way Spark's micro-batch loop does (initialOffset,
latestOffset, partitions, read, commit) without Spark; the last one runs the whole thing in Spark."""

import os
import threading

import psycopg
import pyarrow as pa
import pytest

from sluice import ConflictError, DataLossError, OptionError, RestartNeededError
from sluice.connectors.postgres import PostgresChangesDataSource, PostgresError, _pgoutput
from sluice.connectors.postgres.changes import _publication, _read, _slot, _stream, drop_slot, list_slots
from sluice.spark._compat import to_arrow_schema
from sluice.testing import LocalPostgres
from tests.faults import die_while


def sql(url, *statements):
    with psycopg.connect(url, autocommit=True) as conn:
        out = None
        for statement in statements:
            cur = conn.execute(statement)
            out = cur.fetchall() if cur.description else None
        return out


def stream(url, **options):
    source = PostgresChangesDataSource({"url": url, **options})
    return source.streamReader(source.schema())


def batch(reader, start, limit=None):
    """One micro-batch as Spark runs it: (end offset, rows as a pyarrow Table); Spark's commit is left to the test."""
    end = reader.latestOffset(start, limit or reader.getDefaultReadLimit())
    parts = reader.partitions(start, end)
    batches = [b for p in parts for b in reader.read(p)]
    schema = to_arrow_schema(reader.schema)
    table = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
    return end, table


def new_table(url, name, ddl="id int PRIMARY KEY, v text"):
    sql(url, f"CREATE TABLE {name} ({ddl})")
    return name


@pytest.mark.pg_versions
def test_changes_come_whole_in_commit_order_typed_with_their_metadata(lpg):
    t = new_table(lpg.url, "typed", "id int PRIMARY KEY, v text, amount numeric(10,2), ok boolean, at timestamptz, "
                  "tags int[], raw bytea")
    reader = stream(lpg.url, table=t, snapshot="false")
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a', 1.25, true, '2026-01-02 03:04:05.5+00', '{{1,NULL}}', "
                 "'\\x00ff'), (2, 'b', NULL, false, NULL, NULL, NULL)",
        f"UPDATE {t} SET v = 'a2' WHERE id = 1", f"DELETE FROM {t} WHERE id = 2")
    end, rows = batch(reader, start)
    got = rows.to_pylist()
    assert [(r["_op"], r["id"], r["v"]) for r in got] == [("insert", 1, "a"), ("insert", 2, "b"),
                                                           ("update", 1, "a2"), ("delete", 2, None)]
    first = got[0]
    assert (str(first["amount"]), first["ok"], first["tags"], first["raw"]) == ("1.25", True, [1, None], b"\x00\xff")
    assert first["at"].isoformat() == "2026-01-02T03:04:05.500000+00:00"
    assert first["_table"] == "public.typed" and first["_commit_time"] is not None
    assert got[0]["_xid"] == got[1]["_xid"] != got[2]["_xid"], "the two inserts were one transaction"
    lsns = [r["_lsn"] for r in got]
    assert lsns == sorted(lsns) and len(set(lsns)) == 3, "one commit LSN per transaction, in commit order"
    reader.commit(end)
    assert batch(reader, end)[0] == end, "nothing new: no new offset, so Spark runs no empty micro-batch"


@pytest.mark.pg_versions
def test_changes_are_typed_as_the_batch_reader_reads_the_same_rows_infinities_and_padding_included(lpg):
    from sluice.connectors.postgres import PostgresDataSource

    sql(lpg.url, "CREATE TYPE mood AS ENUM ('sad', 'happy')", "CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
    t = new_table(lpg.url, "many_types", "id int PRIMARY KEY, e mood, d posint, u uuid, j jsonb, day date, "
                  "t time, iv interval, f8 float8, f4 real, i2 smallint, ba bigint[], ta text[], ch char(3), "
                  "ip inet, n numeric(20,5), ts timestamp, tstz timestamptz, fa float8[], da date[], "
                  "tsa timestamptz[], ua uuid[], boola bool[], nm name, i4r int4range")
    reader = stream(lpg.url, table=t, snapshot="false")
    start = reader.initialOffset()
    sql(lpg.url, f"""INSERT INTO {t} VALUES (1, 'happy', 5, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"a": [1]}}',
        '2026-01-02', '03:04:05.5', '1 day 02:03:04', 1.5e300, 1.25, -3, '{{1,NULL,3}}', '{{"a b","c,d",NULL}}',
        'ab', '10.0.0.1/8', 1.5, '2026-01-02 03:04:05.123456', '2026-01-02 03:04:05+02', '{{1.5,NaN,-Infinity}}',
        '{{2026-01-02,infinity}}', '{{infinity,-infinity,"2026-01-02 03:04:05+00"}}',
        '{{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}}', '{{t,f,NULL}}', 'nm', '[1,5)'),
        (2, NULL, NULL, NULL, NULL, 'infinity', NULL, NULL, 'NaN', '-Infinity', NULL, '{{}}', '{{}}', NULL, NULL,
        NULL, '-infinity', 'infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (3, NULL, NULL, NULL, NULL, '-infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        'infinity', '-infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL)""")
    _, changes = batch(reader, start)
    source = PostgresDataSource({"url": lpg.url, "table": t})
    batch_reader = source.reader(source.schema())
    read = pa.Table.from_batches([b for p in batch_reader.partitions() for b in batch_reader.read(p)])
    assert changes.select(read.column_names).schema == read.schema
    differ = [(name, changes.column(name).to_pylist(), read.column(name).to_pylist()) for name in read.column_names
              if repr(changes.column(name).to_pylist()) != repr(read.column(name).to_pylist())]  # repr: NaN == NaN
    assert differ == []
    days = read.column("day").cast(pa.int32()).to_pylist()
    assert days[1:] == [2932896, -719162], "+-infinity read as 9999-12-31 and 0001-01-01, as Spark's JDBC reader"
    assert read.column("ch").to_pylist()[0] == "ab"

    sql(lpg.url, f"INSERT INTO {t} (id, n) VALUES (4, 'NaN')")
    with pytest.raises(PostgresError, match=r"column 'n' \(numeric\(20,5\)\).*NaN.*no Spark decimal"):
        batch(reader, start)
    batch_reader = source.reader(source.schema())
    with pytest.raises(PostgresError, match=r"column 'n' does not convert .*NaN"):
        [b for p in batch_reader.partitions() for b in batch_reader.read(p)]


@pytest.mark.pg_versions
@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_an_update_of_the_key_deletes_the_old_key_so_a_keyed_replica_keeps_no_ghost(lpg, monkeypatch, identity):
    t = new_table(lpg.url, f"rekeyed_{identity.lower()}")
    sql(lpg.url, f"ALTER TABLE {t} REPLICA IDENTITY {identity}", f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")

    def replica_after_changes(slot):
        """Apply a batch of changes to {id: v} as an upsert sink keyed by id does."""
        reader = stream(lpg.url, table=t, snapshot="false", slot=slot)
        start = reader.initialOffset()
        sql(lpg.url, f"UPDATE {t} SET id = 10 WHERE id = 1", f"UPDATE {t} SET v = 'a2' WHERE id = 10",
            f"UPDATE {t} SET id = id + 100", f"UPDATE {t} SET id = id - 100, v = v || '!'")
        _, rows = batch(reader, start)
        reader.stop()
        replica = {1: "a", 2: "b"}
        for r in rows.to_pylist():
            if r["_op"] == "delete":
                replica.pop(r["id"], None)
            else:
                replica[r["id"]] = r["v"]
        return rows, replica

    rows, replica = replica_after_changes(f"sluice_test_rekeyed_{identity.lower()}")
    assert [(r["_op"], r["id"]) for r in rows.to_pylist()][:3] == [("delete", 1), ("insert", 10), ("update", 10)]
    assert replica == dict(sql(lpg.url, f"SELECT id, v FROM {t}")) == {10: "a2!", 2: "b!"}

    # Negative control: an update that moved the key taken as a plain update leaves the old keys behind.
    monkeypatch.setattr(_pgoutput.ChangeDecoder, "_key_changed", lambda self, data, rel, marker, updates, *rest:
                        updates & False)
    sql(lpg.url, f"DELETE FROM {t}", f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    _, replica = replica_after_changes(f"sluice_test_rekeyed_{identity.lower()}_off")
    assert replica != dict(sql(lpg.url, f"SELECT id, v FROM {t}"))
    assert 1 in replica and 102 in replica, "ghosts of keys the source no longer has"


@pytest.mark.pg_versions
def test_a_batch_spark_did_not_commit_is_replayed_by_a_restarted_query_and_consuming_it_would_lose_it(lpg):
    t = new_table(lpg.url, "replay")
    slot = "sluice_test_replay"
    reader = stream(lpg.url, table=t, snapshot="false", slot=slot)
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 100) g")
    end, first = batch(reader, start)
    assert first.num_rows == 100
    # The query dies before Spark commits the batch: a restarted query replays it from the same start offset.
    reader.stop()  # as Spark does when the query ends, or the server when the driver's process dies
    restarted = stream(lpg.url, table=t, snapshot="false", slot=slot)
    # The same changes again; the end may lie further on (WAL written since without a change, such as the restart
    # point the reader logs on PostgreSQL 16+: slot.log-restart-point).
    replayed_end = restarted.latestOffset(start, restarted.getDefaultReadLimit())
    assert _pgoutput.parse_lsn(replayed_end["lsn"]) >= _pgoutput.parse_lsn(end["lsn"])
    again = [b for p in restarted.partitions(start, replayed_end) for b in restarted.read(p)]
    assert pa.Table.from_batches(again).column("id").to_pylist() == first.column("id").to_pylist()

    # Negative control: consuming the changes when they are read (the slot moved to the batch's end before Spark
    # committed it, as pg_logical_slot_get_changes does) leaves nothing to replay, and the query can tell.
    sql(lpg.url, f"SELECT pg_replication_slot_advance('{slot}', '{end['lsn']}')")
    restarted.stop()
    strict = stream(lpg.url, table=t, snapshot="false", slot=slot)
    with pytest.raises(DataLossError, match="past this query's position"):
        strict.latestOffset(start, strict.getDefaultReadLimit())
    strict.stop()
    lenient = stream(lpg.url, table=t, snapshot="false", slot=slot, failOnDataLoss="false")
    skipped_to = lenient.latestOffset(start, lenient.getDefaultReadLimit())
    assert [b for p in lenient.partitions(start, skipped_to) for b in lenient.read(p)] == [], "the batch is lost"


@pytest.mark.pg_versions
def test_the_snapshot_hands_over_to_the_changes_with_no_gap_and_no_overlap_under_concurrent_inserts(lpg):
    """Rows keep being inserted while the slot is created: each id comes exactly once, from the snapshot or from
    the changes. Negative control: the same snapshot read in a fresh snapshot instead of the slot's exported one
    (what a reader taking its own snapshot after creating the slot gets) repeats rows the changes also carry."""
    from sluice.connectors.postgres._snapshot import SnapshotHolder

    t = new_table(lpg.url, "handover")
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'old' FROM generate_series(0, 499) g")
    stop, errors = threading.Event(), []

    def insert():
        try:
            with psycopg.connect(lpg.url, autocommit=True) as conn:
                i = 500
                while not stop.is_set() or i < 700:  # at least 200 inserts, some after the snapshot
                    conn.execute(f"INSERT INTO {t} VALUES (%s, 'new')", (i,))
                    i += 1
        except Exception as e:  # handed to the test thread
            errors.append(e)
            raise

    writer = threading.Thread(target=insert)
    writer.start()
    reader = stream(lpg.url, table=t)
    start = reader.initialOffset()
    assert "snapshot" in start
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"v": 1, "lsn": start["lsn"], "tables": ["public.handover"], "columns": start["columns"]}, \
        "micro-batch 0 is the snapshot alone"
    snapshot_rows = [b for p in reader.partitions(start, end) for b in reader.read(p)]
    fresh = SnapshotHolder(reader.stream.conn, 30)  # the negative control's snapshot: taken after the slot's
    stop.set()
    writer.join()
    assert not errors
    reader.commit(end)
    reader.prepareForTriggerAvailableNow()
    sql(lpg.url, f"INSERT INTO {t} VALUES (100000, 'after AvailableNow began')")
    last, changes = batch(reader, end)
    assert 100000 not in changes.column("id").to_pylist(), "AvailableNow stops where it began"
    assert reader.reportLatestOffset()["retained_wal_bytes"] > 0

    ids = pa.Table.from_batches(snapshot_rows).column("id").to_pylist() + changes.column("id").to_pylist()
    (count,) = sql(lpg.url, f"SELECT count(*) FROM {t} WHERE id < 100000")[0]
    assert sorted(ids) == list(range(count)), "every row exactly once: no gap, no overlap"
    assert changes.num_rows > 0 and set(changes.column("_op").to_pylist()) == {"insert"}

    try:
        other = {**start, "snapshot": fresh.shared.snapshot_id, "channel": fresh.shared.channel}
        again = [b for p in reader.partitions(other, end) for b in reader.read(p)]
    finally:
        fresh.cancel()
    doubled = pa.Table.from_batches(again).column("id").to_pylist() + changes.column("id").to_pylist()
    assert len(doubled) > len(set(doubled)), "a snapshot of its own overlaps the changes"
    reader.commit(last)


def test_retained_wal_past_the_threshold_is_a_warning_naming_the_slot(lpg, caplog):
    t = new_table(lpg.url, "retained")
    quiet = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_retained")
    start = quiet.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'x')")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        quiet.latestOffset(start, quiet.getDefaultReadLimit())
    warned = [r for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("sluice")]
    assert not warned, "1 GiB by default: far away"
    quiet.stop()
    loud = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_retained",
                  **{"retained-wal-warn-bytes": "0"})
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        loud.latestOffset(start, loud.getDefaultReadLimit())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "sluice_test_retained holds back" in warning and lpg.password not in warning


def test_a_publication_of_two_tables_streams_both_in_one_schema_snapshot_included(lpg, monkeypatch):
    a = new_table(lpg.url, "pub_a", "id int PRIMARY KEY, name text")
    b = new_table(lpg.url, "pub_b", "id int PRIMARY KEY, qty bigint")
    sql(lpg.url, f"INSERT INTO {a} VALUES (1, 'one')", f"INSERT INTO {b} VALUES (1, 10)",
        f"CREATE PUBLICATION two_tables FOR TABLE {a}, {b}")
    reader = stream(lpg.url, publication="two_tables", slot="sluice_test_two")
    assert reader.schema.fieldNames()[:3] == ["id", "name", "qty"]
    start = reader.initialOffset()
    end, snapshot = batch(reader, start)
    reader.commit(end)
    sql(lpg.url, f"BEGIN; UPDATE {a} SET name = 'uno' WHERE id = 1; DELETE FROM {b} WHERE id = 1; COMMIT")
    after, changes = batch(reader, end)
    reader.commit(after)
    rows = [(r["_table"], r["_op"], r["id"], r["name"], r["qty"]) for r in snapshot.to_pylist() + changes.to_pylist()]
    assert sorted(rows[:2]) == [("public.pub_a", "insert", 1, "one", None), ("public.pub_b", "insert", 1, None, 10)]
    assert rows[2:] == [("public.pub_a", "update", 1, "uno", None), ("public.pub_b", "delete", 1, None, None)]
    with pytest.raises(OptionError, match=r"not in publication 'two_tables'"):
        stream(lpg.url, publication="two_tables", table="typed")

    # A table joins the publication mid-stream: the batch fails naming it, and the restarted query streams it too,
    # its existing rows read first (snapshot.new-tables; test_changes_backfill.py).
    start = after
    c = new_table(lpg.url, "pub_c", "id int PRIMARY KEY, note text")
    sql(lpg.url, f"ALTER PUBLICATION two_tables ADD TABLE {c}", f"INSERT INTO {c} VALUES (1, 'new')",
        f"INSERT INTO {a} VALUES (2, 'two')")
    with pytest.raises(PostgresError, match=r"table public\.pub_c joined publication 'two_tables' after the query "
                                            r"started.*restart the query"):
        batch(reader, start)
    reader.stop()
    restarted = stream(lpg.url, publication="two_tables", slot="sluice_test_two")
    _, rows = batch(restarted, start)
    assert [(r["_table"], r["_op"], r["id"], r["note"]) for r in rows.to_pylist()] == [
        ("public.pub_c", "read", 1, "new"), ("public.pub_c", "insert", 1, "new"), ("public.pub_a", "insert", 2, None)]
    restarted.stop()
    # Negative control: decoding as if the stream were some of the publication's tables, the new table's change is
    # left out without a word.
    decoder = _read.ChangeDecoder
    monkeypatch.setattr(_read, "ChangeDecoder", lambda *args, **kwargs: decoder(*args[:6], **kwargs))
    stale = _stream.ChangeStreamReader(reader.stream, reader.options, reader.schema)  # resolved at start: two tables
    _, rows = batch(stale, start)
    assert [r["_table"] for r in rows.to_pylist()] == ["public.pub_a"]


@pytest.mark.lines
def test_max_changes_per_trigger_cuts_between_transactions_never_inside_one(lpg):
    t = new_table(lpg.url, "limited")
    reader = stream(lpg.url, table=t, snapshot="false", **{"max-changes-per-trigger": "4"})
    start = reader.initialOffset()
    for i in range(5):  # five transactions of three changes each
        sql(lpg.url, f"INSERT INTO {t} SELECT g, 'x' FROM generate_series({i * 3}, {i * 3 + 2}) g")
    sizes, xids = [], []
    while True:
        end, rows = batch(reader, start)
        if end == start:
            break
        sizes.append(rows.num_rows)
        xids.append(set(rows.column("_xid").to_pylist()))
        reader.commit(end)
        start = end
    assert sizes == [3, 3, 3, 3, 3], "3 + 3 > 4: one whole transaction per batch"
    assert all(len(x) == 1 for x in xids) and len(set.union(*xids)) == 5


@pytest.mark.lines
def test_max_changes_per_trigger_reads_the_snapshot_in_splits_over_several_micro_batches(lpg):
    """A 1,000-row table with a budget of 300: four snapshot batches of one ~250-row split each (planned once and
    carried in the offsets, so a replayed batch reads the same rows), then the changes; every row exactly once."""
    t = new_table(lpg.url, "budgeted_snapshot")
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'old' FROM generate_series(0, 999) g", f"ANALYZE {t}")
    reader = stream(lpg.url, table=t, **{"max-changes-per-trigger": "300"})
    start = first = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1000, 'after the snapshot')")
    sizes, ids = [], []
    while "snapshot" in start:
        end, rows = batch(reader, start)
        replayed = [b for p in reader.partitions(start, end) for b in reader.read(p)]
        assert pa.Table.from_batches(replayed, schema=to_arrow_schema(reader.schema)).column("id").to_pylist() == \
            rows.column("id").to_pylist(), "a replayed snapshot batch reads the same split"
        assert set(rows.column("_op").to_pylist()) == {"insert"}
        sizes.append(rows.num_rows)
        ids += rows.column("id").to_pylist()
        reader.commit(end)
        start = end
    assert len(sizes) == 4 and sum(sizes) == 1000 and max(sizes) <= 300, sizes  # cut by the key histogram
    assert start == {"v": 1, "lsn": first["lsn"], "tables": first["tables"], "columns": first["columns"]}, \
        "the last snapshot batch ends where the changes begin"
    end, changes = batch(reader, start)
    assert changes.column("id").to_pylist() == [1000]
    assert sorted([*ids, 1000]) == list(range(1001)), "every row exactly once"
    reader.commit(end)
    # Without a budget the snapshot is one micro-batch, as before.
    whole = stream(lpg.url, table=t, slot="whole_snapshot")
    start = whole.initialOffset()
    end, rows = batch(whole, start)
    assert end == {"v": 1, "lsn": start["lsn"], "tables": start["tables"], "columns": start["columns"]} \
        and rows.num_rows == 1001
    whole.commit(end)


def mixed_transactions(url, t, count):
    """`count` transactions of 1-4 inserts, an update or a delete each: commits spread over the WAL."""
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(count):
            with conn.transaction():
                if i % 5 == 3:
                    conn.execute(f"UPDATE {t} SET v = v || 'u' WHERE id = %s", ((i - 1) * 10,))
                elif i % 5 == 4:
                    conn.execute(f"DELETE FROM {t} WHERE id = %s", ((i - 3) * 10,))
                else:
                    conn.execute(f"INSERT INTO {t} SELECT g, repeat('v', 200) FROM generate_series(%s::int, %s::int) g",
                                 (i * 10, i * 10 + i % 4))


def change_rows(reader, start, end):
    rows = [r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
    return [(r["_lsn"], r["_xid"], r["_op"], r["id"], r["v"]) for r in rows]


def test_a_batch_fetched_in_wal_ranges_reads_every_transaction_once_in_commit_order(lpg, monkeypatch):
    """fetch-ranges=4: the ranges after the first come from copies of the slot advanced to each range's start, and
    together hold exactly the transactions of one fetch of the whole batch. Negative controls: ranges that overlap,
    or leave a hole, and the check sees the duplicates and the loss."""
    monkeypatch.setattr(_read, "FETCH_RANGE_MIN_WAL", 1024)  # ranges of this test's few hundred KiB of WAL
    copies = []
    copy_slot = _read.ChangeReader._copy_slot

    def counted(self, cur, low):
        copies.append(copy_slot(self, cur, low))
        return copies[-1]

    monkeypatch.setattr(_read.ChangeReader, "_copy_slot", counted)
    t = new_table(lpg.url, "ranged")
    whole = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_whole", **{"fetch-ranges": "1"})
    ranged = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_ranged", **{"fetch-ranges": "4"})
    start_whole, start_ranged = whole.initialOffset(), ranged.initialOffset()
    mixed_transactions(lpg.url, t, 200)
    end_whole = whole.latestOffset(start_whole, whole.getDefaultReadLimit())
    end_ranged = ranged.latestOffset(start_ranged, ranged.getDefaultReadLimit())
    expected = change_rows(whole, start_whole, end_whole)
    assert not copies and len(expected) > 300 and len({r[1] for r in expected}) == 200
    got = change_rows(ranged, start_ranged, end_ranged)
    assert len(copies) == 3 and ranged.stream.slot not in copies, "three ranges from copies of the slot"
    assert got == expected

    def cut(overlap):
        def ranges(start, end, most):
            a, b = start + (end - start) // 3, start + 2 * (end - start) // 3
            return [(start, b), (a, end)] if overlap else [(start, a), (b, end)]
        return ranges

    monkeypatch.setattr(_read, "wal_ranges", cut(overlap=True))
    doubled = change_rows(ranged, start_ranged, end_ranged)
    assert len(doubled) > len(expected) and set(doubled) == set(expected), "the overlap is read twice"
    monkeypatch.setattr(_read, "wal_ranges", cut(overlap=False))
    holed = change_rows(ranged, start_ranged, end_ranged)
    assert set(holed) < set(expected), "the hole is lost"


def test_with_no_slot_free_for_a_copy_a_range_comes_from_the_slot_itself_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(_read, "FETCH_RANGE_MIN_WAL", 1024)
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on",
                                 "max_replication_slots": "1"}) as one_slot:
        t = new_table(one_slot.url, "crowded")
        reader = stream(one_slot.url, table=t, snapshot="false", **{"fetch-ranges": "3"})
        start = reader.initialOffset()
        mixed_transactions(one_slot.url, t, 60)
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        with caplog.at_level("WARNING", logger="sluice.postgres"):
            got = change_rows(reader, start, end)
        whole = stream(one_slot.url, table=t, snapshot="false", slot=reader.stream.slot, **{"fetch-ranges": "1"})
        assert got == change_rows(whole, start, end) and len({r[1] for r in got}) == 60
    warnings = [r.getMessage() for r in caplog.records if "no replication slot free" in r.getMessage()]
    assert len(warnings) == 2 and "fetch-ranges=1" in warnings[0] and "max_replication_slots" in warnings[0]


def test_toasted_values_left_out_of_an_update_are_named_unchanged_or_carried_with_replica_identity_full(lpg):
    t = new_table(lpg.url, "toasty", "id int PRIMARY KEY, n int, doc text")
    sql(lpg.url, f"ALTER TABLE {t} ALTER COLUMN doc SET STORAGE EXTERNAL")  # stored out of line, uncompressed
    big = "z" * 20_000
    reader = stream(lpg.url, table=t, snapshot="false")
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 0, '{big}')", f"UPDATE {t} SET n = 1 WHERE id = 1")
    _, rows = batch(reader, start)
    assert [(r["_op"], r["n"], r["doc"] == big, r["_unchanged"]) for r in rows.to_pylist()] == [
        ("insert", 0, True, []), ("update", 1, False, ["doc"])]

    sql(lpg.url, f"ALTER TABLE {t} REPLICA IDENTITY FULL", f"UPDATE {t} SET n = 2 WHERE id = 1")
    full = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_toast_full")
    begin = full.initialOffset()
    sql(lpg.url, f"UPDATE {t} SET n = 3 WHERE id = 1")
    _, rows = batch(full, begin)
    assert [(r["_op"], r["n"], r["doc"] == big, r["_unchanged"]) for r in rows.to_pylist()] == [
        ("update", 3, True, [])]


@pytest.mark.pg_versions
def test_an_added_column_needs_a_restart_that_reads_it_and_a_truncate_is_an_event_per_table_or_a_failure(lpg):
    t, other = new_table(lpg.url, "ddl"), new_table(lpg.url, "ddl_other")
    slot = "sluice_test_ddl"
    reader = stream(lpg.url, table=f"{t},{other}", snapshot="false", slot=slot)
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a')", f"ALTER TABLE {t} ADD COLUMN extra int",
        f"INSERT INTO {t} VALUES (2, 'b', 7)")
    with pytest.raises(PostgresError, match=r"column\(s\) \['extra'\].*restart the query"):
        batch(reader, start)
    reader.stop()
    restarted = stream(lpg.url, table=f"{t},{other}", snapshot="false", slot=slot)
    end, rows = batch(restarted, start)
    assert [(r["id"], r["extra"]) for r in rows.to_pylist()] == [(1, None), (2, 7)]
    restarted.commit(end)

    failing = stream(lpg.url, table=f"{t},{other}", snapshot="false", slot="sluice_test_ddl_fail", truncate="fail")
    fail_start = failing.initialOffset()
    sql(lpg.url, f"BEGIN; INSERT INTO {t} VALUES (3, 'c', 8); TRUNCATE {t}, {other} RESTART IDENTITY; "
                 f"INSERT INTO {t} VALUES (4, 'd', 9); COMMIT")
    _, rows = batch(restarted, end)
    got = [(r["_op"], r["_table"], r["id"], r["v"], r["extra"]) for r in rows.to_pylist()]
    assert got == [("insert", "public.ddl", 3, "c", 8), ("truncate", "public.ddl", None, None, None),
                   ("truncate", "public.ddl_other", None, None, None), ("insert", "public.ddl", 4, "d", 9)]
    assert len({(r["_lsn"], r["_xid"], r["_commit_time"]) for r in rows.to_pylist()}) == 1  # one transaction's
    with pytest.raises(PostgresError, match=r"TRUNCATE of \['public\.ddl', 'public\.ddl_other'\] .*truncate=fail"):
        batch(failing, fail_start)


@pytest.mark.pg_versions
def test_a_renamed_dropped_or_retyped_column_stops_the_query_and_the_restart_gets_past_it(lpg, monkeypatch,
                                                                                           caplog):
    t = new_table(lpg.url, "renamed", "id int PRIMARY KEY, v text, extra int")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_renamed")
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a', 5)", f"ALTER TABLE {t} RENAME COLUMN extra TO extra2",
        f"INSERT INTO {t} VALUES (2, 'b', 7)")
    with pytest.raises(PostgresError, match=r"\['extra2'\].*added or renamed.*restart the query"):
        batch(reader, start)
    reader.stop()
    # The restarted query's schema has extra2; the batch it replays still holds a change sent under 'extra'. The
    # start offset names each column's attribute number, which the rename kept: the value comes under the new name.
    assert [c[1] for c in start["columns"][0][2]] == ["id", "v", "extra"]
    restarted = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_renamed")
    with caplog.at_level("INFO", logger="sluice.postgres"):
        _, rows = batch(restarted, start)
    assert [(r["id"], r["extra2"]) for r in rows.to_pylist()] == [(1, 5), (2, 7)]
    assert any("{'extra': 'extra2'}" in r.getMessage() for r in caplog.records)
    restarted.stop()
    # Negative control: an offset without the columns (as written before they were recorded) cannot tell a rename:
    # the old name's value is left out with a warning, so the restart still gets past it.
    legacy = {k: v for k, v in start.items() if k != "columns"}
    caplog.clear()
    blind = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_renamed")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        _, rows = batch(blind, legacy)
    assert [(r["id"], r["extra2"]) for r in rows.to_pylist()] == [(1, None), (2, 7)]
    assert any("['extra'], which the table no longer has" in r.getMessage() for r in caplog.records)
    blind.stop()
    # ... and taking every column the schema lacks as new, it fails on the old change again, at every restart.
    with monkeypatch.context() as off:
        off.setattr(_read.ChangeReader, "_gone_columns", lambda self, table, names: [])
        again = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_renamed")
        with pytest.raises(PostgresError, match=r"\['extra'\].*added or renamed"):
            batch(again, legacy)
        again.stop()

    # A dropped column and a widened type stop the query the same way; the restarted one streams the table as it is.
    d = new_table(lpg.url, "reshaped_col", "id int PRIMARY KEY, v text, extra int, small int")
    reader = stream(lpg.url, table=d, snapshot="false", slot="sluice_test_reshaped_col")
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {d} VALUES (1, 'a', 5, 1)", f"ALTER TABLE {d} DROP COLUMN extra",
        f"INSERT INTO {d} VALUES (2, 'b', 2)")
    with pytest.raises(PostgresError, match=r"no longer has column\(s\) \['extra'\].*restart the query"):
        batch(reader, start)
    reader.stop()
    checked, unchecked = (stream(lpg.url, table=d, snapshot="false", slot="sluice_test_reshaped_col") for _ in "ab")
    sql(lpg.url, f"ALTER TABLE {d} ALTER COLUMN small TYPE bigint", f"INSERT INTO {d} VALUES (3, 'c', 1099511627776)")
    with pytest.raises(PostgresError, match=r"\['small'\] of table public.reshaped_col changed type.*restart"):
        batch(checked, start)
    checked.stop()
    # Negative control: without the type check, the query goes on with the schema's int column, and the wider value
    # fails the batch, a failure no restart gets past.
    with monkeypatch.context() as off:
        off.setattr(_pgoutput.ChangeDecoder, "_check_types", lambda self, table, sent, at: None)
        with pytest.raises(Exception, match="1099511627776") as failed:
            batch(unchecked, start)
    assert "changed type" not in str(failed.value) and not isinstance(failed.value, RestartNeededError)
    unchecked.stop()
    restarted = stream(lpg.url, table=d, snapshot="false", slot="sluice_test_reshaped_col")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        _, rows = batch(restarted, start)
    assert [(r["id"], r["small"]) for r in rows.to_pylist()] == [(1, 1), (2, 2), (3, 1099511627776)]
    assert any("carry column(s) ['extra'], which the table no longer has" in r.getMessage() for r in caplog.records)
    restarted.stop()


def test_a_dropped_slot_is_data_loss_and_the_cli_lists_and_drops_slots(lpg, capsys):
    from sluice.cli import main

    t = new_table(lpg.url, "lost")
    slot = "sluice_test_lost"
    reader = stream(lpg.url, table=t, snapshot="false", slot=slot)
    start = reader.initialOffset()
    url = lpg.url.replace(f":{lpg.password}@", "@")
    os.environ["PGPASSWORD"] = lpg.password
    try:
        assert main(["postgres", "--url", url, "slots"]) == 0
        (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(slot)]
        assert "query=server process" in line, "the running query holding it"
        assert main(["postgres", "--url", lpg.url, "slots"]) != 0  # refused: ps would show the password
        assert lpg.password not in capsys.readouterr().err
        assert main(["postgres", "--url", url, "drop-slot", slot]) != 0
        assert f"'{slot}' is in use by a running query (server process" in capsys.readouterr().err
        assert main(["postgres", "--url", url, "drop-slot", slot, "--force"]) == 0
    finally:
        del os.environ["PGPASSWORD"]
    assert slot not in [s.name for s in list_slots(reader.stream.conn)]
    with pytest.raises(DataLossError, match="does not exist any more"):
        reader.latestOffset(start, reader.getDefaultReadLimit())
    reader.stop()
    lenient = stream(lpg.url, table=t, snapshot="false", slot=slot, failOnDataLoss="false")
    lenient.latestOffset(start, lenient.getDefaultReadLimit())
    assert slot in [s.name for s in list_slots(reader.stream.conn)], "re-created"
    lenient.stop()
    assert [s.query for s in list_slots(reader.stream.conn) if s.name == slot] == [None], "let go"
    drop_slot(reader.stream.conn, slot)


def test_a_second_query_on_a_slot_in_use_fails_at_start_and_the_first_one_loses_nothing(lpg, monkeypatch):
    t = new_table(lpg.url, "guarded")
    slot = "sluice_test_guarded"
    first = stream(lpg.url, table=t, snapshot="false", slot=slot)
    start = first.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 10) g")
    monkeypatch.setattr(_slot, "SLOT_GUARD_WAIT_S", 1)
    second = stream(lpg.url, table=t, snapshot="false", slot=slot)
    with pytest.raises(ConflictError, match=r"option 'slot': replication slot 'sluice_test_guarded' is in use by "
                                          r"another query \(server process \d+.*own slot"):
        second.initialOffset()
    end, rows = batch(first, start)
    assert rows.column("id").to_pylist() == list(range(1, 11))
    first.commit(end)
    first.stop()
    third = stream(lpg.url, table=t, snapshot="false", slot=slot)
    assert third.initialOffset() == end, "free once the first one stopped"
    third.stop()

    # Negative control: without the guard a second query starts on the slot, and its commit moves the slot past
    # the first query's position: the first one's changes are gone.
    monkeypatch.setattr(_slot.SlotGuard, "_lock", lambda self, pg: None)
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'y' FROM generate_series(11, 20) g")
    other = stream(lpg.url, table=t, snapshot="false", slot=slot)
    other.initialOffset()
    other_end, _ = batch(other, end)
    other.commit(other_end)
    with pytest.raises(DataLossError, match="another consumer used it"):
        first.latestOffset(end, first.getDefaultReadLimit())


def test_a_guard_session_the_server_ends_is_taken_again_and_the_stream_goes_on(lpg, caplog):
    t = new_table(lpg.url, "guard_lost")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_guard_lost")
    start = reader.initialOffset()
    guard = "application_name = 'sluice slot guard sluice_test_guard_lost'"
    assert sql(lpg.url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {guard}") == [(True,)]
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a')")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        end, rows = batch(reader, start)
    reader.commit(end)
    assert rows.column("id").to_pylist() == [1]
    assert any("was closed; taking it again" in r.getMessage() for r in caplog.records)
    assert sql(lpg.url, f"SELECT count(*) FROM pg_stat_activity WHERE {guard}") == [(1,)], "held again"
    reader.stop()


def test_a_slot_moved_by_someone_else_while_a_batch_is_read_fails_the_batch_before_any_row(lpg, monkeypatch, caplog):
    t = new_table(lpg.url, "moved")
    slot = "sluice_test_moved"
    reader = stream(lpg.url, table=t, snapshot="false", slot=slot)
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(1, 10) g",
        f"INSERT INTO {t} SELECT g, 'x' FROM generate_series(11, 20) g")
    end = reader.latestOffset(start, reader.getDefaultReadLimit())  # planned: the slot was where it should be
    (part,) = reader.partitions(start, end)
    # Someone else moves the slot past the first transaction before the batch is read.
    (first_commit,) = sql(lpg.url, f"SELECT max(lsn)::text FROM pg_logical_slot_peek_binary_changes('{slot}', NULL, "
                                   f"3, 'proto_version', '1', 'publication_names', '{reader.stream.publication}')")[0]
    sql(lpg.url, f"SELECT pg_replication_slot_advance('{slot}', '{first_commit}')")
    with pytest.raises(DataLossError, match=r"slot 'sluice_test_moved' is at .* past the start .* while the batch "
                                            r"was read"):
        next(iter(reader.read(part)))
    lenient = stream(lpg.url, table=t, snapshot="false", slot=slot, failOnDataLoss="false")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        rows = [b for b in lenient.read(part)]
    assert pa.Table.from_batches(rows).column("id").to_pylist() == list(range(11, 21))
    assert any("going on without them" in r.getMessage() for r in caplog.records)

    # Negative control: without the check the batch silently misses the first transaction.
    monkeypatch.setattr(_read.ChangeReader, "_check_position", lambda self, cur, slot, low: True)
    rows = [b for b in reader.read(part)]
    assert pa.Table.from_batches(rows).column("id").to_pylist() == list(range(11, 21))


@pytest.fixture
def own_server():
    """A server of the test's own: WAL retention is server-wide, and a transaction left open by another test (a
    snapshot holder runs until its timeout) pins every slot's restart point."""
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on"}) as server:
        yield server


def test_a_quiet_table_on_a_busy_database_does_not_hold_back_the_servers_wal(own_server):
    lpg = own_server
    t = new_table(lpg.url, "quiet")
    busy = new_table(lpg.url, "busy_elsewhere", "id int, v text")

    def retained(slot):  # what the server must keep for the slot
        return sql(lpg.url, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) FROM pg_replication_slots "
                            f"WHERE slot_name = '{slot}'")[0][0]

    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_quiet")
    held = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_quiet_held",
                  **{"quiet-advance-wal-bytes": str(1 << 40)})
    start, held_start = reader.initialOffset(), held.initialOffset()
    # ~30 MiB of WAL from a table outside the publication; CHECKPOINT logs the running transactions, which is what
    # lets a slot's restart point move (the server does it every 15 s on its own).
    sql(lpg.url, *[f"INSERT INTO {busy} SELECT g, repeat('x', 100) FROM generate_series(1, 100000) g"] * 2,
        "CHECKPOINT")
    end, rows = batch(reader, start)
    assert end["lsn"] != start["lsn"] and rows.num_rows == 0 and reader.partitions(start, end) == []
    reader.commit(end)
    assert reader.latestOffset(end, reader.getDefaultReadLimit()) == end, "one batch without rows, not one a trigger"
    sql(lpg.url, "CHECKPOINT")
    assert retained("sluice_test_quiet") < 1 << 20
    # Negative control: a query that never moves past a stretch without its own changes holds it all back.
    assert held.latestOffset(held_start, held.getDefaultReadLimit()) == held_start
    assert retained("sluice_test_quiet_held") > 16 << 20

    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a')")
    _, rows = batch(reader, end)
    assert rows.column("id").to_pylist() == [1], "the quiet stretch skipped nothing of the publication"


@pytest.mark.pg_versions
def test_a_transaction_larger_than_a_fetch_batch_streams_in_batches_and_a_stopped_read_lets_go(lpg, monkeypatch):
    import adbc_driver_manager.dbapi as adbc_dbapi

    t = new_table(lpg.url, "large_txn", "id int PRIMARY KEY, v text")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_large_txn", **{"fetch-ranges": "1"})
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} SELECT g, md5(g::text) || md5(g::text) FROM generate_series(1, 300000) g")
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    (part,) = reader.partitions(start, end)
    pulled = []  # the record batches read off the server so far
    fetch_record_batch = adbc_dbapi.Cursor.fetch_record_batch

    def counted(cursor):
        for record_batch in fetch_record_batch(cursor):
            pulled.append(record_batch.num_rows)
            yield record_batch

    monkeypatch.setattr(adbc_dbapi.Cursor, "fetch_record_batch", counted)
    read = reader.read(part)
    first = [next(read)]
    pulled_before_first_rows = len(pulled)
    rows = pa.Table.from_batches(first + list(read))
    assert rows.column("id").to_pylist() == list(range(1, 300001))
    assert pulled_before_first_rows < len(pulled), \
        "one transaction of ~30 MB of messages: rows leave before it is all read off the server, never whole"

    # A read Spark stops early (a task killed) closes its session with the rest unread; the batch reads again whole.
    closed = []
    close = _read.RangeFetch.close
    monkeypatch.setattr(_read.RangeFetch, "close", lambda self, clean=False: closed.append(self) or close(self, clean))
    read = reader.read(part)
    next(read)
    assert closed == []
    read.close()
    assert len(closed) == 1, "the fetch's ADBC session is closed when the read stops"
    again = pa.Table.from_batches(list(reader.read(part)))
    assert again.column("id").to_pylist() == list(range(1, 300001))


def test_a_table_without_a_replica_identity_is_refused_before_publishing_it_breaks_its_updates(lpg, monkeypatch):
    t = new_table(lpg.url, "keyless", "id int, v text")
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a')")
    with pytest.raises(OptionError, match=r"table public\.keyless has no replica identity.*every UPDATE and DELETE "
                                          r"on it would fail.*REPLICA IDENTITY FULL"):
        PostgresChangesDataSource({"url": lpg.url, "table": t, "slot": "sluice_test_keyless"}).schema()
    sql(lpg.url, f"UPDATE {t} SET v = 'b'")  # still writable: nothing was published
    sql(lpg.url, f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_keyless")
    start = reader.initialOffset()
    sql(lpg.url, f"UPDATE {t} SET v = 'c'")
    assert [(r["_op"], r["v"]) for r in batch(reader, start)[1].to_pylist()] == [("update", "c")]

    # Negative control: published without the check, the table's updates fail in the database itself.
    other = new_table(lpg.url, "keyless_published", "id int, v text")
    sql(lpg.url, f"INSERT INTO {other} VALUES (1, 'a')")
    monkeypatch.setattr(_publication, "_check_replica_identity", lambda pg, tables: None)
    PostgresChangesDataSource({"url": lpg.url, "table": other, "slot": "sluice_test_keyless_published"}).schema()
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="does not have a replica identity"):
        sql(lpg.url, f"UPDATE {other} SET v = 'b'")
    sql(lpg.url, "DROP PUBLICATION sluice_test_keyless_published")


def test_a_publications_column_list_shapes_the_schema_and_left_out_operations_are_a_warning(lpg, monkeypatch,
                                                                                            caplog):
    t = new_table(lpg.url, "listed", "id int PRIMARY KEY, v text, secret text")
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a', 'hidden')",
        f"CREATE PUBLICATION listed_cols FOR TABLE {t} (id, v)")
    reader = stream(lpg.url, publication="listed_cols", slot="sluice_test_listed")
    assert "secret" not in reader.schema.fieldNames()
    start = reader.initialOffset()
    end, snapshot = batch(reader, start)
    reader.commit(end)
    sql(lpg.url, f"INSERT INTO {t} VALUES (2, 'b', 'hidden too')")
    _, changes = batch(reader, end)
    assert [(r["id"], r["v"]) for r in snapshot.to_pylist() + changes.to_pylist()] == [(1, "a"), (2, "b")]
    reader.stop()
    # Negative control: the table's own columns instead of the publication's: the snapshot carries a column the
    # changes never do (null in every change).
    monkeypatch.setattr(_publication, "_sent_columns", lambda pg, publication, tables: {})
    whole = stream(lpg.url, publication="listed_cols", slot="sluice_test_listed_whole")
    start = whole.initialOffset()
    end, snapshot = batch(whole, start)
    whole.commit(end)
    sql(lpg.url, f"INSERT INTO {t} VALUES (3, 'c', 'hidden as well')")
    _, changes = batch(whole, end)
    assert [r["secret"] for r in snapshot.to_pylist() + changes.to_pylist()] == ["hidden", "hidden too", None]
    whole.stop()

    sql(lpg.url, f"CREATE PUBLICATION inserts_only FOR TABLE {t} WITH (publish = 'insert')")
    with caplog.at_level("WARNING", logger="sluice.postgres"):
        stream(lpg.url, publication="inserts_only", slot="sluice_test_inserts_only")
    assert any("publication inserts_only does not publish update, delete, truncate" in r.getMessage()
               for r in caplog.records)


def test_quoted_names_stream_and_generated_columns_are_left_out_as_pgoutput_leaves_them(lpg, monkeypatch):
    sql(lpg.url, 'CREATE TABLE "Orders" ("Id" int PRIMARY KEY, "Qty" int, '
                 '"Twice" int GENERATED ALWAYS AS ("Qty" * 2) STORED)',
        'INSERT INTO "Orders" ("Id", "Qty") VALUES (1, 5)')

    def snapshot_then_a_change(slot):
        reader = stream(lpg.url, table='public."Orders"', slot=slot)
        start = reader.initialOffset()
        end, snapshot = batch(reader, start)
        reader.commit(end)
        sql(lpg.url, f'INSERT INTO "Orders" ("Id", "Qty") VALUES ({len(slot)}, 7)')
        _, changes = batch(reader, end)
        reader.stop()
        return reader.schema.fieldNames(), snapshot.to_pylist() + changes.to_pylist()

    names, rows = snapshot_then_a_change("sluice_test_quoted")
    assert names[:2] == ["Id", "Qty"] and "Twice" not in names, "pgoutput does not send generated columns"
    assert [(r["_table"], r["Id"], r["Qty"]) for r in rows] == [("public.Orders", 1, 5), ("public.Orders", 18, 7)]
    # Negative control: with the generated column in the schema, the snapshot has its values and no change does.
    monkeypatch.setattr(_publication, "_sent_columns", lambda pg, publication, tables: {})
    _, rows = snapshot_then_a_change("sluice_test_quoted_all")
    assert [r["Twice"] for r in rows] == [10, 14, None]  # two snapshot rows, then the change


def test_a_partitioned_table_streams_under_its_own_name_rows_moving_between_partitions_included(lpg):
    sql(lpg.url, "CREATE TABLE events (id int, day date, v text, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)",
        "CREATE TABLE events_h1 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-07-01')",
        "CREATE TABLE events_h2 PARTITION OF events FOR VALUES FROM ('2026-07-01') TO ('2027-01-01')",
        "INSERT INTO events VALUES (1, '2026-02-01', 'a'), (2, '2026-08-01', 'b')")
    reader = stream(lpg.url, table="events", slot="sluice_test_partitioned")
    start = reader.initialOffset()
    end, snapshot = batch(reader, start)
    reader.commit(end)
    sql(lpg.url, "INSERT INTO events VALUES (3, '2026-03-01', 'c')",
        "UPDATE events SET day = '2026-10-01' WHERE id = 1")  # moves the row to the other partition
    _, changes = batch(reader, end)
    reader.stop()
    assert {r["_table"] for r in snapshot.to_pylist() + changes.to_pylist()} == {"public.events"}
    assert sorted(r["id"] for r in snapshot.to_pylist()) == [1, 2]
    assert [(r["_op"], r["id"], str(r["day"])) for r in changes.to_pylist()] == [
        ("insert", 3, "2026-03-01"), ("delete", 1, "2026-02-01"), ("insert", 1, "2026-10-01")]
    # A publication of one's own that sends the partitions' changes under their names is refused with the fix.
    sql(lpg.url, "CREATE PUBLICATION events_leaves FOR TABLE events")
    with pytest.raises(OptionError, match=r"partitioned.*publish_via_partition_root = true"):
        stream(lpg.url, table="events", publication="events_leaves", slot="sluice_test_partition_leaves")


def test_bad_options_fail_before_anything_is_created(lpg):
    with pytest.raises(OptionError, match="Did you mean 'max-changes-per-trigger'"):
        PostgresChangesDataSource({"url": lpg.url, "table": "x", "max-changes-per-trigger2": "1"}).schema()
    with pytest.raises(OptionError, match="needs option 'table'"):
        PostgresChangesDataSource({"url": lpg.url}).schema()
    with pytest.raises(OptionError, match="not a valid replication slot name"):
        PostgresChangesDataSource({"url": lpg.url, "table": "x", "slot": "Bad-Name"}).schema()
    with pytest.raises(OptionError, match=r"table public\.missing does not exist \(option 'table'\)"):
        PostgresChangesDataSource({"url": lpg.url, "table": "missing"}).schema()
    with pytest.raises(OptionError, match="publication 'nope' does not exist"):
        PostgresChangesDataSource({"url": lpg.url, "publication": "nope"}).schema()
    with pytest.raises(OptionError) as refused:
        PostgresChangesDataSource({"url": lpg.url, "table": "x"}).reader(None)
    assert "stream" in str(refused.value) and lpg.password not in str(refused.value)


def test_wal_level_replica_is_refused_with_the_fix():
    with LocalPostgres(settings={"wal_level": "replica"}) as replica, \
            pytest.raises(PostgresError, match=r"wal_level=replica.*wal_level = logical"):
        PostgresChangesDataSource({"url": replica.url, "table": "x"}).schema()


# ------------------------------------------------------------------------------------------------ in Spark
def transfers(url, accounts, stop, seed, errors):
    """Transactions moving money between two accounts until `stop` is set: the total never changes at a commit."""
    import random

    rnd = random.Random(seed)
    try:
        with psycopg.connect(url, autocommit=False) as conn:
            while not stop.wait(0.01):  # paced (<= 100 transactions/s) so the queries keep up
                a, b = sorted(rnd.sample(range(accounts), 2))  # rows locked in id order: no deadlocks
                amount = rnd.randint(-50, 50)
                conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, a))
                conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, b))
                conn.commit()
    except Exception as e:  # handed to the test thread, which fails with it
        errors.append(e)
        raise


@pytest.mark.spark
def test_transfers_stream_into_postgres_and_the_table_store_untorn_and_exactly_once_across_a_kill(
        spark, lpg, tmp_path):
    """Money moves between accounts in concurrent transactions while the queries start (snapshot hand-over), run,
    and one is killed mid-batch and restarted. Every committed micro-batch of the replicas holds the source's total
    (no transaction torn), and at the end both equal the source row for row (nothing lost, nothing applied twice)."""
    from deltalake import DeltaTable
    from pyspark.errors import StreamingQueryException

    accounts, total = 40, 40 * 1000
    sql(lpg.url, "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, owner text)",
        f"INSERT INTO accounts SELECT g, 1000, 'owner ' || g FROM generate_series(0, {accounts - 1}) g",
        "CREATE TABLE replica (id int PRIMARY KEY, balance bigint, owner text)")
    errors: list[Exception] = []
    stop = threading.Event()
    workers = [threading.Thread(target=transfers, args=(lpg.url, accounts, stop, seed, errors)) for seed in (1, 2)]
    for w in workers:
        w.start()
    warehouse, meta = str(tmp_path / "wh"), str(tmp_path / "meta.db")
    marker = str(tmp_path / "die")

    def changes(slot):
        return spark.readStream.format("postgres_changes").options(url=lpg.url, table="accounts", slot=slot) \
            .option("max-changes-per-trigger", "500").load().select("id", "balance", "owner", "_op")

    def start_store():
        return changes("sluice_to_store").writeStream.format("tablestore").options(
            table="accounts", warehouse=warehouse, meta=meta, **{"primary-key": "id", "upsert.op-column": "_op"}) \
            .option("checkpointLocation", str(tmp_path / "ck-store")).start()

    def start_pg():
        rows = changes("sluice_to_pg")
        return rows.mapInArrow(die_while(marker), rows.schema).writeStream.format("postgres").options(
            url=lpg.url, table="replica", **{"primary-key": "id", "upsert.op-column": "_op",
                                             "sink.mode": "global-ordered", "sink.transactional": "true"}) \
            .option("checkpointLocation", str(tmp_path / "ck-pg")).start()

    to_store, to_pg = start_store(), start_pg()
    states: set[str] = set()  # distinct replica states seen while the transfers run
    while len(states) < 8 and any(w.is_alive() for w in workers):
        assert to_store.exception() is None and to_pg.exception() is None
        count, replica_total, state = sql(lpg.url, "SELECT count(*), coalesce(sum(balance), 0), "
                                                   "md5(string_agg(balance::text, ',' ORDER BY id)) FROM replica")[0]
        if count:
            assert replica_total == total, f"the replica's total {replica_total} != {total}: a torn transaction"
            states.add(state)
        stop.wait(0.05)
    stop.set()
    for w in workers:
        w.join()
    assert not errors
    assert len(states) >= 3, "the replica changed too few times while the transfers ran"

    # Kill the PostgreSQL hop mid-batch (its tasks die, both attempts), then restart it from its checkpoint.
    open(marker, "w").close()
    sql(lpg.url, "BEGIN; UPDATE accounts SET balance = balance - 5 WHERE id = 0; "
                 "UPDATE accounts SET balance = balance + 5 WHERE id = 1; COMMIT")
    with pytest.raises(StreamingQueryException):
        to_pg.awaitTermination(120)
    os.unlink(marker)
    to_pg = start_pg()
    sql(lpg.url, "BEGIN; INSERT INTO accounts SELECT 40, balance, 'owner 40' FROM accounts WHERE id = 39; "
                 "DELETE FROM accounts WHERE id = 39; COMMIT")
    for q in (to_store, to_pg):
        q.processAllAvailable()
        q.stop()

    source = sql(lpg.url, "SELECT id, balance, owner FROM accounts ORDER BY id")
    assert sql(lpg.url, "SELECT id, balance, owner FROM replica ORDER BY id") == source
    table = DeltaTable(f"{warehouse}/accounts")
    stored = table.to_pyarrow_table(columns=["id", "balance", "owner"]).sort_by("id").to_pylist()
    assert [tuple(r.values()) for r in stored] == [tuple(r) for r in source]
    # Every version the table-store sink committed holds the total: no micro-batch tore a transaction.
    versions = range(1, table.version() + 1)
    assert len(versions) > 5
    for version in versions:
        at = DeltaTable(f"{warehouse}/accounts", version=version).to_pyarrow_table(columns=["balance"])
        assert at.num_rows == 0 or pa.compute.sum(at.column("balance")).as_py() == total, f"version {version}"


def test_a_truncate_is_applied_in_its_batch_in_global_order_and_refused_by_name_where_it_cannot_be(lpg,
                                                                                                monkeypatch):
    """The postgres sink in global-ordered mode (not staged: a temporary table per batch) empties the target at the
    truncate and keeps the changes after it. In partition-ordered mode (batches of different keys at once) it
    refuses it, and so does a sink that cannot empty its target (s2_upsert), naming it, when it encodes the chunk:
    before any row of it is buffered, let alone written."""
    from sluice.connector import RecordError, TruncateRefusedError, WriteContext, from_arrow_schema
    from sluice.connectors.postgres import PostgresDataSource
    from sluice.connectors.s2 import _codec
    from sluice.connectors.s2._options import UPSERT_SPEC, UpsertWriteOptions
    from sluice.engine import AsyncSinkWriter

    t, target = new_table(lpg.url, "refused"), new_table(lpg.url, "refused_replica")
    reader = stream(lpg.url, table=t, snapshot="false", slot="sluice_test_refused")
    start = reader.initialOffset()
    sql(lpg.url, f"INSERT INTO {t} VALUES (1, 'a')", f"TRUNCATE {t}", f"INSERT INTO {t} VALUES (2, 'b')",
        f"INSERT INTO {target} VALUES (9, 'from an earlier batch')")
    _, rows = batch(reader, start)
    changes = rows.select(["id", "v", "_op"]).combine_chunks().to_batches()[0]
    assert changes.column("_op").to_pylist() == ["insert", "truncate", "insert"]
    upsert = {"url": lpg.url, "table": target, "primary-key": "id", "upsert.op-column": "_op"}

    def task(options):
        plan = PostgresDataSource(options)._plan(from_arrow_schema(changes.schema), overwrite=False, streaming=False)
        return plan, plan.open_task(WriteContext(write_id="w", partition_id=0))

    with pytest.raises(TruncateRefusedError, match=r"upsert.op-column '_op' has the value 'truncate'.*"
                                                   r"sink.mode=partition-ordered .*Set sink.mode=global-ordered"):
        task(upsert)[1].encode(changes)  # the default mode of upserts
    plan, ordered = task({**upsert, "sink.mode": "global-ordered"})
    with AsyncSinkWriter(ordered.store, plan.config, context=WriteContext(write_id="w", partition_id=0)) as writer:
        encoded = ordered.encode(changes)
        writer.write_chunk(encoded.entries, encoded.sizes)
        writer.finish()
    assert sql(lpg.url, f"SELECT id, v FROM {target}") == sql(lpg.url, f"SELECT id, v FROM {t}") == [(2, "b")]

    s2 = _codec.S2Encoder(UpsertWriteOptions.of(UPSERT_SPEC.parse({
        "s2.basin": "b", "s2.auth-token": "t", "s2.endpoints.account": "http://h:1", "s2.endpoints.basin": "http://h:1",
        "s2.stream": "s", "primary-key": "id", "upsert.op-column": "_op"})), changes.schema.names, WriteContext(),
        stamp=False)
    with pytest.raises(TruncateRefusedError, match=r"upsert.op-column '_op' has the value 'truncate'.*the s2 sink "
                                                   r"cannot apply.*format\('postgres'\) or format\('tablestore'\)"):
        s2(changes)
    # The control: without the refusal, a row without its key, which errors.tolerance=all would send aside as a bad
    # record while the stream goes on with the target's rows left in place.
    monkeypatch.setattr(_codec, "refuse_truncate", lambda *args: None)
    with pytest.raises(RecordError, match=r"primary-key column 'id' has 1 null"):
        s2(changes)


@pytest.mark.spark
def test_a_truncate_between_changes_reaches_postgres_and_the_table_store_in_order(spark, lpg, tmp_path):
    """Inserts, then one transaction of an insert, a TRUNCATE, inserts and an update, then an insert, in three
    micro-batches: the postgres sink (staged, global-ordered) and the table store empty their target at the truncate
    and keep what came after, equal to the source. Negative control: the same stream without its truncate events
    keeps rows the source no longer has."""
    from deltalake import DeltaTable

    sql(lpg.url, *[f"CREATE TABLE {name} (id int PRIMARY KEY, v text)"
                   for name in ("emptied", "emptied_pg", "emptied_ignored")])
    slots = ("sluice_emptied_store", "sluice_emptied_pg", "sluice_emptied_ignored")
    for slot in slots:  # the queries stream from the slots' positions: every change below is theirs
        stream(lpg.url, table="emptied", snapshot="false", slot=slot).initialOffset()
    sql(lpg.url, "INSERT INTO emptied VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "BEGIN; INSERT INTO emptied VALUES (4, 'd'); TRUNCATE emptied; "
        "INSERT INTO emptied VALUES (5, 'e'), (6, 'f'); UPDATE emptied SET v = 'f2' WHERE id = 6; COMMIT",
        "INSERT INTO emptied VALUES (7, 'g')")
    warehouse, meta = str(tmp_path / "wh"), str(tmp_path / "meta.db")
    upsert = {"primary-key": "id", "upsert.op-column": "_op"}
    ordered = {**upsert, "sink.mode": "global-ordered", "sink.transactional": "true"}

    def start(slot, fmt, keep=lambda rows: rows, **options):
        rows = spark.readStream.format("postgres_changes").options(url=lpg.url, table="emptied", slot=slot) \
            .option("snapshot", "false").option("max-changes-per-trigger", "3").load()  # a transaction a batch
        return keep(rows.select("id", "v", "_op")).writeStream.format(fmt).options(**options) \
            .option("checkpointLocation", str(tmp_path / slot)).start()

    queries = [start(slots[0], "tablestore", table="emptied", warehouse=warehouse, meta=meta, **upsert),
               start(slots[1], "postgres", url=lpg.url, table="emptied_pg", **ordered),
               start(slots[2], "postgres", lambda rows: rows.where("_op <> 'truncate'"), url=lpg.url,
                     table="emptied_ignored", **ordered)]
    for q in queries:
        q.processAllAvailable()
        assert len([p for p in q.recentProgress if p["numInputRows"]]) == 3
        q.stop()

    source = sql(lpg.url, "SELECT id, v FROM emptied ORDER BY id")
    assert source == [(5, "e"), (6, "f2"), (7, "g")]
    assert sql(lpg.url, "SELECT id, v FROM emptied_pg ORDER BY id") == source
    table = DeltaTable(f"{warehouse}/emptied")
    stored = table.to_pyarrow_table(columns=["id", "v"]).sort_by("id").to_pylist()
    assert [(r["id"], r["v"]) for r in stored] == source
    assert table.version() == 3  # created (0), then one version per micro-batch, the TRUNCATE included
    # The control: the truncate events left out, the rows from before the TRUNCATE stay.
    assert sql(lpg.url, "SELECT id FROM emptied_ignored ORDER BY id") == [(i,) for i in range(1, 8)]


def test_renames_map_a_relation_by_its_place_before_them_and_by_name_after_them_a_swap_included():
    from sluice.connectors.postgres.changes._columns import Renamed, TableColumns, renamed

    before = (TableColumns("public.t", 7, ((1, "id"), (2, "b"), (3, "c"))),)
    swapped = (TableColumns("public.t", 7, ((1, "id"), (2, "c"), (3, "b"))),)
    moves = renamed(before, swapped)["public.t"]
    assert moves == Renamed(("id", "b", "c"), {"b": "c", "c": "b"})
    assert moves.under_new_names(["id", "b", "c"]) == ["id", "c", "b"]  # sent before the swap
    assert moves.under_new_names(["id", "c", "b"]) == ["id", "c", "b"]  # after it
    one = renamed(before[:1], (TableColumns("public.t", 7, ((1, "id"), (2, "x"), (3, "c"))),))["public.t"]
    assert one.under_new_names(["id", "x", "c", "b"]) == ["id", "x", "c", "b"]  # a new column took the old name
    # The same name, another table (dropped and created again): nothing is taken for a rename.
    assert renamed(before, (TableColumns("public.t", 8, ((1, "id"), (2, "x"), (3, "c"))),)) == {}
    assert renamed(None, swapped) == {}
