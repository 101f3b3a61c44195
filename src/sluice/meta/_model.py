"""The MetaService's vocabulary: job states, the errors it raises, and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice._errors import ConflictError, SluiceError

RUNNING, FINISHED, FAILED, RELEASED = "running", "finished", "failed", "released"


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

