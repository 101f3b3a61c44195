"""The byte pieces the Avro encoder (_avro_encode.py) assembles bodies from, built with numpy. A part holds, per row,
the bytes one leaf of the schema contributes to that row's body, empty where the row does not write it (`write`, a
bool mask; None: every row). A body is its parts concatenated row-wise, all of them in one pass (`join`): no
intermediate body per field, nested record or union.

A part is either the column's own binary array (strings, bytes) or `Bytes`, a (rows, width) byte matrix with each
row's length (numbers, varints, decimals). Before the join, neighbouring parts of one width in every row are put
side by side in one matrix, so the join (whose cost is per row and part) has fewer parts."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@functools.cache
def _empty() -> pa.Scalar:
    """b"" as an Arrow scalar; made on first use, as pyarrow's first scalar imports pandas (seconds in a new worker)."""
    return pa.scalar(b"", pa.binary())


_LIMIT = 2**31  # a binary array's int32 offsets


@dataclass(frozen=True)
class Bytes:
    """Row i's bytes are m[i, :lengths[i]] (lengths None: the whole row)."""

    m: np.ndarray
    lengths: np.ndarray | None = None


Part: TypeAlias = pa.BinaryArray | Bytes


def _whole_runs(run: list[Bytes]) -> list[Bytes]:
    """The run with each stretch of whole parts side by side in one matrix (a column copy). A part whose rows vary
    in length stays apart: shifting what follows it row by row costs more than the join's copy of one more part."""
    groups: list[Bytes] = []
    for b in run:
        if b.lengths is None and groups and groups[-1].lengths is None:
            groups[-1] = Bytes(np.hstack([groups[-1].m, b.m]))
        else:
            groups.append(b)
    return groups


def matrix(m: np.ndarray, lengths: np.ndarray | None = None) -> pa.BinaryArray:
    """Rows of a (n, w) uint8 matrix, row i cut to its first lengths[i] bytes (None: all w), as a binary array."""
    n, w = m.shape
    if lengths is None:
        offsets = np.arange(0, (n + 1) * w, w, dtype=np.int64)
        data = np.ascontiguousarray(m)
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = m[np.arange(w)[None, :] < lengths[:, None]] if w > 1 else m[:, 0][lengths > 0]
    if offsets[-1] >= _LIMIT:
        raise OverflowError(f"{int(offsets[-1]):,} bytes of one Avro field in one batch: send smaller batches")
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
    )


def fixed(values: np.ndarray, write: np.ndarray | None) -> Bytes:
    """Each value's little-endian bytes (a numeric array of one itemsize)."""
    m = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), values.dtype.itemsize)
    return Bytes(m, None if write is None else write * np.int64(m.shape[1]))


