"""The connector shape: a write is planned once on the driver; every task opens its writer from the plan.

`SinkDataSource.plan_write()` validates the write and returns an immutable, picklable `WritePlan`
(a connector subclasses it with what its tasks need: resolved connection, target table, ...). Spark
pickles the plan to every task, which calls `plan.open_task(context)` for a `TaskWriter` (an encoder
and a store), and the driver calls `plan.committer()` when the write commits on the driver. Nothing
is set on the DataSource as a side effect: the plan is the only hand-over between driver and tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice._options import Options
from sluice.engine import BatchCreator, Committer, RequestBuffer, SinkConfig, Store, WriteContext
from sluice.engine._buffer import Ints
from sluice.sink._replay import ReplayGuard

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Encoded:
    """What an encoder makes of one Arrow RecordBatch: engine entries with their byte sizes.

    `rows` are the batch rows the entries came from, when the encoder dropped or merged rows (e.g. kept
    only the last change per key); None means one entry per row, in order. `groups` (partition-ordered writes
    only) are the entries' integer partition codes when the store groups by something the columns do not show,
    e.g. the region an HBase row key falls in: then each group's entries keep their order and one group's batch
    is in flight at a time, in place of the hash buckets (or keys, sink.batch-by=key) of sink.partition-key.
    """

    entries: Sequence[Any]  # what the store's submit() takes, one per request entry: the store's own kind
    sizes: Ints | None  # each entry's bytes; None: only `running` is given
    rows: Ints | None = None
    groups: Ints | None = None
    # The sizes' running sums (a numpy array or a memoryview of integers), when the encoder has them without a pass
    # (`binary_running_sums`): the engine then sums no size, and with `sizes` None makes each entry's size only where
    # one is needed (see AsyncSinkWriter.write_chunk).
    running: Ints | None = None


Encoder = Callable[["pa.RecordBatch"], Encoded]


@dataclass(frozen=True)
class TaskWriter:
    """One task's side of a write: the encoder its batches go through, and the store they go to."""

    encode: Encoder
    store: Store


@dataclass(frozen=True)
class WritePlan:
    """Everything a write needs, decided once on the driver and pickled to every task.

    Subclass it (as a frozen dataclass) with the connector's own fields and implement `open_task`;
    transactional connectors also implement `committer`.
    """

    format_name: str
    options: Options
    schema: StructType
    config: SinkConfig

    @property
    def commits_on_driver(self) -> bool:
        """Whether the driver's Committer publishes each write/epoch (transactions; a store may add e.g.
        overwrite)."""
        return self.config.transactional

    def open_task(self, context: WriteContext) -> TaskWriter:
        """On an executor, once per task that has rows: the task's encoder and store."""
        raise NotImplementedError

    def committer(self) -> Committer | None:
        """On the driver: the Committer of transactional writes, or None when the connector has none."""
        return None

    def replay_guard(self) -> ReplayGuard | None:
        """For streaming writes: where the sink keeps the last micro-batch it committed, so that an older one
        replayed later writes nothing (_replay.py); None: a replay is written again."""
        return None

    def batch_creator(self) -> BatchCreator | None:
        """The connector's default BatchCreator (FLIP-509); None = the engine's default for the mode."""
        return None

    def request_buffer(self) -> RequestBuffer | None:
        """The connector's default RequestBuffer (FLIP-509); None = the engine's default for the mode."""
        return None
