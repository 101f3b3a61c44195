"""What differs by PostgreSQL version, on the server the run asked for ($SLUICE_TEST_PG_VERSION: `make
test-postgres-16` and friends; unset: Debian's PostgreSQL 15)."""

import os
import re

import psycopg
import pytest

from sluice import DataLossError, OptionError
from sluice.connectors.postgres.changes import INVALIDATION_REASONS, drop_slot, list_slots
from sluice.testing import LocalPostgres
from tests.connectors.postgres.test_changes import batch, new_table, sql, stream

pytestmark = pytest.mark.pg_versions


def server_major(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000


def test_the_server_is_the_version_the_run_asked_for(pg):
    wanted = os.environ.get("SLUICE_TEST_PG_VERSION")
    if wanted:
        assert server_major(pg.url) == int(wanted)
    else:
        assert server_major(pg.url) >= 15


@pytest.fixture(scope="module")
def small_wal_budget():
    # max_slot_wal_keep_size: a slot that falls more than 1 MB behind is invalidated at the next checkpoint.
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on", "wal_keep_size": "0",
                                 "max_slot_wal_keep_size": "1MB"}) as server:
        yield server


def test_a_slot_the_server_invalidated_is_data_loss_saying_why_and_how_to_go_on(small_wal_budget):
    url = small_wal_budget.url
    t = new_table(url, "invalidated")
    slot = "sluice_test_invalidated"
    reader = stream(url, table=t, snapshot="false", slot=slot)
    start = reader.initialOffset()
    sql(url, f"INSERT INTO {t} VALUES (1, 'lost with the WAL')")
    for _ in range(3):  # whole WAL segments past the 1 MB budget, then the checkpoint that enforces it
        sql(url, "CREATE TABLE IF NOT EXISTS filler (v text)", "INSERT INTO filler VALUES (repeat('x', 1000))",
            "SELECT pg_switch_wal()")
    sql(url, "CHECKPOINT")
    (state,) = sql(url, f"SELECT wal_status FROM pg_replication_slots WHERE slot_name = '{slot}'")
    assert state == ("lost",), "the server invalidated the slot"
    reason = INVALIDATION_REASONS["wal_removed"]
    with pytest.raises(DataLossError, match=re.escape(f"'{slot}' was invalidated: {reason}")
                       + r".*failOnDataLoss.*start over: drop the slot and the checkpoint"):
        reader.latestOffset(start, reader.getDefaultReadLimit())
    reader.stop()
    if server_major(url) >= 17:  # the server says why itself
        (why,) = sql(url, f"SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = '{slot}'")
        assert why == ("wal_removed",)
    # failOnDataLoss=false: a new slot, and the stream goes on from its position
    lenient = stream(url, table=t, snapshot="false", slot=slot, failOnDataLoss="false")
    resumed = lenient.latestOffset(start, lenient.getDefaultReadLimit())
    assert resumed["lsn"] != start["lsn"]
    assert [s.name for s in list_slots(lenient.stream.conn) if s.name == slot] == [slot], "re-created"
    lenient.stop()
    drop_slot(lenient.stream.conn, slot)


# PostgreSQL 18's idle_replication_slot_timeout is in seconds (pg_settings.unit 's'); 0, the default, disables it,
# so 1 s is the shortest timeout there is: the test waits about that long.
IDLE_TIMEOUT_S = 1


@pytest.fixture(scope="module")
def idle_timeout_server(lpg):
    """On 18 and later, a server of its own that invalidates a slot left unused for IDLE_TIMEOUT_S (at a checkpoint);
    None before 18, whose servers refuse the setting at start."""
    if server_major(lpg.url) < 18:
        yield None
        return
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on",
                                 "idle_replication_slot_timeout": f"{IDLE_TIMEOUT_S}s"}) as server:
        yield server


def test_a_slot_left_idle_past_idle_replication_slot_timeout_is_data_loss_on_18_and_kept_without_it(
        lpg, idle_timeout_server):
    if idle_timeout_server is None:  # before 18 nothing invalidates a slot for being unused
        assert sql(lpg.url, "SELECT count(*) FROM pg_settings WHERE name = 'idle_replication_slot_timeout'") == [(0,)]
        return
    # The same query on two servers, stopped with a row committed after its last batch: one server with the
    # timeout, and the negative control, a server without it (lpg: the default, 0), whose slot stays idle as long.
    servers = {"timeout": idle_timeout_server.url, "control": lpg.url}
    restarts = {}
    for name, url in servers.items():
        t = new_table(url, f"idle_{name}")
        slot = f"sluice_test_idle_{name}"
        reader = stream(url, table=t, snapshot="false", slot=slot)
        start = reader.initialOffset()
        sql(url, f"INSERT INTO {t} VALUES (1, 'read before the stop')")
        end, rows = batch(reader, start)
        assert rows.column("id").to_pylist() == [1]
        reader.commit(end)  # the slot's last use: the server counts its idle time from here (inactive_since)
        reader.stop()
        sql(url, f"INSERT INTO {t} VALUES (2, 'committed while the query was stopped')")
        restarts[name] = (url, t, slot, end)
    for url, _, slot, _ in restarts.values():
        # The server invalidates a slot at a checkpoint whose clock is IDLE_TIMEOUT_S past the slot's last use: wait
        # for exactly that instant on the server's own clock (not for a guessed time), then force the checkpoint.
        of_slot = f"FROM pg_replication_slots WHERE slot_name = '{slot}'"
        assert sql(url, f"SELECT pg_sleep_until(inactive_since + make_interval(secs => {IDLE_TIMEOUT_S})) {of_slot}",
                   f"SELECT clock_timestamp() - inactive_since >= make_interval(secs => {IDLE_TIMEOUT_S}) {of_slot}",
                   ) == [(True,)], f"{slot} has been idle for {IDLE_TIMEOUT_S} s"
        sql(url, "CHECKPOINT")
    (why,) = sql(servers["timeout"], "SELECT invalidation_reason FROM pg_replication_slots "
                                     f"WHERE slot_name = '{restarts['timeout'][2]}'")
    assert why == ("idle_timeout",), "the server invalidated the idle slot"
    assert sql(servers["control"], "SELECT invalidation_reason, wal_status FROM pg_replication_slots "
                                   f"WHERE slot_name = '{restarts['control'][2]}'") == [(None, "reserved")]

    # The query restarted from its checkpoint: on the server with the timeout, the user is told which slot, why,
    # and how to go on, before any row is read; without the timeout it reads the row committed while it was stopped.
    url, t, slot, committed = restarts["timeout"]
    reader = stream(url, table=t, snapshot="false", slot=slot)
    reason = INVALIDATION_REASONS["idle_timeout"]
    assert "idle_replication_slot_timeout" in reason
    with pytest.raises(DataLossError, match=re.escape(f"replication slot '{slot}' was invalidated: {reason}: the "
                                                      f"changes from {committed['lsn']} on cannot be read")
                       + r".*failOnDataLoss.*start over: drop the slot and the checkpoint"):
        reader.latestOffset(committed, reader.getDefaultReadLimit())
    reader.stop()
    drop_slot(reader.stream.conn, slot)
    url, t, slot, committed = restarts["control"]
    reader = stream(url, table=t, snapshot="false", slot=slot)
    _, rows = batch(reader, committed)
    reader.stop()
    drop_slot(reader.stream.conn, slot)
    assert rows.column("id").to_pylist() == [2]


