"""Avro's schema resolution (Avro's specification, "Schema Resolution") on decoded Arrow arrays: data read with the
writer's schema becomes the reader's. Record fields match by name or the reader field's aliases; a reader field the
writer lacks takes the reader's default; writer fields the reader lacks are dropped; int -> long/float/double,
long -> float/double, float -> double and string <-> bytes are promoted; an enum symbol the reader lacks takes the
reader's enum default; arrays, maps, nested records and unions resolve recursively. What cannot resolve for every
record is a SchemaError naming the field; what fails for some records only is a PayloadError naming the first."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._avro_schema import NO_DEFAULT, AvroType, SchemaError
from sluice.formats._avro_types import arrow_type
from sluice.formats._codec import PayloadError

_PROMOTE = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _names(t: AvroType) -> set[str]:
    names = {t.name or t.kind, *(t.aliases)}
    return names | {n.rpartition(".")[2] for n in names}


def _matches(w: AvroType, r: AvroType) -> bool:
    """Whether a writer branch resolves to a reader branch (the spec's union matching: same kind, named types by
    unqualified name or alias, primitives by promotion)."""
    if w.kind in _PROMOTE:
        return r.kind in _PROMOTE[w.kind]
    if w.kind != r.kind:
        return False
    if w.kind in ("record", "enum", "fixed"):
        return bool(_names(w) & _names(r))
    return True


def resolve(arr: pa.Array, w: AvroType, r: AvroType, path: str) -> pa.Array:
    """`arr` holds values of writer type `w` in Spark's types; the result is reader type `r`'s (arrow_type(r))."""
    target, _ = arrow_type(r)
    w_null, r_null = w.kind == "union" and w.null_index is not None, r.kind == "union" and r.null_index is not None
    w_core = w.non_null[0] if w.kind == "union" and len(w.non_null) == 1 else w
    r_core = r.non_null[0] if r.kind == "union" and len(r.non_null) == 1 else r
    if w_null and not r_null and arr.null_count:
        i = int(np.flatnonzero(~arr.is_valid().to_numpy(zero_copy_only=False))[0])
        raise PayloadError(i, f"{path} is null in the writer's record but the reader schema does not allow null")
    if w_core.kind == "union" or r_core.kind == "union":
        return _union(arr, w_core, r_core, path, target)
    return _value(arr, w_core, r_core, path, target)


def _value(arr: pa.Array, w: AvroType, r: AvroType, path: str, target: pa.DataType) -> pa.Array:
    if not _matches(w, r):
        raise SchemaError(
            f"{path}: the writer's {w.name or w.kind} does not resolve to the reader's {r.name or r.kind}"
        )
    if r.kind == "record":
        return _record(arr, w, r, path, target)
    if r.kind == "enum":
        return _enum(arr, r, path)
    if r.kind == "fixed" and w.size != r.size:
        raise SchemaError(f"{path}: fixed of {w.size} bytes in the writer, {r.size} in the reader")
    if r.kind == "array":
        assert w.items is not None and r.items is not None
        values = resolve(arr.values, w.items, r.items, f"{path}[]")
        return pa.ListArray.from_arrays(arr.offsets, values, type=target, mask=_mask(arr))
    if r.kind == "map":
        assert w.items is not None and r.items is not None
        items = resolve(arr.items, w.items, r.items, f"{path}{{}}")
        return pa.MapArray.from_arrays(arr.offsets, arr.keys, items, type=target, mask=_mask(arr))
    if arr.type == target:
        return arr
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaError(f"{path}: the writer's {arr.type} does not convert to the reader's {target}: {e}") from e


def _record(arr: pa.Array, w: AvroType, r: AvroType, path: str, target: pa.StructType) -> pa.Array:
    by_name = {f.name: i for i, f in enumerate(w.fields)}
    children = []
    for rf in r.fields:
        wi = next((by_name[n] for n in (rf.name, *rf.aliases) if n in by_name), None)
        sub = f"{path}.{rf.name}" if path else rf.name
        if wi is not None:
            children.append(resolve(arr.field(wi), w.fields[wi].type, rf.type, sub))
        elif rf.default is NO_DEFAULT:
            raise SchemaError(
                f"field {sub!r} of the reader schema {r.name} is not in the writer schema {w.name} and has no default: "
                "give it a default in the reader schema (Avro's schema resolution needs one)"
            )
        else:
            children.append(default_array(rf.default, rf.type, len(arr), sub))
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_mask(arr))


def _enum(arr: pa.Array, r: AvroType, path: str) -> pa.Array:
    known = pc.is_in(arr, value_set=pa.array(r.symbols, pa.string()))
    unknown = pc.and_(pc.invert(known), arr.is_valid())
    if not pc.any(unknown).as_py():
        return arr
    if r.enum_default is None:
        i = int(np.flatnonzero(unknown.to_numpy(zero_copy_only=False))[0])
        raise PayloadError(
            i,
            f"{path}: enum symbol {arr[i].as_py()!r} is not one of the reader's {r.name} symbols, which has no default",
        )
    return pc.if_else(unknown, pa.scalar(r.enum_default, pa.string()), arr)


def _union(arr: pa.Array, w: AvroType, r: AvroType, path: str, target: pa.DataType) -> pa.Array:
    """Unions as Spark types them: a struct of member0, member1, ... over the non-null branches."""
    w_members = [(b, arr.field(i)) for i, b in enumerate(w.non_null)] if w.kind == "union" else [(w, arr)]
    r_branches = r.non_null if r.kind == "union" else (r,)
    outs: list[pa.Array | None] = [None] * len(r_branches)
    for wb, values in w_members:
        j = next((j for j, rb in enumerate(r_branches) if _matches(wb, rb)), None)
        if j is None:
            if values.null_count < len(values):
                i = int(np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))[0])
                raise PayloadError(
                    i, f"{path}: the writer's {wb.name or wb.kind} matches no branch of the reader's union"
                )
            continue
        field_t = target.field(j).type if r.kind == "union" and len(r_branches) > 1 else target
        got = resolve(values, wb, r_branches[j], path)
        got = got.cast(field_t) if got.type != field_t else got
        prev = outs[j]
        outs[j] = got if prev is None else pc.coalesce(prev, got)
    n = len(arr)
    if not (r.kind == "union" and len(r_branches) > 1):
        vals = [o for o in outs if o is not None]
        return vals[0] if vals else pa.nulls(n, target)
    members = [o if o is not None else pa.nulls(n, target.field(j).type) for j, o in enumerate(outs)]
    return pa.StructArray.from_arrays(members, fields=list(target), mask=_mask(arr))


def _mask(arr: pa.Array) -> pa.Array | None:
    return pc.is_null(arr) if arr.null_count else None


def default_value(value: Any, t: AvroType) -> Any:
    """A field default's JSON value as the Python value of arrow_type(t) (bytes and fixed defaults are strings of
    code points 0-255, per the spec; a union's default is its first branch's)."""
    k = t.kind
    if value is None:
        return None
    if k == "union":
        first = t.branches[0]
        if len(t.non_null) > 1:
            idx = t.non_null.index(first)
            return {f"member{idx}": default_value(value, first)}
        return default_value(value, first)
    if k in ("bytes", "fixed"):
        raw = value.encode("latin-1")
        if t.logical == "decimal":
            return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-t.scale)
        return raw
    if k == "long" and t.logical in ("timestamp-millis", "local-timestamp-millis"):
        return np.datetime64(int(value), "ms")
    if k == "long" and t.logical in ("timestamp-micros", "local-timestamp-micros"):
        return np.datetime64(int(value), "us")
    if k == "int" and t.logical == "date":
        return np.datetime64(int(value), "D").astype(object)
    if k == "record":
        return {f.name: default_value(value.get(f.name, f.default), f.type) for f in t.fields}
    if k == "array":
        assert t.items is not None
        return [default_value(v, t.items) for v in value]
    if k == "map":
        assert t.items is not None
        return [(key, default_value(v, t.items)) for key, v in value.items()]
    return value


def default_array(value: Any, t: AvroType, n: int, path: str) -> pa.Array:
    target = arrow_type(t)[0]
    try:
        scalar = pa.scalar(default_value(value, t), target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise SchemaError(f"field {path!r}: its default {value!r} is not a value of its type: {e}") from e
    return pa.repeat(scalar, n)
