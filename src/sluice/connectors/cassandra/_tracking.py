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

No aggregate finds positions: an SAI `max()` or `count(*)` reads every matching row on the node, and over a
backlog outlives the request timeout. The head is found by queries of the tracking column alone that stop early
(`LIMIT`), each looking above the greatest value the previous one returned (rows come in token order, unrelated to
the value: a few queries); a capped end by bisecting the values with counts of at most cap + 1 fetched values.
Reads are at LOCAL_QUORUM unless `read.consistency` is set (a row the head query saw on one replica must not be
missed by the range's read on another). A table is one split; a micro-batch is read in `partitions` slices of the
token ring (`pieces`), a task each.
"""

from __future__ import annotations

import datetime as dt
import itertools
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
    tracking_column_kind,
)
from sluice.connectors.cassandra._client import TUPLES, Connection, forget_session, quote_ident
from sluice.connectors.cassandra._source import MAX_TOKEN, MIN_TOKEN, CassandraReader
from sluice.connectors.cassandra._table import TableInfo, is_sai_class
from sluice.connectors.cassandra._types import CQLType

INTEGERS = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}  # bits
EXTREME_PAGE = 1000  # values per query of a search for a range's greatest or least value
COUNT_CHEAPLY = 10_000  # records behind are counted up to this many (the values are fetched), unknown beyond
_EPOCH = dt.datetime(1970, 1, 1)
_MIN_TIME = dt.datetime(1, 1, 1)


def _kind(cql: CQLType) -> str | None:
    if cql.name in INTEGERS and not cql.args:
        return "int"
    return "timestamp" if cql.name == "timestamp" else None


def tracking_kind(info: TableInfo, settings: TrackingSettings, target: str) -> str:
    """The kind of the tracking column (`tracking_column_kind`'s checks, by CQL's types); refuses also a partition
    key, a column without an SAI index (naming it), and a start value out of the column's range."""
    name = settings.column
    kind = tracking_column_kind(settings, info.columns, _kind, source=target,
                                works="tinyint, smallint, int, bigint or timestamp, with values that grow as rows are "
                                      "written (e.g. toTimestamp(now()))")
    cql = info.columns[name]
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
    if settings.start not in ("beginning", "now") and kind == "int":  # a value of the kind: tracking_column_kind
        value = parse_value(kind, settings.start, "tracking.start")
        if not -(2 ** (INTEGERS[cql.name] - 1)) <= value < 2 ** (INTEGERS[cql.name] - 1):
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
        # Prepared once per query text and session: the driver sends a PREPARE to every node at each prepare()
        # (prepare_on_all_hosts), which would be nodes x the statements of every planning.
        self._prepared: dict[str, tuple[Any, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_prepared": {}}  # sessions stay in their process; a worker prepares on its own

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

    def range(self, after: TrackingPosition, upto: TrackingPosition | None) -> tuple[str, list[Any]]:
        """The condition for the rows in (after, upto] (upto None: no bound above) and its values; `upto`'s whole
        group is in, and `after`'s when it is a start value (key None)."""
        c = self.column
        if after.value is None:
            clauses, values = [], []
        elif after.key is None:
            clauses, values = [f"{c} >= ?"], [self.bound(after.value, ceil=True)]
        else:
            assert not after.key, "positions of a Cassandra stream take whole groups"
            clauses, values = [f"{c} > ?"], [self.bound(after.value)]
        if upto is not None and upto.value is not None:
            clauses, values = [*clauses, f"{c} <= ?"], [*values, self.bound(upto.value)]
        elif not clauses:  # an SAI query needs a restriction: every value
            clauses, values = [f"{c} >= ?"], [self.lowest]
        return " AND ".join(clauses), values

    def rows(self, query: str, values: Sequence[Any]) -> list[tuple[Any, ...]]:
        """Run `query` on the driver; after a lost connection (a restarted node) once more on a new session."""
        from cassandra.cluster import NoHostAvailable
        from cassandra.connection import ConnectionException

        for attempt in (0, 1):
            session = self.conn.session()
            try:
                statement = self._statement(session, query)
                return list(session.execute(statement.bind(values), execution_profile=TUPLES))
            except (NoHostAvailable, ConnectionException):
                if attempt:
                    raise
                forget_session(self.conn)
        raise AssertionError("unreachable")

    def _statement(self, session: Any, query: str) -> Any:
        """`query` prepared on `session`, once (a new session, after a lost connection, prepares it anew)."""
        from cassandra import ConsistencyLevel

        known = self._prepared.get(query)
        if known is not None and known[0] is session:
            return known[1]
        statement = session.prepare(query)
        statement.consistency_level = ConsistencyLevel.name_to_value[self.consistency]
        self._prepared[query] = (session, statement)
        return statement


class CassandraTrackingEnumerator(TrackingEnumerator):
    """Driver side: the head and the ends of capped ranges, by SAI queries that fetch the tracking column only and
    stop early (LIMIT), never by aggregates (an SAI aggregate reads every matching row, and over a table's backlog
    outlives the request timeout)."""

    def __init__(self, cql: TrackingCql, column: str, pieces: int) -> None:
        self.cql, self.column, self.kind = cql, column, cql.kind
        self.slices = pieces
        self._head: TrackingPosition | None = None  # the greatest value seen: the next head is searched above it

    def pieces(self, split: Split) -> list[Split]:
        """A micro-batch's range is read in `partitions` slices of the token ring, one task each."""
        step = (MAX_TOKEN - MIN_TOKEN) // self.slices
        bounds = [MIN_TOKEN + i * step for i in range(self.slices)] + [MAX_TOKEN]
        return [Split(split.split_id, {"lo": lo, "hi": hi}) for lo, hi in itertools.pairwise(bounds)]

    def _values(self, condition: str, values: Sequence[Any], limit: int) -> list[int]:
        found = self.cql.rows(f"SELECT {self.cql.column} FROM {self.cql.conn.target} WHERE {condition} "
                              f"LIMIT {int(limit)}", values)
        return [self.cql.number(row[0]) for row in found if row[0] is not None]

    def _extreme(self, after: TrackingPosition, upto: TrackingPosition | None, greatest: bool) -> int | None:
        """The greatest (or least) value in (after, upto] (upto None: no bound above): SAI returns rows in token
        order, not by value, so each query takes up to EXTREME_PAGE values and the next one looks beyond the best
        of them; with values unrelated to tokens, a few queries."""
        best: int | None = None
        while True:
            if best is None:
                low, high = after, upto
            elif greatest:
                low, high = TrackingPosition(best, ()), upto
            else:
                low, high = after, TrackingPosition(best - 1, ())
            found = self._values(*self.cql.range(low, high), EXTREME_PAGE)
            if not found:
                return best
            best = max(found) if greatest else min(found)

    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        value = self._extreme(self._head or TrackingPosition(), None, greatest=True)
        if value is not None:
            self._head = TrackingPosition(value, ())
        head = self._head or TrackingPosition()
        return {split.split_id: head for split in splits}

    def _count(self, after: TrackingPosition, upto: TrackingPosition, most: int) -> int:
        """Rows in (after, upto], counted up to `most` + 1."""
        return len(self._values(*self.cql.range(after, upto), most + 1))

    def _last(self, after: TrackingPosition, upto: TrackingPosition) -> TrackingPosition | None:
        if upto.value is None or after == upto:
            return None
        inside = after.value is None or upto.value > after.value or (after.key is None and upto.value == after.value)
        if inside and self._values(f"{self.cql.column} = ?", [self.cql.bound(upto.value)], 1):
            return upto  # the range's end has a row (a settled head, usually): the last row
        value = self._extreme(after, upto, greatest=True)
        return None if value is None else TrackingPosition(value, ())

    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        """Without a cap, the greatest value in the range. With one: the greatest value v with at most `rows` rows
        in (after, v], found by bisecting the values with counts of at most `rows` + 1 rows (no ORDER BY on an SAI
        column), stopping once the range holds at least half the cap; the first group alone when it is over the
        cap."""
        if not rows or self._count(after, upto, rows) <= rows:
            return self._last(after, upto)
        assert upto.value is not None
        first = self._extreme(after, upto, greatest=False)
        if first is None:  # deleted since it was counted
            return self._last(after, upto)
        low, high = first, upto.value  # the first group is in (the cap never cuts it)
        if self._count(after, TrackingPosition(low, ()), rows) >= rows:
            return TrackingPosition(low, ())
        while high - low > 1:  # count(after, low] < rows < count(after, high]
            middle = low + (high - low) // 2
            count = self._count(after, TrackingPosition(middle, ()), rows)
            if count > rows:
                high = middle
            else:
                low = middle
                if count * 2 >= rows:
                    break
        return self._last(after, TrackingPosition(low, ()))

    def count_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition, most: int) -> int | None:
        """Rows behind, when there are at most COUNT_CHEAPLY (fetched: SAI counts by reading); None beyond."""
        if upto.value is None:
            return 0
        count = self._count(after, upto, min(most, COUNT_CHEAPLY))
        return None if count > min(most, COUNT_CHEAPLY) else count


class CassandraTrackingReader(TrackingReader):
    """Executor side: one range as Arrow, by the batch read's paged SELECT (its columns and conversions) restricted
    to the range by the SAI index. Rows of a micro-batch come in token order, not in tracking order (Cassandra 5.0
    sorts no SAI result); micro-batches follow each other in tracking order."""

    def __init__(self, rows: CassandraReader, cql: TrackingCql) -> None:
        self.rows, self.cql = rows, cql

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[Any]:
        condition, values = self.cql.range(after, upto)
        token = f"token({', '.join(quote_ident(c) for c in self.rows.info.partition_key)})"
        return self.rows.with_letters(f"{self.rows.select_columns()} WHERE {token} > ? AND {token} <= ? AND "
                                      f"{condition}", [split.info["lo"], split.info["hi"], *values],
                                      f"{split.split_id} ({after} - {upto})")
