"""The Avro payload format (PayloadFormat of _codec.py): bodies in bulk to and from Arrow, writer schemas resolved to
the reader's by Avro's rules. Confluent's framing around the bodies is _wire.py's."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats import _avro_types
from sluice.formats._avro_decode import decode_raw
from sluice.formats._avro_encode import encode_rows
from sluice.formats._avro_resolve import resolve
from sluice.formats._avro_schema import AvroType, SchemaError, parse
from sluice.formats._codec import RegisteredSchema


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> AvroType:
    return parse(text)


def _schema(s: RegisteredSchema) -> AvroType:
    if s.schema_type != "AVRO":
        raise SchemaError(f"schema {s.schema_id} is {s.schema_type}, not AVRO")
    t = _parsed(s.text)
    if t.kind != "record":
        raise SchemaError(f"schema {s.schema_id} is an Avro {t.kind}: sluice reads and writes Avro records")
    return t


class AvroFormat:
    """Avro bodies (no framing). Stateless apart from a cache of parsed schema texts: pickles to the tasks as is."""

    def reader_type(self, reader: RegisteredSchema) -> pa.StructType:
        return _avro_types.record_type(_schema(reader))

    def decode(self, bodies: pa.BinaryArray, writer: RegisteredSchema, reader: RegisteredSchema) -> pa.StructArray:
        w, r = _schema(writer), _schema(reader)
        if isinstance(bodies, pa.ChunkedArray):
            bodies = bodies.combine_chunks()
        if not pa.types.is_binary(bodies.type):
            bodies = bodies.cast(pa.binary())
        present = None
        if bodies.null_count:  # tombstones decode to null rows; the rest are decoded together
            valid = bodies.is_valid().to_numpy(zero_copy_only=False)
            present = np.flatnonzero(valid)
            bodies = bodies.filter(pa.array(valid))
        try:
            raw = decode_raw(bodies, w)
        except Exception as e:
            _reindex(e, present)
            raise
        try:
            out = raw if w is r or writer.text == reader.text else resolve(raw, w, r, "")
        except Exception as e:
            _reindex(e, present)
            raise
        if present is not None:
            positions = np.full(len(valid), -1, dtype=np.int64)
            positions[present] = np.arange(len(present))
            out = pc.take(out, pa.array(positions, mask=positions < 0))
        assert isinstance(out, pa.StructArray)
        return out

    def schema_from_arrow(self, arrow_type: pa.StructType, name: str) -> str:
        return _avro_types.schema_from_arrow(arrow_type, name)

    def encode(self, rows: pa.StructArray, writer: RegisteredSchema) -> pa.BinaryArray:
        return encode_rows(rows, _schema(writer))


def _reindex(e: Exception, present: np.ndarray | None) -> None:
    """A PayloadError's index is into the bodies given, nulls included."""
    from sluice.formats._codec import PayloadError

    if isinstance(e, PayloadError) and present is not None and 0 <= e.index < len(present):
        e.index = int(present[e.index])
        e.args = (f"record {e.index}: {e.reason}" + (f" (column {e.column!r})" if e.column else ""),)
