"""Split sources (FLIP-27) on Spark's Python Data Source API.

A `SplitEnumerator` runs on the driver: it finds splits (and, for streaming, new ones over time) and
knows where each split's data starts and ends. A `SplitReader` runs on executors and reads one split
between two positions as Arrow record batches. Positions are integers that grow (S2: seq nums). The
offset Spark checkpoints is a `SplitOffset` (_offset.py) as JSON. Everything read() needs travels
in the `SplitPartition`, so executors never depend on driver-side state, and a micro-batch replayed
from the checkpoint reads exactly the same positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pyspark.sql.datasource import DataSourceReader, InputPartition

from sluice.metrics._reads import ReadObserver, observed, observed_parts
from sluice.metrics._report import SourceReport, SplitLag
from sluice.source._offset import SplitOffset
from sluice.source._stream import StreamReaderCore
from sluice.spark._compat import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxRows


@dataclass(frozen=True)
class Split:
    split_id: str
    info: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class SplitPartition(InputPartition):
    """One split's positions [start, end): what an executor reads. Pickled to executors."""

    split: Split
    start: int
    end: int

    def __init__(self, split: Split, start: int, end: int) -> None:
        super().__init__(f"{split.split_id}:{start}-{end}")
        self.split, self.start, self.end = split, start, end


@dataclass
class SplitGroup(InputPartition):
    """Several splits' ranges read one after another by one task: many small splits (a topic of hundreds of
    partitions) cost one task, not one each. Pickled to executors."""

    parts: tuple[SplitPartition, ...]

    def __init__(self, parts: Sequence[SplitPartition]) -> None:
        super().__init__(f"{parts[0].value}+{len(parts) - 1}")
        self.parts = tuple(parts)


def tasks(ranges: Iterable[tuple[Split, int, int]], max_per_partition: int | None,
          per_task: int | None) -> list[SplitPartition | SplitGroup]:
    """The read tasks of splits' ranges: a range cut in pieces of `max_per_partition` (`cut`) is read in parallel,
    piece by piece; whole ranges are packed (`pack`)."""
    out: list[SplitPartition | SplitGroup] = []
    whole: list[SplitPartition] = []
    for split, start, end in ranges:
        pieces = cut(split, start, end, max_per_partition)
        (whole if len(pieces) == 1 else out).extend(pieces)
    return out + pack(whole, per_task)


def pack(parts: Sequence[SplitPartition], per_task: int | None) -> list[SplitPartition | SplitGroup]:
    """`parts` as read tasks of up to `per_task` positions each (records, where a position is a record): a range of
    at least that many stays a task of its own, smaller ones are packed in turn, in split order, into groups. The
    same parts always pack the same way, so a micro-batch replayed from the checkpoint reads the same tasks.
    None or 0: a task per part."""
    if not per_task:
        return list(parts)
    out: list[SplitPartition | SplitGroup] = []
    group: list[SplitPartition] = []
    size = 0
    for part in sorted(parts, key=lambda p: (p.split.split_id, p.start)):
        n = part.end - part.start
        if n >= per_task:
            out.append(part)
            continue
        if group and size + n > per_task:
            out.append(group[0] if len(group) == 1 else SplitGroup(group))
            group, size = [], 0
        group.append(part)
        size += n
    if group:
        out.append(group[0] if len(group) == 1 else SplitGroup(group))
    return out


def read_parts(reader: SplitReader, task: SplitPartition | SplitGroup,
               reads: ReadObserver | None) -> Iterator[Any] | None:
    """A read task's batches: its range's, or its group's ranges' one after another (None: nothing to read), reported
    to `reads` as one task's, with each split's own fetch lag (`observed_parts`)."""
    parts = [p for p in (task.parts if isinstance(task, SplitGroup) else (task,)) if p.end > p.start]
    if not parts:
        return None
    if len(parts) == 1:
        return observed(reads, reader.read(parts[0].split, parts[0].start, parts[0].end), parts[0].split.split_id)
    pairs = reader.read_many([(p.split, p.start, p.end) for p in parts])
    return observed_parts(reads, ((split_id, iter((batch,))) for split_id, batch in pairs))


