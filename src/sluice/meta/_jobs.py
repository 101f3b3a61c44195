"""Jobs and the tables they read and write: one writer per table, no cycle of jobs and tables (FLIP-276)."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace

from sluice.meta._backend import Cursor, Transactions
from sluice.meta._model import (
    FAILED,
    FINISHED,
    RELEASED,
    RUNNING,
    Job,
    LineageCycleError,
    MetaError,
    WriterConflictError,
)


class JobRegistry(Transactions):
    """Registration, the single-writer check at every commit, and the end of jobs."""

    def register_job(self, name: str, sources: Iterable[str], sinks: Iterable[str], *, job_id: str | None = None,
                     query_id: str | None = None) -> Job:
        """Record a running job and its tables. Refuses a second writer of a table and a cycle."""
        sources, sinks = tuple(dict.fromkeys(sources)), tuple(dict.fromkeys(sinks))
        if not sinks:
            raise MetaError(f"job '{name}' has no sink table; a job registers the tables it writes")
        job_id = job_id or f"{name}-{uuid.uuid4().hex[:8]}"
        # Its sinks' writers, every registration (the cycle check reads every running job's edges), and the job
        # itself: its rows are replaced below, which finish_job must not interleave with.
        locks = ("registry", f"job:{job_id}", *(f"table:{t}" for t in sinks))
        with self._tx(write=True, locks=locks) as cur:
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
            # The job's row before its edges, as `_end` takes them: two transactions locking rows of one job wait
            # for each other in one order, never in a cycle.
            cur.execute("DELETE FROM sluice_jobs WHERE job_id = ?", (job_id,))
            cur.execute("DELETE FROM sluice_job_tables WHERE job_id = ?", (job_id,))
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
        with self._tx(write=True, locks=(f"table:{table}",)) as cur:  # the table's writer; other tables go on
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

    def _find_cycle(self, cur: Cursor, job_id: str, name: str, sources: Sequence[str],
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
        # The job's lock, which register_job takes too. Without it, ending a job while it registers again under
        # its id (a restarted driver; the old one, or release-job, ending it) can run between the registration's
        # statements: each statement of a READ COMMITTED transaction sees what committed before it, so the end
        # skips the job row the registration replaced and then deletes the new registration's edges, leaving a
        # running job that writes no table (and a second writer gets in). With it, one runs after the other.
        # No table lock: claim_writer only reads the writer and updates its row, which waits for this end's update
        # of it or the other way round; a claim that saw the job running commits as it, as a moment earlier. An
        # expired writer's `_end` meets this one on the job's row first: the second ends nothing and finds no
        # edges left. No deadlock with the advisory locks either: every transaction takes all of its own in its
        # first round trip, sorted (Backend.begin_sql), before any row lock, so none waits for an advisory lock
        # while holding a row.
        with self._tx(write=True, locks=(f"job:{job_id}",)) as cur:
            self._end(cur, job_id, status)

    @staticmethod
    def _end(cur: Cursor, job_id: str, status: str) -> None:
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
