"""`format("cassandra")` reads: splits by ranges of the partitioner's token ring (FLIP-27's split enumerator and
split reader), each read with a paged `SELECT ... WHERE token(key) > lo AND token(key) <= hi`.

The number of splits comes from the table's size estimates (`system.size_estimates`, refreshed by each node every
few minutes) divided by `read.split-size-mb`, or is set with `partitions`. Cassandra has no snapshots: splits read
at slightly different moments, so a read concurrent with writes may see some of them (docs/cassandra.md).

A value that has no form in its column's Spark type (a varint or decimal beyond decimal(38), a date beyond year
9999) fails its page's conversion; only then are its rows found one by one, and they go to the read's dead letters
(errors.tolerance=all) or fail the read naming them.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from sluice.connector import (
    SEND_ASIDE,
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitPartition,
    SplitReader,
    ValueTypeError,
    read_with_letters,
)
from sluice.connectors.cassandra._client import TUPLES, Connection, quote_ident
from sluice.connectors.cassandra._table import TableInfo
from sluice.connectors.cassandra._types import CQLType, arrow_column, scalar_converter

MIN_TOKEN, MAX_TOKEN = -(2**63), 2**63 - 1  # Murmur3Partitioner's ring (it never produces MIN_TOKEN itself)


def estimated_bytes(conn: Connection) -> int:
    """The table's size as the contacted node estimates it (0 before its first estimate)."""
    rows = conn.session().execute(
        "SELECT mean_partition_size, partitions_count FROM system.size_estimates "
        "WHERE keyspace_name = %s AND table_name = %s", (conn.keyspace, conn.table))
    return sum(r.mean_partition_size * r.partitions_count for r in rows)


class CassandraEnumerator(SplitEnumerator):
    """A batch read's splits: token ranges (lo, hi], each read once (positions 0..1)."""

    def __init__(self, conn: Connection, partitions: int | None, split_bytes: int) -> None:
        self.conn, self.partitions, self.split_bytes = conn, partitions, split_bytes

    def discover(self) -> list[Split]:
        count = self.partitions or max(1, math.ceil(estimated_bytes(self.conn) / self.split_bytes))
        step = (MAX_TOKEN - MIN_TOKEN) // count
        bounds = [MIN_TOKEN + i * step for i in range(count)] + [MAX_TOKEN]
        return [Split(f"tokens:{lo}", {"lo": lo, "hi": hi}) for lo, hi in itertools.pairwise(bounds)]

    def start_position(self, split: Split) -> int:
        return 0

    def end_position(self, split: Split) -> int:
        return 1


@dataclass(frozen=True)
class Restriction:
    """A filter Cassandra applies itself: `column op ?`, bound to `value` (a list for IN)."""

    column: str
    op: str  # =, IN, >, >=, <, <=
    value: Any


_RANGE_OPS = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<",
              "LessThanOrEqual": "<="}


def restrictions(filters: list[Any], info: TableInfo) -> list[tuple[Any, Restriction]]:
    """The filters CQL can apply, as (filter, restriction): equality or IN on every partition-key column (then a
    read asks for those partitions only, no token ranges), and equality or ranges on the first clustering column
    (a slice of each partition). Others stay with Spark."""
    by_column: dict[str, list[tuple[Any, Restriction]]] = {}
    for f in filters:
        kind = type(f).__name__
        if len(getattr(f, "attribute", ())) != 1:
            continue
        column = f.attribute[0]
        if column not in info.columns or info.columns[column].args or info.columns[column].fields:
            continue  # not a column, or a collection or user type: Spark compares those
        convert = scalar_converter(info.columns[column])
        if kind == "In" and column in info.partition_key:
            by_column.setdefault(column, []).append((f, Restriction(column, "IN", [convert(v) for v in f.value])))
        elif kind in _RANGE_OPS and f.value is not None and (
                (column in info.partition_key and kind == "EqualTo")
                or (info.clustering and column == info.clustering[0])):
            by_column.setdefault(column, []).append((f, Restriction(column, _RANGE_OPS[kind], convert(f.value))))
    keyed = all(len(by_column.get(c, ())) == 1 for c in info.partition_key)
    out = [pair for c in info.partition_key for pair in by_column.get(c, ())] if keyed else []
    if info.clustering:
        out += by_column.get(info.clustering[0], [])
    return out


# What converting a value the driver read into Arrow raises when the value has no form in the Spark type:
# ArrowInvalid (a ValueError: out of the type's range), ValueError (a date beyond year 9999), decimal's
# InvalidOperation (an ArithmeticError: over 38 digits), ArrowTypeError (a TypeError: a schema given to the read
# that does not fit the column).
UNTYPED = (ValueError, TypeError, ArithmeticError)
_AS_JSON = (str, int, float, bool, Decimal, bytes, datetime.date, list, tuple, dict)  # as record_json writes them


