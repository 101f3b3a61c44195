"""Where the MetaService lives: a SQLite file or a PostgreSQL database, its tables, and one transaction discipline.

Jobs coordinate only through database transactions. A transaction that must not interleave with another names
what it serializes on (`locks`: "table:orders" for a table's writer, "query:q1" for a query's micro-batches,
"registry" for registrations, which look at every job's edges for a cycle). SQLite has one write lock for the file
(`BEGIN IMMEDIATE`); PostgreSQL takes a transaction-scoped advisory lock per name, so two jobs registering at once
cannot both become a table's writer or close a cycle between them, while commits to different tables proceed in
parallel.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("sluice.meta")

DEFAULT_PATH = Path(".sluice") / "meta.db"
CONNECT_TIMEOUT_S = 10  # PostgreSQL, unless the URL sets connect_timeout

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS sluice_jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, "
    "host TEXT, pid BIGINT, query_id TEXT, started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS sluice_job_tables (job_id TEXT NOT NULL, table_name TEXT NOT NULL, "
    "role TEXT NOT NULL, PRIMARY KEY (job_id, table_name, role))",
    "CREATE TABLE IF NOT EXISTS sluice_batch_barriers (query_id TEXT NOT NULL, batch_id BIGINT NOT NULL, "
    "barrier BIGINT NOT NULL, PRIMARY KEY (query_id, batch_id))",
    "CREATE TABLE IF NOT EXISTS sluice_aligned_barriers (tables TEXT NOT NULL, start_barrier BIGINT NOT NULL, "
    "barrier BIGINT NOT NULL, PRIMARY KEY (tables, start_barrier))",
    "CREATE TABLE IF NOT EXISTS sluice_barriers (table_name TEXT NOT NULL, barrier BIGINT NOT NULL, "
    "version BIGINT NOT NULL, job_id TEXT, committed_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (table_name, barrier))",
    # Which table feeds which through some job, ever: kept when jobs end (vacuum and consistent reads need it), one
    # row per pair however many runs.
    "CREATE TABLE IF NOT EXISTS sluice_lineage (source TEXT NOT NULL, sink TEXT NOT NULL, PRIMARY KEY (source, sink))",
    # What a job holds in another store (a replication slot), and when it last said so (_holdings.py).
    "CREATE TABLE IF NOT EXISTS sluice_job_holdings (kind TEXT NOT NULL, location TEXT NOT NULL, name TEXT NOT NULL, "
    "job_id TEXT NOT NULL, seen_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (kind, location, name))",
    # Where writes sent refused records (errors.tolerance=all), recorded by their drivers (_deadletters.py).
    "CREATE TABLE IF NOT EXISTS sluice_dead_letters (target TEXT NOT NULL, connector TEXT NOT NULL, "
    "records BIGINT NOT NULL, first_at DOUBLE PRECISION NOT NULL, last_at DOUBLE PRECISION NOT NULL, "
    "write_id TEXT NOT NULL, PRIMARY KEY (target, connector))",
    # claim_writer asks, at every commit, which running job writes a table: by table, not a scan of every job's edges.
    "CREATE INDEX IF NOT EXISTS sluice_job_tables_by_table ON sluice_job_tables (table_name, role)",
)
# Columns added after the first release: (table, column, type), added to an older database when missing.
ADDED_COLUMNS = (("sluice_jobs", "lease_until", "DOUBLE PRECISION"),
                  # An ended job's sources and sinks (JSON): its edge rows are dropped, its history shown.
                  ("sluice_jobs", "ended_tables", "TEXT"),
                  # A running job's last sign of life from its driver (a watched query's progress, _holdings.py).
                  ("sluice_jobs", "seen_at", "DOUBLE PRECISION"))


def check_url(url: str | None) -> str:
    """The MetaService's database URL (default $SLUICE_META, then DEFAULT_PATH), refused when no backend serves it:
    never a SQLite file named 'mysql:' in the working directory."""
    url = url or os.environ.get("SLUICE_META") or str(DEFAULT_PATH)
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() not in ("postgresql", "postgres", "sqlite"):
        from sluice._errors import OptionError

        raise OptionError(f"meta: the MetaService runs on SQLite (a path or sqlite:///path) or PostgreSQL "
                          f"(postgresql://...), not on {scheme}://.")
    return url


class Backend:
    """The differences between SQLite and PostgreSQL that the service needs."""

    def __init__(self, url: str | None) -> None:
        url = check_url(url)
        self.is_pg = url.startswith(("postgresql://", "postgres://"))
        if self.is_pg:
            self.url, self.param = url, "%s"
            self.display = url.split("@")[-1] if "@" in url else url
            from psycopg.conninfo import conninfo_to_dict

            # How long a kept connection's BEGIN may go unanswered: as long as connecting may take (_connections.py).
            self.answer_within = float(conninfo_to_dict(url).get("connect_timeout") or CONNECT_TIMEOUT_S)
        else:
            path = Path(url.removeprefix("sqlite:///").removeprefix("sqlite://"))
            path.parent.mkdir(parents=True, exist_ok=True)
            self.url, self.param, self.display = str(path), "?", str(path)

    def connect(self) -> Any:
        if self.is_pg:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            # A database the network stops answering fails the call instead of holding the job forever (as long as
            # the URL does not say otherwise): connecting gives up after 10 s, keepalives notice a silent peer in
            # about 25 s, unacknowledged requests give up after 30 s. And a client that vanishes mid-transaction
            # (its machine gone) has the server end its session after 60 s, not hold its locks until the server's
            # own keepalives notice, hours later by default.
            # Named in pg_stat_activity, so an operator can count a job's MetaService sessions (docs/deploy.md).
            params: dict[str, Any] = {
                "application_name": "sluice-meta", "connect_timeout": str(CONNECT_TIMEOUT_S), "keepalives": "1",
                "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
                "tcp_user_timeout": "30000", **conninfo_to_dict(self.url)}
            if "idle_in_transaction_session_timeout" not in str(params.get("options", "")):
                params["options"] = f"{params.get('options', '')} -c idle_in_transaction_session_timeout=60000".strip()
            # Transactions are begun and ended by statement (`begin_sql`): the locks go in the same round trip.
            return psycopg.connect(**params, autocommit=True)
        return sqlite3.connect(self.url, timeout=60, isolation_level=None)  # waits up to 60 s for a lock

    def setup(self, conn: Any) -> None:
        if not self.is_pg:
            conn.execute("PRAGMA journal_mode=WAL")  # persistent: readers never wait for the writer

    def columns(self, cur: Cursor, table: str) -> set[str]:
        if self.is_pg:
            cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                        "AND table_schema = current_schema()", (table,))
            return {r[0] for r in cur.fetchall()}
        cur.execute(f"PRAGMA table_info({table})")
        return {r[1] for r in cur.fetchall()}

    def begin_sql(self, locks: Sequence[str]) -> str:
        """PostgreSQL: the statements that begin a transaction holding `locks` (advisory locks, released at its
        end), in one order for every transaction so two holding several cannot deadlock each other."""
        keys = sorted({lock_key(name) for name in locks})
        return "; ".join(["BEGIN", *(f"SELECT pg_advisory_xact_lock({key})" for key in keys)])


def lock_key(name: str) -> int:
    """The advisory lock key of a lock name: a stable 64-bit hash (Python's hash() differs per process). Two names
    sharing a key, or another application's lock of the same key, only make transactions wait for each other."""
    return int.from_bytes(hashlib.blake2b(f"sluice-meta:{name}".encode(), digest_size=8).digest(), "big", signed=True)


class Cursor:
    """A DB-API cursor that takes '?' placeholders on both backends."""

    def __init__(self, cur: Any, param: str) -> None:
        self._cur, self._param = cur, param

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        if self._param != "?":
            sql = sql.replace("?", self._param)
        self._cur.execute(sql, tuple(params))

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


# Databases this process brought up to date already. The table store makes a MetaService at every commit; bringing
# the schema up to date takes the write lock (CREATE ... IF NOT EXISTS), which then queued behind every other job's
# commits once per step. A SQLite file is known by its inode too: a file deleted and made anew is set up again.
_READY: set[tuple[str, int]] = set()


def _ready_key(db: Backend) -> tuple[str, int] | None:
    if db.is_pg:
        return (db.url, 0)
    try:
        return (db.url, os.stat(db.url).st_ino)
    except FileNotFoundError:
        return None


class Transactions:
    """What every part of the MetaService shares: its database (tables created or brought up to date here, once
    per process) and `_tx`, one transaction. On SQLite each transaction opens the file anew; on PostgreSQL it runs
    on a connection this process keeps (_connections.py). Jobs on several machines share the database, never a
    connection."""

    def __init__(self, url: str | None = None) -> None:
        self._db = Backend(url)
        if _ready_key(self._db) in _READY:
            return
        if not self._db.is_pg:
            conn = self._db.connect()
            try:
                self._db.setup(conn)
            finally:
                conn.close()
        # Processes starting at once would race to create the tables (PostgreSQL's CREATE TABLE IF NOT EXISTS
        # fails on a concurrent twin): one at a time.
        with self._tx(write=True, locks=("schema",)) as cur:
            for statement in SCHEMA:
                cur.execute(statement)
            for table, column, kind in ADDED_COLUMNS:
                if column not in self._db.columns(cur, table):
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        key = _ready_key(self._db)
        if key is not None:
            _READY.add(key)

    def close(self) -> None:
        """Close this process's idle connections to this MetaService's database (PostgreSQL; they close at exit
        otherwise). A later call opens one again."""
        if self._db.is_pg:
            from sluice.meta._connections import KEPT

            KEPT.close(self._db.url)

    @contextmanager
    def _tx(self, write: bool = False, locks: Sequence[str] = ()) -> Iterator[Cursor]:
        """One transaction, serialized with the others naming any of `locks` (see the module's docstring)."""
        if self._db.is_pg:
            with self._pg_tx(locks) as cur:
                yield cur
            return
        conn = self._db.connect()
        try:
            # IMMEDIATE takes the file's write lock up front (waiting for it): a deferred transaction that reads
            # and then writes fails at once with "database is locked" when another writer got there first.
            conn.execute("BEGIN IMMEDIATE" if write or locks else "BEGIN")
            yield Cursor(conn.cursor(), self._db.param)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    @contextmanager
    def _pg_tx(self, locks: Sequence[str]) -> Iterator[Cursor]:
        import psycopg  # here, as _connections: a SQLite MetaService never imports them

        from sluice.meta._connections import KEPT, NoAnswer, begin

        sql = self._db.begin_sql(locks)
        conn, stale = KEPT.take(self._db.url), None
        if conn is not None:
            try:
                begin(conn, sql, self._db.answer_within)
            except psycopg.OperationalError as e:
                broken = conn.broken
                conn.close()
                if not broken or isinstance(e, NoAnswer):  # a silent network: connecting would wait as long again
                    raise
                # A kept connection the server ended while it sat idle (a restart, idle_session_timeout): nothing
                # of this transaction ran, so it runs again, once, on a new connection.
                stale = " ".join(str(e).split())
                log.warning("MetaService %s: a kept connection failed before its transaction began (%s); "
                            "connecting again", self._db.display, stale)
                conn = None
            except BaseException:
                conn.close()
                raise
        if conn is None:
            try:
                conn = self._db.connect()
                try:
                    begin(conn, sql, self._db.answer_within)
                except BaseException:
                    conn.close()
                    raise
            except psycopg.Error as e:
                if stale is not None:
                    e.add_note(f"(connecting again after the kept connection to the MetaService {self._db.display} "
                               f"failed: {stale})")
                raise
        try:
            yield Cursor(conn.cursor(), self._db.param)
            conn.execute("COMMIT")
        except BaseException as e:
            if not conn.closed:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error as failed:
                    e.add_note(f"(rolling back on the MetaService's connection failed too: {failed})")
            KEPT.give_back(self._db.url, conn)  # closes it unless it is usable and outside a transaction
            raise
        KEPT.give_back(self._db.url, conn)
