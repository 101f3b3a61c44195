"""`spark.readStream.format("clickhouse")`: a table streamed by a tracking column of the user's (sluice's
tracking-column stream, docs/tracking.md).

ClickHouse keeps no commit order sluice can read: an insert's rows become visible when its part is committed, and
the `_block_number` column (MergeTree's enable_block_number_column) is provisional while the insert runs. So the
tracking column is the user's: an integer that grows, or a DateTime/DateTime64 set when the row is written
(`DEFAULT now64(6)`). Positions are compared by the server as tuples of the column's value as a number
(DateTime64: microseconds, so rows of one microsecond are one group, never cut) and the tie-breaker columns
(`tracking.tie-breaker`, their text cast back to their type); without a tie-breaker a micro-batch takes whole
groups of one tracking value.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sluice.connector import (
    Split,
    SqlTrackingEnumerator,
    TrackingPosition,
    TrackingReader,
    TrackingSettings,
    tracking_column_kind,
)
from sluice.connectors.clickhouse._client import Connection, quote_ident, quote_literal
from sluice.connectors.clickhouse._source import ClickHouseReader
from sluice.connectors.clickhouse._types import SIGNED, UNSIGNED, CHType

_TIMES = ("DateTime", "DateTime64")


def _kind(kind: CHType) -> str | None:
    base = kind.base.name
    if base in SIGNED or base in UNSIGNED:
        return "int"
    return "timestamp" if base in _TIMES else None


def tracking_kind(types: dict[str, CHType], settings: TrackingSettings, tie_breaker: Sequence[str],
                  table: str) -> str:
    """The kind of the tracking column (`tracking_column_kind`'s checks, by ClickHouse's types)."""
    return tracking_column_kind(settings, types, _kind, source=table, tie_breaker=tie_breaker,
                                works="an integer (Int8..Int64, UInt8..UInt64) or a DateTime/DateTime64 whose values "
                                      "grow as rows are inserted (e.g. DEFAULT now64(6))")


class ClickHouseTrackingSql:
    """The SQL of positions: the tracking value as a number and the tie-breaker, compared as one tuple."""

    def __init__(self, conn: Connection, types: dict[str, CHType], column: str, kind: str,
                 tie_breaker: Sequence[str]) -> None:
        self.conn, self.kind = conn, kind
        c = quote_ident(column)
        base = types[column].base.name
        self.number = c if kind == "int" else (
            f"toUnixTimestamp64Micro({c})" if base == "DateTime64" else f"toInt64(toUnixTimestamp({c})) * 1000000")
        self.keys = [(quote_ident(name), str(types[name])) for name in tie_breaker]
        self.not_null = f"{c} IS NOT NULL"

    def _tuple(self) -> str:
        return f"tuple({', '.join([self.number, *(k for k, _ in self.keys)])})"

    def _tuple_of(self, at: TrackingPosition) -> str:
        assert at.value is not None and at.key is not None
        keys = [f"CAST({quote_literal(text)} AS {kind})" for text, (_, kind) in zip(at.key, self.keys, strict=True)]
        return f"tuple({', '.join([str(int(at.value)), *keys])})"

    def range(self, after: TrackingPosition, upto: TrackingPosition) -> str:
        if after.value is None:
            low = self.not_null
        elif after.key is None:
            low = f"{self.number} >= {int(after.value)}"
        else:
            low = f"{self._tuple()} > {self._tuple_of(after)}"
        return f"{low} AND {self._tuple()} <= {self._tuple_of(upto)}"

    def order(self, descending: bool = False) -> str:
        way = " DESC" if descending else ""
        return ", ".join(f"{c}{way}" for c in [self.number, *(k for k, _ in self.keys)])

    def position_list(self) -> str:
        return ", ".join([f"toString({self.number})", *(f"toString({k})" for k, _ in self.keys)])


class ClickHouseTrackingEnumerator(SqlTrackingEnumerator):
    """Driver side: the head and the ends of capped ranges, over HTTP."""

    sql: ClickHouseTrackingSql  # the store's own TrackingSql: it also holds the connection

    def __init__(self, sql: ClickHouseTrackingSql, column: str, final: bool) -> None:
        self.sql, self.column, self.kind = sql, column, sql.kind
        self.source = sql.conn.target + (" FINAL" if final else "")

    def rows(self, query: str) -> list[list[str]]:
        return self.sql.conn.rows(query)


class ClickHouseTrackingReader(TrackingReader):
    """Executor side: one range as Arrow (the batch read's SELECT, its casts, FINAL and dead letters, with the
    range's WHERE)."""

    def __init__(self, rows: ClickHouseReader, sql: ClickHouseTrackingSql) -> None:
        self.rows, self.sql = rows, sql

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[Any]:
        s = self.sql
        query = f"{self.rows.select_sql(Split('all'))} WHERE {s.range(after, upto)} ORDER BY {s.order()}"
        return self.rows.with_letters(query, f"{split.split_id} ({after} - {upto})")

