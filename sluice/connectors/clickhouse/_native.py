"""Arrow -> ClickHouse's Native format, column by column with numpy (no Python work per row).

Native is column-major like Arrow: a block is the column count and row count (varints), then per column its
name, its type and its values - fixed-width types as little-endian arrays, strings as varint length + bytes,
Nullable(T) as a null map (one byte per row) then T's values. RowBinary, the row-major alternative, would need
every column's bytes interleaved row by row: an extra scatter of every byte for no gain on the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import OptionError

INTS = {"Int8": np.int8, "Int16": np.int16, "Int32": np.int32, "Int64": np.int64,
        "UInt8": np.uint8, "UInt16": np.uint16, "UInt32": np.uint32, "UInt64": np.uint64}
FLOATS = {"Float32": np.float32, "Float64": np.float64}
_DECIMAL = re.compile(r"Decimal(?:(32|64|128)\((\d+)\)|\((\d+),\s*(\d+)\))")
SUPPORTED = "Int8..Int64, UInt8..UInt64, Float32/64, Decimal, String, Date, DateTime and Nullable of them"


@dataclass(frozen=True)
class ColumnType:
    """A ClickHouse column type sluice writes and reads: base name, nullability, decimal precision/scale."""

    name: str  # as ClickHouse spells it, e.g. Nullable(Decimal(9, 2))
    base: str  # Int32, String, Decimal, Date, DateTime, ...
    nullable: bool
    precision: int = 0
    scale: int = 0

    @classmethod
    def parse(cls, column: str, spelled: str) -> ColumnType:
        inner, nullable = spelled, False
        if spelled.startswith("Nullable(") and spelled.endswith(")"):
            inner, nullable = spelled[len("Nullable("):-1], True
        if inner in INTS or inner in FLOATS or inner in ("String", "Date", "DateTime"):
            return cls(spelled, inner, nullable)
        if inner.startswith("DateTime("):  # DateTime('Europe/Berlin'): stored as UTC seconds all the same
            return cls(spelled, "DateTime", nullable)
        match = _DECIMAL.fullmatch(inner)
        if match:
            if match.group(1):
                width, scale = int(match.group(1)), int(match.group(2))
                precision = {32: 9, 64: 18, 128: 38}[width]
            else:
                precision, scale = int(match.group(3)), int(match.group(4))
            return cls(spelled, "Decimal", nullable, precision, scale)
        raise OptionError(f"column '{column}' has ClickHouse type {spelled}, which sluice does not write or read; "
                          f"supported: {SUPPORTED}. Exclude the column (it must then have a default) or change "
                          "its type.")

    @property
    def decimal_width(self) -> int:
        return 4 if self.precision <= 9 else 8 if self.precision <= 18 else 16


def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(LEB128 size of every value, the bytes of every value as columns of a (n, 10) array)."""
    values = values.astype(np.uint64)
    sizes = np.ones(len(values), dtype=np.int64)
    for k in range(1, 10):
        sizes += values >= np.uint64(1 << (7 * k))
    shifted = values[:, None] >> (np.arange(10, dtype=np.uint64) * np.uint64(7))[None, :]
    groups = (shifted & np.uint64(0x7F)).astype(np.uint8)
    more = np.arange(10)[None, :] < (sizes[:, None] - 1)
    return sizes, groups | (more.astype(np.uint8) << 7)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(value: str) -> bytes:
    data = value.encode()
    return _varint(len(data)) + data


def _strings(column: pa.Array) -> bytes:
    """Varint length + bytes per value, vectorized: lengths and data placed with two scatters."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        column = column.cast(pa.string()).cast(pa.binary())
    column = pc.fill_null(column, b"") if column.null_count else column
    column = pa.concat_arrays([column]) if isinstance(column, pa.ChunkedArray) else column
    offset_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[column.offset:column.offset + len(column) + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    sizes, groups = _varints(lengths)
    record = sizes + lengths
    starts = np.concatenate(([0], np.cumsum(record)[:-1])) if len(record) else np.zeros(0, np.int64)
    out = np.empty(int(record.sum()), dtype=np.uint8)
    for k in range(int(sizes.max()) if len(sizes) else 0):
        has = sizes > k
        out[starts[has] + k] = groups[has, k]
    total = int(lengths.sum())
    if total:
        shift = np.repeat(starts + sizes - offsets[:-1], lengths)
        source = np.arange(offsets[0], offsets[-1], dtype=np.int64)
        out[source + shift] = data[source]
    return out.tobytes()


def _fixed(column: pa.Array, dtype: type, name: str, row_key) -> bytes:
    """A numeric column as the target's little-endian array, refusing values the type cannot hold."""
    if pa.types.is_boolean(column.type):
        column = column.cast(pa.uint8())
    target = pa.from_numpy_dtype(dtype)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(0, column.type) if not pa.types.is_decimal(column.type) else
                              pa.scalar(0).cast(column.type))
    try:
        cast = column.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = column.cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
        info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else np.finfo(dtype)
        bad = np.flatnonzero((values < info.min) | (values > info.max) | (values != np.round(values))
                             if np.issubdtype(dtype, np.integer) else np.zeros(len(values), bool))
        row = int(bad[0]) if len(bad) else 0
        raise OptionError(f"value {column[row].as_py()} of column '{name}' does not fit its ClickHouse type "
                          f"{target} ({row_key(row)}). Nothing of this chunk was sent: fix or filter those rows, or "
                          "widen the column.") from None
    return cast.to_numpy(zero_copy_only=False).astype(dtype, copy=False).tobytes()


