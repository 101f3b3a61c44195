"""Encode Arrow rows as Avro bodies in bulk (Avro's specification, "Binary Encoding"). The schema is walked once per
batch: each leaf becomes one or two parts (_avro_parts.py: per row, the bytes that leaf writes), a record's parts are
its fields' in order (nested records and unions inline theirs), and each body is all of the row's parts
concatenated in one pass at the end. No per-record Python. A row that does not fit the schema (a null where the
schema has none, a string that is not one of an enum's symbols, a decimal past its precision, an int past 32 bits, a
fixed of the wrong size) is a PayloadError naming the row and the column, raised before anything is returned.

`live` marks the rows whose value is written: values under a null struct or outside a union's chosen branch write
no bytes and are never refused. Arrays and maps encode their items as bodies of their own, joined per row."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats import _avro_parts as parts
from sluice.formats._avro_schema import AvroType, SchemaError
from sluice.formats._codec import PayloadError

Parts = list[parts.Part]


def _numpy(arr: pa.Array, fill: object) -> np.ndarray:
    return arr.fill_null(fill).to_numpy(zero_copy_only=False) if arr.null_count else arr.to_numpy(zero_copy_only=False)


def _valid(arr: pa.Array) -> np.ndarray:
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _write(live: np.ndarray) -> np.ndarray | None:
    """The parts' row mask: None when every row is written (the parts' fast paths)."""
    return None if live.all() else live


class Encoder:
    def __init__(self, n: int) -> None:
        self.n = n
        self.errors: list[tuple[int, str, str]] = []

    def refuse(self, rows: np.ndarray, column: str, reason: str) -> None:
        if rows.any():
            self.errors.append((int(np.flatnonzero(rows)[0]), column, reason))

    def encode(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> Parts:
        """The parts of `arr` under `t`: the rows not `live` write nothing."""
        if t.kind == "union":
            return self._union(arr, t, column, live)
        if arr.null_count and t.kind != "null":
            self.refuse(live & ~_valid(arr), column, f"null where the Avro schema's {t.kind} allows none")
        k, lt = t.kind, t.logical
        write = _write(live)
        if k == "null":
            return []
        if k == "boolean":
            return [parts.fixed(_numpy(arr, False).astype(np.uint8), write)]
        if k in ("int", "long"):
            return [parts.varints(self._integers(arr, t, column, live), write)]
        if k == "float":
            return [parts.fixed(_numpy(arr.cast(pa.float32()), 0).astype("<f4", copy=False), write)]
        if k == "double":
            return [parts.fixed(_numpy(arr.cast(pa.float64()), 0).astype("<f8", copy=False), write)]
        if lt == "decimal" and k in ("bytes", "fixed"):
            return self._decimal(arr, t, column, live)
        if k in ("string", "bytes"):
            data = parts.binary(arr)
            return [parts.varints(parts.lengths(data), write), parts.blank(data, write)]
        if k == "fixed":
            data = arr.cast(pa.binary()) if not pa.types.is_binary(arr.type) else arr
            size = pc.binary_length(data).to_numpy(zero_copy_only=False)
            wrong = live & _valid(arr) & (size != t.size)
            self.refuse(wrong, column, f"a value of fixed {t.name} is not {t.size} bytes")
            return [parts.blank(data.fill_null(bytes(t.size)) if data.null_count else data, write)]
        if k == "enum":
            idx = pc.index_in(arr, value_set=pa.array(t.symbols, pa.string()))
            missing = live & _valid(arr) & ~_valid(idx)
            self.refuse(missing, column, f"a string that is not one of enum {t.name}'s symbols {list(t.symbols)}")
            return [parts.varints(_numpy(idx, 0), write)]
        if k == "record":
            return self.record(arr, t, column, live)
        if k in ("array", "map"):
            return self._blocks(arr, t, column, live)
        raise SchemaError(f"column {column!r}: no Avro encoding for {k}")

    def record(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> Parts:
        if not pa.types.is_struct(arr.type):
            raise SchemaError(f"column {column!r}: record {t.name} needs a struct column, not {arr.type}")
        child_live = live & _valid(arr) if arr.null_count else live
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        out: Parts = []
        for f in t.fields:
            sub = f"{column}.{f.name}" if column else f.name
            if f.name not in names:
                if f.default is None and f.type.kind == "union" and f.type.null_index is not None:
                    child = pa.nulls(len(arr))
                else:
                    raise SchemaError(f"column {sub!r} of the Avro schema {t.name} is not in the rows: add it")
            else:
                child = arr.field(names[f.name])
            out += self.encode(child, f.type, sub, child_live)
        return out

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
        v = _numpy(arr.cast(pa.int64()), 0).astype(np.int64, copy=False)
        if t.kind == "int":
            self.refuse(live & ((v < -(2**31)) | (v >= 2**31)), column, "a value past Avro int's 32 bits")
        return v

    def _decimal(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> Parts:
        if not pa.types.is_decimal(arr.type):
            arr = arr.cast(pa.decimal128(38, t.scale))
        valid = _valid(arr)
        at = arr.type
        if at.precision - at.scale > t.precision - t.scale:  # else no value of the type can be past the bound
            bound = pa.scalar(Decimal(10) ** (t.precision - t.scale), pa.decimal128(38, max(at.scale, 0)))
            over = pc.greater_equal(pc.abs(arr.cast(pa.decimal128(38, at.scale))), bound)
            past = live & valid & _numpy(over, False)
            self.refuse(past, column, f"a decimal past the schema's precision {t.precision}")
        if at.scale != t.scale:
            try:
                arr = arr.cast(pa.decimal128(38, t.scale))
            except pa.ArrowInvalid:
                self.refuse(live & valid, column, f"a decimal that does not fit scale {t.scale}")
                return []
        if not (pa.types.is_decimal128(arr.type)):
            arr = arr.cast(pa.decimal128(38, t.scale))
        arr = arr.fill_null(Decimal(0)) if arr.null_count else arr
        write = _write(live)
        if t.kind == "bytes":
            return [parts.decimal_bytes(arr, write)]
        n = len(arr)
        le = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * 16 : (arr.offset + n) * 16].reshape(n, 16)
        be = le[:, ::-1]
        if t.size > 16:
            sign = np.where(be[:, 0] >= 0x80, np.uint8(0xFF), np.uint8(0))
            be = np.concatenate([np.repeat(sign[:, None], t.size - 16, axis=1), be], axis=1)
        body = be[:, be.shape[1] - t.size :]
        return [parts.Bytes(body, None if write is None else write * np.int64(t.size))]

    def _blocks(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> Parts:
        """One block of all the row's items (its count, the items, then the end's count 0); an empty or null list
        is the end alone."""
        assert t.items is not None
        if isinstance(arr, pa.LargeListArray):
            arr = arr.cast(pa.list_(arr.type.value_field))
        valid = _valid(arr)
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        base = offsets[0]
        item_live = np.repeat(live & valid, np.diff(offsets))
        if t.kind == "map":
            keys = arr.keys.slice(base, offsets[-1] - base)
            items = arr.items.slice(base, offsets[-1] - base)
            item_parts = self.encode(keys, AvroType("string"), f"{column} key", item_live)
            item_parts += self.encode(items, t.items, f"{column} value", item_live)
        else:
            values = arr.values.slice(base, offsets[-1] - base)
            item_parts = self.encode(values, t.items, f"{column} item", item_live)
        counts = np.where(live & valid, np.diff(offsets), 0)
        has = _write(counts > 0)
        joined = parts.group(parts.join(item_parts, len(item_live)), offsets - base)
        return [parts.varints(counts, has), parts.blank(joined, has), parts.constant(0, len(arr), _write(live))]

    def _union(self, arr: pa.Array, t: AvroType, column: str, live: np.ndarray) -> Parts:
        rest = t.non_null
        ni = t.null_index
        n = len(arr)
        valid = _valid(arr)
        write = _write(live)
        if len(rest) == 1 or not pa.types.is_struct(arr.type) or arr.type.num_fields != len(rest):
            if len(rest) != 1:
                raise SchemaError(f"column {column!r}: a union of {len(rest)} types needs a struct of member0...")
            bi = t.branches.index(rest[0])
            if ni is None:
                self.refuse(live & ~valid, column, "null where the Avro union has no null branch")
            index = np.full(n, bi) if ni is None or not arr.null_count else np.where(valid, bi, ni)
            return [parts.varints(index, write), *self.encode(arr, rest[0], column, live & valid)]
        # Spark's union struct: the first non-null member is the branch written
        members = [arr.field(j) for j in range(len(rest))]
        chosen = np.full(n, -1)
        for j in reversed(range(len(rest))):
            chosen = np.where(_valid(members[j]) & valid, j, chosen)
        nothing = chosen < 0
        if ni is None:
            self.refuse(live & nothing, column, "a union struct with no member set, and the union has no null branch")
        branch = np.array([t.branches.index(b) for b in rest] + [ni or 0])
        out: Parts = [parts.varints(branch[chosen], write)]  # chosen -1: the last entry, the null branch
        for j, b in enumerate(rest):
            pick = chosen == j
            if pick.any():
                out += self.encode(members[j], b, f"{column}.member{j}", live & pick)
        return out


def encode_rows(rows: pa.StructArray, schema: AvroType) -> pa.BinaryArray:
    """One Avro body per row; null rows become null bodies (Kafka tombstones)."""
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    n = len(rows)
    enc = Encoder(n)
    valid = _valid(rows)
    body_parts = enc.record(rows, schema, "", valid)
    if enc.errors:
        index, column, reason = min(enc.errors)
        raise PayloadError(index, reason, column=column)
    out = parts.join(body_parts, n)
    if rows.null_count:
        out = pc.if_else(pa.array(valid), out, pa.nulls(n, pa.binary()))
    return out
