"""MetaService (FLIP-276): jobs, their source and sink tables, and each table's completed barriers.

Lives in a real database: a SQLite file by default (`.sluice/meta.db`), PostgreSQL when jobs run on several
machines. Jobs coordinate only through database transactions: registration takes the database's write
lock (SQLite `BEGIN IMMEDIATE`, PostgreSQL `LOCK TABLE ... IN EXCLUSIVE MODE`), so two jobs registering at
once cannot both become a table's writer or close a cycle between them.

A barrier is a logical timestamp in ms. A table completes a barrier when the commit holding it is done; the
table's Delta version for that barrier is recorded with it. The consistent version of a set of tables is the
largest barrier every one of them has completed, with each table's version for it; tables the set depends on
(upstream through jobs) must have completed it too.

One module past ~400 lines, for now: the backend (SQLite or PostgreSQL, its connection settings), the schema, jobs
and barriers share one connection-and-transaction helper and the registration lock; splitting them into backend,
schema, jobs and barriers modules is the next step of issue 33's restructuring, with the pruning of old barrier
rows (the soak's one unbounded growth) in the barriers module.

One module past 400 lines: its storage backend, schema, jobs and barriers share one connection and transaction
discipline; splitting them (backend, schema, jobs, barriers) is a step of its own (the restructuring issue, 33).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sluice._errors import ConflictError, SluiceError

DEFAULT_PATH = Path(".sluice") / "meta.db"
RUNNING, FINISHED, FAILED, RELEASED = "running", "finished", "failed", "released"
# Micro-batches of a query whose barrier bookkeeping is kept for replays (older rows are deleted as new ones come):
# Spark keeps the metadata of spark.sql.streaming.minBatchesToRetain (default 100) batches and can replay no
# batch older than that; twice that leaves room for a raised setting.
REPLAYABLE_BATCHES = 200

_SCHEMA = (
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
)
# Columns added after the first release: (table, column, type), added to an older database when missing.
_ADDED_COLUMNS = (("sluice_jobs", "lease_until", "DOUBLE PRECISION"),
                  # An ended job's sources and sinks (JSON): its edge rows are dropped, its history shown.
                  ("sluice_jobs", "ended_tables", "TEXT"))


class MetaError(SluiceError):
    """The MetaService refused a request; the message says why and what to do."""


class WriterConflictError(MetaError, ConflictError):
    """A sink table already has an active writing job."""


class LineageCycleError(MetaError):
    """Registering the job would close a cycle of jobs and tables."""


class NoConsistentVersionError(MetaError):
    """The tables have no barrier in common yet."""


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    status: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    host: str | None = None
    pid: int | None = None
    query_id: str | None = None
    started_at: float = 0.0
    ended_at: float | None = None


@dataclass(frozen=True)
class ConsistentVersion:
    barrier: int
    versions: dict[str, int] = field(default_factory=dict)


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


class _Backend:
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
            params = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                      "keepalives_count": "3", "tcp_user_timeout": "30000", **conninfo_to_dict(self.url)}
            if "idle_in_transaction_session_timeout" not in str(params.get("options", "")):
                params["options"] = f"{params.get('options', '')} -c idle_in_transaction_session_timeout=60000".strip()
            return psycopg.connect(**params)
        return sqlite3.connect(self.url, timeout=60, isolation_level=None)  # waits up to 60 s for a lock

    def setup(self, conn: Any) -> None:
        if not self.is_pg:
            conn.execute("PRAGMA journal_mode=WAL")  # persistent: readers never wait for the writer

    def columns(self, cur: _Cursor, table: str) -> set[str]:
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


class MetaService:
    """Jobs, lineage and completed barriers. `MetaService()` opens `.sluice/meta.db` (or $SLUICE_META)."""

    def __init__(self, url: str | None = None) -> None:
        self._db = _Backend(url)
        conn = self._db.connect()
        try:
            self._db.setup(conn)
        finally:
            conn.close()
        with self._tx(write=True) as cur:
            for statement in _SCHEMA:
                cur.execute(statement)
            for table, column, kind in _ADDED_COLUMNS:
                if column not in self._db.columns(cur, table):
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def __repr__(self) -> str:
        return f"MetaService({self._db.display})"

    # ------------------------------------------------------------------ plumbing
    @contextmanager
    def _tx(self, exclusive: bool = False, write: bool = False) -> Iterator[Any]:
        conn = self._db.connect()
        try:
            self._db.begin(conn, exclusive, write)
            cur = conn.cursor()
            yield _Cursor(cur, self._db.param)
            conn.commit() if self._db.is_pg else conn.execute("COMMIT")
        except BaseException:
            conn.rollback() if self._db.is_pg else conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    # ------------------------------------------------------------------ jobs
    def register_job(self, name: str, sources: Iterable[str], sinks: Iterable[str], *, job_id: str | None = None,
                     query_id: str | None = None) -> Job:
        """Record a running job and its tables. Refuses a second writer of a table and a cycle."""
        sources, sinks = tuple(dict.fromkeys(sources)), tuple(dict.fromkeys(sinks))
        if not sinks:
            raise MetaError(f"job '{name}' has no sink table; a job registers the tables it writes")
        job_id = job_id or f"{name}-{uuid.uuid4().hex[:8]}"
        with self._tx(exclusive=True) as cur:
            for table in sinks:
                cur.execute("SELECT j.job_id, j.name, j.host, j.pid, j.lease_until FROM sluice_jobs j JOIN "
                            "sluice_job_tables t ON t.job_id = j.job_id WHERE t.table_name = ? AND t.role = 'sink' "
                            "AND j.status = ?", (table, RUNNING))
                row = cur.fetchone()
                if row is not None and row[4] is not None and row[4] < time.time():  # an idle implicit writer
                    self._end(cur, row[0], RELEASED)
                elif row is not None and row[0] != job_id:
                    raise WriterConflictError(
                        f"table '{table}' already has an active writer: job '{row[0]}' ({row[1]}, host {row[2]}, "
                        f"pid {row[3]}). Stop that job, or if it died without finishing, release it: "
                        f"sluice meta release-job {row[0]}")
            cycle = self._find_cycle(cur, job_id, name, sources, sinks)
            if cycle:
                raise LineageCycleError(f"registering job '{name}' would close a cycle: {' -> '.join(cycle)}. "
                                        "A table may not feed, through jobs, the job that writes it.")
            cur.execute("DELETE FROM sluice_job_tables WHERE job_id = ?", (job_id,))
            cur.execute("DELETE FROM sluice_jobs WHERE job_id = ?", (job_id,))
            now = time.time()
            cur.execute("INSERT INTO sluice_jobs (job_id, name, status, host, pid, query_id, started_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (job_id, name, RUNNING, socket.gethostname(), os.getpid(), query_id, now))
            for role, tables in (("source", sources), ("sink", sinks)):
                for table in tables:
                    cur.execute("INSERT INTO sluice_job_tables (job_id, table_name, role) VALUES (?, ?, ?)",
                                (job_id, table, role))
            for source in sources:
                for sink in sinks:
                    cur.execute("INSERT INTO sluice_lineage (source, sink) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                (source, sink))
        return Job(job_id, name, RUNNING, sources, sinks, socket.gethostname(), os.getpid(), query_id, now)

    def claim_writer(self, table: str, *, name: str, query_id: str | None = None, lease_s: float = 0) -> str:
        """The job that commits to `table` now, checked at every commit of a table-store sink (single writer).

        The table's running writer may be: a job registered for it (`register_job`), which this commit joins when
        it is that job (a batch write with the job's name or id, or its streaming query: the first query to commit
        binds to a registered job that has none yet); or an implicit job of a streaming query that did not
        register, owning the table until `lease_s` after its last commit (renewed here). Anything else is a
        second concurrent writer: WriterConflictError naming the table and the other job. With no running writer,
        a streaming query (query_id) becomes the implicit writer; a batch write (no query_id) commits under no
        job row (returns `name`), so one-off writes leave no bookkeeping behind.
        """
        with self._tx(exclusive=True) as cur:
            now = time.time()
            cur.execute("SELECT j.job_id, j.name, j.host, j.pid, j.query_id, j.lease_until FROM sluice_jobs j "
                        "JOIN sluice_job_tables t ON t.job_id = j.job_id WHERE t.table_name = ? AND t.role = 'sink' "
                        "AND j.status = ?", (table, RUNNING))
            row = cur.fetchone()
            if row is not None:
                job_id, job_name, host, pid, bound, lease_until = row
                if lease_until is not None and lease_until < now and bound != query_id:  # an idle implicit writer
                    self._end(cur, job_id, RELEASED)
                elif query_id is not None and bound in (None, query_id):
                    if bound is None:
                        cur.execute("UPDATE sluice_jobs SET query_id = ? WHERE job_id = ?", (query_id, job_id))
                    if lease_until is not None:
                        cur.execute("UPDATE sluice_jobs SET lease_until = ? WHERE job_id = ?", (now + lease_s, job_id))
                    return str(job_id)
                elif query_id is None and name in (job_name, job_id):
                    return str(job_id)
                else:
                    writer = f"streaming query {query_id}" if query_id else f"batch write '{name}'"
                    raise WriterConflictError(
                        f"table '{table}' already has an active writer: job '{job_id}' ({job_name}, host {host}, "
                        f"pid {pid}{f', query {bound}' if bound else ''}); refusing {writer}: a table has one "
                        "writer at a time. Stop that job, or if it died without finishing, release it: "
                        f"sluice meta release-job {job_id}")
            if query_id is None:
                return name
            job_id = f"{name}-{uuid.uuid4().hex[:8]}"
            cur.execute("INSERT INTO sluice_jobs (job_id, name, status, host, pid, query_id, started_at, lease_until) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (job_id, name, RUNNING, socket.gethostname(), os.getpid(),
                                                            query_id, now, now + lease_s))
            cur.execute("INSERT INTO sluice_job_tables (job_id, table_name, role) VALUES (?, ?, 'sink')",
                        (job_id, table))
            return job_id

    def bind_query(self, job_id: str, query_id: str) -> None:
        """Tie a registered job to its streaming query (JobHandle.watch), so only that query commits as it."""
        with self._tx(write=True) as cur:
            cur.execute("UPDATE sluice_jobs SET query_id = ? WHERE job_id = ? AND query_id IS NULL", (query_id, job_id))

    def _find_cycle(self, cur: _Cursor, job_id: str, name: str, sources: Sequence[str],
                    sinks: Sequence[str]) -> list[str] | None:
        """A path sink -> job -> table ... -> one of the new job's sources, through the other live jobs' edges."""
        cur.execute("SELECT t.job_id, j.name, t.table_name, t.role FROM sluice_job_tables t JOIN sluice_jobs j "
                    "ON j.job_id = t.job_id WHERE j.status = ? AND j.job_id <> ?", (RUNNING, job_id))
        feeds: dict[str, list[tuple[str, str]]] = {}  # table -> [(job name, job id)] reading it
        writes: dict[str, list[str]] = {}  # job id -> tables it writes
        names: dict[str, str] = {}
        for jid, jname, table, role in cur.fetchall():
            names[jid] = jname
            if role == "source":
                feeds.setdefault(table, []).append((jname, jid))
            else:
                writes.setdefault(jid, []).append(table)
        for table in sinks:
            if table in sources:
                return [table, f"[{name}]", table]
        targets = set(sources)
        stack = [(table, [f"[{name}]", table]) for table in sinks]
        seen: set[str] = set()
        while stack:
            table, path = stack.pop()
            if table in seen:
                continue
            seen.add(table)
            for jname, jid in feeds.get(table, []):
                for out in writes.get(jid, []):
                    step = [*path, f"[{jname}]", out]
                    if out in targets:
                        return [*step, f"[{name}]"]
                    stack.append((out, step))
        return None

    def finish_job(self, job_id: str, status: str = FINISHED) -> None:
        """Mark a job ended (finished, failed or released): its tables are free for another writer."""
        if status not in (FINISHED, FAILED, RELEASED):
            raise MetaError(f"status must be {FINISHED}, {FAILED} or {RELEASED}, got {status!r}")
        with self._tx(write=True) as cur:
            self._end(cur, job_id, status)

    @staticmethod
    def _end(cur: _Cursor, job_id: str, status: str) -> None:
        """End a running job and drop its bookkeeping: its table edges (the lineage pairs stay in sluice_lineage)
        and its query's micro-batch barriers but the last (a restarted query replays at most that one). Completed
        barriers stay: consistent reads need them."""
        cur.execute("UPDATE sluice_jobs SET status = ?, ended_at = ? WHERE job_id = ? AND status = ?",
                    (status, time.time(), job_id, RUNNING))
        cur.execute("SELECT table_name, role FROM sluice_job_tables WHERE job_id = ? ORDER BY table_name", (job_id,))
        edges = cur.fetchall()
        if edges:
            tables = {role: [t for t, r in edges if r == role] for role in ("source", "sink")}
            cur.execute("UPDATE sluice_jobs SET ended_tables = ? WHERE job_id = ?", (json.dumps(tables), job_id))
        cur.execute("DELETE FROM sluice_job_tables WHERE job_id = ?", (job_id,))
        cur.execute("SELECT query_id FROM sluice_jobs WHERE job_id = ?", (job_id,))
        row = cur.fetchone()
        if row is not None and row[0]:
            cur.execute("DELETE FROM sluice_batch_barriers WHERE query_id = ? AND batch_id < (SELECT max(batch_id) "
                        "FROM sluice_batch_barriers WHERE query_id = ?)", (row[0], row[0]))

    def release_job(self, job_id: str) -> Job:
        """For a job that died without finishing (driver killed): end it so its tables can be written again."""
        job = self.job(job_id)
        if job.status != RUNNING:
            raise MetaError(f"job '{job_id}' is not running (status {job.status}); nothing to release")
        self.finish_job(job_id, RELEASED)
        return replace(job, status=RELEASED, ended_at=self.job(job_id).ended_at)

    def job(self, job_id: str) -> Job:
        for job in self.jobs():
            if job.job_id == job_id:
                return job
        raise MetaError(f"no job '{job_id}' in {self!r}; list them with: sluice meta jobs")

    def jobs(self) -> list[Job]:
        with self._tx() as cur:
            cur.execute("SELECT job_id, name, status, host, pid, query_id, started_at, ended_at, ended_tables "
                        "FROM sluice_jobs ORDER BY started_at")
            rows = cur.fetchall()
            cur.execute("SELECT job_id, table_name, role FROM sluice_job_tables ORDER BY table_name")
            edges = cur.fetchall()
        out = []
        for jid, name, status, host, pid, query_id, started, ended, ended_tables in rows:
            sources = tuple(t for j, t, r in edges if j == jid and r == "source")
            sinks = tuple(t for j, t, r in edges if j == jid and r == "sink")
            if ended_tables and not (sources or sinks):  # an ended job: what it read and wrote, as history
                history = json.loads(ended_tables)
                sources, sinks = tuple(history["source"]), tuple(history["sink"])
            out.append(Job(jid, name, status, sources, sinks, host, pid, query_id, started, ended))
        return out

    # ------------------------------------------------------------------ barriers
    def complete_barrier(self, table: str, barrier: int, version: int, job_id: str | None = None) -> bool:
        """Record that `table` completed `barrier` in Delta version `version`. False if it already had (replay)."""
        with self._tx(write=True) as cur:
            cur.execute("SELECT version FROM sluice_barriers WHERE table_name = ? AND barrier = ?", (table, barrier))
            row = cur.fetchone()
            if row is not None:
                if row[0] != version:
                    raise MetaError(f"table '{table}' completed barrier {barrier} in version {row[0]} already; "
                                    f"refusing version {version} for it (a barrier is committed once)")
                return False
            cur.execute("SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?", (table,))
            last = cur.fetchone()[0]
            if last is not None and barrier < last:
                raise MetaError(f"table '{table}' already completed barrier {last}; barrier {barrier} is older "
                                "(barriers only grow)")
            cur.execute("INSERT INTO sluice_barriers (table_name, barrier, version, job_id, committed_at) "
                        "VALUES (?, ?, ?, ?, ?)", (table, barrier, version, job_id, time.time()))
        return True

    def batch_barrier(self, query_id: str, batch_id: int, tables: Sequence[str]) -> int:
        """The barrier of an ingest micro-batch: assigned when first asked (now in ms, above every barrier the
        tables and the query have), the same one on every replay of that batch."""
        with self._tx(exclusive=True) as cur:
            known = _batch_barrier(cur, query_id, batch_id)
            if known is not None:
                return known
            floor = int(time.time() * 1000)
            cur.execute("SELECT max(barrier) FROM sluice_batch_barriers WHERE query_id = ?", (query_id,))
            floor = max(floor, (cur.fetchone()[0] or 0) + 1)
            for table in tables:
                cur.execute("SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?", (table,))
                floor = max(floor, (cur.fetchone()[0] or 0) + 1)
            _insert_batch_barrier(cur, query_id, batch_id, floor)
            return floor

    def record_batch_barrier(self, query_id: str, batch_id: int, barrier: int) -> None:
        """A job reading table-store tables: micro-batch `batch_id` processes input up to `barrier` (its read
        tasks record it; its sink then commits with that barrier). The same batch always maps to one barrier."""
        with self._tx(exclusive=True) as cur:
            known = _batch_barrier(cur, query_id, batch_id)
            if known is None:
                _insert_batch_barrier(cur, query_id, batch_id, barrier)
            elif known != barrier:
                raise MetaError(f"micro-batch {batch_id} of query {query_id} has barrier {known}; refusing {barrier}")

    def aligned_barrier(self, tables: Sequence[str], start_barrier: int) -> int:
        """The barrier the next micro-batch of a job reading all of `tables` advances to from `start_barrier`.

        Every table-store source of the job asks with the same start (their previous batch ended aligned); the
        first to ask fixes the answer - the newest barrier all the tables completed - and the others get the
        same one, so the sources of one micro-batch never pair different barriers. `start_barrier` when there is
        nothing newer in common yet.
        """
        group = ",".join(sorted(set(tables)))
        with self._tx(exclusive=True) as cur:
            cur.execute("SELECT barrier FROM sluice_aligned_barriers WHERE tables = ? AND start_barrier = ?",
                        (group, start_barrier))
            row = cur.fetchone()
            if row is not None:
                return int(row[0])
            names = group.split(",")
            marks = ", ".join("?" * len(names))
            cur.execute(f"SELECT barrier FROM sluice_barriers WHERE table_name IN ({marks}) AND barrier > ? "
                        "GROUP BY barrier HAVING count(DISTINCT table_name) = ? ORDER BY barrier DESC LIMIT 1",
                        (*names, start_barrier, len(names)))
            found = cur.fetchone()
            if found is None:
                return start_barrier
            cur.execute("INSERT INTO sluice_aligned_barriers (tables, start_barrier, barrier) VALUES (?, ?, ?)",
                        (group, start_barrier, int(found[0])))
            cur.execute("DELETE FROM sluice_aligned_barriers WHERE tables = ? AND start_barrier < (SELECT "
                        "min(start_barrier) FROM (SELECT start_barrier FROM sluice_aligned_barriers WHERE tables = ? "
                        f"ORDER BY start_barrier DESC LIMIT {REPLAYABLE_BATCHES}) AS kept)", (group, group))
            return int(found[0])

    def prune_barriers(self, table: str, below_version: int) -> int:
        """Forget `table`'s barriers completed in a version older than `below_version` (the oldest version a
        consistent read may still open, see tablestore.vacuum), never its newest. Returns the rows deleted."""
        with self._tx(write=True) as cur:
            cur.execute("DELETE FROM sluice_barriers WHERE table_name = ? AND version < ? AND barrier < "
                        "(SELECT max(barrier) FROM sluice_barriers WHERE table_name = ?)",
                        (table, below_version, table))
            return max(0, cur.rowcount)

    def barriers(self, table: str) -> list[tuple[int, int]]:
        """(barrier, version) pairs of a table, oldest first."""
        with self._tx() as cur:
            cur.execute("SELECT barrier, version FROM sluice_barriers WHERE table_name = ? ORDER BY barrier",
                        (table,))
            return [(int(b), int(v)) for b, v in cur.fetchall()]

    def tables(self) -> dict[str, tuple[int, int] | None]:
        """Every known table -> its last (barrier, version), or None before its first barrier."""
        with self._tx() as cur:
            cur.execute("SELECT table_name FROM sluice_job_tables UNION SELECT table_name FROM sluice_barriers")
            names = sorted(r[0] for r in cur.fetchall())
            cur.execute("SELECT b.table_name, b.barrier, b.version FROM sluice_barriers b JOIN (SELECT table_name, "
                        "max(barrier) AS barrier FROM sluice_barriers GROUP BY table_name) m "
                        "ON m.table_name = b.table_name AND m.barrier = b.barrier")
            last = {t: (int(b), int(v)) for t, b, v in cur.fetchall()}
        return {name: last.get(name) for name in names}

    def _feeds(self) -> dict[str, set[str]]:
        """table -> the tables written from it by a job (one read of the edges)."""
        with self._tx() as cur:
            cur.execute("SELECT source, sink FROM sluice_lineage")
            pairs = cur.fetchall()
        feeds: dict[str, set[str]] = {}
        for source, sink in pairs:
            feeds.setdefault(source, set()).add(sink)
        return feeds

    @staticmethod
    def _reach(start: Iterable[str], step: dict[str, set[str]]) -> set[str]:
        out: set[str] = set()
        stack = list(start)
        while stack:
            for nxt in step.get(stack.pop(), ()):
                if nxt not in out:
                    out.add(nxt)
                    stack.append(nxt)
        return out

    def upstream(self, tables: Iterable[str]) -> set[str]:
        """The tables `tables` depend on through jobs (not including themselves unless in a cycle)."""
        fed_by: dict[str, set[str]] = {}
        for source, outs in self._feeds().items():
            for out in outs:
                fed_by.setdefault(out, set()).add(source)
        return self._reach(tables, fed_by)

    def downstream(self, tables: Iterable[str]) -> set[str]:
        """The tables written, through jobs, from `tables` (not including themselves unless in a cycle)."""
        return self._reach(tables, self._feeds())

    def last_barrier(self, table: str) -> tuple[int, int] | None:
        """The table's newest (barrier, version), or None before its first barrier."""
        with self._tx() as cur:
            cur.execute("SELECT barrier, version FROM sluice_barriers WHERE table_name = ? ORDER BY barrier DESC "
                        "LIMIT 1", (table,))
            row = cur.fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def barrier_version(self, table: str, barrier: int) -> int | None:
        """The Delta version in which `table` completed `barrier`, or None if it has not."""
        with self._tx() as cur:
            cur.execute("SELECT version FROM sluice_barriers WHERE table_name = ? AND barrier = ?", (table, barrier))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def consistent_version(self, tables: Sequence[str]) -> ConsistentVersion:
        """The largest barrier every table in `tables` completed (and every table they depend on reached)."""
        tables = list(dict.fromkeys(tables))
        if not tables:
            raise MetaError("consistent_version needs at least one table")
        marks = ", ".join("?" * len(tables))
        with self._tx() as cur:
            cur.execute(f"SELECT barrier FROM sluice_barriers WHERE table_name IN ({marks}) GROUP BY barrier "
                        "HAVING count(DISTINCT table_name) = ? ORDER BY barrier DESC LIMIT 1", (*tables, len(tables)))
            row = cur.fetchone()
            if row is None:
                cur.execute(f"SELECT table_name, max(barrier) FROM sluice_barriers WHERE table_name IN ({marks}) "
                            "GROUP BY table_name", tuple(tables))
                have = dict(cur.fetchall())
                unknown = [t for t in tables if t not in have]
                if unknown:  # a typo or a table no job has written yet: say so, not "no barrier in common"
                    raise NoConsistentVersionError(
                        f"table(s) {unknown} have no completed barrier at all in the MetaService {self._db.display}: "
                        "check the names (consistent-with / read_consistent), or wait for their first commit")
                raise NoConsistentVersionError(
                    f"tables {tables} have no completed barrier in common yet (last barriers: "
                    f"{ {t: have.get(t) for t in tables} }); wait for their jobs to complete one")
            barrier = int(row[0])
            cur.execute("SELECT table_name, version FROM sluice_barriers WHERE barrier = ? "
                        f"AND table_name IN ({marks})", (barrier, *tables))
            versions = {t: int(v) for t, v in cur.fetchall()}
        upstream = self.upstream(tables)  # once, not once per table
        behind = {t: last for t, last in self.tables().items()
                  if t in upstream and t not in versions and (last is None or last[0] < barrier)}
        if behind:
            raise NoConsistentVersionError(f"upstream table(s) {sorted(behind)} have not reached barrier {barrier} "
                                           "that their downstream tables completed; the lineage is inconsistent")
        return ConsistentVersion(barrier, versions)


def _batch_barrier(cur: _Cursor, query_id: str, batch_id: int) -> int | None:
    cur.execute("SELECT barrier FROM sluice_batch_barriers WHERE query_id = ? AND batch_id = ?", (query_id, batch_id))
    row = cur.fetchone()
    return int(row[0]) if row is not None else None


def _insert_batch_barrier(cur: _Cursor, query_id: str, batch_id: int, barrier: int) -> None:
    cur.execute("INSERT INTO sluice_batch_barriers (query_id, batch_id, barrier) VALUES (?, ?, ?)",
                (query_id, batch_id, barrier))
    cur.execute("DELETE FROM sluice_batch_barriers WHERE query_id = ? AND batch_id <= ?",
                (query_id, batch_id - REPLAYABLE_BATCHES))


class _Cursor:
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
