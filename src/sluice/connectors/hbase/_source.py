"""`format("hbase")` reads: one split per region (FLIP-27's split enumerator and split reader), or several per
region with read.splits-per-region, each a scan of its row-key range through the Thrift2 gateway.

Spark 4.1+ hands Python readers their filters: comparisons and prefixes on the row key's first column become the
scans' key range (regions outside it are not read). Only the schema's columns are asked for (their cells).
HBase has no snapshots across regions: splits scan at slightly different moments (docs/hbase.md).

Versions: a scan with maxVersions=N returns up to N cells per column; a row per distinct cell timestamp is the
unit a writer made (sluice writes every cell of a put, and a delete, with one timestamp).

A row whose key or a cell does not decode as the read's types fails the read, or with errors.tolerance=all goes to
the read's dead letters as its row key, timestamp and cells (`build_or_aside`; the others are read).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.connector import (
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitReader,
    ValueTypeError,
    build_or_aside,
    read_with_letters,
)
from sluice.connectors.hbase._catalog import Catalog
from sluice.connectors.hbase._cells import decoder
from sluice.connectors.hbase._client import Connection, regions, thrift
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._options import ReadOptions


def successor(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with `prefix` (None: there is none)."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else None


@dataclass(frozen=True)
class KeyRange:
    """Row keys start <= key < stop (b"": unbounded on that side)."""

    start: bytes = b""
    stop: bytes = b""

    def clip(self, other: KeyRange) -> KeyRange | None:
        """The part of this range inside `other`; None when empty."""
        start = max(self.start, other.start)
        stops = [s for s in (self.stop, other.stop) if s]
        stop = min(stops) if stops else b""
        return None if stop and start >= stop else KeyRange(start, stop)


def _cut(region: KeyRange, pieces: int) -> list[KeyRange]:
    """`pieces` equal byte ranges of a region (keys read as 8-byte big-endian numbers)."""
    if pieces == 1:
        return [region]
    low = int.from_bytes(region.start[:8].ljust(8, b"\x00"), "big")
    high = int.from_bytes(region.stop[:8].ljust(8, b"\x00"), "big") if region.stop else 1 << 64
    step = (high - low) // pieces
    if step == 0:
        return [region]
    bounds = [region.start] + [(low + i * step).to_bytes(8, "big") for i in range(1, pieces)] + [region.stop]
    return [KeyRange(a, b) for a, b in itertools.pairwise(bounds) if not b or a < b]


_FLOATING = ("float", "double")  # -0.0 and 0.0 encode differently, and Spark compares them equal: not pushed
_COMPARISONS = ("EqualTo", "GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual")


def key_range(filters: Sequence[Any], key: KeyCodec, schema: pa.Schema) -> tuple[KeyRange | None, list[Any]]:
    """The row-key range the filters on the key's first column allow (None: no key), and the filters it applies.

    A value v of the first column encodes as p: with a one-column key, p is the whole key of v; otherwise the
    keys whose first column is v are exactly those starting with p."""
    first, kind = key.columns[0], key.kinds[0]
    whole: KeyRange | None = KeyRange()
    taken = []
    for f in filters:
        name = type(f).__name__
        if tuple(getattr(f, "attribute", ())) != (first,) or kind in _FLOATING:
            continue
        value: Any = getattr(f, "value", None)  # a scalar of the filter's kind (a str for StringStartsWith)
        part: KeyRange | None
        if name == "StringStartsWith" and kind == "string":
            low = value.encode()
            part = KeyRange(low, successor(low) or b"") if low else KeyRange()
        elif name in _COMPARISONS and value is not None:
            try:
                low = key.encode_values([value], schema)
            except (OptionError, pa.ArrowException, TypeError, ValueError):
                continue  # a value the key cannot hold (e.g. with a 0 byte): Spark filters
            high = low + b"\x00" if len(key.columns) == 1 else successor(low)  # None: no key is after them
            part = {"EqualTo": KeyRange(low, high or b""),
                    "GreaterThanOrEqual": KeyRange(low),
                    "GreaterThan": KeyRange(high) if high is not None else None,
                    "LessThan": KeyRange(b"", low) if low else None,
                    "LessThanOrEqual": KeyRange(b"", high or b"")}[name]
        else:
            continue
        whole = whole.clip(part) if whole is not None and part is not None else None
        taken.append(f)
    return whole, taken


Row = tuple[bytes, int, dict[int, bytes]]  # a row read: its key, timestamp and {cell's index: value}


class HBaseReader(SplitReader):
    """Scans one split's key range, its cells decoded into the schema's columns."""

    def __init__(self, conn: Connection, catalog: Catalog, key: KeyCodec, schema: pa.Schema, rows_per_fetch: int,
                 time_range: tuple[int, int] | None, versions: int = 1, stamp_column: str | None = None,
                 dead_letters: DeadLetterRoute | None = None, read_id: str = "", streaming: bool = False) -> None:
        """`dead_letters`: where rows that do not decode go (errors.tolerance=all), named after the streaming query,
        else `read_id`."""
        self.conn, self.catalog, self.key, self.schema = conn, catalog, key, schema
        self.rows_per_fetch, self.time_range = rows_per_fetch, time_range
        self.versions, self.stamp_column = versions, stamp_column
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, self.catalog.table,
                                 lambda letters: self._scan(split, letters))

    def _scan(self, split: Split, letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        module = thrift()
        cells = self.catalog.cells
        columns = [module.TColumn(family=c.family, qualifier=c.qualifier) for _, c in cells]
        scan = module.TScan(startRow=split.info["start"] or None, stopRow=split.info["stop"] or None,
                            columns=columns or None, caching=self.rows_per_fetch, maxVersions=self.versions,
                            timeRange=module.TTimeRange(*self.time_range) if self.time_range else None)
        place = {(c.family, c.qualifier): i for i, (_, c) in enumerate(cells)}
        decode_key = self.key.decoder(self.schema)
        decoders = [decoder(self.schema.field(name).type, name) for name, _ in cells]
        index = split.info["index"]
        scanner = self.conn.call("openScanner", self.catalog.table.encode(), scan, index=index)
        try:
            while True:
                results = self.conn.call("getScannerRows", scanner, self.rows_per_fetch, index=index)
                if not results:
                    return
                batch = self._typed(list(self._rows(results, place)), decode_key, decoders, letters)
                if batch.num_rows:
                    yield batch
        finally:
            self.conn.call("closeScanner", scanner, index=index)

    def batches(self, results: Sequence[Any], letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        """Rows of this reader's cells (Thrift results, in the order given) as record batches of rows-per-fetch;
        rows that do not decode go to `letters` (None: they fail the read)."""
        place = {(c.family, c.qualifier): i for i, (_, c) in enumerate(self.catalog.cells)}
        decode_key = self.key.decoder(self.schema)
        decoders = [decoder(self.schema.field(name).type, name) for name, _ in self.catalog.cells]
        for i in range(0, len(results), self.rows_per_fetch):
            rows = list(self._rows(list(results[i:i + self.rows_per_fetch]), place))
            batch = self._typed(rows, decode_key, decoders, letters)
            if batch.num_rows:
                yield batch

    def decoded(self, results: Sequence[Any]) -> pa.RecordBatch:
        """Rows of this reader's cells (Thrift results) as one batch, with no dead letters (lookups): a key or cell
        that does not decode raises a ValueTypeError naming it."""
        place = {(c.family, c.qualifier): i for i, (_, c) in enumerate(self.catalog.cells)}
        decoders = [decoder(self.schema.field(name).type, name) for name, _ in self.catalog.cells]
        return self._batch(list(self._rows(list(results), place)), self.key.decoder(self.schema), decoders)

    def _rows(self, results: list[Any], place: dict[tuple[bytes, bytes], int]) -> Iterator[Row]:
        """(row key, timestamp, {cell's index: value}) per row read: a row key's newest cells, or with
        read.versions > 1 its cells grouped by timestamp, newest first."""
        for result in results:
            key = bytes(result.row)
            by_stamp: dict[int, dict[int, bytes]] = {}
            for cell in result.columnValues:
                i = place.get((bytes(cell.family), bytes(cell.qualifier)))
                if i is not None:
                    by_stamp.setdefault(cell.timestamp, {})[i] = bytes(cell.value)
            if self.versions == 1:  # one cell per column: the newest of each
                yield key, max(by_stamp, default=0), {i: v for cells in by_stamp.values() for i, v in cells.items()}
            else:
                # each column brings its N newest cells; the row's N newest timestamps are the versions
                for stamp in sorted(by_stamp, reverse=True)[:self.versions]:
                    yield key, stamp, by_stamp[stamp]

    def _typed(self, rows: list[Row], decode_key: Any, decoders: list[Any],
               letters: DeadLetterWriter | None) -> pa.RecordBatch:
        table = self.catalog.table
        return build_or_aside(rows, lambda some: self._batch(some, decode_key, decoders), letters,
                              lambda row: f"hbase table {table}, row key {row[0]!r}", self._letter)

    def _letter(self, row: Row) -> dict[str, Any]:
        """A row that does not decode, as its dead letter: its key, timestamp and cells ("family:qualifier": the
        bytes; the dead letter's JSON holds them as text, or as {"base64": ...} when they are not UTF-8)."""
        key, stamp, found = row
        cells = self.catalog.cells
        return {"row": key, "timestamp": stamp,
                "cells": {str(cells[i][1]): value for i, value in sorted(found.items())}}

    def _batch(self, rows: Sequence[Row], decode_key: Any, decoders: list[Any]) -> pa.RecordBatch:
        """The rows as one batch of the schema; a key or cell that does not decode raises a ValueTypeError naming it
        (and the cell's column and bytes)."""
        cells = self.catalog.cells
        keys = [key for key, _, _ in rows]
        values: list[list[Any]] = [[None] * len(rows) for _ in cells]
        for row, (_, _, found) in enumerate(rows):
            for i, value in found.items():
                try:
                    values[i][row] = decoders[i](value)
                except (ValueError, UnicodeDecodeError) as e:
                    raise ValueTypeError(f"the cell {cells[i][1]} ({_shown(value)}) of column "
                                         f"'{cells[i][0]}' does not decode: {e}") from None
        try:
            arrays = dict(zip(self.key.columns, decode_key(keys), strict=True))
        except (ValueError, IndexError) as e:
            raise ValueTypeError(f"the row key does not decode as rowkey {list(self.key.columns)} ({e}): was it "
                                 "written with the same key columns and types? (docs/hbase.md, row keys)") from None
        arrays.update((name, pa.array(values[i], self.schema.field(name).type)) for i, (name, _) in enumerate(cells))
        if self.stamp_column:
            kind = self.schema.field(self.stamp_column).type
            scale = 1 if kind == pa.int64() else 1000  # Spark's timestamps are microseconds
            arrays[self.stamp_column] = pa.array([stamp * scale for _, stamp, _ in rows], kind)
        return pa.RecordBatch.from_arrays([arrays[n] for n in self.schema.names], schema=self.schema)


def _shown(value: bytes) -> str:
    return repr(value) if len(value) <= 64 else f"{value[:64]!r}... ({len(value)} bytes)"


class RegionEnumerator(SplitEnumerator):
    """A batch read's splits: each region's key range (or its pieces) inside the pushed range, read once."""

    def __init__(self, conn: Connection, table: str, splits_per_region: int) -> None:
        self.conn, self.table, self.splits_per_region = conn, table, splits_per_region
        self.range: KeyRange | None = KeyRange()  # None: the filters allow no row key

    def discover(self) -> list[Split]:
        if self.range is None:
            return []
        splits: list[Split] = []
        for region in regions(self.conn, self.table):
            inside = KeyRange(region.start, region.end).clip(self.range)
            for piece in _cut(inside, self.splits_per_region) if inside is not None else ():
                splits.append(Split(f"keys:{piece.start.hex()}-{piece.stop.hex()}",
                                    {"start": piece.start, "stop": piece.stop, "index": len(splits)}))
        return splits

    def start_position(self, split: Split) -> int:
        return 0

    def end_position(self, split: Split) -> int:
        return 1


class HBaseBatchReader(SplitBatchReader):
    """The batch read: a split per region (or several)."""

    enumerator: RegionEnumerator
    reader: HBaseReader


class HBasePushdownReader(HBaseBatchReader):
    """pushdown=true: Spark's filters on the row key's first column become the splits' key range (Spark 4.1+ hands
    Python readers their filters)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        self.enumerator.range, taken = key_range(list(filters), self.reader.key, self.reader.schema)
        pushed = {id(f) for f in taken}
        yield from (f for f in filters if id(f) not in pushed)


def stamp_column(options: ReadOptions, schema: pa.Schema) -> str | None:
    """read.timestamp-column, checked against the schema and read.versions."""
    column, versions = options.read_timestamp_column, options.read_versions
    if column is None:
        if versions > 1:
            raise OptionError(f"read.versions={versions} gives a row per version, and the versions of a row differ "
                              "in their timestamp: name a long or timestamp column of the schema that gets it with "
                              "read.timestamp-column, e.g. 'written_at'.")
        return None
    if column not in schema.names:
        raise OptionError(f"read.timestamp-column '{column}' is not a column of the read's schema (columns: "
                          f"{schema.names}); add it, e.g. '{column} timestamp'.")
    if column in options.rowkey:
        raise OptionError(f"read.timestamp-column '{column}' is a rowkey column; it must be a column of its own.")
    kind = schema.field(column).type
    if not (kind == pa.int64() or pa.types.is_timestamp(kind)):
        raise OptionError(f"read.timestamp-column '{column}' is {kind}; it must be a long (milliseconds since the "
                          "epoch) or a timestamp.")
    return column


def check_versions(versions: int, catalog: Catalog, kept: dict[bytes, int]) -> None:
    """read.versions within what every read family keeps (HBase returns no more than a family's VERSIONS)."""
    short = sorted(f.decode(errors="replace") for f in catalog.families if kept.get(f, 1) < versions)
    if short:
        family = short[0]
        raise OptionError(f"read.versions={versions}, and families {short} of {catalog.table} keep only "
                          f"{kept.get(family.encode(), 1)} version(s) of a cell: the older ones are gone. Lower "
                          f"read.versions or keep more (alter '{catalog.table}', NAME => '{family}', "
                          f"VERSIONS => {versions} in the HBase shell; it applies to cells written after).")


def time_range(given: tuple[str, ...]) -> tuple[int, int] | None:
    """read.time-range (`given`) as (min, max) milliseconds, or None when not set."""
    if not given:
        return None
    try:
        low, high = (int(v) for v in given)
    except ValueError:
        raise OptionError(f"read.time-range={','.join(given)!r} must be two whole numbers min,max (milliseconds), "
                          "e.g. '0,1767225600000'.") from None
    if not 0 <= low < high:
        raise OptionError(f"read.time-range={low},{high}: need 0 <= min < max.")
    return low, high