def test_a_failover_slot_from_postgresql_17_on_and_a_clear_refusal_before(lpg):
    url = lpg.url
    t = new_table(url, "failover")
    major = server_major(url)
    if major < 17:
        with pytest.raises(OptionError, match=rf"option 'slot.failover' needs PostgreSQL 17 .* runs {major}\."):
            stream(url, table=t, slot="sluice_test_failover", **{"slot.failover": "true"})
        return
    # Both ways sluice creates a slot: with the snapshot (replication protocol) and without (SQL); and the default.
    for snapshot, failover in (("true", "true"), ("false", "true"), ("false", "false")):
        slot = f"sluice_test_failover_{snapshot}_{failover}"
        reader = stream(url, table=t, slot=slot, snapshot=snapshot, **{"slot.failover": failover})
        start = reader.initialOffset()
        end, _ = batch(reader, start)
        reader.commit(end)
        reader.stop()
        assert sql(url, f"SELECT failover FROM pg_replication_slots WHERE slot_name = '{slot}'") == \
            [(failover == "true",)], (snapshot, failover)
        drop_slot(reader.stream.conn, slot)


def test_virtual_generated_columns_of_postgresql_18_are_left_out_like_stored_ones(lpg):
    url = lpg.url
    virtual = "VIRTUAL" if server_major(url) >= 18 else "STORED"  # 18 adds VIRTUAL (and makes it the default)
    sql(url, f"CREATE TABLE gen_{virtual.lower()} (id int PRIMARY KEY, qty int, "
             f"twice int GENERATED ALWAYS AS (qty * 2) {virtual})",
        f"INSERT INTO gen_{virtual.lower()} (id, qty) VALUES (1, 5)")
    reader = stream(url, table=f"gen_{virtual.lower()}", slot=f"sluice_test_gen_{virtual.lower()}")
    start = reader.initialOffset()
    end, snapshot = batch(reader, start)
    reader.commit(end)
    sql(url, f"INSERT INTO gen_{virtual.lower()} (id, qty) VALUES (2, 7)")
    _, changes = batch(reader, end)
    reader.stop()
    assert "twice" not in reader.schema.fieldNames(), "pgoutput sends no generated column"
    assert [(r["id"], r["qty"]) for r in snapshot.to_pylist() + changes.to_pylist()] == [(1, 5), (2, 7)]


def test_from_16_on_each_batch_logs_a_restart_point_the_slot_moves_to(lpg):
    """Every peek decodes from the slot's restart_lsn, which moves only past a running-transactions record. From 16
    on the reader logs one per planned batch (pg_log_standby_snapshot), so after two more batches the slot restarts
    from it; switched off (and before 16) no record is logged and the server's own, every 15 s, are all there is."""
    from sluice.connectors.postgres._pgoutput import parse_lsn

    t = new_table(lpg.url, "restart_points")
    major = server_major(lpg.url)
    for on in (True, False):
        slot = f"restart_points_{str(on).lower()}"
        reader = stream(lpg.url, table=t, snapshot="false", slot=slot, **{"slot.log-restart-point": str(on).lower()})
        position = reader.initialOffset()
        logged = []
        for i in range(3):
            sql(lpg.url, f"INSERT INTO {t} VALUES ({i + 10 * on}, 'x')")
            end, rows = batch(reader, position)
            assert rows.num_rows == 1
            reader.commit(end)
            position = end
            logged.append(reader.reportLatestOffset().get("restart_point"))
        restart = parse_lsn(sql(lpg.url, f"SELECT restart_lsn::text FROM pg_replication_slots "
                                         f"WHERE slot_name = '{slot}'")[0][0])
        reader.stop()
        if on and major >= 16:
            assert all(logged), logged
            assert restart >= parse_lsn(logged[0]), f"restart_lsn {restart:X} did not reach the first point {logged}"
        else:
            assert logged == [None] * 3, "no running-transactions record logged"