class SplitEnumerator(ABC):
    """Driver side: which splits exist and where their data is. Positions come one split at a time
    (`start_position`, `end_position`) or many at once (`start_positions`, `end_positions`: a store asked once):
    implement one of each pair, and the other is made from it."""

    # Each pair, (one split, many splits): a concrete enumerator overrides at least one of the two.
    _PAIRS = (("start_position", "start_positions"), ("end_position", "end_positions"))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "__abstractmethods__", None):
            return  # still abstract (no discover): checked on its concrete subclasses
        for one, many in cls._PAIRS:
            if getattr(cls, one) is getattr(SplitEnumerator, one) and \
                    getattr(cls, many) is getattr(SplitEnumerator, many):
                raise TypeError(f"{cls.__name__} must implement {one}() or {many}()")

    @abstractmethod
    def discover(self) -> list[Split]:
        """The splits that exist now (streaming calls it again to find new ones)."""

    def start_position(self, split: Split) -> int:
        """Where reading of a split known at query start begins."""
        return self.start_positions([split])[split.split_id]

    def end_position(self, split: Split) -> int:
        """The position after the last readable record now (batch reads: the end fixed at planning)."""
        return self.end_positions([split])[split.split_id]

    def start_positions(self, splits: Sequence[Split]) -> dict[str, int]:
        """start_position of many splits; override to ask the store once instead of once per split."""
        return {split.split_id: self.start_position(split) for split in splits}

    def end_positions(self, splits: Sequence[Split], starts: Mapping[str, int] | None = None) -> dict[str, int]:
        """end_position of many splits; override to ask the store once instead of once per split. `starts`:
        where a streaming read stands in each split (a store whose readable end depends on it may use it)."""
        return {split.split_id: self.end_position(split) for split in splits}

    def bounds(self, splits: Sequence[Split]) -> dict[str, tuple[int, int]]:
        """(start, end) of many splits, for a batch read; override to ask the store once for both."""
        starts, ends = self.start_positions(splits), self.end_positions(splits)
        return {split.split_id: (starts[split.split_id], ends[split.split_id]) for split in splits}

    def bytes_end(self, split: Split, start: int, end: int, max_bytes: int) -> tuple[int, int]:
        """(position, bytes): how far from `start` (at most `end`) fits in `max_bytes`, and the bytes that is.

        At least one record is admitted, so a record larger than the budget cannot stall the query.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot bound micro-batches by bytes")

    def close(self) -> None:
        """Release what the enumerator keeps open between calls (a streaming read's stop)."""

    def new_split_position(self, split: Split) -> int:
        """Where a split found while a stream runs starts: its beginning, so nothing it holds is missed."""
        return 0


class SplitReader(ABC):
    """Executor side: reads one split from a start to an end position."""

    @abstractmethod
    def read(self, split: Split, start: int, end: int) -> Iterator[Any]:
        """Yield Arrow RecordBatches matching the declared schema."""

    def read_many(self, ranges: Sequence[tuple[Split, int, int]]) -> Iterator[tuple[str, Any]]:
        """The ranges of one read task (`pack`'s group of small ranges) as (split id, batch) pairs, each split's in
        order. One range after another unless overridden: a store that fetches many splits at once (Kafka's consumer
        assigned all of a group's partitions) overrides it, and may interleave the splits' batches."""
        for split, start, end in ranges:
            for batch in self.read(split, start, end):
                yield split.split_id, batch


def cut(split: Split, start: int, end: int, max_per_partition: int | None) -> list[SplitPartition]:
    """A split's range as one partition, or several of at most `max_per_partition` positions each."""
    if end <= start:
        return []
    if not max_per_partition or end - start <= max_per_partition:
        return [SplitPartition(split, start, end)]
    return [SplitPartition(split, s, min(s + max_per_partition, end)) for s in range(start, end, max_per_partition)]


class SplitBatchReader(DataSourceReader):
    """Batch read: every split's end is fixed when the query is planned."""

    def __init__(self, enumerator: SplitEnumerator, reader: SplitReader, max_per_partition: int | None, *,
                 reads: ReadObserver | None = None, per_task: int | None = None) -> None:
        """`reads`: where read tasks report what they fetch (sluice.metrics; None: nowhere); `per_task`: ranges of
        fewer positions are packed into tasks of up to that many (`pack`; None: a task per range)."""
        self.enumerator = enumerator
        self.reader = reader
        self.max_per_partition = max_per_partition
        self.reads = reads
        self.per_task = per_task

    def partitions(self) -> Sequence[InputPartition]:
        splits = self.enumerator.discover()
        bounds = self.enumerator.bounds(splits)
        out = tasks(((split, *bounds[split.split_id]) for split in splits), self.max_per_partition, self.per_task)
        return out or [SplitPartition(Split("__empty__"), 0, 0)]

    def read(self, partition: SplitPartition | SplitGroup) -> Iterator[Any]:  # type: ignore[override]
        yield from read_parts(self.reader, partition, self.reads) or ()


class SplitStreamReader(StreamReaderCore[SplitOffset, SplitPartition | SplitGroup]):
    """Streaming read with discovery, admission control (rows or bytes per trigger) and AvailableNow."""

    cap_options = ("max-records-per-trigger", "max-bytes-per-trigger")

    def __init__(self, enumerator: SplitEnumerator, reader: SplitReader, max_per_partition: int | None,
                 max_records: int | None, max_bytes: int | None, *, source: tuple[str, str] | None = None,
                 reads: ReadObserver | None = None, per_task: int | None = None) -> None:
        """`source`: (format, what is read) to report how far the query is behind to a metrics collector
        (sluice.metrics), per split and in all, in positions, which are records where a position is a record (S2's
        seq nums, Kafka's offsets); `reads`: where read tasks report what they fetch; `per_task`: ranges of fewer
        positions are packed into tasks of up to that many (`pack`)."""
        super().__init__(source=source, max_rows=max_records, max_bytes=max_bytes, reads=reads)
        self.enumerator = enumerator
        self.reader = reader
        self.max_per_partition = max_per_partition
        self.per_task = per_task
        self._splits: dict[str, Split] = {}
        self._heads: dict[str, int] = {}  # each split's end as the last planning saw it

    def _known(self) -> dict[str, Split]:
        for split in self.enumerator.discover():
            self._splits.setdefault(split.split_id, split)
        return self._splits

    def parse_offset(self, raw: dict) -> SplitOffset:
        return SplitOffset.from_json(raw, self.format)

    def first_offset(self) -> SplitOffset:
        return SplitOffset(self.enumerator.start_positions(list(self._known().values())))

    def available_now_end(self) -> SplitOffset:
        return SplitOffset(self.enumerator.end_positions(list(self._known().values())))

    def next_end(self, start: SplitOffset, limit: ReadLimit) -> SplitOffset:
        positions = dict(start.positions)
        target = None if self.target is None else self.target.positions
        splits = self._known() if target is None else {k: self._splits[k] for k in target}
        for sid, split in splits.items():
            if sid not in positions:  # asked only for a split the start lacks: one request each (Kafka: an admin call)
                positions[sid] = self.enumerator.new_split_position(split)
        ends = {}
        latest = self.enumerator.end_positions(list(splits.values()), positions)
        self._heads.update(latest)
        for sid in splits:
            begin = positions[sid]
            end = latest[sid]
            if target is not None:
                end = min(end, target[sid])
            ends[sid] = max(begin, end)
        if isinstance(limit, ReadAllAvailable):
            return SplitOffset(ends)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_rows
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else self.max_bytes
        if max_rows:
            ends = self._share_rows(positions, ends, max_rows)
        if max_bytes:
            budget = max_bytes
            for sid in sorted(ends):
                if ends[sid] <= positions[sid]:
                    continue
                if budget <= 0:
                    ends[sid] = positions[sid]
                    continue
                ends[sid], used = self.enumerator.bytes_end(self._splits[sid], positions[sid], ends[sid], budget)
                budget -= used
        return SplitOffset(ends)

    @staticmethod
    def _share_rows(positions: dict[str, int], ends: dict[str, int], max_rows: int) -> dict[str, int]:
        """Split a row budget fairly: every split with data gets an equal share; unused shares go around."""
        left = {sid: ends[sid] - positions[sid] for sid in ends}
        take = dict.fromkeys(ends, 0)
        budget = max_rows
        while budget > 0 and any(left.values()):
            hungry = [sid for sid in sorted(left) if left[sid] > 0]
            share = max(1, budget // len(hungry))
            for sid in hungry:
                grant = min(share, left[sid], budget)
                take[sid] += grant
                left[sid] -= grant
                budget -= grant
                if budget == 0:
                    break
        return {sid: positions[sid] + take[sid] for sid in ends}

    def plan(self, start: SplitOffset, end: SplitOffset) -> Sequence[SplitPartition | SplitGroup]:
        begin = start.positions
        ranges = []
        for sid, stop in sorted(end.positions.items()):
            split = self._splits.get(sid) or Split(sid)
            ranges.append((split, begin[sid] if sid in begin else self.enumerator.new_split_position(split), stop))
        return tasks(ranges, self.max_per_partition, self.per_task)

    def read_partition(self, partition: SplitPartition | SplitGroup) -> Iterator[Any] | None:
        return read_parts(self.reader, partition, None)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Each range of a task observed as its split's (`read_parts`), not the task's batches as one."""
        yield from read_parts(self.reader, cast(SplitPartition | SplitGroup, partition), self.reads) or ()

    def lag(self, end: SplitOffset) -> SourceReport:
        """Each split's committed position against its head as the last planning saw it, and their sum."""
        committed = end.positions
        splits = []
        for sid, head in sorted(self._heads.items()):
            position = committed.get(sid, head)
            splits.append(SplitLag(sid, position, head, max(0, head - position)))
        behind = sum(split.pending_records for split in splits)
        return self.report(pending_records=behind, splits=tuple(splits))

    def close(self) -> None:
        self.enumerator.close()
