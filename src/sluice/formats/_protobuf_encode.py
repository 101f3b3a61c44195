"""Protobuf's binary encoding written column by column with numpy and Arrow kernels: no Python per row.

Each field of a message becomes a binary array of that field's encoded bytes per row (tag, then a varint, fixed
bytes or a length-delimited value; nothing for an unset field or, without presence, for proto3's default), and a
row's message is the concatenation of its fields' bytes in field-number order (binary_join_element_wise); repeated
fields are joined per row (binary_join over a list array), scalar ones packed. The input is what
_protobuf_rows.prepare_struct made of the rows (checked and cast); the bytes are what protobuf's own serializer
writes, up to the order of map entries (the encoding section of protobuf.dev's documentation).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._codec import PayloadError
from sluice.formats._protobuf_types import (
    TYPE_BOOL,
    TYPE_BYTES,
    TYPE_DOUBLE,
    TYPE_ENUM,
    TYPE_FIXED32,
    TYPE_FIXED64,
    TYPE_FLOAT,
    TYPE_GROUP,
    TYPE_INT32,
    TYPE_MESSAGE,
    TYPE_SFIXED32,
    TYPE_SFIXED64,
    TYPE_SINT32,
    TYPE_SINT64,
    TYPE_STRING,
    TYPE_UINT32,
    TYPE_UINT64,
    is_map,
)


@functools.cache
def _empty() -> pa.Scalar:
    """b"" as an Arrow scalar; made on first use, as pyarrow's first scalar imports pandas (seconds in a new worker)."""
    return pa.scalar(b"", pa.binary())


_FIXED = {TYPE_FIXED32: "<u4", TYPE_SFIXED32: "<i4", TYPE_FLOAT: "<f4", TYPE_FIXED64: "<u8", TYPE_SFIXED64: "<i8",
          TYPE_DOUBLE: "<f8"}
_RANGES = {TYPE_INT32: (-2**31, 2**31 - 1), TYPE_SINT32: (-2**31, 2**31 - 1), TYPE_SFIXED32: (-2**31, 2**31 - 1),
           TYPE_UINT32: (0, 2**32 - 1), TYPE_FIXED32: (0, 2**32 - 1), TYPE_UINT64: (0, None), TYPE_FIXED64: (0, None)}


