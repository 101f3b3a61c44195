"""Streaming reads of stores without a change feed: a tracking column (Kafka Connect's JDBC source in
timestamp+incrementing mode, Logstash's `tracking_column`), on the split framework's terms (FLIP-27).

Each split's position is the last (tracking value, tie-breaker) a micro-batch covered: a `TrackingPosition`, the
value an integer (an increasing id, or a timestamp in microseconds since the epoch, UTC), the tie-breaker the text
of the key columns of the last row (a primary key), so that many rows of one value can be cut between micro-batches.
A micro-batch reads the rows of (start, end] in (value, tie-breaker) order. The store compares positions (its
types, its collation), never Python.

Late rows, the known trap of tracking columns (a transaction that took its value before another one and commits
after it): the stream never reads past the greatest position the store showed at least `lag-window` ago
(`LagWindow`). A row is read exactly once if it is committed within the window of the moment a greater position
became visible; a row committed later than that is behind the offset and is never read. This costs latency equal
to the window and keeps the offset one position per split (no keys of re-read rows to de-duplicate against, which
grow with rate x window and make a replay depend on what the offset remembered). Rows with a NULL tracking value,
updates that do not move the tracking column, and deletes are not seen.

The store plugs in through a `TrackingEnumerator` (driver: the head, the end of a capped range, a count) and a
`TrackingReader` (executors: one range as Arrow record batches); the options are in _tracking_options.py. A
micro-batch's range is read by tasks of about `tracking.rows-per-task` rows, cut at rows' positions.
"""

from __future__ import annotations

import datetime as dt
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from sluice._errors import OptionError
from sluice.metrics._reads import ReadObserver
from sluice.metrics._report import SourceReport, SplitLag
from sluice.source._framework import Split
from sluice.source._offset import SparkOffset, check_offset_version
from sluice.source._stream import StreamReaderCore
from sluice.source._tracking_options import TrackingSettings
from sluice.spark._compat import ReadLimit

TRACKING_OFFSET_VERSION = 1
KINDS = ("int", "timestamp")  # what a tracking value is: an integer, or microseconds since the epoch (UTC)
# Records behind are counted up to this many per split (beyond: unknown): a bounded scan when a stream starts far
# behind.
COUNT_AT_MOST = 1_000_000


@dataclass(frozen=True)
class TrackingPosition:
    """After which row a split's reading stands: rows ordered by (value, key) greater than this one are ahead.
    value None: before every row; key None: before every row of `value` (a start at a given value)."""

    value: int | None = None
    key: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "key": None if self.key is None else list(self.key)}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TrackingPosition:
        value, key = raw.get("value"), raw.get("key")
        return cls(None if value is None else int(value), None if key is None else tuple(str(k) for k in key))

    def describe(self, kind: str) -> str:
        if self.value is None:
            return "the beginning"
        shown = show_value(kind, self.value)
        return shown if self.key is None else f"{shown} key {list(self.key)}"


BEGINNING = TrackingPosition()


def show_value(kind: str, value: int) -> str:
    if kind == "timestamp":
        return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=value)).isoformat()
    return str(value)


