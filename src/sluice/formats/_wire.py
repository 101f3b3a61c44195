"""Confluent's wire format, on whole arrays: a zero magic byte, the schema id as a 4-byte big-endian integer, then
the body (Confluent's "Wire format" in its Schema Registry serializer docs). No per-record Python: the ids are
gathered with numpy from the values' one data buffer, the bodies are one compute slice."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAGIC = 0
HEADER = 5


@dataclass(frozen=True)
class Framed:
    """Split values. `schema_ids[i]` is -1 for a null value (a tombstone) and for a bad frame; `bad` holds the
    indexes of the values that are not in Confluent's format (a wrong magic byte or shorter than 5 bytes), for the
    caller to name by offset. `bodies[i]` is null where the value is null or bad."""

    schema_ids: np.ndarray
    bodies: pa.BinaryArray
    bad: np.ndarray

    def first_bad_reason(self, values: pa.Array) -> str:
        i = int(self.bad[0])
        v = values[i].as_py()
        if len(v) < HEADER:
            return f"a {len(v)}-byte value is shorter than Confluent's 5-byte header (magic byte and schema id)"
        return f"magic byte {v[0]} where Confluent's wire format has {MAGIC}: not a schema registry payload"


def _binary(values: pa.Array) -> pa.BinaryArray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not pa.types.is_binary(values.type):
        values = values.cast(pa.binary())
    assert isinstance(values, pa.BinaryArray)
    return values


def split(values: pa.Array) -> Framed:
    """Schema ids and bodies of framed values (binary or large_binary; nulls stay null)."""
    values = _binary(values)
    n = len(values)
    _, offs_buf, data_buf = values.buffers()
    offsets = (
        np.frombuffer(offs_buf, dtype=np.int32, count=n + 1, offset=values.offset * 4) if n else np.zeros(1, np.int32)
    )
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)
        if data_buf is not None and data_buf.size
        else np.zeros(HEADER, np.uint8)
    )
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    long_enough = lengths >= HEADER
    at = np.where(long_enough, starts, 0)  # gather only where the five header bytes exist
    magic_ok = data[at] == MAGIC
    good = valid & long_enough & magic_ok
    bad = np.flatnonzero(valid & ~(long_enough & magic_ok))
    ids = (
        (data[at + 1].astype(np.int64) << 24)
        | (data[at + 2].astype(np.int64) << 16)
        | (data[at + 3].astype(np.int64) << 8)
        | data[at + 4].astype(np.int64)
    )
    ids = np.where(good, ids, -1)
    bodies = pc.binary_slice(values, HEADER)
    if len(bad):
        bodies = pc.if_else(pa.array(good), bodies, pa.nulls(n, pa.binary()))
    return Framed(ids, bodies, bad)


def frame(bodies: pa.Array, schema_id: int) -> pa.BinaryArray:
    """Prefix each body with the magic byte and `schema_id`; null bodies stay null (tombstones)."""
    header = pa.scalar(bytes([MAGIC]) + int(schema_id).to_bytes(4, "big"), pa.binary())
    out = pc.binary_join_element_wise(header, _binary(bodies), b"")
    assert isinstance(out, pa.BinaryArray)
    return out
