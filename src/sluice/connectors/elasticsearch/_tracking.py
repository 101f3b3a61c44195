"""`spark.readStream.format("elasticsearch")`: an index streamed by a tracking field of the user's (sluice's
tracking-column stream, docs/tracking.md), on Elasticsearch and OpenSearch alike.

A search engine has no commit order sluice can read: a document becomes searchable at its shard's next refresh
(`refresh_interval`), each shard on its own. So the tracking field is the user's: an integer that grows (long,
integer, short, byte) or a `date`/`date_nanos` set when the document is written, optionally with a tie-breaker
(`tracking.tie-breaker`, a keyword or integer field). The engine compares positions: a range (after, upto] is a
bool query of range clauses on the two fields. Dates are compared by the millisecond (a `date_nanos` field sorts
with `numeric_type: date`), so documents of one millisecond are one group; the position holds microseconds.

The driver asks the head (a `size: 1` search sorted descending) and the ends of capped ranges (the n-th hit of a
sorted search, 10,000 at a time: `index.max_result_window`); a task reads its range in its own point in time (PIT)
with a sorted `search_after`, tie-broken by `_shard_doc` on Elasticsearch and by `_doc` in slices of one shard on
OpenSearch (the batch read's `PitLayout`), and frees the PIT when done.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any

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
from sluice.connectors.elasticsearch._client import Connection
from sluice.connectors.elasticsearch._source import PitLayout, SliceReader

INTEGERS = ("long", "integer", "short", "byte")
DATES = ("date", "date_nanos")
KEYS = ("keyword", *INTEGERS)
WINDOW = 10_000  # index.max_result_window's default: the deepest `from + size` a search may ask


def _nested(kinds: dict[str, str], name: str, option: str) -> None:
    """Refuses a field inside a nested object: a document holds many of its values, and hits sort by one of them."""
    parts = name.split(".")
    for depth in range(1, len(parts)):
        if kinds.get(".".join(parts[:depth])) == "nested":
            raise OptionError(f"{option} '{name}' is inside the nested field '{'.'.join(parts[:depth])}': a document "
                              "holds many of its values, and hits sort by one of them. Name a field of the document "
                              "itself.")


WORKS = f"an integer ({', '.join(INTEGERS)}) or a date/date_nanos whose values grow as documents are written"


def _kind(found: str, column: str) -> str:
    """The kind of a tracking field of mapping type `found`; refuses another type, saying why it cannot be one."""
    if found in INTEGERS:
        return "int"
    if found in DATES:
        return "timestamp"
    why = ("a text field is analyzed: it neither sorts nor ranges by its value" if found in ("text", "match_only_text")
           else "not a value a position can hold exactly")
    raise OptionError(f"tracking.column '{column}' is a {found} field ({why}); a tracking field must be {WORKS}")


def tracking_kind(kinds: dict[str, str], settings: TrackingSettings, tie_breaker: str | None,
                  index: str) -> tuple[str, str | None]:
    """The kind of the tracking field and the tie-breaker's mapping type (`tracking_column_kind`'s checks, by the
    mapping's types); refuses also a field inside a nested object and a tie-breaker of a type that cannot tell
    documents apart exactly."""
    keys = [tie_breaker] if tie_breaker is not None else []
    for name, option in [(settings.column, "tracking.column"), *((k, "tracking.tie-breaker") for k in keys)]:
        _nested(kinds, name, option)
    kind = tracking_column_kind(settings, dict(sorted(kinds.items())), lambda found: _kind(found, settings.column),
                                source=f"index '{index}'", works=WORKS, tie_breaker=keys, noun="field",
                                where="the mapping")
    key_type = None
    if tie_breaker is not None:
        key_type = kinds[tie_breaker]
        if key_type not in KEYS:
            raise OptionError(f"tracking.tie-breaker '{tie_breaker}' is a {key_type} field; a tie-breaker must be a "
                              f"keyword or an integer ({', '.join(INTEGERS)}) field, sortable and exact")
    return kind, key_type


class SearchPositions:
    """The query DSL of positions: sort keys, a position from a hit's sort values, and the range (after, upto] as
    range clauses the engine evaluates. `filters`: the user's read.query, which every search also applies."""

    def __init__(self, column: str, kind: str, key: str | None, key_type: str | None,
                 filters: Sequence[dict] = ()) -> None:
        self.column, self.kind, self.key, self.key_type = column, kind, key, key_type
        self.filters = list(filters)

    def sort(self, descending: bool = False) -> list[dict]:
        order = "desc" if descending else "asc"
        value: dict[str, Any] = {"order": order}
        if self.kind == "timestamp":
            value["numeric_type"] = "date"  # milliseconds, date_nanos too: one group per millisecond
        return [{self.column: value}, *([{self.key: order}] if self.key else [])]

    def position(self, hit: dict) -> TrackingPosition:
        values = hit["sort"]
        value = int(values[0]) * (1000 if self.kind == "timestamp" else 1)
        return TrackingPosition(value, tuple(str(v) for v in values[1:1 + (self.key is not None)]))

    def _value(self, op: str, v: int) -> dict:
        """The tracking field compared to `v` (microseconds for a timestamp: bounds in whole milliseconds)."""
        if self.kind == "int":
            return {"range": {self.column: {op: v}}}
        floor, ceil = v // 1000, -(-v // 1000)
        bound = {"gt": ("gte", floor + 1), "gte": ("gte", ceil), "lt": ("lt", ceil), "lte": ("lt", floor + 1)}[op]
        return {"range": {self.column: {bound[0]: bound[1], "format": "epoch_millis"}}}

    def _equal(self, v: int) -> list[dict]:
        return [self._value("gte", v), self._value("lte", v)]

    def _key(self, op: str, text: str) -> dict:
        return {"range": {self.key: {op: text if self.key_type == "keyword" else int(text)}}}

    def _beyond(self, at: TrackingPosition, strict: str, key_op: str) -> dict:
        """Positions past `at` on one side: (value strictly beyond) or (value equal and key `key_op` at's key)."""
        assert at.value is not None
        if not self.key or not at.key:  # no tie-breaker: whole groups of one value
            return self._value(strict, at.value)
        same = {"bool": {"filter": [*self._equal(at.value), self._key(key_op, at.key[0])]}}
        return {"bool": {"should": [self._value(strict, at.value), same], "minimum_should_match": 1}}

    def present(self) -> list[dict]:
        """The documents a stream reads at all: the user's query, and a value in each field of the position."""
        return [*self.filters, *({"exists": {"field": f}} for f in (self.column, self.key) if f)]

    def range(self, after: TrackingPosition, upto: TrackingPosition) -> dict:
        """The documents in (after, upto]."""
        clauses = self.present()
        if after.value is not None:
            if after.key is None:  # a start at a value: every document of it
                clauses.append(self._value("gte", after.value))
            else:
                clauses.append(self._beyond(after, "gt", "gt"))
        assert upto.value is not None
        if self.key and upto.key:
            clauses.append(self._beyond(upto, "lt", "lte"))
        else:
            clauses.append(self._value("lte", upto.value))
        return {"bool": {"filter": clauses}}


