"""A change stream's replication slot: its state on the server, the guard that gives it to one query at a time, and
the operations `sluice postgres slots` / `drop-slot` run."""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sluice.connector import ConflictError, OptionError, SourceReport
from sluice.connectors.postgres._client import Connection, PostgresError, quote_ident, sqlstate_of
from sluice.connectors.postgres._pgoutput import parse_lsn
from sluice.connectors.postgres._snapshot_holder import holder_name

log = logging.getLogger("sluice.postgres")

# The settings of every session that decodes the slot: pgoutput's text values are parsed in these formats.
DECODING_SESSION = ("SET DateStyle = ISO", "SET TimeZone = 'UTC'", "SET IntervalStyle = postgres",
            "SET bytea_output = hex")
_SLOT_BUSY = "55006"  # object_in_use: another backend is decoding the slot (a killed task's, for a moment)
NO_FREE_SLOT = "53400"  # configuration_limit_exceeded: all max_replication_slots are in use
_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out


@dataclass(frozen=True)
class SlotState:
    confirmed: int
    restart: int
    wal_status: str | None
    retained_bytes: int
    invalidation_reason: str | None = None  # PostgreSQL 17+ says why a slot was invalidated

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.invalidation_reason is not None

    def why_invalidated(self) -> str:
        return INVALIDATION_REASONS.get(self.invalidation_reason or "wal_removed",
                                        f"the server invalidated it ({self.invalidation_reason})")


# pg_replication_slots.invalidation_reason (PostgreSQL 17; idle_timeout since 18) in words; before 17 a lost slot
# has wal_status 'lost' only, which then always means removed WAL.
INVALIDATION_REASONS = {
    "wal_removed": "the server removed WAL it still needed (max_slot_wal_keep_size)",
    "idle_timeout": "it was unused for longer than the server's idle_replication_slot_timeout",
    "rows_removed": "rows it needed were vacuumed away (on a standby: hot_standby_feedback off)",
    "wal_level_insufficient": "the server's wal_level was lowered below logical",
}


def slot_state(pg: Any, slot: str) -> SlotState | None:
    # to_jsonb(s): invalidation_reason exists from PostgreSQL 17 on; older servers give null.
    row = pg.execute("SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, "
                     "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                     "to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s "
                     "WHERE slot_name = %s AND database = current_database()", (slot,)).fetchone()
    if row is None:
        return None
    return SlotState(parse_lsn(row[0]) if row[0] else 0, parse_lsn(row[1]) if row[1] else 0, row[2], row[3] or 0,
                     row[4])


def slot_lag(pg: Any, slot: str) -> SourceReport | None:
    """How far the slot is behind the server's WAL, and the WAL it holds back (sluice.metrics' source report)."""
    row = pg.execute("SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text, "
                     "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, "
                     "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint "
                     "FROM pg_replication_slots WHERE slot_name = %s AND database = current_database()",
                     (slot,)).fetchone()
    if row is None:
        return None
    return SourceReport(format="postgres_changes", source=slot, pending_bytes=max(0, row[2]),
                        retained_bytes=max(0, row[3]), position=row[0] or "", head=row[1], at=time.time())


def holder_of(pg: Any, slot: str) -> tuple[str, str] | None:
    """(snapshot id, notify channel) of the running process that holds `slot`'s exported snapshot, if any."""
    prefix = holder_name(slot, "", "").rsplit("/", 2)[0] + "/"
    row = pg.execute("SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, %s) "
                     "LIMIT 1", (prefix,)).fetchone()
    if row is None:
        return None
    _, _, snapshot, suffix = row[0].split("/")
    return snapshot, f"sluice_snap_{suffix}"


SLOT_GUARD_WAIT_S = 15  # a query restarted at once may find its last run's session still closing


def guard_name(slot: str) -> str:
    """The application_name of the session holding `slot` for a running query (visible in pg_stat_activity)."""
    return f"sluice slot guard {slot}"[:63]


def slot_holder(pg: Any, slot: str) -> str | None:
    """Which running query holds `slot` (its guard session), if any is visible to this user."""
    row = pg.execute("SELECT pid, host(client_addr), backend_start FROM pg_stat_activity "
                     "WHERE application_name = %s AND pid <> pg_backend_pid() LIMIT 1", (guard_name(slot),)).fetchone()
    if row is None:
        return None
    pid, addr, since = row
    return f"server process {pid}, client {addr or 'local socket'}, since {since:%Y-%m-%d %H:%M:%S %Z}"


