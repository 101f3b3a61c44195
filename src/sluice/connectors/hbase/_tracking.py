"""`spark.readStream.format("hbase")`: rows found by their cell timestamps (sluice's tracking-column stream,
docs/tracking.md; docs/hbase.md says what is seen).

Every put gives its cells a timestamp, and a scan takes a time range [min, max): so HBase's natural tracking
value is the cell timestamp, and a time-range scan sees every put, an update of any column included. Positions are
(timestamp in microseconds, the row key's hex; hex compares as the bytes do), one for the whole table; a micro-batch's
range is read in one task per region (`pieces`, asked at each plan, so a region split or move changes nothing).
Inside a range (after, upto], a row's timestamp is its newest cell inside it among the read's columns; the row is
read with its values as of the range's end (the cells the scan did not bring, read as of then), and a row whose
cells fall in several ranges is read once per range.

The head: HBase has no max(timestamp) to ask, and a put's timestamp is the region server's clock when the put is
applied; the put is visible shortly after (MVCC, once its WAL entry is written). So the head is the clock: every
timestamp up to the driver's now. The lag window covers a put's time from timestamp to visible, and the driver's
clock running ahead of the region servers' (a driver behind only adds latency). Timestamps the writer gives (sluice's
write.timestamp=micro-batch, a user's own) are no clock: such a put is read only if its timestamp is within the
window of its becoming visible (docs/hbase.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from sluice.connector import (
    DeadLetterWriter,
    OptionError,
    Split,
    TrackingEnumerator,
    TrackingPosition,
    TrackingReader,
    TrackingSettings,
    read_with_letters,
    tracking_column_kind,
)
from sluice.connectors.hbase._client import Connection, regions, thrift
from sluice.connectors.hbase._source import HBaseReader

KIND = "timestamp"  # positions are microseconds (cell timestamps are milliseconds)
MICROS = 1000


WORKS = "a long (milliseconds since the epoch) or a timestamp"


def tracking_column(settings: TrackingSettings, schema: pa.Schema, rowkey: Sequence[str]) -> None:
    """tracking.column: the read schema's column (long: milliseconds, or timestamp) that gets each row's cell
    timestamp (`tracking_column_kind`'s checks, tracking.start's included); refuses a rowkey column or one of
    another type, naming it."""
    column = settings.column

    def kind(found: pa.DataType) -> str:
        if column in rowkey:  # whatever its type: the tracking value is no column's value on HBase
            raise OptionError(f"tracking.column '{column}' is a rowkey column; on HBase the tracking value is the "
                              "cells' timestamp: name a column of its own (long or timestamp) that gets it.")
        if not (found == pa.int64() or pa.types.is_timestamp(found)):
            raise OptionError(f"tracking.column '{column}' is {found}; on HBase it gets the row's cell timestamp and "
                              f"must be {WORKS}.")
        return KIND

    tracking_column_kind(settings, dict(zip(schema.names, schema.types, strict=True)), kind,
                         source="the read's schema", works=WORKS, where="the read's schema",
                         advice=f"On HBase it names the column that gets each row's cell timestamp (the tracking "
                                f"value); add it, e.g. '{column} timestamp'.")


def _ceil_ms(micros: int) -> int:
    return -(-micros // MICROS)


def time_range(after: TrackingPosition, upto: TrackingPosition) -> tuple[int, int]:
    """The milliseconds [min, max) of the cells a range (after, upto] may hold. A position (v, None) stands before
    every row of timestamp v; (v, key) after that row."""
    low = 0 if after.value is None else _ceil_ms(after.value)
    assert upto.value is not None
    high = _ceil_ms(upto.value) if upto.key is None else upto.value // MICROS + 1
    return low, max(low, high)


def _after(position: tuple[int, str], at: TrackingPosition) -> bool:
    """Whether a row's position (micros, key hex) is past `at`."""
    if at.value is None:
        return True
    if at.key is None:
        return position[0] >= at.value
    return position > (at.value, at.key[0])


def within(position: tuple[int, str], after: TrackingPosition, upto: TrackingPosition) -> bool:
    return _after(position, after) and not _after(position, upto)


def _position(result: Any) -> tuple[int, str]:
    """A scanned row's position: its newest cell (of those the scan asked for, inside its time range)."""
    return max(c.timestamp for c in result.columnValues) * MICROS, bytes(result.row).hex()