def parse_value(kind: str, text: str, option: str) -> int:
    """A tracking value given by the user (an integer, or an ISO 8601 timestamp, UTC when it names no zone)."""
    try:
        if kind == "int":
            return int(text)
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        what = "a whole number" if kind == "int" else "an ISO 8601 timestamp (2026-11-27T18:00:00+00:00)"
        raise OptionError(f"option '{option}' must be beginning, now or {what} for this tracking column; got "
                          f"{text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class TrackingOffset(SparkOffset):
    """A tracking-column stream's offset: where each split stands. Serialized form (version 1):
    {"v": 1, "column": name, "kind": "int" | "timestamp", "splits": {split id: {"value": int, "key": [text]}}}."""

    column: str
    kind: str
    positions: Mapping[str, TrackingPosition]
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", dict(self.positions))

    def to_json(self) -> dict[str, Any]:
        return {"v": TRACKING_OFFSET_VERSION, "column": self.column, "kind": self.kind,
                "splits": {sid: at.to_json() for sid, at in sorted(self.positions.items())}}

    @classmethod
    def from_json(cls, raw: dict[str, Any], source: str, column: str, kind: str) -> TrackingOffset:
        """Refuses an offset of another version, or of another tracking column or kind than this query's."""
        check_offset_version(raw, f"{source} tracking", TRACKING_OFFSET_VERSION)
        if raw.get("column") != column or raw.get("kind") != kind:
            raise OptionError(f"the checkpoint's offset tracks column '{raw.get('column')}' ({raw.get('kind')}), "
                              f"this query tracking.column '{column}' ({kind}): positions of one column mean "
                              "nothing in another. Keep the checkpoint's column, or start over with a new checkpoint")
        positions = {str(sid): TrackingPosition.from_json(at) for sid, at in raw.get("splits", {}).items()}
        return cls(column, kind, positions, raw)


class TrackingEnumerator(ABC):
    """Driver side: the store's splits and where their rows are. Positions are compared by the store."""

    column: str  # the tracking column
    kind: str  # one of KINDS

    def discover(self) -> list[Split]:
        """The splits (one by default: the whole table)."""
        return [Split("all")]

    @abstractmethod
    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        """The position of each split's greatest visible row now (BEGINNING when it has none)."""

    @abstractmethod
    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        """The position of the last row of (after, upto], or of the `rows`-th (a cap) when there are more; None
        when the range holds no row. A range takes every row of its end's (value, key), so a key that is not
        unique is never cut in two. A store whose head is not a row's position (a clock: HBase's cell timestamps)
        may answer `upto` itself for a range that holds a row."""

    def pieces(self, split: Split) -> list[Split]:
        """The parts of a split that a range is read in, one task each, asked when a micro-batch is planned (default:
        the split whole). A store whose positions are one for a table but whose rows live on several servers (HBase's
        regions, which split and move; Cassandra's slices of the token ring) reads each range in one task per part, each
        task the whole range of its part, and its offset stays one position."""
        return [split]

    def count_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                     most: int) -> int | None:
        """Rows in (after, upto] (records behind, for the metrics), counting no further than `most` + 1; None: the
        store cannot tell cheaply."""
        return None

    def close(self) -> None:
        """Release what the enumerator holds between calls."""


class TrackingReader(ABC):
    """Executor side: the rows of one split in (after, upto], in (value, key) order, as Arrow record batches."""

    @abstractmethod
    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[Any]:
        ...


