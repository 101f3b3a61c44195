"""A sink's memory of the micro-batches it committed, so an older one replayed later is skipped.

Spark replays a micro-batch whose commit its checkpoint lacks (the driver died between the tasks' work and the
commit log) and, from an older copy of a checkpoint, micro-batches committed long ago. Stores that order writes by
versions or timestamps (Elasticsearch's external versions, HBase's cell timestamps, Cassandra's write times) make a
replay of an older micro-batch lose to the later ones, but only while they remember a later delete: a delete's
tombstone lasts `index.gc_deletes` (60 s by default), until a major compaction (HBase), or `gc_grace_seconds`
(Cassandra). A `ReplayGuard` keeps, in the store, the last micro-batch committed per query and target: each task of
a micro-batch asks it once (not once per row) and writes nothing when its micro-batch is not newer; the driver
records each micro-batch after Spark's commit of it reaches the sink. It holds as long as the marker is kept.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class ReplayGuard(ABC):
    """Where a sink keeps the last micro-batch committed by a query (`write_id`, the checkpoint's query id) into
    its target. Pickled to tasks with the plan: keep it to plain settings, connect inside the methods."""

    @abstractmethod
    def last_committed(self, write_id: str) -> int | None:
        """On an executor, once per task of a micro-batch: the last micro-batch committed, or None."""

    @abstractmethod
    def mark_committed(self, write_id: str, epoch: int) -> None:
        """On the driver, after the micro-batch `epoch` is committed; never lowers what is kept (a replayed older
        micro-batch that marks again leaves the newer mark)."""
