"""`spark.readStream.format("cassandra")`: a table streamed by a tracking column of the user's, found through a
storage-attached index (SAI, Cassandra 5.0) on it (sluice's tracking-column stream, docs/tracking.md).

Cassandra keeps no change order a client can range over without a full scan: CDC is node-local files, and
`WRITETIME(col)` can be selected but not restricted or indexed. An SAI index answers range predicates on a non-key
column, `col > ? AND col <= ?`, without ALLOW FILTERING, so the tracking column is the user's (an integer that
grows, or a `timestamp` set at write, `toTimestamp(now())`) and must carry an SAI index; a column without one
would be a full scan per micro-batch, and is refused by name. Cassandra 5.0 has no ORDER BY on an SAI column (the
server refuses it: "except for ANN queries"), so positions never cut a group of one tracking value: every position
is "after every row of value v" (key `()`), and a micro-batch takes whole groups (rows of one millisecond, for a
timestamp), as ClickHouse's stream without a tie-breaker does. The primary key would be the natural tie-breaker,
but with neither ORDER BY nor tuple comparisons across partitions, cutting a group by it would mean reading the
group whole into the driver every time; whole groups cost only a cap that is exceeded by one group.

Heads, capped ends and counts are server-side aggregates over the SAI range (`max(col)`, `count(*)`: the node reads
the matching rows, only their count or maximum comes back): the head is `max(col)` over the rows above the last
head seen (a scan of the whole column at the query's first planning only), a capped end is found by bisecting the
value range with counts (a few counts of ranges no wider than the micro-batch). A table is one split; a micro-batch
is read by tasks of about `tracking.rows-per-task` rows, cut at values.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any

from sluice.connector import (
    OptionError,
    Split,
    TrackingEnumerator,
    TrackingPosition,
    TrackingReader,
    TrackingSettings,
    parse_value,
)
from sluice.connectors.cassandra._client import TUPLES, Connection, forget_session, quote_ident
from sluice.connectors.cassandra._source import CassandraReader
from sluice.connectors.cassandra._table import TableInfo, is_sai_class

INTEGERS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}  # bits
_EPOCH = dt.datetime(1970, 1, 1)
_MIN_TIME = dt.datetime(1, 1, 1)


def tracking_kind(info: TableInfo, settings: TrackingSettings, target: str) -> str:
    """The kind of the tracking column; refuses a missing column, one of another type, one without an SAI index
    (naming it), and a start value that is not of the column's kind or range."""
    name = settings.column
    if name not in info.columns:
        close = [c for c in info.columns if c.lower() == name.lower()]
        hint = f" (the table has '{close[0]}': names are case-sensitive)" if close else ""
        raise OptionError(f"tracking.column '{name}' is not a column of {target}{hint}; columns: {list(info.columns)}")
    cql = info.columns[name]
    if cql.name in INTEGERS and not cql.args:
        kind = "int"
    elif cql.name == "timestamp":
        kind = "timestamp"
    else:
        raise OptionError(f"tracking.column '{name}' has type {cql}; a tracking column must be tinyint, smallint, int, "
                          "bigint or timestamp, with values that grow as rows are written (e.g. toTimestamp(now()))")
    if info.partition_key == (name,):
        raise OptionError(f"tracking.column '{name}' is the partition key of {target}: Cassandra ranges over a "
                          "partition key's tokens only, and no index can be made on a partition key of one column. "
                          "Track another column (with an SAI index)")
    index = info.indexes.get(name)
    if index is None or not is_sai_class(index):
        has = f" (its index is {index}: a legacy or SASI index)" if index else ""
        raise OptionError(f"tracking.column '{name}' of {target} has no storage-attached index{has}: Cassandra "
                          "cannot range-scan it without reading the whole table each micro-batch. Create one: "
                          f"CREATE INDEX ON {target} ({quote_ident(name)}) USING 'sai'")
    if settings.start not in ("beginning", "now"):
        value = parse_value(kind, settings.start, "tracking.start")
        if kind == "int" and not -(2 ** (INTEGERS[cql.name] - 1)) <= value < 2 ** (INTEGERS[cql.name] - 1):
            raise OptionError(f"tracking.start {value} is out of the range of tracking.column '{name}' ({cql})")
    return kind


