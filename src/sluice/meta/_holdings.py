"""What a job holds in a store outside the table store (a PostgreSQL replication slot), and each job's last sign of
life: what `sluice doctor` needs to say whose a leftover is and whether that job still runs. A watched job's driver
also records its query's progress (record_sign_of_life, at most every HEARTBEAT_S).

A holding is recorded by the job's driver (format("postgres_changes") with option 'job') when its query starts and
again at most every HEARTBEAT_S while it commits micro-batches; that time is the job's sign of life, beside its
start and its last table-store commit (sluice_barriers.committed_at).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.meta._backend import Transactions
from sluice.meta._model import MetaError

HEARTBEAT_S = 30.0  # a holding's seen_at is renewed at most this often (one database write per query per 30 s)


@dataclass(frozen=True)
class Holding:
    kind: str  # what it is: "postgres-slot"
    location: str  # where: the database (for a slot, the PostgreSQL database's name)
    name: str  # the slot's name
    job_id: str
    seen_at: float  # when its job last said it holds it (unix seconds)


class HoldingLedger(Transactions):
    def record_holding(self, job_id: str, kind: str, location: str, name: str) -> None:
        """Record that job `job_id` holds `name` (of `kind`, in `location`) now. Refuses a job the MetaService does
        not know: a holding must name its owner."""
        with self._tx(write=True) as cur:
            cur.execute("SELECT 1 FROM sluice_jobs WHERE job_id = ?", (job_id,))
            if cur.fetchone() is None:
                raise MetaError(f"no job '{job_id}' in {self!r} to hold {kind} '{name}': register the job first "
                                "(sluice.tablestore.register_job or MetaService.register_job) and give its job_id")
            cur.execute("INSERT INTO sluice_job_holdings (kind, location, name, job_id, seen_at) VALUES "
                        "(?, ?, ?, ?, ?) ON CONFLICT (kind, location, name) DO UPDATE SET job_id = excluded.job_id, "
                        "seen_at = excluded.seen_at", (kind, location, name, job_id, time.time()))

    def forget_holding(self, kind: str, location: str, name: str) -> None:
        with self._tx(write=True) as cur:
            cur.execute("DELETE FROM sluice_job_holdings WHERE kind = ? AND location = ? AND name = ?",
                        (kind, location, name))

    def holdings(self) -> list[Holding]:
        with self._tx() as cur:
            cur.execute("SELECT kind, location, name, job_id, seen_at FROM sluice_job_holdings ORDER BY 1, 2, 3")
            return [Holding(*row) for row in cur.fetchall()]

    def record_sign_of_life(self, job_id: str) -> None:
        """A running job's driver says it is alive (sluice.tablestore's JobHandle.watch: its query's progress)."""
        with self._tx(write=True) as cur:
            cur.execute("UPDATE sluice_jobs SET seen_at = ? WHERE job_id = ? AND status = 'running'",
                        (time.time(), job_id))

    def last_signs_of_life(self) -> dict[str, float]:
        """Each job's latest recorded activity: its start, its driver's last sign of life, its last table-store
        commit, its holdings' renewals."""
        with self._tx() as cur:
            cur.execute("SELECT job_id, started_at, seen_at FROM sluice_jobs")
            signs = {job_id: max(started, seen or started) for job_id, started, seen in cur.fetchall()}
            cur.execute("SELECT job_id, max(committed_at) FROM sluice_barriers WHERE job_id IS NOT NULL "
                        "GROUP BY job_id")
            rows = cur.fetchall()
            cur.execute("SELECT job_id, max(seen_at) FROM sluice_job_holdings GROUP BY job_id")
            rows += cur.fetchall()
        for job_id, at in rows:
            if job_id in signs and at is not None:
                signs[job_id] = max(signs[job_id], at)
        return signs

