"""Puts as Thrift bytes, built a column at a time in Arrow: the hot path of `format("hbase")` writes.

A `TPut` object per row (with its list and a `TColumnValue` per cell) costs a task more CPU than the gateway and
the region server spend on the row: building the objects, serializing them, and Python's cyclic garbage collector
walking the tens of thousands a task keeps buffered. So each row's put is built directly as the bytes Thrift's
binary protocol writes for it (field header, length, value; `hbase.thrift`'s field ids), with Arrow's element-wise
binary join over whole columns, and the engine buffers one `bytes` object a row, which the collector ignores.
`put_multiple` sends a batch of them as one `putMultiple` call on a thriftpy2 client and reads its reply as
thriftpy2 does (so the gateway's exceptions arrive as they would from the client).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Thrift binary protocol: field type bytes, then the 2-byte field id (hbase.thrift's numbering).
_STRING, _I32, _I64, _LIST, _STRUCT, _STOP = 0x0B, 0x08, 0x0A, 0x0F, 0x0C, 0x00


def _field(kind: int, number: int) -> bytes:
    return struct.pack(">bh", kind, number)


def _binary(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def _scalar(value: bytes) -> pa.Scalar:
    return pa.scalar(value, pa.binary())


def _big_endian(values: Any, kind: str, width: int) -> pa.Array:
    raw = pa.py_buffer(np.asarray(values, kind).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, raw]).cast(pa.binary())


def _length(array: pa.Array) -> pa.Array:
    return _big_endian(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), ">i4", 4)


def thrift_puts(keys: pa.Array, cells: Sequence[tuple[bytes, bytes, pa.Array]], stamps: np.ndarray,
                durability: int | None) -> tuple[pa.Array, np.ndarray]:
    """Each row's `TPut(row, columnValues, timestamp, durability)` as Thrift binary bytes, its cells'
    timestamps the row's; and each row's count of cells (null values are no cell: a row of none is no put).
    `cells` are (family, qualifier, binary values) in the put's column order."""
    stamp = _big_endian(stamps, ">i8", 8)
    counts = np.zeros(len(keys), np.int64)
    parts = []
    for family, qualifier, values in cells:
        head = (_field(_STRING, 1) + _binary(family) + _field(_STRING, 2) + _binary(qualifier)
                + _field(_STRING, 3))
        # TColumnValue(family, qualifier, value, timestamp); null values make a null, then no bytes.
        cell = pc.binary_join_element_wise(_scalar(head), _length(values), values, _scalar(_field(_I64, 4)), stamp,
                                           _scalar(bytes([_STOP])), _scalar(b""), null_handling="emit_null")
        counts += values.is_valid().to_numpy(zero_copy_only=False)
        parts.append(cell.fill_null(b"") if values.null_count else cell)
    tail = [_scalar(_field(_I32, 6) + struct.pack(">i", durability))] if durability else []
    puts = pc.binary_join_element_wise(
        _scalar(_field(_STRING, 1)), _length(keys), keys,
        _scalar(_field(_LIST, 2) + bytes([_STRUCT])), _big_endian(counts, ">i4", 4), *parts,
        _scalar(_field(_I64, 3)), stamp, *tail, _scalar(bytes([_STOP])), _scalar(b""))
    return puts, counts


def put_row(put: bytes) -> bytes:
    """The row key of a put made by thrift_puts."""
    return put[7:7 + int.from_bytes(put[3:7], "big")]


def put_multiple(client: Any, table: bytes, puts: list[bytes]) -> None:
    """THBaseService.putMultiple(table, puts) with puts already in Thrift bytes, on a thriftpy2 client."""
    from thriftpy2.thrift import TMessageType

    protocol = client._oprot
    protocol.write_message_begin("putMultiple", TMessageType.CALL, 0)
    protocol.trans.write(b"".join([_field(_STRING, 1), _binary(table), _field(_LIST, 2), bytes([_STRUCT]),
                                   struct.pack(">i", len(puts)), *puts, bytes([_STOP])]))
    protocol.write_message_end()
    protocol.trans.flush()
    client._recv("putMultiple")
