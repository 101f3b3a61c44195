"""Whose a leftover is and whether its job still runs, from what the MetaService records: each job's status, host,
pid, query id, and its last sign of life (start, last table-store commit, holding renewals)."""

from __future__ import annotations

import os
import socket
import time

from sluice.doctor._model import Owner, Verdict
from sluice.meta import RUNNING, MetaService


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


class Owners:
    """The MetaService's jobs, looked up by job id or query id, and the rule for removing what they own.

    Removable: what belongs to a job the MetaService records as stopped (finished, failed, released); or to a
    running job whose process is not seen running and that gave no sign of life for `dead_after` seconds (a
    driver killed before it could end its job). A running job whose pid runs on this host is alive however long
    it was silent. Anything else is not removed by --fix: a job on another host silent for less than
    `dead_after`, or state no job of the MetaService owns.
    """

    def __init__(self, meta: MetaService, dead_after: float | None, now: float | None = None) -> None:
        self.now = time.time() if now is None else now
        self.dead_after = dead_after
        here = socket.gethostname()
        signs = meta.last_signs_of_life()
        self.by_job: dict[str, Owner] = {}
        self.by_query: dict[str, Owner] = {}
        for job in meta.jobs():
            alive = _pid_alive(job.pid) if job.host == here and job.pid else None
            owner = Owner(job.job_id, job.name, job.status, job.host, job.pid, job.query_id, job.started_at,
                          job.ended_at, signs.get(job.job_id, job.started_at), alive)
            self.by_job[job.job_id] = owner
            if job.query_id:
                # A query restarted under a new job keeps its id: the newest job is the owner.
                self.by_query[job.query_id] = owner

    def now_of(self, owner: Owner, by_query: bool) -> Owner | None:
        """`owner` as the MetaService has it now; with `by_query`, the newest job of its query (a query restarted
        under a new job takes over what its last run left in the stores)."""
        if by_query and owner.query_id and owner.query_id in self.by_query:
            return self.by_query[owner.query_id]
        return self.by_job.get(owner.job_id)

    def verdict(self, owner: Owner | None) -> Verdict:
        if owner is None:
            return Verdict(False, "no job of the MetaService owns it; remove it by hand once sure no query needs it")
        if owner.status != RUNNING:
            return Verdict(True, f"its job {owner.status}")
        if owner.pid_alive:
            return Verdict(False, f"its job runs (pid {owner.pid} on this host)")
        silent = self.now - owner.last_sign_of_life
        if self.dead_after is not None and silent > self.dead_after:
            seen = "no such process on this host" if owner.pid_alive is False else f"host {owner.host}"
            return Verdict(True, f"its job is recorded running but is dead: {seen}, no sign of life for {silent:.0f} s "
                                 f"(> --dead-after {self.dead_after:g})")
        hint = " and its pid is gone from this host" if owner.pid_alive is False else ""
        return Verdict(False, f"its job is recorded running{hint}, last sign of life {silent:.0f} s ago; "
                              "give --dead-after SECONDS to treat a job silent that long as dead")