class SearchTrackingEnumerator(TrackingEnumerator):
    """Driver side: the head, the ends of capped ranges and the documents behind, one search or count each."""

    def __init__(self, conn: Connection, positions: SearchPositions) -> None:
        self.conn, self.positions = conn, positions
        self.column, self.kind = positions.column, positions.kind

    def _hit(self, query: dict, rank: int, descending: bool = False) -> TrackingPosition | None:
        """The position of the `rank`-th hit (from 1) of `query` sorted by position; None when there are fewer."""
        body = {"size": 1, "from": rank - 1, "_source": False, "track_total_hits": False, "query": query,
                "sort": self.positions.sort(descending)}
        _, answer = self.conn.request("POST", f"/{self.conn.index}/_search", body)
        hits = answer["hits"]["hits"]
        return self.positions.position(hits[0]) if hits else None

    def _count(self, query: dict) -> int:
        _, answer = self.conn.request("POST", f"/{self.conn.index}/_count", {"query": query})
        return int(answer["count"])

    def heads(self, splits: Sequence[Split]) -> dict[str, TrackingPosition]:
        head = self._hit({"bool": {"filter": self.positions.present()}}, 1, descending=True) or TrackingPosition()
        return {split.split_id: head for split in splits}

    def end_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition,
                   rows: int | None) -> TrackingPosition | None:
        at, left = after, rows or 0
        if left and self._count(self.positions.range(after, upto)) <= left:
            left = 0  # the whole range fits: one count, not a deep search per 10,000 documents
        while left > 0:
            step = min(left, WINDOW)
            end = self._hit(self.positions.range(at, upto), step)
            if end is None:
                break  # fewer than `step` documents left: the range's last one is the end
            left = 0 if step == left else left - self._count(self.positions.range(at, end))
            if left <= 0:
                return end
            at = end
        return self._hit(self.positions.range(after, upto), 1, descending=True)

    def count_within(self, split: Split, after: TrackingPosition, upto: TrackingPosition, most: int) -> int | None:
        return self._count(self.positions.range(after, upto))


class SearchTrackingReader(TrackingReader):
    """Executor side: one range as Arrow, paged with search_after in a point in time of its own (the batch read's
    SliceReader: its columns, dates and pages), freed when the range is read."""

    def __init__(self, rows: SliceReader, positions: SearchPositions, layout: PitLayout) -> None:
        self.rows, self.positions, self.layout = rows, positions, layout

    def read(self, split: Split, after: TrackingPosition, upto: TrackingPosition) -> Iterator[Any]:
        r = self.rows
        return read_with_letters(r.dead_letters, r.read_id, r.streaming, r.conn.index,
                                 lambda letters: self._read(after, upto, letters))

    def _read(self, after: TrackingPosition, upto: TrackingPosition,
              letters: DeadLetterWriter | None) -> Iterator[Any]:
        conn, layout = self.rows.conn, self.layout
        rows = copy.copy(self.rows)
        rows.query = self.positions.range(after, upto)
        sort = [*self.positions.sort(), *layout.tiebreak]
        slices = layout.slices if layout.opensearch else 1
        pit = layout.open(conn, self.rows.keep_alive)
        try:
            for i in range(slices):
                yield from rows.pages(Split(f"slice:{i}", {"pit": pit, "slice": i, "max": slices, "sort": sort}),
                                      letters)
        finally:
            layout.close(conn, pit)
