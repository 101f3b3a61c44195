"""Row keys: Spark key columns -> bytes whose unsigned byte order is the order of the key values, and back.

HBase sorts rows by their key bytes, compared unsigned, left to right; a region holds a range of them and a scan
reads one. So a composite key is its columns' encodings, one after the other, each of which sorts as its values:

| Spark type | bytes |
| --- | --- |
| byte, short, int, long | big-endian two's complement, 1/2/4/8 bytes, sign bit flipped (so -1 sorts before 0) |
| date | its days since 1970-01-01 as an int; timestamp: microseconds since the epoch (UTC) as a long |
| float, double | IEEE 754 big-endian; positive: sign bit flipped, negative: every bit flipped |
| decimal(p, s) | the unscaled value (the scale is the column's) as a 16-byte long, sign bit flipped |
| boolean | one byte, 0 or 1 |
| string (UTF-8), binary | the bytes; followed by one 0 byte unless the column is the key's last |

A string or binary column that is not the key's last may not hold a 0 byte (it would end the column early); the
last needs no terminator, so a key of one string column is that string's UTF-8 bytes, as other HBase clients
write it, and a prefix of a last string column is a prefix of the row key (a scan's row prefix). A null key
column is refused: HBase rows have a whole key.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import OptionError, RecordError

# Fixed-width kinds: (width, the integer numpy type of their bits).
_FIXED = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "date32": 4, "timestamp": 8, "float": 4, "double": 8,
          "bool": 1, "decimal": 16}
_SIGN = {1: np.uint8(0x80), 2: np.uint16(0x8000), 4: np.uint32(0x8000_0000), 8: np.uint64(0x8000_0000_0000_0000)}


# Arrow type test -> key encoding, first match wins.
_KINDS = ((pa.types.is_int8, "int8"), (pa.types.is_int16, "int16"), (pa.types.is_int32, "int32"),
          (pa.types.is_int64, "int64"), (pa.types.is_date32, "date32"), (pa.types.is_timestamp, "timestamp"),
          (pa.types.is_float32, "float"), (pa.types.is_float64, "double"), (pa.types.is_boolean, "bool"),
          (pa.types.is_decimal, "decimal"), (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
          (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"))


def kind_of(dtype: pa.DataType, column: str) -> str:
    """The key encoding of an Arrow type (OptionError naming the column when a key cannot be of it)."""
    for test, kind in _KINDS:
        if test(dtype):
            return kind
    raise OptionError(f"row key column '{column}' is {dtype}; a row key column must be a number, string, binary, "
                      "boolean, date, timestamp or decimal (docs/hbase.md, row keys).")


def _fixed_bits(column: pa.Array, kind: str) -> np.ndarray:
    """The column's values as unsigned big-endian integers whose order is the values' order."""
    width = _FIXED[kind]
    unsigned = np.dtype(f">u{width}")
    if kind == "bool":
        return np.asarray(column.cast(pa.uint8()).to_numpy(zero_copy_only=False), dtype=unsigned)
    if kind in ("float", "double"):
        native = np.asarray(column.to_numpy(zero_copy_only=False), dtype=f"<f{width}")
        bits = native.view(f"<u{width}")
        negative = (bits & _SIGN[width]) != 0
        bits = np.where(negative, ~bits, bits | _SIGN[width])
        return bits.astype(unsigned)
    if kind in ("timestamp", "date32"):
        column = column.cast(pa.int64() if kind == "timestamp" else pa.int32())
    native = np.asarray(column.to_numpy(zero_copy_only=False), dtype=f"<i{width}")
    return (native.view(f"<u{width}") ^ _SIGN[width]).astype(unsigned)


def _decimal_bits(column: pa.Array) -> list[bytes]:
    """16-byte sign-flipped big-endian unscaled values (Python ints: decimal128 has no numpy view)."""
    scale = column.type.scale
    out = []
    for value in column.to_pylist():
        unscaled = int(value.scaleb(scale))
        out.append((unscaled + (1 << 127)).to_bytes(16, "big"))
    return out


ADVICE = "Fix such rows, or set errors.tolerance=all and errors.deadletter.format to send them aside."


def _zero_bytes(column: pa.Array, kind: str) -> np.ndarray:
    """Rows whose value (of a string or binary key column) holds a 0 byte."""
    found = pc.find_substring(column.cast(pa.binary()) if kind == "binary" else column, "\x00")
    return np.asarray(found.fill_null(-1).to_numpy(zero_copy_only=False)) >= 0


def _zero_byte_message(column: pa.Array, name: str, row: int) -> str:
    return (f"row key column '{name}' holds a 0 byte in row {row} of this batch ({column[row].as_py()!r}); only the "
            "key's last column may (docs/hbase.md, row keys). Put that column last in the rowkey option, or remove "
            "the 0 bytes")


def _component(column: pa.Array, kind: str, last: bool, name: str, checked: bool = False) -> pa.Array:
    """One key column's encodings, as a binary array (`checked`: its rows hold no 0 byte where none may be)."""
    if kind in ("string", "binary"):
        as_binary = column.cast(pa.binary())
        if last:
            return as_binary
        if not checked:
            hits = np.flatnonzero(_zero_bytes(column, kind))
            if hits.size:
                raise OptionError(_zero_byte_message(column, name, int(hits[0])) + ".")
        return pc.binary_join_element_wise(as_binary, pa.scalar(b"", pa.binary()), pa.scalar(b"\x00", pa.binary()))
    if kind == "decimal":
        return pa.array(_decimal_bits(column), pa.binary(16)).cast(pa.binary())
    bits = _fixed_bits(column, kind)
    width = _FIXED[kind]
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(column), [None, pa.py_buffer(bits.tobytes())])
    return fixed.cast(pa.binary())


