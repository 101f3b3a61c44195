"""Encode Arrow rows as Avro bodies in bulk (Avro's specification, "Binary Encoding"): each column becomes a binary
array of its per-row encodings, built with numpy and pyarrow.compute, and a record's fields are joined row-wise.
No per-record Python. A row that does not fit the schema (a null where the schema has none, a string that is not
one of an enum's symbols, a decimal past its precision, an int past 32 bits, a fixed of the wrong size) is a
PayloadError naming the row and the column, raised before anything is returned.

`live` marks the rows whose value is written: values under a null struct or outside a union's chosen branch are
encoded (arrays stay aligned) but never refused."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._avro_schema import AvroType, SchemaError
from sluice.formats._codec import PayloadError

_EMPTY = b""


def _from_matrix(m: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """Rows of a (n, w) uint8 matrix, row i cut to its first lengths[i] bytes, as a binary array."""
    keep = np.arange(m.shape[1])[None, :] < lengths[:, None]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(m[keep])])


def varints(v: np.ndarray) -> pa.BinaryArray:
    """Zigzag varints of int64 values: z = (v << 1) ^ (v >> 63), 7 bits a byte, the high bit set on all but the last."""
    v = v.astype(np.int64, copy=False)
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)
    nbytes = np.ones(len(z), dtype=np.int64)
    for k in range(1, 10):
        more = z >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        nbytes += more
    width = int(nbytes.max()) if len(nbytes) else 1
    m = np.empty((len(z), width), dtype=np.uint8)
    for k in range(width):  # column k: bits 7k..7k+6, the high bit set where more bytes follow
        m[:, k] = ((z >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | np.where(nbytes > k + 1, 0x80, 0)
    return _from_matrix(m, nbytes)


def _fixed_width(values: np.ndarray, width: int) -> pa.BinaryArray:
    n = len(values)
    offsets = np.arange(n + 1, dtype=np.int32) * width
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(values).tobytes())]
    )


def _const(value: bytes, n: int) -> pa.BinaryArray:
    return pa.repeat(pa.scalar(value, pa.binary()), n)


def _flat(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's int64 offsets (n + 1, not rebased) and its whole data buffer as uint8."""
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, dtype=np.uint8)
    return offsets, data


def _join(*parts: pa.Array) -> pa.BinaryArray:
    """Row-wise concatenation of binary arrays (none null) into one buffer: every row's start is the cumulative sum
    of the rows' totals, and each part's bytes are scattered to their row's start plus the parts before them, so the
    work is a few numpy passes over the bytes (pyarrow's binary_join_element_wise goes row by row)."""
    if len(parts) == 1:
        return parts[0]
    n = len(parts[0])
    flats = [_flat(p if pa.types.is_binary(p.type) else p.cast(pa.binary())) for p in parts]
    lengths = [np.diff(o) for o, _ in flats]
    total = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sum(lengths), out=total[1:])
    if total[-1] >= 2**31:
        raise OverflowError(
            f"{int(total[-1]):,} bytes of Avro bodies in one batch, past a binary array's 2 GiB: send smaller batches"
        )
    out = np.empty(int(total[-1]), dtype=np.uint8)
    pos = total[:-1].copy()
    for (offsets, data), size in zip(flats, lengths, strict=True):
        lo, hi = int(offsets[0]), int(offsets[-1])
        if hi > lo:
            # byte k of the part lands at k + (its row's position - its row's source offset)
            shift = np.repeat(pos - offsets[:-1], size)
            shift += np.arange(lo, hi, dtype=np.int64)
            out[shift] = data[lo:hi]
        pos += size
    return pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(total.astype(np.int32)), pa.py_buffer(out)])


def _numpy(arr: pa.Array, fill: object) -> np.ndarray:
    return arr.fill_null(fill).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy(zero_copy_only=False)


