"""One stream-reader core for every streaming source: split sources (FLIP-27), tracking-column streams, change
capture and the table store's barrier stream alike.

The core owns the flow Spark drives through its Python `DataSourceStreamReader` methods: the initial offset,
admission control (the default read limit, `latestOffset(start, limit)`), Trigger.AvailableNow (`StreamReaderCore`:
the end fixed when `prepareForTriggerAvailableNow` is called; `OpenStreamReaderCore` has none of its own, so Spark
runs such a query as one micro-batch), planning, reading, commit (what the store releases, then the lag told to a
metrics collector) and stop. A reader plugs in through a small interface on its own typed offset (FLIP-27's
SourceReaderBase shape: the base owns the loop, the store supplies the steps): how to parse one, where a stream
starts, where the next micro-batch ends, how a range is cut into partitions and read. The offset is converted to and
from Spark's JSON dict only here, at the boundary; inside, a reader sees typed offsets only.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Generic, Protocol, Self, TypeVar, cast

from pyspark.sql.datasource import InputPartition

from sluice.metrics._push import SourceReporter
from sluice.metrics._reads import ReadObserver, observed
from sluice.metrics._report import SourceReport
from sluice.spark._compat import (
    AdmissionControlledReader,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)


class StreamOffset(Protocol):
    """What the core asks of a typed offset: its JSON for Spark, and Spark's own dict back when nothing moved."""

    def to_json(self) -> dict[str, Any]: ...

    def json_or(self, start: Self) -> dict[str, Any]: ...


OffsetT = TypeVar("OffsetT", bound=StreamOffset)
PartitionT = TypeVar("PartitionT", bound=InputPartition)


class OpenStreamReaderCore(AdmissionControlledReader, Generic[OffsetT, PartitionT]):
    """A streaming read over a typed offset `OffsetT` without Trigger.AvailableNow of its own (Spark then runs such a
    query as one micro-batch): subclasses implement the abstract steps, the hooks if need be. `StreamReaderCore` is
    this with a fixed AvailableNow end."""

    def __init__(self, *, source: tuple[str, str] | None, max_rows: int | None = None,
                 max_bytes: int | None = None, reads: ReadObserver | None = None) -> None:
        """`source`: (format, what is read), for the lag reported to a metrics collector (sluice.metrics) after each
        commit (None: never reported); `max_rows` / `max_bytes`: the per-trigger cap (Spark's default read limit);
        `reads`: where read tasks report what they fetch."""
        self.source = source
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.reads = reads
        self.target: OffsetT | None = None  # Trigger.AvailableNow (StreamReaderCore): never read past this end
        self._lag = SourceReporter.on_driver() if source is not None else SourceReporter(None)

    # ------------------------------------------------------------------ the steps a reader supplies
    @abstractmethod
    def parse_offset(self, raw: dict) -> OffsetT:
        """An offset Spark hands over (refused when another sluice, or another query's options, wrote it)."""

    @abstractmethod
    def first_offset(self) -> OffsetT:
        """Where micro-batch 0 starts."""

    @abstractmethod
    def next_end(self, start: OffsetT, limit: ReadLimit) -> OffsetT:
        """Where the micro-batch from `start` ends: within `limit` and, under AvailableNow, `self.target`."""

    @abstractmethod
    def plan(self, start: OffsetT, end: OffsetT) -> Sequence[PartitionT]:
        """The partitions of the micro-batch (start, end]: everything an executor needs travels in them."""

    @abstractmethod
    def read_partition(self, partition: PartitionT) -> Iterator[Any] | None:
        """One partition's Arrow record batches (executors); None: nothing to read, no read task reported."""

    # ------------------------------------------------------------------ hooks
    def spark_end(self, end: OffsetT, start: OffsetT) -> dict:
        """`end` as Spark gets it: Spark's own `start` back when nothing moved (no empty micro-batch)."""
        return end.json_or(start)

    def split_of(self, partition: PartitionT) -> str | None:
        """The split a read task reads, for its metrics (None: not a split source's)."""
        return None

    def committed(self, end: OffsetT) -> None:
        """What the store releases once Spark committed up to `end` (offsets themselves live in Spark's checkpoint)."""

    def lag(self, end: OffsetT) -> SourceReport | None:
        """How far the committed `end` is behind the store's head (asked only when a metrics collector runs)."""
        return None

    def close(self) -> None:
        """Release what the reader holds between micro-batches."""

    @property
    def format(self) -> str | None:
        """The format read, named in errors (None: a stream not given its source)."""
        return self.source[0] if self.source is not None else None

    def report(self, **fields: Any) -> SourceReport:
        """A `SourceReport` of this stream's format and what it reads."""
        assert self.source is not None, "a stream without a source reports no lag"
        return SourceReport(format=self.source[0], source=self.source[1], **fields)

    @staticmethod
    def rows_of(limit: ReadLimit) -> int | None:
        """The row budget of `limit` (None: none)."""
        return limit.max_rows if isinstance(limit, ReadMaxRows) else None

    # ------------------------------------------------------------------ Spark's DataSourceStreamReader
    def initialOffset(self) -> dict:
        return self.first_offset().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows:
            return ReadMaxRows(self.max_rows)
        if self.max_bytes:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        at = self.parse_offset(start)
        return self.spark_end(self.next_end(at, limit), at)

    def plan_partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self.plan(self.parse_offset(start), self.parse_offset(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        mine = cast(PartitionT, partition)  # Spark hands back a partition this reader's `plan` made
        batches = self.read_partition(mine)
        if batches is not None:
            yield from observed(self.reads, batches, self.split_of(mine))

    def commit(self, end: dict) -> None:
        at = self.parse_offset(end)
        self.committed(at)
        if self._lag.target is not None and (report := self.lag(at)) is not None:
            self._lag.report(report)

    def stop(self) -> None:
        self.close()


class StreamReaderCore(OpenStreamReaderCore[OffsetT, PartitionT], SupportsTriggerAvailableNow):
    """A streaming read that supports Trigger.AvailableNow: the end is fixed when the run starts, and micro-batches
    (within the read limit) run up to it."""

    @abstractmethod
    def available_now_end(self) -> OffsetT:
        """The end of what is readable now, fixed for a Trigger.AvailableNow run."""

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.available_now_end()
