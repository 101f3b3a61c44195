"""`format("clickhouse")` reads: splits by ranges of the sorting key's first column, each read as CSV into Arrow.

The enumerator (driver) asks for the column's min and max once and cuts [min, max] into `partitions` ranges;
each reader (executor) runs `SELECT ... WHERE lo <= key < hi` (ClickHouse's primary index skips the rest) and
parses the streamed CSV with pyarrow's C++ reader. ReplacingMergeTree tables are read with FINAL, so a key's
replaced rows never show. ClickHouse has no snapshots: splits read at slightly different moments, so a read
concurrent with writes may see some of them (docs/clickhouse.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import Option, OptionError, OptionSpec, Split, SplitEnumerator, SplitReader, conform
from sluice.connectors.clickhouse._client import CONNECTION_OPTIONS, Connection, quote_ident
from sluice.connectors.clickhouse._native import INTS, ColumnType, arrow_type
from sluice.connectors.clickhouse._table import TableInfo

READ_OPTIONS = (
    Option("partitions", "int", 4, "Splits (Spark partitions) of a read, by ranges of the sorting key's first "
           "column; 1 when that column is not an integer, Date or DateTime.", minimum=1, maximum=10_000),
    Option("final", "bool", None, "Read with FINAL (one row per key of a ReplacingMergeTree table); default: true "
           "for ReplacingMergeTree tables, false otherwise."),
)
READ_SPEC = OptionSpec("clickhouse", (*CONNECTION_OPTIONS, *READ_OPTIONS))
RANGED = (*INTS, "Date", "DateTime")


def read_schema(info: TableInfo) -> tuple[dict[str, ColumnType], pa.Schema]:
    """Every column's type and the Arrow schema of a read (UInt64 reads as decimal(20,0): Spark has no uint64)."""
    types = info.column_types(list(info.types))
    return types, pa.schema([pa.field(n, arrow_type(t), nullable=True) for n, t in types.items()])


def _literal(kind: ColumnType, value: int) -> str:
    if kind.base == "Date":
        return f"toDate({value})"
    if kind.base == "DateTime":
        return f"toDateTime({value})"
    return str(value)


def _as_number(kind: ColumnType, column: str) -> str:
    return f"toInt64({column})" if kind.base in ("Date", "DateTime") else column


class ClickHouseEnumerator(SplitEnumerator):
    """A batch read's splits: key ranges [lo, hi) (the last one closed), each read once (positions 0..1)."""

    def __init__(self, conn: Connection, info: TableInfo, types: dict[str, ColumnType], partitions: int) -> None:
        self.conn, self.info, self.types, self.partitions = conn, info, types, partitions

    def discover(self) -> list[Split]:
        key = self.info.sorting_key[0] if self.info.sorting_key else None
        kind = self.types.get(key) if key else None
        if kind is None or kind.base not in RANGED or kind.nullable or self.partitions == 1:
            return [Split("all")]
        column = _as_number(kind, quote_ident(key))
        bounds = self.conn.rows(f"SELECT toString(min({column})), toString(max({column})) FROM {self.conn.target}")
        low, high = (int(v) for v in bounds[0])
        if high <= low:
            return [Split("all")]
        step = max(1, -(-(high - low + 1) // self.partitions))
        cuts = list(range(low, high + 1, step))
        return [Split(f"{key}:{lo}", {"column": key, "lo": lo, "hi": lo + step if lo + step <= high else None})
                for lo in cuts]

    def start_position(self, split: Split) -> int:
        return 0

    def end_position(self, split: Split) -> int:
        return 1


class ClickHouseReader(SplitReader):
    def __init__(self, conn: Connection, types: dict[str, ColumnType], schema: pa.Schema, final: bool) -> None:
        self.conn, self.types, self.schema, self.final = conn, types, schema, final

    def _select(self, split: Split) -> str:
        out = []
        for name in self.schema.names:
            kind, column = self.types[name], quote_ident(name)
            # Dates and times as numbers: ClickHouse prints day 0 / second 0 as '0000-00-00 ...'.
            number = {"Date": "toUInt16", "DateTime": "toUInt32"}.get(kind.base)
            if number is None:
                out.append(column)
            elif kind.nullable:
                out.append(f"if(isNull({column}), NULL, {number}(assumeNotNull({column})))")
            else:
                out.append(f"{number}({column})")
        where = ""
        if split.info:
            kind = self.types[split.info["column"]]
            column = quote_ident(split.info["column"])
            where = f" WHERE {column} >= {_literal(kind, split.info['lo'])}"
            if split.info["hi"] is not None:
                where += f" AND {column} < {_literal(kind, split.info['hi'])}"
        final = " FINAL" if self.final else ""
        return f"SELECT {', '.join(out)} FROM {self.conn.target}{final}{where} FORMAT CSV"

    def read(self, split: Split, start: int, end: int) -> Iterator[Any]:
        import pyarrow.csv as pacsv

        csv_types = {f.name: pa.int64() if self.types[f.name].base in ("Date", "DateTime") else f.type
                     for f in self.schema}
        stream = _Chunks(self.conn.stream(self._select(split)))
        reader = pacsv.open_csv(
            stream, read_options=pacsv.ReadOptions(column_names=self.schema.names, block_size=4 << 20),
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            convert_options=pacsv.ConvertOptions(column_types=csv_types, null_values=["\\N"],
                                                 strings_can_be_null=True, quoted_strings_can_be_null=False))
        for batch in reader:
            yield conform(self._times(batch), self.schema)

    def _times(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays = []
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            base = self.types[name].base
            if base == "DateTime":
                column = pc.multiply(column, 1_000_000).cast(pa.timestamp("us", "UTC"))
            elif base == "Date":
                column = column.cast(pa.int32()).cast(pa.date32())
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


class _Chunks:
    """A file-like view of an iterator of byte chunks (what pyarrow's streaming CSV reader reads from)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buffer, self.closed = chunks, b"", False

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self.buffer) < size:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        if size < 0:
            out, self.buffer = self.buffer, b""
        else:
            out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def close(self) -> None:
        self.closed = True


def check_final(info: TableInfo, final: bool | None) -> bool:
    if final is None:
        return info.replacing
    if final and not info.engine.endswith("MergeTree"):
        raise OptionError(f"final=true: table engine {info.engine} does not support FINAL; remove the option.")
    return final