class Encoder:
    def __init__(self, n: int) -> None:
        self.n = n
        self.errors: list[tuple[int, str, str]] = []

    def refuse(self, rows: np.ndarray, column: str, reason: str) -> None:
        if rows.any():
            self.errors.append((int(np.flatnonzero(rows)[0]), column, reason))

    def encode(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> pa.BinaryArray:
        """Per-row encodings of `arr` under `t`; rows not `live` may hold anything."""
        if t.kind == "union":
            return self._union(arr, t, column, live)
        if arr.null_count and t.kind != "null":
            self.refuse(
                live & ~arr.is_valid().to_numpy(zero_copy_only=False),
                column,
                f"null where the Avro schema's {t.kind} allows none",
            )
        k, lt = t.kind, t.logical
        n = len(arr)
        if k == "null":
            return _const(_EMPTY, n)
        if k == "boolean":
            return _fixed_width(_numpy(arr, False).astype(np.uint8), 1)
        if k in ("int", "long"):
            return varints(self._integers(arr, t, column, live))
        if k == "float":
            return _fixed_width(_numpy(arr.cast(pa.float32()), 0).astype("<f4"), 4)
        if k == "double":
            return _fixed_width(_numpy(arr.cast(pa.float64()), 0).astype("<f8"), 8)
        if lt == "decimal" and k in ("bytes", "fixed"):
            return self._decimal(arr, t, column, live)
        if k in ("string", "bytes"):
            data = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
            data = data.fill_null(_EMPTY) if data.null_count else data
            return _join(varints(pc.binary_length(data).to_numpy(zero_copy_only=False)), data)
        if k == "fixed":
            data = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
            size = pc.binary_length(data).to_numpy(zero_copy_only=False)
            self.refuse(
                live & arr.is_valid().to_numpy(zero_copy_only=False) & (size != t.size),
                column,
                f"a value of fixed {t.name} is not {t.size} bytes",
            )
            return data.fill_null(bytes(t.size)) if data.null_count else data
        if k == "enum":
            idx = pc.index_in(arr, value_set=pa.array(t.symbols, pa.string()))
            missing = (
                live & arr.is_valid().to_numpy(zero_copy_only=False) & ~idx.is_valid().to_numpy(zero_copy_only=False)
            )
            self.refuse(missing, column, f"a string that is not one of enum {t.name}'s symbols {list(t.symbols)}")
            return varints(_numpy(idx, 0))
        if k == "record":
            return self.record(arr, t, column, live)
        if k in ("array", "map"):
            return self._blocks(arr, t, column, live)
        raise SchemaError(f"column {column!r}: no Avro encoding for {k}")

    def record(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> pa.BinaryArray:
        if not pa.types.is_struct(arr.type):
            raise SchemaError(f"column {column!r}: record {t.name} needs a struct column, not {arr.type}")
        child_live = live & arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else live
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        parts = []
        for f in t.fields:
            sub = f"{column}.{f.name}" if column else f.name
            if f.name not in names:
                if f.default is None and f.type.kind == "union" and f.type.null_index is not None:
                    child = pa.nulls(len(arr))
                else:
                    raise SchemaError(f"column {sub!r} of the Avro schema {t.name} is not in the rows: add it")
            else:
                child = arr.field(names[f.name])
            parts.append(self.encode(child, f.type, sub, child_live))
        if not parts:
            return _const(_EMPTY, len(arr))
        return _join(*parts) if len(parts) > 1 else parts[0]

    def _integers(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> np.ndarray:
        at = arr.type
        if pa.types.is_timestamp(at):
            per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
            want = 10**3 if t.logical in ("timestamp-millis", "local-timestamp-millis") else 10**6
            v = _numpy(arr.cast(pa.int64()), 0)
            have = per_second[at.unit]
            return v * (want // have) if want >= have else v // (have // want)
        if pa.types.is_date(at) or pa.types.is_time(at):
            return _numpy(
                arr.cast(pa.int32() if (pa.types.is_date32(at) or pa.types.is_time32(at)) else pa.int64()), 0
            ).astype(np.int64)
        v = _numpy(arr.cast(pa.int64()), 0).astype(np.int64)
        if t.kind == "int":
            self.refuse(live & ((v < -(2**31)) | (v >= 2**31)), column, "a value past Avro int's 32 bits")
        return v

    def _decimal(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> pa.BinaryArray:
        n = len(arr)
        if not pa.types.is_decimal(arr.type):
            arr = arr.cast(pa.decimal128(38, t.scale))
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        bound = pa.scalar(Decimal(10) ** (t.precision - t.scale), pa.decimal128(38, max(arr.type.scale, 0)))
        over = pc.greater_equal(pc.abs(arr.cast(pa.decimal128(38, arr.type.scale))), bound)
        self.refuse(live & valid & _numpy(over, False), column, f"a decimal past the schema's precision {t.precision}")
        if arr.type.scale != t.scale:
            try:
                arr = arr.cast(pa.decimal128(38, t.scale))
            except pa.ArrowInvalid:
                self.refuse(live & valid, column, f"a decimal that does not fit scale {t.scale}")
                return _const(_EMPTY, n)
        arr = arr.cast(pa.decimal128(38, t.scale)).fill_null(Decimal(0))
        le = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * 16 : (arr.offset + n) * 16].reshape(n, 16)
        be = le[:, ::-1]
        sign = np.where(be[:, 0] >= 0x80, np.uint8(0xFF), np.uint8(0))
        if t.kind == "fixed":
            return (
                _fixed_width(np.ascontiguousarray(be[:, 16 - t.size :]), t.size)
                if t.size <= 16
                else _fixed_width(np.concatenate([np.repeat(sign[:, None], t.size - 16, axis=1), be], axis=1), t.size)
            )
        # the shortest two's complement form, as Java's BigInteger.toByteArray writes it
        differs = be != sign[:, None]
        first = np.where(differs.any(axis=1), np.argmax(differs, axis=1), 16)
        first = np.minimum(first, 15)
        top_bit = (be[np.arange(n), first] >= 0x80).astype(np.uint8) * 0xFF
        first = np.where(top_bit != sign, first - 1, first)
        length = 16 - first
        idx = (np.arange(16)[None, :] + first[:, None]) % 16
        shifted = np.take_along_axis(be, idx, axis=1)
        body = _from_matrix(shifted, length)
        return _join(varints(length), body)

    def _blocks(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> pa.BinaryArray:
        assert t.items is not None
        if isinstance(arr, pa.LargeListArray):
            arr = arr.cast(pa.list_(arr.type.value_field))
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        counts = np.diff(offsets)
        counts = np.where(valid, counts, 0)
        base = offsets[0]
        item_live = np.repeat(live & valid, np.diff(offsets))
        if t.kind == "map":
            keys = arr.keys.slice(base, offsets[-1] - base)
            items = arr.items.slice(base, offsets[-1] - base)
            enc = _join(
                self.encode(keys, AvroType("string"), f"{column} key", item_live),
                self.encode(items, t.items, f"{column} value", item_live),
            )
        else:
            values = arr.values.slice(base, offsets[-1] - base)
            enc = self.encode(values, t.items, f"{column} item", item_live)
        rel = (offsets - base).astype(np.int32)
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(rel), enc), _EMPTY)
        end = _const(b"\x00", len(arr))
        head = varints(counts)
        with_items = _join(head, joined, end)
        return pc.if_else(pa.array(counts > 0), with_items, end)

    def _union(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> pa.BinaryArray:
        rest = t.non_null
        ni = t.null_index
        n = len(arr)
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        if len(rest) == 1 or not pa.types.is_struct(arr.type) or arr.type.num_fields != len(rest):
            if len(rest) != 1:
                raise SchemaError(f"column {column!r}: a union of {len(rest)} types needs a struct of member0...")
            bi = t.branches.index(rest[0])
            if ni is None:
                self.refuse(live & ~valid, column, "null where the Avro union has no null branch")
            value = _join(varints(np.full(n, bi)), self.encode(arr, rest[0], column, live & valid))
            if ni is None or not arr.null_count:
                return value
            return pc.if_else(pa.array(valid), value, pa.scalar(varints(np.array([ni]))[0].as_py(), pa.binary()))
        # Spark's union struct: the first non-null member is the branch written
        members = [arr.field(j) for j in range(len(rest))]
        chosen = np.full(n, -1)
        for j in reversed(range(len(rest))):
            chosen = np.where(members[j].is_valid().to_numpy(zero_copy_only=False) & valid, j, chosen)
        nothing = chosen < 0
        if ni is None:
            self.refuse(live & nothing, column, "a union struct with no member set, and the union has no null branch")
        out = _const(varints(np.array([ni or 0]))[0].as_py(), n)
        for j, b in enumerate(rest):
            pick = chosen == j
            if pick.any():
                enc = _join(
                    varints(np.full(n, t.branches.index(b))),
                    self.encode(members[j], b, f"{column}.member{j}", live & pick),
                )
                out = pc.if_else(pa.array(pick), enc, out)
        return out


def encode_rows(rows: pa.StructArray, schema: AvroType) -> pa.BinaryArray:
    """One Avro body per row; null rows become null bodies (Kafka tombstones)."""
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    n = len(rows)
    enc = Encoder(n)
    valid = rows.is_valid().to_numpy(zero_copy_only=False)
    out = enc.record(rows, schema, "", valid)
    if enc.errors:
        index, column, reason = min(enc.errors)
        raise PayloadError(index, reason, column=column)
    if rows.null_count:
        out = pc.if_else(pa.array(valid), out, pa.nulls(n, pa.binary()))
    return out
