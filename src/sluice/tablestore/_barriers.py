"""The barrier hand-off between a table-store source and a table-store sink in one streaming query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.meta import MetaService


@dataclass(frozen=True)
class BarrierHandoff:
    """Which barrier a micro-batch carries from its table-store input to its table-store output.

    The source's task of micro-batch (query, batch) `offer`s the barrier its rows reach; the sink's commit of
    that micro-batch `take`s it, or gets a new barrier when no table-store source offered one (other sources).
    Either way a replay of the micro-batch gets the same barrier. Kept in the MetaService: the source's tasks
    and the sink's driver-side commit run in different processes (on a cluster, different machines).
    """

    meta: str | None  # the MetaService's location (SQLite path or postgresql:// URL)

    def offer(self, query_id: str, batch_id: int, barrier: int) -> None:
        MetaService(self.meta).record_batch_barrier(query_id, batch_id, barrier)

    def take(self, query_id: str, batch_id: int, tables: Sequence[str]) -> int:
        return MetaService(self.meta).batch_barrier(query_id, batch_id, tables)