def _binary(offsets: np.ndarray, data: np.ndarray) -> pa.BinaryArray:
    return pa.BinaryArray.from_buffers(pa.binary(), len(offsets) - 1,
                                       [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def varints(values: np.ndarray) -> pa.BinaryArray:
    """Each value (as uint64: negative int32/int64 are their 64-bit two's complement, as protobuf writes them) as
    a base-128 varint."""
    v = values.astype(np.uint64, copy=False)
    lengths = np.ones(len(v), dtype=np.int64)
    rest = v >> np.uint64(7)
    while True:
        more = rest != 0
        if not more.any():
            break
        lengths += more
        rest >>= np.uint64(7)
    offsets = np.zeros(len(v) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    starts = offsets[:-1]
    for j in range(int(lengths.max()) if len(v) else 0):
        rows = np.nonzero(lengths > j)[0]
        byte = (v[rows] >> np.uint64(7 * j)) & np.uint64(0x7F)
        byte |= np.where(lengths[rows] - 1 > j, np.uint64(0x80), np.uint64(0))
        data[starts[rows] + j] = byte.astype(np.uint8)
    return _binary(offsets, data)


def _tag(number: int, wire_type: int) -> pa.Scalar:
    return pa.scalar(varints(np.array([(number << 3) | wire_type], dtype=np.uint64))[0].as_py(), pa.binary())


def _join(*parts: pa.Array | pa.Scalar) -> pa.BinaryArray:
    return pc.binary_join_element_wise(*parts, _empty())


def _delimited(payload: pa.BinaryArray) -> pa.BinaryArray:
    lengths = pc.binary_length(payload).to_numpy(zero_copy_only=False)
    return _join(varints(lengths), payload)


def _numbers(column: pa.Array, field: Any, path: str) -> np.ndarray:
    """A scalar column's values as the numbers protobuf writes (checked against the field's range)."""
    kind = field.type
    if kind == TYPE_ENUM:
        if pa.types.is_integer(column.type):
            return column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        names = pa.array([v.name for v in field.enum_type.values])
        numbers = pa.array([v.number for v in field.enum_type.values], pa.int64())
        positions = pc.index_in(column, value_set=names)
        unknown = pc.and_(positions.is_null(), column.is_valid())
        if pc.any(unknown).as_py():
            first = int(pc.index(unknown, True).as_py())
            raise PayloadError(first, f"{column[first].as_py()!r} is not a value of enum {field.enum_type.full_name}",
                               column=path)
        return pc.take(numbers, positions).fill_null(0).to_numpy(zero_copy_only=False)
    if kind == TYPE_BOOL:
        return column.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
    values = column.fill_null(0)
    bounds = _RANGES.get(kind)
    if bounds is not None:
        low, high = bounds
        checks = [] if pa.types.is_unsigned_integer(values.type) else [pc.less(values, low)]
        if high is not None:
            checks.append(pc.greater(values, high))
        outside = checks[0] if len(checks) == 1 else pc.or_(*checks) if checks else None
        if outside is not None and pc.any(outside).as_py():
            first = int(pc.index(outside, True).as_py())
            raise PayloadError(first, f"Value out of range: {values[first].as_py()} for a "
                               f"{field.name!r} field of type {_type_name(kind)}", column=path)
    array = values.to_numpy(zero_copy_only=False)
    if kind in (TYPE_SINT32, TYPE_SINT64):
        signed = array.astype(np.int64)
        return ((signed << 1) ^ (signed >> 63)).view(np.uint64)
    if kind in _FIXED:
        return array
    return array.astype(np.int64).view(np.uint64) if array.dtype.kind in "if" else array.astype(np.uint64)


def _type_name(kind: int) -> str:
    names = {TYPE_INT32: "int32", TYPE_SINT32: "sint32", TYPE_SFIXED32: "sfixed32", TYPE_UINT32: "uint32",
             TYPE_FIXED32: "fixed32", TYPE_UINT64: "uint64", TYPE_FIXED64: "fixed64", TYPE_STRING: "string",
             TYPE_BYTES: "bytes", TYPE_ENUM: "enum", TYPE_BOOL: "bool", TYPE_DOUBLE: "double", TYPE_FLOAT: "float",
             TYPE_SFIXED64: "sfixed64", TYPE_SINT64: "sint64"}
    return names.get(kind, "int64" if kind == 3 else str(kind))


def _payloads(column: pa.Array, field: Any, path: str) -> tuple[pa.BinaryArray, int]:
    """Each value's encoding without its tag, and the wire type."""
    kind = field.type
    if kind in (TYPE_MESSAGE, TYPE_GROUP):
        return _delimited(message_bytes(column, field.message_type, f"{path}.")), 2
    t = column.type
    text = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
    fits = text if kind in (TYPE_STRING, TYPE_BYTES) else (
        text or pa.types.is_integer(t) if kind == TYPE_ENUM else
        pa.types.is_integer(t) or pa.types.is_boolean(t) or (pa.types.is_floating(t) and kind in _FIXED))
    if not fits:
        valid = column.is_valid()
        first = int(pc.index(valid, True).as_py()) if pc.any(valid).as_py() else 0
        raise PayloadError(first, f"a {t} column does not fit field {field.name!r} ({_type_name(kind)})", column=path)
    if kind in (TYPE_STRING, TYPE_BYTES):
        return _delimited(column.cast(pa.binary()).fill_null(b"")), 2
    numbers = _numbers(column, field, path)
    if kind in _FIXED:
        width = 4 if _FIXED[kind].endswith("4") else 8
        data = np.ascontiguousarray(numbers.astype(_FIXED[kind])).view(np.uint8)
        return _binary(np.arange(len(numbers) + 1, dtype=np.int64) * width, data), 5 if width == 4 else 1
    return varints(numbers), 0


def _default(column: pa.Array, field: Any) -> pa.Array:
    """Rows where a field without presence holds proto3's default (not written, as protobuf does)."""
    kind = field.type
    if kind in (TYPE_STRING, TYPE_BYTES):
        return pc.equal(pc.binary_length(column), 0)
    if kind == TYPE_ENUM and not pa.types.is_integer(column.type):
        first = field.enum_type.values[0]
        number_zero = next((v.name for v in field.enum_type.values if v.number == 0), first.name)
        return pc.equal(column, number_zero)
    if kind == TYPE_BOOL:
        return pc.invert(column)
    return pc.equal(column, pa.scalar(0, column.type))


def field_bytes(column: pa.Array, field: Any, path: str) -> pa.BinaryArray:
    """One field's encoded bytes per row (empty when there is nothing to write)."""
    number = field.number
    if is_map(field) or field.is_repeated:
        lists = column
        if is_map(field):
            entries = pa.StructArray.from_arrays([column.keys, column.items], names=["key", "value"])
            lists = pa.ListArray.from_arrays(column.offsets, entries)
        values = lists.flatten()
        if is_map(field):
            encoded = _join(_tag(number, 2), _delimited(message_bytes(values, field.message_type, f"{path}.")))
        elif field.type in (TYPE_MESSAGE, TYPE_GROUP, TYPE_STRING, TYPE_BYTES):
            payloads, wire = _payloads(values, field, path)
            encoded = _join(_tag(number, wire), payloads)
        else:  # packed: one length-delimited run of the values
            payloads, _ = _payloads(values, field, path)
            offsets = pc.subtract(lists.offsets, lists.offsets[0]) if len(lists) else lists.offsets
            packed = pc.binary_join(pa.ListArray.from_arrays(offsets, payloads), _empty())
            return pc.if_else(pc.greater(pc.binary_length(packed).fill_null(0), 0),
                              _join(_tag(number, 2), _delimited(packed.fill_null(b""))), _empty())
        offsets = pc.subtract(lists.offsets, lists.offsets[0]) if len(lists) else lists.offsets
        return pc.binary_join(pa.ListArray.from_arrays(offsets, encoded), _empty()).fill_null(b"")
    payloads, wire = _payloads(column, field, path)
    written = column.is_valid() if field.has_presence else pc.invert(_default(column, field).fill_null(True))
    return pc.if_else(written, _join(_tag(number, wire), payloads), _empty())


def message_bytes(rows: pa.StructArray, message: Any, path: str = "") -> pa.BinaryArray:
    """Each row's message bytes (a null row's are empty: the caller masks it)."""
    columns = dict(zip([f.name for f in rows.type], rows.flatten(), strict=True))
    parts = [field_bytes(columns[f.name], f, f"{path}{f.name}") for f in sorted(message.fields, key=lambda f: f.number)
             if f.name in columns]
    if not parts:
        return pa.array([b""] * len(rows), pa.binary())
    return _join(*parts) if len(parts) > 1 else parts[0]
