"""`format("hbase")` reads: one split per region (FLIP-27's split enumerator and split reader), or several per
region with read.splits-per-region, each a scan of its row-key range through the Thrift2 gateway.

Spark 4.1+ hands Python readers their filters: comparisons and prefixes on the row key's first column become the
scans' key range (regions outside it are not read). Only the schema's columns are asked for (their cells).
HBase has no snapshots across regions: splits scan at slightly different moments (docs/hbase.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice.connector import Option, OptionError, OptionSpec, Split, SplitBatchReader, SplitEnumerator, SplitReader
from sluice.connectors.hbase._catalog import CATALOG_OPTIONS, Catalog
from sluice.connectors.hbase._cells import decoder
from sluice.connectors.hbase._client import CONNECTION_OPTIONS, Connection, regions, thrift
from sluice.connectors.hbase._keys import KeyCodec

READ_OPTIONS = (
    Option("read.splits-per-region", "int", 1, "Splits (Spark partitions) per region: its key range cut into "
           "this many equal byte ranges.", minimum=1, maximum=1024),
    Option("read.rows-per-fetch", "int", 1000, "Rows per scanner call (and the scan's caching).", minimum=1,
           maximum=1_000_000),
    Option("read.time-range", "list", (), "min,max: only cells with min <= timestamp < max (milliseconds), e.g. "
           "'0,1767225600000' to read the table as of a moment."),
)
READ_SPEC = OptionSpec("hbase", (*CONNECTION_OPTIONS, *CATALOG_OPTIONS, *READ_OPTIONS))


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
        value = getattr(f, "value", None)
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


class HBaseReader(SplitReader):
    """Scans one split's key range, its cells decoded into the schema's columns."""

    def __init__(self, conn: Connection, catalog: Catalog, key: KeyCodec, schema: pa.Schema, rows_per_fetch: int,
                 time_range: tuple[int, int] | None) -> None:
        self.conn, self.catalog, self.key, self.schema = conn, catalog, key, schema
        self.rows_per_fetch, self.time_range = rows_per_fetch, time_range

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        module = thrift()
        cells = self.catalog.cells
        columns = [module.TColumn(family=c.family, qualifier=c.qualifier) for _, c in cells]
        scan = module.TScan(startRow=split.info["start"] or None, stopRow=split.info["stop"] or None,
                            columns=columns or None, caching=self.rows_per_fetch, maxVersions=1,
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
                yield self._batch(results, place, decode_key, decoders)
        finally:
            self.conn.call("closeScanner", scanner, index=index)

    def _batch(self, results: list[Any], place: dict[tuple[bytes, bytes], int], decode_key: Any,
               decoders: list[Any]) -> pa.RecordBatch:
        cells = self.catalog.cells
        keys = [bytes(r.row) for r in results]
        values: list[list[Any]] = [[None] * len(results) for _ in cells]
        for row, result in enumerate(results):
            for cell in result.columnValues:
                i = place.get((bytes(cell.family), bytes(cell.qualifier)))
                if i is None:
                    continue
                try:
                    values[i][row] = decoders[i](bytes(cell.value))
                except (ValueError, UnicodeDecodeError) as e:
                    raise OptionError(f"row key {keys[row]!r}, cell {cells[i][1]}: {e}") from None
        try:
            key_arrays = dict(zip(self.key.columns, decode_key(keys), strict=True))
        except (ValueError, IndexError) as e:
            raise OptionError(f"a row key of {self.catalog.table} does not decode as rowkey "
                              f"{list(self.key.columns)} ({e}): was it written with the same key columns and "
                              "types? (docs/hbase.md, row keys)") from None
        cell_arrays = {name: pa.array(values[i], self.schema.field(name).type) for i, (name, _) in enumerate(cells)}
        arrays = [key_arrays[n] if n in key_arrays else cell_arrays[n] for n in self.schema.names]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


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
    """The batch read, with Spark's filters on the row key's first column turned into the splits' key range."""

    enumerator: RegionEnumerator
    reader: HBaseReader

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        self.enumerator.range, taken = key_range(list(filters), self.reader.key, self.reader.schema)
        pushed = {id(f) for f in taken}
        yield from (f for f in filters if id(f) not in pushed)


def time_range(opts: Any) -> tuple[int, int] | None:
    given = opts["read.time-range"]
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
