"""A tracking enumerator for stores that answer SQL (PostgreSQL, ClickHouse): the head, the end of a capped range
and the rows behind are one query each, and the store compares positions as a tuple of (tracking value as a number,
tie-breaker columns), never Python. A store supplies the SQL of its positions (`TrackingSql`) and how it runs a
query (`rows`)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from sluice.source._framework import Split
from sluice.source._tracking import TrackingEnumerator, TrackingPosition


class TrackingSql(Protocol):
    """The SQL of one store's positions."""

    not_null: str  # the condition that a row has a tracking value

    def range(self, after: TrackingPosition, upto: TrackingPosition) -> str:
        """The condition for the rows in (after, upto]."""

    def order(self, descending: bool = False) -> str:
        """ORDER BY's list: the tracking value, then the tie-breakers."""

    def position_list(self) -> str:
        """SELECT's list giving a row's position: the tracking value as an integer, then each tie-breaker as text."""


def position_of(row: Sequence[Any]) -> TrackingPosition:
    """A position from a row of `position_list()`."""
    return TrackingPosition(int(row[0]), tuple(str(k) for k in row[1:]))


class SqlTrackingEnumerator(TrackingEnumerator):
    """Heads, capped ends and counts by SQL over one split (the whole source). A subclass sets `sql` and `source`
    (what the queries read from: a table with its modifiers, e.g. ClickHouse's FINAL, or a subquery and its alias)
    in its constructor."""

    sql: TrackingSql
    source: str

    @abstractmethod
    def rows(self, query: str) -> Sequence[Sequence[Any]]:  # Any: the store's own column values
        """Run `query` on the driver; its rows."""

    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        s = self.sql
        found = self.rows(f"SELECT {s.position_list()} FROM {self.source} WHERE {s.not_null} "
                          f"ORDER BY {s.order(descending=True)} LIMIT 1")
        head = position_of(found[0]) if found else TrackingPosition()
        return {split.split_id: head for split in splits}

    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        s = self.sql
        within = f"SELECT {s.position_list()} FROM {self.source} WHERE {s.range(after, upto)}"
        if rows:
            found = self.rows(f"{within} ORDER BY {s.order()} LIMIT 1 OFFSET {int(rows) - 1}")
            if found:
                return position_of(found[0])
        found = self.rows(f"{within} ORDER BY {s.order(descending=True)} LIMIT 1")
        return position_of(found[0]) if found else None

    def count_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition, most: int) -> int | None:
        return int(self.rows(f"SELECT count(*) FROM (SELECT 1 FROM {self.source} WHERE "
                             f"{self.sql.range(after, upto)} LIMIT {int(most) + 1}) AS behind")[0][0])
