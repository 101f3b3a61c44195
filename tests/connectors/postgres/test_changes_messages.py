"""format("postgres_changes") with option 'messages.prefix': logical decoding messages (pg_logical_emit_message,
PostgreSQL 14+), the carrier of the transactional outbox, on a real server. The reader is driven as Spark's
micro-batch loop drives it (test_changes.py's helpers); the outbox into Kafka runs in Spark (tests/connectors/kafka/
test_outbox.py)."""

import psycopg
import pyarrow as pa
import pytest

from sluice import OptionError
from sluice.connectors.postgres import PostgresChangesDataSource
from sluice.connectors.postgres.changes import _publication
from tests.connectors.postgres.test_changes import batch, sql, stream


def emit(conn, prefix, content, transactional=True):
    return conn.execute("SELECT pg_logical_emit_message(%s, %s, %s)::text",
                        (transactional, prefix, content)).fetchone()[0]


def contents(table):
    return [bytes(c).decode() for c in table.column("content").to_pylist()]


@pytest.mark.pg_versions
def test_messages_of_the_listed_prefixes_come_in_commit_order_and_a_rolled_back_ones_never(lpg):
    reader = stream(lpg.url, **{"messages.prefix": "outbox,audit", "slot": "sluice_test_messages"})
    start = reader.initialOffset()
    with psycopg.connect(lpg.url, autocommit=True) as first, psycopg.connect(lpg.url, autocommit=True) as second:
        first.execute("BEGIN")
        emit(first, "outbox", "emitted first, committed second")
        second.execute("BEGIN")
        emit(second, "outbox", "emitted second, committed first")
        emit(second, "audit", "the second prefix")
        emit(second, "other", "a prefix not listed")
        second.execute("COMMIT")
        first.execute("COMMIT")
        first.execute("BEGIN")
        emit(first, "outbox", "rolled back")
        emit(first, "outbox", "not transactional, in the rolled back transaction", transactional=False)
        first.execute("ROLLBACK")
        # A non-transactional message's WAL is flushed by the next commit (or the WAL writer, or flush => true on
        # PostgreSQL 17+); the stream reads up to the flushed position.
        emit(first, "other", "a commit after")
    _, rows = batch(reader, start)
    assert contents(rows) == ["emitted second, committed first", "the second prefix", "emitted first, committed second",
                              "not transactional, in the rolled back transaction"]
    assert rows.column("prefix").to_pylist() == ["outbox", "audit", "outbox", "outbox"]
    assert rows.column("transactional").to_pylist() == [True, True, True, False]
    commits = rows.column("_lsn").to_pylist()
    assert commits[0] == commits[1] < commits[2] < commits[3], "in commit order, a transaction's messages together"
    assert None not in rows.column("_xid").to_pylist()[:3] and rows.column("_xid")[3].as_py() is None
    # Negative controls: the order is the commits', not the messages' own (the first one emitted comes third), and
    # the rolled-back and unlisted messages were sent by the server: listed, they come.
    own = rows.column("message_lsn").to_pylist()
    assert own[2] < own[0]
    reader.stop()
    everything = stream(lpg.url, **{"messages.prefix": "outbox,audit,other", "slot": "sluice_test_messages"})
    _, all_rows = batch(everything, start)
    assert "a prefix not listed" in contents(all_rows) and "rolled back" not in contents(all_rows)
    everything.stop()


def test_a_restart_from_the_checkpoint_replays_the_batch_spark_did_not_commit_and_misses_nothing(lpg):
    options = {"messages.prefix": "outbox", "max-changes-per-trigger": "3"}
    slots = {"kept": "sluice_test_messages_kept", "consumed": "sluice_test_messages_consumed"}
    readers = {case: stream(lpg.url, slot=slot, **options) for case, slot in slots.items()}
    starts = {case: reader.initialOffset() for case, reader in readers.items()}
    with psycopg.connect(lpg.url, autocommit=True) as conn:
        for i in range(10):  # transactional and not, alternating: batches end after one kind or the other
            emit(conn, "outbox", f"m{i}", transactional=i % 2 == 0)
            emit(conn, "elsewhere", f"x{i}", transactional=i % 3 == 0)

    def run(case):
        """Batch 1 committed, batch 2 read and the driver gone before Spark commits it, then the restarted query."""
        reader, at = readers[case], starts[case]
        end, rows = batch(reader, at)
        reader.commit(end)
        seen = contents(rows)
        at, (end, uncommitted) = end, batch(reader, end)
        assert (rows.num_rows, uncommitted.num_rows) == (3, 3), "max-changes-per-trigger"
        reader.stop()
        if case == "consumed":  # the slot moved when the batch was read, as pg_logical_slot_get_changes moves it
            sql(lpg.url, f"SELECT pg_replication_slot_advance('{slots[case]}', '{end['lsn']}')")
        restarted = stream(lpg.url, slot=slots[case], failOnDataLoss="false", **options)
        replayed = [b for p in restarted.partitions(at, end) for b in restarted.read(p)]  # Spark replays batch 2
        seen += [c for b in replayed for c in contents(pa.Table.from_batches([b]))]
        at = end
        while (step := batch(restarted, at))[0] != at:
            at = step[0]
            restarted.commit(at)
            seen += contents(step[1])
        restarted.stop()
        return seen, contents(uncommitted)

    seen, uncommitted = run("kept")
    assert seen == [f"m{i}" for i in range(10)], "every message once, in order, the uncommitted batch replayed"
    # Negative control: a slot moved as the batch was read leaves nothing to replay: batch 2 is lost.
    seen, uncommitted = run("consumed")
    assert seen == [m for m in (f"m{i}" for i in range(10)) if m not in uncommitted] and len(uncommitted) == 3


@pytest.mark.pg_versions
def test_messages_options_are_refused_before_any_read(lpg, monkeypatch):
    with pytest.raises(OptionError, match=r"Did you mean 'messages\.prefix'"):
        PostgresChangesDataSource({"url": lpg.url, "messages.prefx": "outbox"}).schema()
    with pytest.raises(OptionError, match=r"'messages\.prefix' and 'table' together"):
        PostgresChangesDataSource({"url": lpg.url, "messages.prefix": "outbox", "table": "t"}).schema()
    sql(lpg.url, "CREATE TABLE published (id int PRIMARY KEY)", "CREATE PUBLICATION with_tables FOR TABLE published")
    with pytest.raises(OptionError, match="has tables"):
        PostgresChangesDataSource({"url": lpg.url, "messages.prefix": "outbox", "publication": "with_tables"}).schema()
    schema = PostgresChangesDataSource({"url": lpg.url, "messages.prefix": "outbox", "slot": "sluice_m"}).schema()
    assert schema.fieldNames() == ["prefix", "content", "transactional", "message_lsn", "_lsn", "_commit_time", "_xid"]
    # Every server the tests run is 14 or later: the refusal of an older one, on this server said to be 13.
    monkeypatch.setattr(_publication, "_check_server", lambda pg, conn: 130000)
    with pytest.raises(OptionError, match=r"'messages\.prefix' needs PostgreSQL 14 or later"):
        PostgresChangesDataSource({"url": lpg.url, "messages.prefix": "outbox"}).schema()