class SlotGuard:
    """One query per slot. Two queries on one slot (the default slot name is the same for the same tables) would each
    advance it past the other's position, and the other's changes would be gone. The driver holds an advisory lock
    named after the slot, on a session of its own, for the query's life; a second query waits SLOT_GUARD_WAIT_S for it
    and then fails at start, before either loses anything. The server drops the lock with the session: stop(), the
    driver's process exiting, or (its machine gone) the session's TCP keepalives, within about a minute."""

    def __init__(self, conn: Connection, slot: str) -> None:
        self.conn, self.slot = conn, slot
        self.key = int.from_bytes(hashlib.blake2b(f"sluice slot {slot}".encode(), digest_size=8).digest(), "big",
                                  signed=True)
        self.name = guard_name(slot)
        self._pg: Any = None

    def hold(self) -> Any:
        """Take the lock, or make sure this session still has it (a session the server closed is taken again).
        Returns the session, which the driver also plans micro-batches on: Spark asks for the latest offset every
        few milliseconds while nothing comes, and a connection each time would be that many logins."""
        import psycopg

        if self._pg is not None:
            try:
                self._pg.execute("SELECT 1")
                return self._pg
            except psycopg.Error:
                log.warning("the session holding slot %s for this query was closed; taking it again", self.slot)
                self.release()
        pg = self.conn.connect_psycopg()
        try:
            pg.execute("SELECT set_config('application_name', %s, false)", (self.name,))
            for setting, value in (("tcp_keepalives_idle", "30"), ("tcp_keepalives_interval", "10"),
                                   ("tcp_keepalives_count", "3"), ("lock_timeout", f"{SLOT_GUARD_WAIT_S}s")):
                pg.execute("SELECT set_config(%s, %s, false)", (setting, value))
            if pg.info.server_version >= 140000:  # managed services may end idle sessions
                pg.execute("SELECT set_config('idle_session_timeout', '0', false)")
            self._lock(pg)
            for statement in DECODING_SESSION:
                pg.execute(statement)
        except Exception as e:
            holder = self._holder(pg) if sqlstate_of(e) == _LOCK_NOT_AVAILABLE else None
            pg.close()
            if holder is None:
                raise PostgresError(f"locking slot '{self.slot}' for this query on {self.conn.describe()} failed: "
                                    f"{self.conn.scrub(e)}", sqlstate_of(e)) from None
            raise ConflictError(
                f"option 'slot': replication slot '{self.slot}' is in use by another query ({holder}; waited "
                f"{SLOT_GUARD_WAIT_S} s). Two queries on one slot would each advance it past the other's changes. "
                "Give each query its own slot (.option('slot', ...)); if that query is gone, its session ends within "
                "about a minute") from None
        self._pg = pg
        return pg

    def _lock(self, pg: Any) -> None:
        pg.execute("SELECT pg_advisory_lock(%s)", (self.key,))  # waits lock_timeout for a holder to let go

    def _holder(self, pg: Any) -> str:
        import psycopg

        try:
            holder = slot_holder(pg, self.slot)
        except psycopg.Error:
            holder = None
        return holder or "its session is not visible to this user"

    def release(self) -> None:
        import psycopg

        if self._pg is not None:
            pg, self._pg = self._pg, None
            try:
                # Let go before closing: a session's end is noticed by the server a moment later, and a query
                # restarted at once (or `sluice postgres slots`) should find the slot free.
                pg.execute("SELECT pg_advisory_unlock_all(), set_config('application_name', '', false)")
                pg.close()
            except (OSError, psycopg.Error) as e:  # the server drops the lock with the session either way
                log.debug("closing the session holding slot %s: %s", self.slot, e)
                pg.close()


def busy_retry(action: Any, what: str, conn: Connection, deadline_s: float = 30.0) -> Any:
    """Run `action`; while the slot is in use by another backend (a task being killed), wait and retry."""
    until = time.monotonic() + deadline_s
    delay = 0.1
    while True:
        try:
            return action()
        except Exception as e:
            if sqlstate_of(e) != _SLOT_BUSY or time.monotonic() > until:
                raise PostgresError(f"{what} on {conn.describe()} failed: {conn.scrub(e)}", sqlstate_of(e)) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


@dataclass(frozen=True)
class SlotInfo:
    name: str
    database: str
    active: bool
    confirmed: str | None
    retained_bytes: int
    wal_status: str | None
    query: str | None = None  # the running query holding it (slot_holder), if any
    inactive_since: str | None = None  # PostgreSQL 17+: since when no session used it (None while in use, or older)


def list_slots(conn: Connection, prefix: str = "sluice_") -> list[SlotInfo]:
    """The logical replication slots whose names start with `prefix` (sluice's default names), with retained WAL."""
    with conn.connect_psycopg() as pg:
        # to_jsonb(s): inactive_since exists from PostgreSQL 17 on; older servers give null.
        rows = pg.execute("SELECT slot_name::text, database::text, active, confirmed_flush_lsn::text, "
                          "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint, wal_status, "
                          "to_jsonb(s) ->> 'inactive_since' FROM pg_replication_slots s WHERE slot_type = 'logical' "
                          "AND NOT temporary AND starts_with(slot_name, %s) "
                          "ORDER BY 1", (prefix,)).fetchall()
        return [SlotInfo(name, database, active, confirmed, retained, wal_status, query=slot_holder(pg, name),
                         inactive_since=since)
                for name, database, active, confirmed, retained, wal_status, since in rows]


def drop_slot(conn: Connection, slot: str, *, publication: bool = True, force: bool = False) -> None:
    """Drop a slot (the server keeps WAL for it until then) and the publication sluice created under its name; a
    slot a running query holds only with `force`."""
    with conn.connect_psycopg() as pg:
        if pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is None:
            raise OptionError(f"there is no replication slot '{slot}' on {conn.describe()} (sluice postgres slots "
                              "lists them)")
        holder = slot_holder(pg, slot)
        if holder is not None and not force:
            raise ConflictError(f"replication slot '{slot}' is in use by a running query ({holder}): dropping it is "
                              "data loss for that query. Stop the query first, or force it (--force)")
        busy_retry(lambda: pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,)), f"dropping slot '{slot}'",
                    conn)
        if publication:
            pg.execute(f"DROP PUBLICATION IF EXISTS {quote_ident(slot)}")