def _decimal(column: pa.Array, kind: ColumnType, name: str, row_key) -> bytes:
    """Decimal(P, S) as its scaled integer (Int32/Int64/Int128), from Arrow decimals, integers or floats."""
    target = pa.decimal128(38, kind.scale)
    if column.null_count:
        column = pc.fill_null(column, pa.scalar(0).cast(column.type))
    try:
        cast = column.cast(target, safe=True)
    except pa.ArrowInvalid:
        raise OptionError(f"column '{name}' has a value that does not fit {kind.name} exactly (more decimal places "
                          "than its scale, or too large); round or filter first.") from None
    words = np.frombuffer(cast.buffers()[1], dtype=np.int64)[2 * cast.offset:2 * (cast.offset + len(cast))]
    low, high = words[0::2], words[1::2]
    limit = 10 ** (kind.precision - kind.scale)
    too_big = pc.greater_equal(pc.abs(cast), pa.scalar(limit).cast(target)) if kind.precision < 38 else None
    if too_big is not None and pc.any(too_big).as_py():
        row = pc.index(too_big, True).as_py()
        raise OptionError(f"value {column[row].as_py()} of column '{name}' does not fit {kind.name} "
                          f"({row_key(row)}). Nothing of this chunk was sent.")
    if kind.decimal_width == 16:
        return np.ascontiguousarray(np.stack([low, high], axis=1)).tobytes()
    return low.astype(np.int32 if kind.decimal_width == 4 else np.int64).tobytes()


def encode_column(column: pa.Array, kind: ColumnType, name: str, row_key) -> bytes:
    """One column's values in Native encoding (its null map first when Nullable)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    prefix = b""
    if kind.nullable:
        prefix = pc.is_null(column).cast(pa.uint8()).to_numpy(zero_copy_only=False).tobytes()
    elif column.null_count:
        row = pc.index(pc.is_null(column), True).as_py()
        raise OptionError(f"column '{name}' is not Nullable in ClickHouse ({kind.name}), but {column.null_count} "
                          f"row(s) have no value for it ({row_key(row)}). Nothing of this chunk was sent: fill or "
                          "filter them, or make the column Nullable.")
    base = kind.base
    if base in INTS or base in FLOATS:
        return prefix + _fixed(column, INTS.get(base) or FLOATS[base], name, row_key)
    if base == "String":
        return prefix + _strings(column)
    if base == "Decimal":
        return prefix + _decimal(column, kind, name, row_key)
    if base == "Date":
        days = column.cast(pa.date32()).cast(pa.int32())
        return prefix + _fixed(days, np.uint16, name, row_key)
    if base == "DateTime":
        if pa.types.is_timestamp(column.type):
            seconds = pc.divide(column.cast(pa.timestamp("us", "UTC")).cast(pa.int64()), 1_000_000)
        else:
            seconds = column.cast(pa.int64())
        return prefix + _fixed(seconds, np.uint32, name, row_key)
    raise AssertionError(base)


def native_block(table: pa.Table, types: dict[str, ColumnType], row_key) -> bytes:
    """One Native block holding every row of `table`."""
    parts = [_varint(table.num_columns), _varint(table.num_rows)]
    for name in table.column_names:
        kind = types[name]
        parts += [_string(name), _string(kind.name), encode_column(table.column(name), kind, name, row_key)]
    return b"".join(parts)


def arrow_type(kind: ColumnType) -> pa.DataType:
    """The Arrow type a ClickHouse column reads as (and the Spark type it maps to)."""
    base = kind.base
    if base in INTS:
        if base == "UInt64":
            return pa.decimal128(20, 0)  # Spark has no unsigned 64-bit type
        if base.startswith("UInt"):
            return {"UInt8": pa.int16(), "UInt16": pa.int32(), "UInt32": pa.int64()}[base]
        return pa.from_numpy_dtype(INTS[base])
    if base in FLOATS:
        return pa.from_numpy_dtype(FLOATS[base])
    if base == "String":
        return pa.string()
    if base == "Date":
        return pa.date32()
    if base == "DateTime":
        return pa.timestamp("us", "UTC")
    return pa.decimal128(kind.precision, kind.scale)
