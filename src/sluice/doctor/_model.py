"""The doctor's records: a leftover found in a store (Finding), its owner as the MetaService knows it (Owner), and
the verdict on removing it (Verdict)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Kinds of findings, one per kind of state a pipeline leaves behind.
PG_SLOT = "postgres-slot"
PG_STAGED = "postgres-staged-rows"
KAFKA_TXN = "kafka-open-transaction"
TABLE_CLAIM = "tablestore-writer-claim"
TABLE_BARRIER = "tablestore-barrier-in-progress"
S2_OPEN = "s2-uncommitted-micro-batch"
DEAD_LETTERS = "dead-letter-target"  # records sent aside lately (not a leftover: nothing to remove)


@dataclass(frozen=True)
class Owner:
    """The MetaService's job behind a finding, and what the MetaService records of its life."""

    job_id: str
    name: str
    status: str  # running, finished, failed, released
    host: str | None
    pid: int | None
    query_id: str | None
    started_at: float
    ended_at: float | None
    last_sign_of_life: float  # its start, last table-store commit or holding renewal, whichever is latest
    pid_alive: bool | None  # on this host: whether its pid runs now; None: another host (cannot tell)

    def describe(self, now: float) -> str:
        silent = max(0.0, now - self.last_sign_of_life)
        where = f"host {self.host} pid {self.pid}" + ("" if self.pid_alive is None else
                                                     " (running)" if self.pid_alive else " (no such process now)")
        return f"job {self.job_id} ({self.name}), {self.status}, {where}, last sign of life {silent:.0f} s ago"


@dataclass(frozen=True)
class Verdict:
    safe: bool
    why: str


@dataclass(frozen=True)
class Finding:
    """One thing a pipeline left in a store: where, what it costs, whose it is, and whether removing it is safe."""

    kind: str
    store: str  # the store it is in (postgresql://user@host:port/db, a Kafka bootstrap, the MetaService)
    name: str  # the slot, staging table and write, topic partition, table, ...
    cost: str  # what it costs, in words (retained WAL bytes, rows, records held back, ...)
    owner: Owner | None
    verdict: Verdict
    # Figures for gauges and tests: retained_bytes, rows, age_s, ... (numbers only)
    figures: dict[str, float] = field(default_factory=dict)
    # What --fix needs to remove it (slot name, write id, transactional ids, job id), typed per kind by its module.
    handle: tuple[str, ...] = ()

    def line(self, now: float) -> str:
        owner = self.owner.describe(now) if self.owner else "no job of the MetaService"
        safe = "yes" if self.verdict.safe else "no"
        return (f"{self.kind}  {self.name}  in {self.store}\n    cost: {self.cost}\n    owner: {owner}\n"
                f"    safe to remove: {safe} ({self.verdict.why})")


@dataclass(frozen=True)
class Action:
    """What --fix did (or refused) for a finding."""

    finding: Finding
    done: bool
    what: str