class RegionScans:
    """Time-range scans of a table's key ranges through the gateway (driver and executors)."""

    def __init__(self, conn: Connection, table: str, columns: Sequence[tuple[bytes, bytes]], rows_per_fetch: int):
        self.conn, self.table, self.columns, self.rows_per_fetch = conn, table, tuple(columns), rows_per_fetch

    def scan(self, piece: Split, after: TrackingPosition, upto: TrackingPosition, *, keys_only: bool = False,
             fetch: int | None = None) -> Iterator[list[Any]]:
        """The rows of `piece`'s key range with cells in the range's time range, a fetch at a time (not yet cut at
        the range's positions). `keys_only`: the cells without their values (KeyOnlyFilter)."""
        module = thrift()
        low, high = time_range(after, upto)
        if low >= high:
            return
        fetch = fetch or self.rows_per_fetch
        scan = module.TScan(startRow=piece.info.get("start") or None, stopRow=piece.info.get("stop") or None,
                            columns=[module.TColumn(family=f, qualifier=q) for f, q in self.columns] or None,
                            caching=fetch, maxVersions=1, timeRange=module.TTimeRange(low, high),
                            filterString=b"KeyOnlyFilter()" if keys_only else None)
        index = piece.info.get("index", 0)
        scanner = self.conn.call("openScanner", self.table.encode(), scan, index=index)
        try:
            while results := self.conn.call("getScannerRows", scanner, fetch, index=index):
                yield results
        finally:
            self.conn.call("closeScanner", scanner, index=index)

    def as_of(self, rows: Sequence[bytes], high: int, index: int) -> dict[bytes, Any]:
        """The read's cells of `rows` newest below `high` (ms): the rows' values as of a range's end."""
        module = thrift()
        columns = [module.TColumn(family=f, qualifier=q) for f, q in self.columns] or None
        gets = [module.TGet(row=row, columns=columns, timeRange=module.TTimeRange(0, high)) for row in rows]
        found = self.conn.call("getMultiple", self.table.encode(), gets, index=index)
        return {bytes(r.row): r for r in found if r.row}


class HBaseTrackingEnumerator(TrackingEnumerator):
    """Driver side: the clock as the head, whether a range holds a row, a capped range's end (a keys-only scan),
    and the regions a range is read in."""

    def __init__(self, scans: RegionScans, column: str, clock: Any = time.time) -> None:
        self.scans, self.column, self.kind, self.clock = scans, column, KIND, clock

    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        # Before every row of the next millisecond: every timestamp up to now.
        head = TrackingPosition((int(self.clock() * 1000) + 1) * MICROS, None)
        return {split.split_id: head for split in splits}

    def pieces(self, split: Split) -> list[Split]:
        return [Split(f"region:{r.start.hex()}-{r.end.hex()}", {"start": r.start, "stop": r.end, "index": i})
                for i, r in enumerate(regions(self.scans.conn, self.scans.table))]

    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        if not rows:
            return upto if self._any(split, after, upto) else None
        # A cap: the rows-th position of the whole range, its keys (no values) on the driver, by one scanner over
        # the split's key range (not one per region).
        found = sorted(position for results in self.scans.scan(Split(split.split_id), after, upto, keys_only=True)
                       for position in map(_position, results) if within(position, after, upto))
        if not found:
            return None
        if len(found) <= rows:
            return upto
        value, key = found[rows - 1]
        return TrackingPosition(value, (key,))

    def _any(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> bool:
        # One scanner over the split's whole key range: the gateway's scanner walks the regions, so an idle stream's
        # planning is three calls, not three per region. A row at a time: a fetch of n waits for n rows, which may
        # lie in n regions (only rows of the range's first millisecond, at or below its key, are passed over).
        for results in self.scans.scan(Split(split.split_id), after, upto, keys_only=True, fetch=1):
            if any(within(_position(r), after, upto) for r in results):
                return True
        return False


class HBaseTrackingReader(TrackingReader):
    """Executor side: one region's rows of a range, their values as of the range's end, in (timestamp, row key)
    order (a task's rows are sorted in memory: max-records-per-trigger and tracking.rows-per-task bound them)."""

    def __init__(self, scans: RegionScans, rows: HBaseReader) -> None:
        self.scans, self.rows = scans, rows

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[pa.RecordBatch]:
        r = self.rows
        return read_with_letters(r.dead_letters, r.read_id, r.streaming, r.catalog.table,
                                 lambda letters: self._read(split, after, upto, letters))

    def _read(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
              letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        kept: list[tuple[tuple[int, str], Any]] = []
        for results in self.scans.scan(split, after, upto):
            kept.extend((p, r) for p, r in ((_position(r), r) for r in results) if within(p, after, upto))
        if not kept:
            return
        wanted = len(self.scans.columns)
        partial = [bytes(r.row) for _, r in kept if len(r.columnValues) < wanted]
        if partial:  # cells older than the range: the row's values as of the range's end
            high = time_range(after, upto)[1]
            index = split.info.get("index", 0)
            whole: dict[bytes, Any] = {}
            for i in range(0, len(partial), self.rows.rows_per_fetch):
                whole.update(self.scans.as_of(partial[i:i + self.rows.rows_per_fetch], high, index))
            kept = [(p, whole.get(bytes(r.row), r)) for p, r in kept]
        kept.sort(key=lambda pr: pr[0])
        yield from self.rows.batches([r for _, r in kept], letters)
