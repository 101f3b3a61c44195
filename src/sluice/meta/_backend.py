"""Where the MetaService lives: a SQLite file or a PostgreSQL database, its tables, and one transaction discipline.

Jobs coordinate only through database transactions: registration takes the database's write lock (SQLite
`BEGIN IMMEDIATE`, PostgreSQL `LOCK TABLE ... IN EXCLUSIVE MODE`), so two jobs registering at once cannot both
become a table's writer or close a cycle between them.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_PATH = Path(".sluice") / "meta.db"

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
            params: dict[str, Any] = {
                "connect_timeout": "10", "keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                "keepalives_count": "3", "tcp_user_timeout": "30000", **conninfo_to_dict(self.url)}
            if "idle_in_transaction_session_timeout" not in str(params.get("options", "")):
                params["options"] = f"{params.get('options', '')} -c idle_in_transaction_session_timeout=60000".strip()
            return psycopg.connect(**params)
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

    def begin(self, conn: Any, exclusive: bool, write: bool) -> None:
        if self.is_pg:
            if exclusive:
                conn.execute("LOCK TABLE sluice_jobs IN EXCLUSIVE MODE")
        else:
            # IMMEDIATE takes the write lock up front (waiting for it): a deferred transaction that reads and
            # then writes fails at once with "database is locked" when another writer got there first.
            conn.execute("BEGIN IMMEDIATE" if write or exclusive else "BEGIN")


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
    per process) and `_tx`, one transaction on a fresh connection (jobs on several machines share the database,
    never a connection)."""

    def __init__(self, url: str | None = None) -> None:
        self._db = Backend(url)
        if _ready_key(self._db) in _READY:
            return
        conn = self._db.connect()
        try:
            self._db.setup(conn)
        finally:
            conn.close()
        with self._tx(write=True) as cur:
            for statement in SCHEMA:
                cur.execute(statement)
            for table, column, kind in ADDED_COLUMNS:
                if column not in self._db.columns(cur, table):
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        key = _ready_key(self._db)
        if key is not None:
            _READY.add(key)

    @contextmanager
    def _tx(self, exclusive: bool = False, write: bool = False) -> Iterator[Cursor]:
        conn = self._db.connect()
        try:
            self._db.begin(conn, exclusive, write)
            cur = conn.cursor()
            yield Cursor(cur, self._db.param)
            conn.commit() if self._db.is_pg else conn.execute("COMMIT")
        except BaseException:
            conn.rollback() if self._db.is_pg else conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()