@dataclass
class TrackingPartition(InputPartition):
    """One split's range (after, upto]: what an executor reads. Pickled to executors."""

    split: Split
    after: TrackingPosition
    upto: TrackingPosition

    def __init__(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> None:
        super().__init__(f"{split.split_id}:{after}-{upto}")
        self.split, self.after, self.upto = split, after, upto


class LagWindow:
    """The heads a split showed over time (a monotonic clock); `settled()` is the newest one seen at least
    `window_s` ago: every row below it that commits within the window of its being seen is visible by then."""

    def __init__(self, window_s: float, clock: Any = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[str, deque[tuple[float, TrackingPosition]]] = {}

    def observe(self, heads: Mapping[str, TrackingPosition]) -> None:
        now = self.clock()
        for sid, head in heads.items():
            seen = self._seen.setdefault(sid, deque())
            if not seen or seen[-1][1] != head:
                seen.append((now, head))

    def settled(self, sid: str) -> TrackingPosition | None:
        """None: nothing seen long enough ago (a query's first window after a (re)start)."""
        seen = self._seen.get(sid)
        if not seen:
            return None
        ripe = self.clock() - self.window_s
        while len(seen) > 1 and seen[1][0] <= ripe:
            seen.popleft()  # a newer settled head makes this one useless
        return seen[0][1] if seen[0][0] <= ripe else None

    def seen_any(self) -> bool:
        return bool(self._seen)

    def wait(self) -> None:
        """Until every head observed so far has settled (Trigger.AvailableNow: its target is read whole)."""
        time.sleep(self.window_s)


class TrackingStreamReader(StreamReaderCore[TrackingOffset, TrackingPartition]):
    """A tracking-column stream: start positions, the lag window, admission control (max rows per trigger),
    Trigger.AvailableNow, and metrics (records behind when the store counts them; currentFetchEventTimeLag from a
    timestamp tracking column)."""

    cap_options = ("max-records-per-trigger",)

    def __init__(self, enumerator: TrackingEnumerator, reader: TrackingReader, settings: TrackingSettings, *,
                 source: tuple[str, str], reads: ReadObserver | None = None) -> None:
        """`source`: (format, what is read), for errors and the metrics collector; `reads`: where read tasks report
        what they fetch."""
        super().__init__(source=source, max_rows=settings.max_records, reads=reads)
        self.enumerator = enumerator
        self.reader = reader
        self.settings = settings
        self._window = LagWindow(settings.lag_window_ms / 1000)
        self._splits = {split.split_id: split for split in enumerator.discover()}
        self._heads: dict[str, TrackingPosition] = {}

    def parse_offset(self, raw: dict) -> TrackingOffset:
        return TrackingOffset.from_json(raw, self.format or "", self.enumerator.column, self.enumerator.kind)

    def _made(self, positions: Mapping[str, TrackingPosition]) -> TrackingOffset:
        return TrackingOffset(self.enumerator.column, self.enumerator.kind, positions)

    def first_offset(self) -> TrackingOffset:
        start = self.settings.start
        if start == "beginning":
            positions = dict.fromkeys(self._splits, BEGINNING)
        elif start == "now":
            positions = self.enumerator.heads(list(self._splits.values()))
        else:
            value = parse_value(self.enumerator.kind, start, "tracking.start")
            positions = dict.fromkeys(self._splits, TrackingPosition(value, None))
        return self._made(positions)

    def available_now_end(self) -> TrackingOffset:
        heads = self.enumerator.heads(list(self._splits.values()))
        self._window.observe(heads)
        self._window.wait()
        return self._made(heads)

    def _observe(self) -> None:
        heads = self.enumerator.heads(list(self._splits.values()))
        self._heads = heads
        self._window.observe(heads)

    def next_end(self, start: TrackingOffset, limit: ReadLimit) -> TrackingOffset:
        if not self._window.seen_any():
            # A query's first planning waits one window, so it has a settled head to read to: on Spark 4.0/4.1,
            # Trigger.AvailableNow asks once (prepareForTriggerAvailableNow is never called there) and would
            # otherwise read nothing.
            self._observe()
            self._window.wait()
        self._observe()
        rows = self.rows_of(limit)
        target = None if self.target is None else self.target.positions
        ends = dict(start.positions)
        for sid, split in sorted(self._splits.items()):
            after = ends.setdefault(sid, BEGINNING)
            upto = target[sid] if target is not None else self._window.settled(sid)
            if upto is None or upto.value is None:
                continue
            share = None if rows is None else max(1, rows // len(self._splits))
            end = self.enumerator.end_within(split, after, upto, share)
            if end is not None:
                ends[sid] = end
        return self._made(ends)

    def plan(self, start: TrackingOffset, end: TrackingOffset) -> Sequence[TrackingPartition]:
        begin = start.positions
        out: list[TrackingPartition] = []
        for sid, upto in sorted(end.positions.items()):
            after = begin.get(sid, BEGINNING)
            if upto != after and upto.value is not None:
                split = self._splits.get(sid) or Split(sid)
                pieces = self.enumerator.pieces(split)
                for cut in self._cuts(split, after, upto):
                    out.extend(TrackingPartition(piece, after, cut) for piece in pieces)
                    after = cut
        return out

    def _cuts(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> list[TrackingPosition]:
        """The ends of a range's tasks, `upto` last: positions of rows about rows-per-task apart. A replayed
        micro-batch may be cut elsewhere (rows committed late inside it), its tasks together read the same range."""
        ends: list[TrackingPosition] = []
        every = self.settings.rows_per_task
        while every:
            end = self.enumerator.end_within(split, ends[-1] if ends else after, upto, every)
            if end is None or end == upto:
                break
            ends.append(end)
        return [*ends, upto]

    def read_partition(self, partition: TrackingPartition) -> Iterator[Any]:
        return self.reader.read(partition.split, partition.after, partition.upto)

    def split_of(self, partition: TrackingPartition) -> str:
        return partition.split.split_id

    def lag(self, end: TrackingOffset) -> SourceReport:
        """Rows between each split's committed position and its head (when the store counts them), and the head's
        tracking time minus the committed one's (a timestamp column)."""
        committed = end.positions
        kind = self.enumerator.kind
        splits: list[SplitLag] = []
        behind: int | None = 0  # None once a split's count is unknown
        time_behind: float | None = None
        for sid, head in sorted(self._heads.items()):
            at = committed.get(sid, BEGINNING)
            count = self.enumerator.count_within(self._splits[sid], at, head, COUNT_AT_MOST) \
                if head.value is not None else 0
            if count is not None and count > COUNT_AT_MOST:
                count = None
            behind = None if count is None or behind is None else behind + count
            if count is not None:  # a split whose rows behind are unknown is left out, not shown as 0
                splits.append(SplitLag(sid, at.value or 0, head.value or 0, count))
            if kind == "timestamp" and head.value is not None and at.value is not None:
                time_behind = max(time_behind or 0.0, (head.value - at.value) / 1000)
        last = next(iter(committed.values()), BEGINNING)
        top = next(iter(self._heads.values()), BEGINNING)
        return self.report(pending_records=behind, position=last.describe(kind), head=top.describe(kind),
                           time_behind_ms=time_behind, splits=tuple(splits))

    def close(self) -> None:
        self.enumerator.close()
