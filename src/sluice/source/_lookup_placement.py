"""A lookup's shuffle by `KeyPlacement` (source/_lookup.py): each row to the partition the reader names for its key,
before the lookup's `mapInArrow`, so each task asks one server.

Spark's `repartition(n, column)` sends a row to `pmod(murmur3_x86_32(column, seed 42), n)` (`HashPartitioning`), not
to partition `column`. So the workers tag each row with a stand-in value per partition: `slots[i]` is the smallest
int whose Spark hash lands in partition i, found once on the driver. Spark then puts the row exactly where the
reader said, with a plain DataFrame shuffle that runs alike on batch and streaming DataFrames and on Spark Connect.
The tag column is dropped after the shuffle. A row with a null key (it matches nothing) goes to partition
`row % n`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.source._lookup import KeyPlacement
from sluice.source._lookup_join import key_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TAG = "__sluice_placement"
_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `hash()` of an int column's value (Murmur3_x86_32.hashInt), as `HashPartitioning` computes it."""
    k1 = (value & _M32) * 0xCC9E2D51 & _M32
    k1 = _rotl32(k1, 15) * 0x1B873593 & _M32
    h1 = _rotl32(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _M32
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def slots(partitions: int) -> tuple[int, ...]:
    """For each partition of `partitions`, the smallest non-negative int `repartition(partitions, c)` sends there."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(spark_hash_int(value) % partitions, value)  # Python's % is Spark's pmod here
        value += 1
    return tuple(found[i] for i in range(partitions))


@dataclass(frozen=True)
class Tagger:
    """mapInArrow's function before the shuffle: each batch with its rows' stand-in partition values."""

    placement: KeyPlacement
    on: tuple[str, ...]
    key_types: tuple[pa.DataType, ...]
    slots: tuple[int, ...]

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield batch.append_column(TAG, self.tags(batch))

    def tags(self, batch: pa.RecordBatch) -> pa.Array:
        keys = pa.table([key_column(batch.column(name), to) for name, to in zip(self.on, self.key_types, strict=True)],
                        names=list(self.on))
        valid = pc.is_valid(keys.column(0))
        for name in self.on[1:]:
            valid = pc.and_(valid, pc.is_valid(keys.column(name)))
        # Null keys spread round-robin; each distinct key's partition is asked once.
        part = np.arange(batch.num_rows, dtype=np.int64) % len(self.slots)
        present = np.flatnonzero(valid.to_numpy(zero_copy_only=False))
        if present.size:
            rows = keys.take(pa.array(present))
            distinct = rows.group_by(list(self.on), use_threads=False).aggregate([])
            assigned = np.asarray(self.placement.assign(distinct).to_numpy(zero_copy_only=False), dtype=np.int64)
            part[present] = assigned[_positions(rows, distinct)]
        return pa.array(np.asarray(self.slots, dtype=np.int32)[part])


def _positions(rows: pa.Table, distinct: pa.Table) -> np.ndarray:
    """Each row's position among `distinct` (which holds every row's key)."""
    if rows.num_columns == 1:
        return np.asarray(pc.index_in(rows.column(0), value_set=distinct.column(0).combine_chunks()).to_numpy())
    names = rows.column_names
    left = rows.append_column("__row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    right = distinct.append_column("__at", pa.array(np.arange(distinct.num_rows, dtype=np.int64)))
    joined = left.join(right, keys=names, use_threads=False).sort_by("__row")
    return np.asarray(joined.column("__at").to_numpy())


def placed(df: DataFrame, placement: KeyPlacement, on: tuple[str, ...],
           key_types: tuple[pa.DataType, ...]) -> DataFrame:
    """`df` shuffled into `placement.partitions` partitions, each row where `placement` puts its key."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    tagger = Tagger(placement, on, key_types, slots(placement.partitions))
    tagged = StructType([*df.schema.fields, StructField(TAG, IntegerType(), False)])
    return df.mapInArrow(tagger.run, tagged).repartition(placement.partitions, TAG).drop(TAG)