class CassandraReader(SplitReader):
    def __init__(self, conn: Connection, info: TableInfo, schema: pa.Schema, fetch_size: int,
                 consistency: str, dead_letters: DeadLetterRoute | None = None, read_id: str = "",
                 streaming: bool = False) -> None:
        """`dead_letters`: where rows with a value that does not convert to the schema go (errors.tolerance=all),
        named after the streaming query, else `read_id`."""
        self.conn, self.info, self.schema = conn, info, schema
        self.fetch_size, self.consistency = fetch_size, consistency
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming
        self.where: list[Restriction] = []  # pushed filters

    @property
    def keyed(self) -> bool:
        """Whether pushed filters name the partitions to read (no token ranges then)."""
        return any(r.column in self.info.partition_key for r in self.where)

    def select_columns(self) -> str:
        """SELECT's list and FROM, for the schema's columns."""
        columns = ", ".join(quote_ident(n) for n in self.schema.names) or "COUNT(*)"
        return f"SELECT {columns} FROM {self.conn.target}"

    def select(self) -> str:
        clauses = [f"{quote_ident(r.column)} {r.op} ?" for r in self.where]
        if not self.keyed:
            token = f"token({', '.join(quote_ident(c) for c in self.info.partition_key)})"
            clauses[:0] = [f"{token} > ?", f"{token} <= ?"]
        # A clustering slice over token ranges filters inside each partition: Cassandra wants it said.
        allow = " ALLOW FILTERING" if self.where and not self.keyed else ""
        return f"{self.select_columns()} WHERE {' AND '.join(clauses)}{allow}"

    def bound_values(self, split: Split) -> tuple[Any, ...]:
        tokens = () if self.keyed else (split.info["lo"], split.info["hi"])
        return (*tokens, *(r.value for r in self.where))

    def read(self, split: Split, start: int, end: int) -> Iterator[Any]:
        return self.with_letters(self.select(), self.bound_values(split), split.split_id)

    def described(self) -> str:
        return f"table {self.conn.target}"

    def with_letters(self, query: str, values: Sequence[Any], split: str) -> Iterator[pa.RecordBatch]:
        """`batches` in a read task that sends the rows it cannot type aside."""
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, self.described(),
                                 lambda letters: self.batches(query, values, letters, split))

    def batches(self, query: str, values: Sequence[Any], letters: DeadLetterWriter | None = None,
                split: str = "") -> Iterator[pa.RecordBatch]:
        """The rows of `query` bound to `values`, a record batch per page; rows with a value that does not convert
        go to `letters`, or fail the read when it is None."""
        from cassandra import ConsistencyLevel

        session = self.conn.session()
        statement = session.prepare(query)
        statement.consistency_level = ConsistencyLevel.name_to_value[self.consistency]
        statement.fetch_size = self.fetch_size
        kinds: list[CQLType] = [self.info.columns[n] for n in self.schema.names]
        result = session.execute(statement.bind(values), execution_profile=TUPLES)
        while True:
            page = result.current_rows
            if page:
                batch = self._typed(page, kinds, letters, split)
                if batch is not None:
                    yield batch
            if not result.has_more_pages:
                return
            result.fetch_next_page()

    def _arrow(self, page: Sequence[Sequence[Any]], kinds: list[CQLType]) -> pa.RecordBatch:
        columns = list(zip(*page, strict=True))
        arrays = [arrow_column(list(cells), kind, field.type)
                  for cells, kind, field in zip(columns, kinds, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _typed(self, page: Sequence[Sequence[Any]], kinds: list[CQLType], letters: DeadLetterWriter | None,
               split: str) -> pa.RecordBatch | None:
        """The page as Arrow, without the rows whose values do not convert (sent to `letters`); None when none
        is left."""
        try:
            return self._arrow(page, kinds)
        except UNTYPED:
            bad = self._untyped(page, kinds, split)
            if not bad:
                raise  # no one row is at fault
        if letters is None:
            first = bad[min(bad)]
            raise ValueTypeError(f"{first}. {SEND_ASIDE}") from None
        names = self.schema.names
        letters.add([{n: v if v is None or isinstance(v, _AS_JSON) else str(v) for n, v in zip(names, page[row],
                                                                                                strict=True)}
                     for row in sorted(bad)], [bad[row] for row in sorted(bad)])
        kept = [row for i, row in enumerate(page) if i not in bad]
        return self._arrow(kept, kinds) if kept else None

    def _untyped(self, page: Sequence[Sequence[Any]], kinds: list[CQLType], split: str) -> dict[int, ValueTypeError]:
        """The rows of a page that failed to convert, each with an error naming the table, split, key, column and
        value (rare: each column of the page is tried, then the failing ones value by value)."""
        names = self.schema.names
        key = [names.index(c) for c in self.info.primary_key if c in names]
        bad: dict[int, ValueTypeError] = {}
        for i, (kind, field) in enumerate(zip(kinds, self.schema, strict=True)):
            try:
                arrow_column([row[i] for row in page], kind, field.type)
                continue
            except UNTYPED:
                pass
            for r, row in enumerate(page):
                try:
                    arrow_column([row[i]], kind, field.type)
                except UNTYPED as e:
                    if r not in bad:
                        named = ", ".join(f"{names[k]}={row[k]!r}" for k in key)
                        why = "more digits than it holds" if isinstance(e, InvalidOperation) else str(e)
                        bad[r] = ValueTypeError(f"cassandra {self.described()}, split {split}, key ({named}): the "
                                                f"value {row[i]!r} of column '{field.name}' (CQL {kind}) does not "
                                                f"convert to {field.type}: {why}")
        return bad


class CassandraBatchReader(SplitBatchReader):
    """The batch read: token-range splits, or one split when pushed filters name whole partition keys."""

    enumerator: CassandraEnumerator
    reader: CassandraReader

    def partitions(self) -> Sequence[InputPartition]:
        if self.reader.keyed:
            return [SplitPartition(Split("partitions"), 0, 1)]
        return super().partitions()


class CassandraPushdownReader(CassandraBatchReader):
    """pushdown=true: Spark's filters on the partition key and first clustering column go into the CQL (Spark 4.1+
    hands Python readers their filters)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        taken = restrictions(list(filters), self.reader.info)
        pushed = {id(f) for f, _ in taken}
        self.reader.where = [r for _, r in taken]
        yield from (f for f in filters if id(f) not in pushed)


def check_columns(info: TableInfo, names: list[str], conn: Connection) -> None:
    missing = [n for n in names if n not in info.columns]
    if missing:
        raise OptionError(f"column(s) {missing} of the given schema are not in {conn.target}; table columns: "
                          f"{list(info.columns)}")
