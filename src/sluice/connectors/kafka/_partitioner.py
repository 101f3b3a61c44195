"""The partition Kafka's default partitioner gives a keyed record, computed over an Arrow column at once.

Java producers, Spark's Kafka sink and librdkafka's `murmur2_random` (the sink's partitioner) put a keyed record in
partition `(murmur2(key) & 0x7fffffff) % partitions` (Kafka's `Utils.murmur2`, seed 0x9747b28c). An exactly-once
write that knows each row's partition before the write can hand each task a share of the partitions
(`transaction.by-partition`), so that a task's transaction adds only those.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

_SEED, _M = np.uint32(0x9747B28C), np.uint32(0x5BD1E995)


def murmur2(keys: pa.Array) -> np.ndarray:
    """Kafka's murmur2 of each key's bytes (strings as UTF-8), as uint32; a null key hashes as empty. Vectorized over
    the rows, one step per 4 bytes of the longest key: keys are short."""
    binary = keys.cast(pa.binary()) if not pa.types.is_binary(keys.type) else keys
    binary = pc.fill_null(binary, b"")
    if isinstance(binary, pa.ChunkedArray):
        binary = binary.combine_chunks()
    offsets = np.frombuffer(binary.buffers()[1], np.int32)[binary.offset:binary.offset + len(binary) + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(binary.buffers()[2] or b"", np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = _SEED ^ lengths.astype(np.uint32)
    with np.errstate(over="ignore"):
        for step in range(int(lengths.max(initial=0)) // 4):
            rows = np.flatnonzero(lengths >= 4 * (step + 1))
            at = starts[rows] + 4 * step
            k = (data[at].astype(np.uint32) | (data[at + 1].astype(np.uint32) << 8)
                 | (data[at + 2].astype(np.uint32) << 16) | (data[at + 3].astype(np.uint32) << 24))
            k *= _M
            k ^= k >> np.uint32(24)
            k *= _M
            h[rows] = (h[rows] * _M) ^ k
        tail = lengths % 4
        base = starts + (lengths - tail)
        for extra, shift in ((3, 16), (2, 8)):
            rows = np.flatnonzero(tail >= extra)
            h[rows] ^= data[base[rows] + extra - 1].astype(np.uint32) << np.uint32(shift)
        rows = np.flatnonzero(tail >= 1)
        h[rows] ^= data[base[rows]].astype(np.uint32)
        h[rows] *= _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h


def kafka_partitions(keys: pa.Array, partitions: int) -> pa.Int32Array:
    """The partition of each row: its key's, as Kafka's default partitioner picks it; a row without a key takes
    partitions in turn by its place in the batch (deterministic, so a replayed micro-batch lays out the same)."""
    chosen = (murmur2(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)
    nulls = np.flatnonzero(np.asarray(keys.is_null(), bool))
    chosen[nulls] = np.arange(len(nulls), dtype=np.uint32) % np.uint32(partitions)
    return pa.array(chosen.astype(np.int32), pa.int32())


def with_partition_column(df: DataFrame, partitions: int) -> DataFrame:
    """`df` with an int `partition` column: each row's, from its `key` (`kafka_partitions`), in Arrow batches."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    def add(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield batch.append_column("partition", kafka_partitions(batch.column("key"), partitions))

    return df.mapInArrow(add, StructType([*df.schema.fields, StructField("partition", IntegerType())]))