class TrackingCql:
    """The CQL of positions over an SAI-indexed column: ranges of whole groups of one value, bound to the
    column's type."""

    def __init__(self, conn: Connection, info: TableInfo, column: str, kind: str, consistency: str) -> None:
        self.conn, self.kind, self.consistency = conn, kind, consistency
        self.column = quote_ident(column)
        bits = INTEGERS.get(info.columns[column].name, 64)
        self.lowest: Any = -(2 ** (bits - 1)) if kind == "int" else _MIN_TIME

    def bound(self, value: int, ceil: bool = False) -> Any:
        """A value as the driver binds it: Cassandra's timestamps are milliseconds, a start value between two is
        rounded up (>=) and a range's ends down (their values are read from the column, whole milliseconds)."""
        if self.kind == "int":
            return value
        millis = -(-value // 1000) if ceil else value // 1000
        return _EPOCH + dt.timedelta(milliseconds=millis)

    def number(self, found: Any) -> int:
        """A value read back (an int, or a naive UTC datetime) as a position's value."""
        if self.kind == "int":
            return int(found)
        return (found - _EPOCH) // dt.timedelta(microseconds=1)

    def range(self, after: TrackingPosition, upto: TrackingPosition) -> tuple[str, list[Any]]:
        """The condition for the rows in (after, upto] and its values; `upto`'s whole group is in, and `after`'s
        when it is a start value (key None)."""
        assert upto.value is not None
        c = self.column
        if after.value is None:
            clauses, values = [], []
        elif after.key is None:
            clauses, values = [f"{c} >= ?"], [self.bound(after.value, ceil=True)]
        else:
            assert not after.key, "positions of a Cassandra stream take whole groups"
            clauses, values = [f"{c} > ?"], [self.bound(after.value)]
        return " AND ".join([*clauses, f"{c} <= ?"]), [*values, self.bound(upto.value)]

    def rows(self, query: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run `query` on the driver; after a lost connection (a restarted node) once more on a new session."""
        from cassandra import ConsistencyLevel
        from cassandra.cluster import NoHostAvailable
        from cassandra.connection import ConnectionException

        for attempt in (0, 1):
            session = self.conn.session()
            try:
                statement = session.prepare(query)
                statement.consistency_level = ConsistencyLevel.name_to_value[self.consistency]
                return list(session.execute(statement.bind(values), execution_profile=TUPLES))
            except (NoHostAvailable, ConnectionException):
                if attempt:
                    raise
                forget_session(self.conn)
        raise AssertionError("unreachable")


class CassandraTrackingEnumerator(TrackingEnumerator):
    """Driver side: the head and the ends of capped ranges, by aggregates over the SAI range."""

    def __init__(self, cql: TrackingCql, column: str) -> None:
        self.cql, self.column, self.kind = cql, column, cql.kind
        self._head: TrackingPosition | None = None  # the greatest value seen: the next head is searched above it

    def _aggregate(self, what: str, condition: str, values: Sequence[Any]) -> Any:
        return self.cql.rows(f"SELECT {what} FROM {self.cql.conn.target} WHERE {condition}", values)[0][0]

    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        c = self.cql.column
        if self._head is None or self._head.value is None:
            found = self._aggregate(f"max({c})", f"{c} >= ?", [self.cql.lowest])
        else:
            found = self._aggregate(f"max({c})", f"{c} > ?", [self.cql.bound(self._head.value)])
        if found is not None:
            self._head = TrackingPosition(self.cql.number(found), ())
        head = self._head or TrackingPosition()
        return {split.split_id: head for split in splits}

    def _count(self, after: TrackingPosition, upto: TrackingPosition) -> int:
        return int(self._aggregate("count(*)", *self.cql.range(after, upto)))

    def _last(self, after: TrackingPosition, upto: TrackingPosition) -> TrackingPosition | None:
        found = self._aggregate(f"max({self.cql.column})", *self.cql.range(after, upto))
        return None if found is None else TrackingPosition(self.cql.number(found), ())

    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        """Without a cap, the greatest value in the range. With one: the greatest value v with at most `rows` rows
        in (after, v], found by bisecting the values with counts (no ORDER BY on an SAI column), stopping once
        the range holds at least half the cap; the first group alone when it is over the cap."""
        if not rows or self._count(after, upto) <= rows:
            return self._last(after, upto)
        assert upto.value is not None
        first = self._aggregate(f"min({self.cql.column})", *self.cql.range(after, upto))
        low, high = self.cql.number(first), upto.value  # the first group is in (the cap never cuts it)
        if self._count(after, TrackingPosition(low, ())) >= rows:
            return TrackingPosition(low, ())
        while high - low > 1:  # count(after, low] < rows < count(after, high]
            middle = low + (high - low) // 2
            count = self._count(after, TrackingPosition(middle, ()))
            if count > rows:
                high = middle
            else:
                low = middle
                if count * 2 >= rows:
                    break
        return self._last(after, TrackingPosition(low, ()))

    def count_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition, most: int) -> int | None:
        return self._count(after, upto)


class CassandraTrackingReader(TrackingReader):
    """Executor side: one range as Arrow, by the batch read's paged SELECT (its columns and conversions) restricted
    to the range by the SAI index. Rows of a micro-batch come in token order, not in tracking order (Cassandra 5.0
    sorts no SAI result); micro-batches follow each other in tracking order."""

    def __init__(self, rows: CassandraReader, cql: TrackingCql) -> None:
        self.rows, self.cql = rows, cql

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[Any]:
        condition, values = self.cql.range(after, upto)
        yield from self.rows.batches(f"{self.rows.select_columns()} WHERE {condition}", values)
