"""`format("clickhouse")` reads: splits by ranges of the sorting key's first column, each read as Arrow.

The enumerator (driver) asks for the column's min and max once and cuts [min, max] into `partitions` ranges;
each reader (executor) runs `SELECT ... WHERE lo <= key < hi FORMAT ArrowStream` (ClickHouse's primary index skips
the rest), casting each column to a type whose Arrow form Spark has (`_types.read_type`), and hands pyarrow's
record batches on as they stream in, cast to the read's schema (a schema the user gives may narrow a column: a row
whose value does not convert goes to the read's dead letters with errors.tolerance=all, `conform_or_aside`).
ReplacingMergeTree tables are read with FINAL, so a key's replaced and deleted rows never show. ClickHouse has no
snapshots: splits read at slightly different moments, so a read concurrent with writes may see some of them
(docs/clickhouse.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sluice.connector import (
    SEND_ASIDE,
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    Split,
    SplitEnumerator,
    SplitReader,
    ValueTypeError,
    conform_or_aside,
    read_with_letters,
)
from sluice.connectors.clickhouse._client import Connection, quote_ident
from sluice.connectors.clickhouse._table import TableInfo
from sluice.connectors.clickhouse._types import SIGNED, UNSIGNED, CHType, arrow_type, read_type

RANGED = (*SIGNED, *UNSIGNED, "Date", "DateTime")


def read_schema(info: TableInfo) -> tuple[dict[str, CHType], pa.Schema]:
    """Every column's type and the Arrow schema of a read (UInt64 reads as decimal(20,0): Spark has no uint64)."""
    types = info.column_types(list(info.spelled))
    return types, pa.schema([pa.field(n, arrow_type(read_type(t)), nullable=True) for n, t in types.items()])


def _literal(kind: CHType, value: int) -> str:
    return {"Date": f"toDate({value})", "DateTime": f"toDateTime({value})"}.get(kind.name, str(value))


def _as_number(kind: CHType, column: str) -> str:
    return f"toInt64({column})" if kind.name in ("Date", "DateTime") else column


class ClickHouseEnumerator(SplitEnumerator):
    """A batch read's splits: key ranges [lo, hi) (the last one closed), each read once (positions 0..1)."""

    def __init__(self, conn: Connection, info: TableInfo, types: dict[str, CHType], partitions: int) -> None:
        self.conn, self.info, self.types, self.partitions = conn, info, types, partitions

    def discover(self) -> list[Split]:
        key = self.info.sorting_key[0] if self.info.sorting_key else None
        kind = self.types.get(key) if key else None
        if key is None or kind is None or kind.base.name not in RANGED or kind.nullable or self.partitions == 1:
            return [Split("all")]
        column = _as_number(kind.base, quote_ident(key))
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
    def __init__(self, conn: Connection, types: dict[str, CHType], schema: pa.Schema, final: bool, key: tuple[str, ...],
                 dead_letters: DeadLetterRoute | None = None, read_id: str = "", streaming: bool = False) -> None:
        """`schema`: the read's (its types may narrow the columns' read types); `key`: the columns that name a row
        in errors (the sorting key); `dead_letters`: where rows with a value that does not convert to `schema` go
        (errors.tolerance=all), named after the streaming query, else `read_id`."""
        self.conn, self.types, self.schema, self.final, self.key = conn, types, schema, final, key
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming

    def described(self) -> str:
        return f"table {self.conn.target}"

    def with_letters(self, sql: str, split: str) -> Iterator[pa.RecordBatch]:
        """The rows of `sql` cast to the schema, in a read task that sends the rows that do not convert aside."""
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, self.described(),
                                 lambda letters: self._conformed(sql, split, letters))

    def _conformed(self, sql: str, split: str, letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        where = f"clickhouse {self.described()}, split {split}"
        for batch in self.conn.arrow_batches(sql):
            if not batch.num_rows:
                continue
            try:
                yield conform_or_aside(batch, self.schema, letters, where, key=self.key)
            except pa.ArrowInvalid as e:  # without a route, or with no one row at fault
                raise ValueTypeError(f"{where}: {e}." + (f" {SEND_ASIDE}" if letters is None else "")) from None

    def select_sql(self, split: Split) -> str:
        out = []
        for name in self.schema.names:
            kind, column = self.types[name], quote_ident(name)
            target = read_type(kind)
            out.append(column if target == kind else f"CAST({column} AS {target}) AS {column}")
        where = ""
        if split.info:
            kind = self.types[split.info["column"]].base
            column = quote_ident(split.info["column"])
            where = f" WHERE {column} >= {_literal(kind, split.info['lo'])}"
            if split.info["hi"] is not None:
                where += f" AND {column} < {_literal(kind, split.info['hi'])}"
        final = " FINAL" if self.final else ""
        return f"SELECT {', '.join(out)} FROM {self.conn.target}{final}{where}"

    def read(self, split: Split, start: int, end: int) -> Iterator[Any]:
        return self.with_letters(self.select_sql(split), split.split_id)


def check_final(info: TableInfo, final: bool | None) -> bool:
    if final is None:
        return info.replacing
    if final and not info.engine.endswith("MergeTree"):
        raise OptionError(f"final=true: table engine {info.engine} does not support FINAL; remove the option.")
    return final
