"""A lookup join's work on the Python workers: per Arrow batch of the DataFrame, its distinct keys looked up in bulk
(through the cache when there is one) and the rows joined back in Arrow, for every store alike.

The join runs on row positions only, and the output columns are taken by position: with one key column and one row
per key (a primary key), each row's key is found among the rows' keys by a hash lookup (`index_in`); otherwise by
Acero's hash join of the key columns plus a position column on each side. Either way any column type passes
through, the input's order is kept, a key with several rows gives several rows, a missing key nulls (left) or no
row (inner). Rows never become Python objects; the
cache alone handles keys as Python values, one per distinct key.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.metrics._lookups import LookupObserver, LookupTally
from sluice.source._lookup import LookupCacheSettings, LookupReader
from sluice.source._lookup_cache import LookupCache, cache_for

_LEFT, _RIGHT = "__sluice_left_position", "__sluice_right_position"


@dataclass(frozen=True)
class LookupPlan:
    """A lookup planned on the driver (source/_lookup_dataframe.py), carried to the workers by mapInArrow."""

    reader: LookupReader
    on: tuple[str, ...]  # key columns, named alike in the DataFrame and the store
    how: str  # "left" | "inner"
    looked_up: tuple[pa.Field, ...]  # the columns added, nullable
    rows: pa.Schema  # the reader's rows (key columns included)
    cache: LookupCacheSettings
    lookup_id: str  # names this lookup's cache in each worker process
    observer: LookupObserver | None = None  # reports each task's counts to the collector, if one runs

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """mapInArrow's function: one task's batches, enriched."""
        cache = cache_for(self.lookup_id, self.cache)
        tally = LookupTally()
        out = self._enriched(batches, cache, tally)
        if self.observer is None:
            return out
        # A worker process runs one task at a time: its cache's evictions since the task started are the task's.
        evicted_before = cache.stats().evictions if cache is not None else 0

        def cache_counts() -> tuple[int, int]:
            if cache is None:
                return 0, 0
            now = cache.stats()
            return now.evictions - evicted_before, now.rows

        return self.observer.observed(out, tally, cache_counts)

    def _enriched(self, batches: Iterator[pa.RecordBatch], cache: LookupCache | None,
                  tally: LookupTally) -> Iterator[pa.RecordBatch]:
        clean = False
        try:
            for batch in batches:
                enriched = enrich(self, batch, cache, tally)
                tally.records_in += batch.num_rows
                tally.records_out += enriched.num_rows
                yield from enriched.to_batches()
            clean = True
        finally:
            self.reader.close(clean)


def key_column(column: pa.Array, to: pa.DataType) -> pa.Array:
    """A DataFrame's key column as the store's key type. An integer out of a narrower key's range cannot be in the
    store: it becomes null (matches nothing) rather than failing the cast."""
    if column.type == to:
        return column
    if pa.types.is_integer(column.type) and pa.types.is_integer(to):
        info = np.iinfo(to.to_pandas_dtype())
        inside = pc.and_(pc.greater_equal(column, info.min), pc.less_equal(column, info.max))
        column = pc.if_else(inside, column, pa.scalar(None, column.type))
    return column.cast(to)


def enrich(plan: LookupPlan, batch: pa.RecordBatch, cache: LookupCache | None, tally: LookupTally) -> pa.Table:
    """`batch` with the looked-up columns: each row once per matching store row (left: once with nulls if none)."""
    key_types = [plan.rows.field(name).type for name in plan.on]
    keys = pa.table([key_column(batch.column(name), to) for name, to in zip(plan.on, key_types, strict=True)],
                    names=list(plan.on))
    valid = pc.is_valid(keys.column(0))
    for name in plan.on[1:]:
        valid = pc.and_(valid, pc.is_valid(keys.column(name)))
    distinct = keys.filter(valid).group_by(list(plan.on), use_threads=False).aggregate([])
    rows = rows_for(plan, distinct, cache, tally)

    at_left, at_right = positions(plan, keys, rows)
    columns = [batch.column(i) if at_left is None else batch.column(i).take(at_left) for i in range(batch.num_columns)]
    columns += [rows.column(f.name).take(at_right) for f in plan.looked_up]
    schema = pa.schema([*batch.schema, *plan.looked_up])
    return pa.Table.from_arrays(columns, schema=schema).combine_chunks()


def positions(plan: LookupPlan, keys: pa.Table, rows: pa.Table) -> tuple[pa.Array | pa.ChunkedArray | None,
                                                                         pa.Array | pa.ChunkedArray]:
    """(the batch's row of each output row, None: each row once, in order; the store row of each, null: none)."""
    key = rows.column(plan.on[0])
    if len(plan.on) == 1 and pc.count_distinct(key).as_py() == rows.num_rows:
        # One key column, one row per key (a primary key): a hash lookup of each row's key, no join to plan.
        at_right = pc.index_in(keys.column(0), value_set=key.combine_chunks())
        if plan.how == "left":
            return None, at_right
        matched = pc.is_valid(at_right)
        return pc.indices_nonzero(matched), at_right.filter(matched)
    left = keys.append_column(_LEFT, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    right = rows.select(list(plan.on)).append_column(_RIGHT, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    joined = left.join(right, keys=list(plan.on), join_type="left outer" if plan.how == "left" else "inner",
                       use_threads=False).sort_by([(_LEFT, "ascending"), (_RIGHT, "ascending")])
    return joined.column(_LEFT), joined.column(_RIGHT)


def read(plan: LookupPlan, keys: pa.Table, tally: LookupTally) -> pa.Table:
    """The reader's rows for `keys`, in the planned Arrow schema."""
    if keys.num_rows == 0:
        return plan.rows.empty_table()
    started = time.perf_counter()
    rows = plan.reader.lookup(keys)
    tally.loaded(keys.num_rows, rows.num_rows, time.perf_counter() - started)
    return rows if rows.schema == plan.rows else rows.cast(plan.rows)


def rows_for(plan: LookupPlan, distinct: pa.Table, cache: LookupCache | None, tally: LookupTally) -> pa.Table:
    """The rows of the distinct keys: from the cache where it has them, the rest read (and cached) in one call."""
    if cache is None:
        tally.looked_up(0, distinct.num_rows)
        return read(plan, distinct, tally)
    asked = list(zip(*(distinct.column(name).to_pylist() for name in plan.on), strict=True))
    found, missing = cache.get_many(asked)
    tally.looked_up(len(found), len(missing))
    fetched = read(plan, distinct.take(pa.array(missing, pa.int64())), tally) if missing else plan.rows.empty_table()
    cache.put_many(by_key(plan, fetched, [asked[i] for i in missing]))
    # One chunk: the join and the takes then index one array, not a chunk per cached key.
    return pa.concat_tables([fetched, *found]).combine_chunks() if found else fetched


def by_key(plan: LookupPlan, rows: pa.Table, asked: list[tuple[Hashable, ...]]) -> list[tuple[Hashable, pa.Table]]:
    """Each asked key with its rows (zero-copy slices of `rows` sorted by key; an empty table for a key without)."""
    rows = rows.sort_by([(name, "ascending") for name in plan.on]) if rows.num_rows else rows
    found: dict[Hashable, pa.Table] = {}
    row_keys = zip(*(rows.column(name).to_pylist() for name in plan.on), strict=True)
    start = 0
    for key, run in itertools.groupby(row_keys):
        length = sum(1 for _ in run)
        found[key] = rows.slice(start, length)
        start += length
    none = rows.slice(0, 0)
    return [(key, found.get(key, none)) for key in asked]
