"""The table store (FLIP-276) as the MetaService sees it: writer claims (a running job is its sink tables' only
writer until it ends) and barriers in progress (a micro-batch given a barrier its job's tables have not completed).
A dead job's claim refuses every other writer of its tables; removing it is `sluice meta release-job`."""

from __future__ import annotations

from sluice.doctor._model import TABLE_BARRIER, TABLE_CLAIM, Finding
from sluice.doctor._owners import Owners
from sluice.meta import RUNNING, MetaService


def examine(meta: MetaService, owners: Owners) -> list[Finding]:
    store = repr(meta)
    completed = {table: last[0] for table, last in meta.tables().items() if last}
    batches = meta.last_batch_barriers()
    found = []
    for job in meta.jobs():
        if job.status != RUNNING or not job.sinks:
            continue
        owner = owners.by_job[job.job_id]
        verdict = owners.verdict(owner)
        found.append(Finding(TABLE_CLAIM, store, ", ".join(job.sinks),
                             f"no other job may write {', '.join(job.sinks)} while it stands", owner, verdict,
                             {"tables": float(len(job.sinks))}, (job.job_id,)))
        if job.query_id and job.query_id in batches:
            batch, barrier = batches[job.query_id]
            behind = [t for t in job.sinks if completed.get(t, -1) < barrier]
            if behind:
                found.append(Finding(TABLE_BARRIER, store, f"barrier {barrier} of query {job.query_id}",
                                     f"micro-batch {batch} got barrier {barrier}, not yet completed by "
                                     f"{', '.join(behind)}: consistent reads stop before it", owner, verdict,
                                     {"barrier": float(barrier)}, (job.job_id,)))
    return found


def remove(meta: MetaService, finding: Finding) -> str:
    (job_id,) = finding.handle
    if meta.job(job_id).status != RUNNING:
        return f"job {job_id} was released already"
    meta.release_job(job_id)
    return f"released job {job_id}: its tables may be written by another job, its barrier bookkeeping trimmed"