def zigzag(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def varint_matrix(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned varints of uint64 values, 7 bits a byte, the high bit set on all but the last: a (n, w) matrix and
    each row's byte count. w is the widest value's count, so a batch of small values costs one column."""
    n = len(z)
    top = int(z.max()) if n else 0
    width = max(1, (top.bit_length() + 6) // 7)
    if width == 1:
        return z.astype(np.uint8).reshape(n, 1), np.ones(n, dtype=np.int64)
    nbytes = np.ones(n, dtype=np.int64)
    for k in range(1, width):
        nbytes += z >= np.uint64(1 << (7 * k))
    m = np.empty((n, width), dtype=np.uint8)
    for k in range(width):  # column k: bits 7k..7k+6, the high bit set where more bytes follow
        col = (z >> np.uint64(7 * k)).astype(np.uint8) & np.uint8(0x7F)
        if k + 1 < width:
            col |= (nbytes > k + 1).view(np.uint8) << np.uint8(7)
        m[:, k] = col
    return m, nbytes


def varints(v: np.ndarray, write: np.ndarray | None = None) -> Bytes:
    """Zigzag varints of int64 values (Avro's int and long): z = (v << 1) ^ (v >> 63)."""
    m, nbytes = varint_matrix(zigzag(v))
    if write is not None:
        return Bytes(m, np.where(write, nbytes, 0))
    # values of one width (small ints, lengths, nearby timestamps): a whole matrix, merged without a scatter
    return Bytes(m, None if m.shape[1] == 1 or int(nbytes.min()) == m.shape[1] else nbytes)


def constant(value: int, n: int, write: np.ndarray | None) -> Bytes:
    """The varint of one int on every row written."""
    return varints(np.full(n, value, dtype=np.int64), write)


def decimal_bytes(arr: pa.Decimal128Array, write: np.ndarray | None) -> Bytes:
    """Avro's decimal as bytes: the varint length, then the shortest big-endian two's complement (what Java's
    BigInteger.toByteArray writes). The int128 is read as two int64 halves: a value needs k bytes where k - 1 is the
    count of thresholds 2^(8j - 1), j = 1..15, that its magnitude bits (the value, complemented when negative)
    reach."""
    n = len(arr)
    halves = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset : 2 * (arr.offset + n)].reshape(n, 2)
    sign = halves[:, 1] >> 63  # 0 or -1
    lo = (halves[:, 0] ^ sign).view(np.uint64)
    hi = (halves[:, 1] ^ sign).view(np.uint64)
    wide = hi != 0
    k = np.ones(n, dtype=np.int64)
    for j in range(1, 16):
        bit = 8 * j - 1
        reached = wide if bit < 64 else wide & (hi >= np.uint64(1 << (bit - 64)))
        if bit < 64:
            reached = reached | (lo >= np.uint64(1 << bit))
        if not reached.any():
            break
        k += reached
    width = int(k.max()) if n else 1
    le = halves.view(np.uint8).reshape(n, 16)
    # body column c of a k-byte value is its byte k - 1 - c, counted from the least significant
    at = np.maximum(k[:, None] - 1 - np.arange(width)[None, :], 0)
    m = np.empty((n, width + 1), dtype=np.uint8)
    m[:, 0] = (k << 1).astype(np.uint8)  # the length's zigzag varint: k <= 16, one byte
    m[:, 1:] = np.take_along_axis(le, at, axis=1)
    lengths = k + 1
    if write is not None:
        lengths = np.where(write, lengths, 0)
    return Bytes(m, lengths)


def binary(arr: pa.Array) -> pa.BinaryArray:
    """`arr` as binary without nulls: a null is empty."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_binary(arr.type):
        arr = arr.cast(pa.binary())
    if not arr.null_count:
        return arr
    if not lengths(arr)[~arr.is_valid().to_numpy(zero_copy_only=False)].any():
        # the nulls hold no bytes (as Arrow's builders leave them): the same buffers without the validity bitmap
        _, offsets, data = arr.buffers()
        return pa.BinaryArray.from_buffers(pa.binary(), len(arr), [None, offsets, data], offset=arr.offset)
    return arr.fill_null(b"")


def _offsets(arr: pa.BinaryArray) -> np.ndarray:
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset :]


def lengths(arr: pa.BinaryArray) -> np.ndarray:
    return np.diff(_offsets(arr)).astype(np.int64)


def group(items: pa.BinaryArray, bounds: np.ndarray) -> pa.BinaryArray:
    """Row i: items bounds[i] to bounds[i + 1] (a list's offsets from 0) concatenated. A row's items are neighbours
    in `items`' data, so this is new offsets over the same data buffer, no copy."""
    n = len(bounds) - 1
    if not len(items):
        return pa.repeat(_empty(), n)
    offsets = _offsets(items)[bounds]
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), items.buffers()[2]])


def blank(part: pa.BinaryArray, write: np.ndarray | None) -> pa.BinaryArray:
    """`part` emptied on the rows not written."""
    if write is None or not (lengths(part)[~write] > 0).any():
        return part
    out = pc.if_else(pa.array(write), part, _empty())
    assert isinstance(out, pa.BinaryArray)
    return out


def join(pieces: list[Part], n: int) -> pa.BinaryArray:
    """Row-wise concatenation of the parts, in order: each run of Bytes merged, then one pass of
    binary_join_element_wise over all of them."""
    if not pieces or n == 0:
        return pa.repeat(_empty(), n)
    parts: list[pa.BinaryArray] = []
    run: list[Bytes] = []
    for p in [*pieces, None]:
        if isinstance(p, Bytes):
            run.append(p)
            continue
        if run:
            parts += [matrix(b.m, b.lengths) for b in _whole_runs(run)]
            run = []
        if p is not None:
            parts.append(p)
    total = 0
    for p in parts:
        o = _offsets(p)
        total += int(o[-1]) - int(o[0])
    if total >= _LIMIT:
        raise OverflowError(
            f"{total:,} bytes of Avro bodies in one batch, past a binary array's 2 GiB: send smaller batches"
        )
    if len(parts) == 1:
        return parts[0]
    out = pc.binary_join_element_wise(*parts, _empty())
    assert isinstance(out, pa.BinaryArray)
    return out
