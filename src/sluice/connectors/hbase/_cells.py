"""Cell values: Spark column values <-> cell bytes, as HBase's own `Bytes` class writes and reads them.

| Spark type | cell bytes (Java: how to read them) |
| --- | --- |
| string | UTF-8 (`Bytes.toString`) |
| binary | as is |
| boolean | one byte, 0xFF for true, 0x00 for false (`Bytes.toBoolean`) |
| byte, short, int, long | big-endian two's complement, 1/2/4/8 bytes (`Bytes.toShort/toInt/toLong`) |
| float, double | IEEE 754 big-endian (`Bytes.toFloat/toDouble`) |
| date | days since 1970-01-01 as a 4-byte int; timestamp: microseconds since the epoch (UTC), 8-byte long |
| decimal | a 4-byte scale, then the unscaled value's minimal two's complement bytes (`Bytes.toBigDecimal`) |

A null is no cell (write.null-cells says whether it deletes the stored one). Reading, a cell of the wrong width
for its column is an error naming the row and column, never a silently wrong number.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import OptionError

_INT_WIDTHS = {8: 1, 16: 2, 32: 4, 64: 8}




def _fixed_cells(values: np.ndarray, width: int) -> pa.Array:
    raw = pa.py_buffer(values.tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, raw]).cast(pa.binary())


def encoder(dtype: pa.DataType, column: str, shown: str | None = None) -> Callable[[pa.Array], pa.Array]:
    """Column -> each row's cell bytes, a binary array (null where null); `shown` is the column's type in errors
    (Spark's name)."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_binary(dtype) \
            or pa.types.is_large_binary(dtype):
        return lambda a: a.cast(pa.binary())
    if pa.types.is_boolean(dtype):
        true, false = pa.scalar(b"\xff", pa.binary()), pa.scalar(b"\x00", pa.binary())
        return lambda a: pc.if_else(a, true, false)
    if pa.types.is_integer(dtype) or pa.types.is_date32(dtype) or pa.types.is_timestamp(dtype) \
            or pa.types.is_floating(dtype):
        if pa.types.is_date32(dtype):
            dtype = pa.int32()
        elif pa.types.is_timestamp(dtype):
            dtype = pa.int64()
        if pa.types.is_floating(dtype):
            width, big = dtype.bit_width // 8, f">f{dtype.bit_width // 8}"
        else:
            width, big = _INT_WIDTHS[dtype.bit_width], f">i{_INT_WIDTHS[dtype.bit_width]}"

        def fixed(a: pa.Array) -> pa.Array:
            filled = a.cast(dtype).fill_null(0) if a.null_count else a.cast(dtype)
            cells = _fixed_cells(np.asarray(filled.to_numpy(zero_copy_only=False), big), width)
            return pc.if_else(a.is_valid(), cells, pa.nulls(1, pa.binary())[0]) if a.null_count else cells

        return fixed
    if pa.types.is_decimal(dtype):
        scale = dtype.scale

        def decimal(a: pa.Array) -> pa.Array:
            out: list[bytes | None] = []
            for value in a.to_pylist():
                if value is None:
                    out.append(None)
                    continue
                unscaled = int(value.scaleb(scale))
                length = max(1, (unscaled.bit_length() + 8) // 8)
                out.append(scale.to_bytes(4, "big", signed=True) + unscaled.to_bytes(length, "big", signed=True))
            return pa.array(out, pa.binary())

        return decimal
    raise OptionError(f"column '{column}' is {shown or dtype}; HBase cells take strings, binary, booleans, numbers, "
                      "dates, timestamps and decimals (docs/hbase.md, cell values). Convert it, e.g. to_json() for a "
                      "struct, array or map.")


def decoder(dtype: pa.DataType, column: str) -> Callable[[bytes], Any]:
    """Cell bytes -> the column's Python value (ValueError for bytes of the wrong width)."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return lambda b: b.decode()
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return lambda b: b
    if pa.types.is_boolean(dtype):
        return lambda b: _width(b, 1, column) != b"\x00"
    if pa.types.is_floating(dtype):
        width = dtype.bit_width // 8
        kind = f">f{width}"
        return lambda b: float(np.frombuffer(_width(b, width, column), kind)[0])
    if pa.types.is_integer(dtype):
        width = _INT_WIDTHS[dtype.bit_width]
        return lambda b: int.from_bytes(_width(b, width, column), "big", signed=True)
    if pa.types.is_date32(dtype) or pa.types.is_timestamp(dtype):
        width = 4 if pa.types.is_date32(dtype) else 8
        base = pa.int32() if width == 4 else pa.int64()
        return lambda b: pa.scalar(int.from_bytes(_width(b, width, column), "big", signed=True), base).cast(
            dtype).as_py()
    if pa.types.is_decimal(dtype):
        def decimal(b: bytes) -> Decimal:
            if len(b) < 5:
                raise ValueError(f"{len(b)} bytes in column '{column}' are no decimal (4 bytes of scale, then the "
                                 "unscaled value)")
            scale = int.from_bytes(b[:4], "big", signed=True)
            return Decimal(int.from_bytes(b[4:], "big", signed=True)).scaleb(-scale)

        return decimal
    encoder(dtype, column)  # raises the error naming the supported types
    raise AssertionError


def _width(b: bytes, width: int, column: str) -> bytes:
    if len(b) != width:
        raise ValueError(f"a cell of {len(b)} bytes cannot be column '{column}', which takes {width}-byte values "
                         "(docs/hbase.md, cell values): give the column the type it was written with")
    return b
