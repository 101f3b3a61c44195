"""The MetaService of FLIP-276: job/table lineage and each table's completed barriers, in a real database.

    from sluice.meta import MetaService
    meta = MetaService()                                  # .sluice/meta.db, or MetaService("postgresql://...")
    job = meta.register_job("ingest", sources=[], sinks=["orders"])
    meta.complete_barrier("orders", barrier=1700000000000, version=3, job_id=job.job_id)
    meta.consistent_version(["orders", "customer_totals"])   # -> ConsistentVersion(barrier, {table: version})
    meta.finish_job(job.job_id)

From the shell: `sluice meta jobs|tables|lineage|consistent-version T...|release-job JOB` (--meta URL).
"""

from sluice.meta._backend import check_url
from sluice.meta._deadletters import DeadLetterTarget
from sluice.meta._heartbeat import HoldingHeartbeat
from sluice.meta._holdings import Holding
from sluice.meta._model import (
    FAILED,
    FINISHED,
    RELEASED,
    RUNNING,
    ConsistentVersion,
    Job,
    LineageCycleError,
    MetaError,
    NoConsistentVersionError,
    WriterConflictError,
)
from sluice.meta._service import MetaService

__all__ = ["FAILED", "FINISHED", "RELEASED", "RUNNING", "ConsistentVersion", "DeadLetterTarget", "Holding",
           "HoldingHeartbeat", "Job", "LineageCycleError", "MetaError", "MetaService", "NoConsistentVersionError",
           "WriterConflictError", "check_url"]