@dataclass(frozen=True)
class KeyCodec:
    """The row key of a table: its columns, in order, and how each is encoded."""

    columns: tuple[str, ...]
    kinds: tuple[str, ...]

    @classmethod
    def for_schema(cls, columns: Sequence[str], schema: pa.Schema) -> KeyCodec:
        return cls(tuple(columns), tuple(kind_of(schema.field(c).type, c) for c in columns))

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        """Every row's key; RecordError with rows that have none (a null key column, or a 0 byte in a string or binary
        column that is not the key's last)."""
        self._check(batch)
        return self.encoded(batch).to_pylist()

    def encoded(self, batch: pa.RecordBatch) -> pa.Array:
        """Every row's key as a binary array, in Arrow, unchecked: rows `encode` refuses must not be in `batch`,
        except a keyless one (`keyless`), whose bytes are then its columns' one after the other."""
        parts = []
        for i, (name, kind) in enumerate(zip(self.columns, self.kinds, strict=True)):
            parts.append(_component(batch.column(name), kind, i == len(self.columns) - 1, name, checked=True))
        if len(parts) == 1:
            return parts[0]
        return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))

    def _check(self, batch: pa.RecordBatch) -> None:
        """RecordError with the rows of the first key column found null, or holding a 0 byte where none may be (one
        problem at a time, so each dead letter has its own reason: the engine encodes the other rows again)."""
        for i, (name, kind) in enumerate(zip(self.columns, self.kinds, strict=True)):
            column = batch.column(name)
            rows: list[int] = []
            if column.null_count:
                rows = np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False))).tolist()
                others = {c: batch.column(c)[rows[0]].as_py() for c in self.columns if c != name}
                first = (f"row key column '{name}' is null in row {rows[0]} of this batch (other key columns: "
                         f"{others}): HBase rows need a whole key. Filter such rows out or fill them in")
            elif kind in ("string", "binary") and i < len(self.columns) - 1:
                rows = np.flatnonzero(_zero_bytes(column, kind)).tolist()
                first = _zero_byte_message(column, name, rows[0]) if rows else ""
            if rows:
                more = f" ({len(rows) - 1} more such row(s) in this batch)" if len(rows) > 1 else ""
                raise RecordError(f"{first}{more}. {ADVICE}", rows=rows)

    def keyless(self, batch: pa.RecordBatch) -> np.ndarray:
        """Rows (no null key columns) with no row key: a 0 byte in a string or binary column that is not the key's
        last, which no row of the table can have (lookups: such a key matches nothing)."""
        found = np.zeros(batch.num_rows, dtype=bool)
        for i, (name, kind) in enumerate(zip(self.columns, self.kinds, strict=True)):
            if kind in ("string", "binary") and i < len(self.columns) - 1:
                found |= _zero_bytes(batch.column(name), kind)
        return found

    def encode_values(self, values: Sequence[Any], schema: pa.Schema) -> bytes:
        """The key (or key prefix, if fewer values than columns) of Python values: pushed-down filters."""
        parts = []
        for i, value in enumerate(values):
            name = self.columns[i]
            array = pa.array([value], schema.field(name).type)
            last = i == len(self.columns) - 1
            parts.append(_component(array, self.kinds[i], last, name)[0].as_py())
        return b"".join(parts)

    def decoder(self, schema: pa.Schema) -> Callable[[list[bytes]], list[pa.Array]]:
        """Keys -> one Arrow array per key column (the types of `schema`)."""
        types = [schema.field(c).type for c in self.columns]
        kinds = self.kinds

        def decode(keys: list[bytes]) -> list[pa.Array]:
            values: list[list[Any]] = [[] for _ in kinds]
            for key in keys:
                at = 0
                for i, kind in enumerate(kinds):
                    last = i == len(kinds) - 1
                    value, at = _decode_one(key, at, kind, last, types[i])
                    values[i].append(value)
            return [pa.array(v, t) for v, t in zip(values, types, strict=True)]

        return decode


_UNPACK = {"int8": ">B", "int16": ">H", "int32": ">I", "int64": ">Q", "date32": ">I", "timestamp": ">Q"}


def _decode_one(key: bytes, at: int, kind: str, last: bool, dtype: pa.DataType) -> tuple[Any, int]:
    if kind in ("string", "binary"):
        end = len(key) if last else key.index(b"\x00", at)
        raw = key[at:end]
        return (raw.decode() if kind == "string" else raw), end + (0 if last else 1)
    width = _FIXED[kind]
    chunk = key[at:at + width]
    if len(chunk) != width:
        raise ValueError(f"row key {key!r} is shorter than its columns' encoding")
    if kind == "bool":
        return chunk != b"\x00", at + width
    if kind == "decimal":
        unscaled = int.from_bytes(chunk, "big") - (1 << 127)
        return Decimal(unscaled).scaleb(-dtype.scale), at + width
    if kind in ("float", "double"):
        (bits,) = struct.unpack(">I" if width == 4 else ">Q", chunk)
        sign = 1 << (width * 8 - 1)
        bits = bits ^ sign if bits & sign else ~bits & ((1 << (width * 8)) - 1)
        return struct.unpack(">f" if width == 4 else ">d", bits.to_bytes(width, "big"))[0], at + width
    (bits,) = struct.unpack(_UNPACK[kind], chunk)
    value = bits - (1 << (width * 8 - 1))
    if kind == "timestamp":
        return pa.scalar(value, pa.int64()).cast(dtype).as_py(), at + width
    if kind == "date32":
        return pa.scalar(value, pa.int32()).cast(dtype).as_py(), at + width
    return value, at + width
