"""Avro types as Spark reads them, in Arrow (Spark's SchemaConverters.toSqlType), and the Avro schema Spark's to_avro
would derive from an Arrow struct (SchemaConverters.toAvroType), with [null, T] unions defaulting to null so that a
later schema version can add or drop the field under a registry's BACKWARD rule."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from sluice.formats._avro_schema import AvroType, SchemaError

TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")
TIMESTAMP_LOCAL = pa.timestamp("us")


def arrow_type(t: AvroType) -> tuple[pa.DataType, bool]:
    """(Arrow type, nullable) of an Avro type, as Spark's from_avro types it: enum and uuid -> string, fixed ->
    binary, time-millis/micros -> int/long (Spark's SchemaConverters gives them no time type), timestamps in
    microseconds (UTC for timestamp-*, none for local-timestamp-*), [null, T] -> nullable T, other unions -> a
    struct of member0, member1, ..."""
    k, lt = t.kind, t.logical
    if k == "null":
        return pa.null(), True
    if k == "boolean":
        return pa.bool_(), False
    if k == "int":
        return (pa.date32() if lt == "date" else pa.int32()), False
    if k == "long":
        if lt in ("timestamp-millis", "timestamp-micros"):
            return TIMESTAMP_UTC, False
        if lt in ("local-timestamp-millis", "local-timestamp-micros"):
            return TIMESTAMP_LOCAL, False
        return pa.int64(), False
    if k == "float":
        return pa.float32(), False
    if k == "double":
        return pa.float64(), False
    if k in ("bytes", "fixed"):
        if lt == "decimal" and 0 < t.precision <= 38:
            return pa.decimal128(t.precision, t.scale), False
        return pa.binary(), False
    if k in ("string", "enum"):
        return pa.string(), False
    if k == "record":
        return pa.struct([pa.field(f.name, *arrow_type(f.type)) for f in t.fields]), False
    if k == "array":
        assert t.items is not None
        return pa.list_(pa.field("element", *arrow_type(t.items))), False
    if k == "map":
        assert t.items is not None
        vt, vn = arrow_type(t.items)
        return pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", vt, nullable=vn)), False
    if k == "union":
        rest = t.non_null
        nullable = t.null_index is not None
        if len(rest) == 1:
            return arrow_type(rest[0])[0], nullable
        kinds = {b.kind for b in rest if b.logical is None}
        if len(rest) == 2 and kinds == {"int", "long"}:
            return pa.int64(), nullable
        if len(rest) == 2 and kinds == {"float", "double"}:
            return pa.float64(), nullable
        return pa.struct([pa.field(f"member{i}", arrow_type(b)[0]) for i, b in enumerate(rest)]), nullable
    raise SchemaError(f"unsupported Avro type {k!r}")


def record_type(t: AvroType) -> pa.StructType:
    if t.kind != "record":
        raise SchemaError(f"the schema's top level is {t.kind!r}: sluice reads and writes Avro records")
    st = arrow_type(t)[0]
    assert isinstance(st, pa.StructType)
    return st


def schema_from_arrow(arrow: pa.StructType, name: str) -> str:
    """An Avro record schema for rows of `arrow`: nested structs become records named after their path (unique)."""
    namespace, _, short = name.rpartition(".")
    return json.dumps(_record(arrow, short or "topLevelRecord", namespace))


def _record(st: pa.StructType, name: str, namespace: str) -> dict[str, Any]:
    inner = f"{namespace}.{name}" if namespace else name
    fields = []
    for f in st:
        t = _avro(f.type, f.name, inner)
        if f.nullable and t != "null":
            fields.append({"name": f.name, "type": ["null", t], "default": None})
        else:
            fields.append({"name": f.name, "type": t})
    out: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
    if namespace:
        out["namespace"] = namespace
    return out


def _avro(t: pa.DataType, name: str, namespace: str) -> Any:
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t):
        return "long"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(t):
        lt = "timestamp-micros" if t.tz is not None else "local-timestamp-micros"
        return {"type": "long", "logicalType": lt}
    if pa.types.is_decimal(t):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if pa.types.is_struct(t):
        return _record(t, name, namespace)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        items = _avro(t.value_type, name, namespace)
        return {"type": "array", "items": ["null", items] if t.value_field.nullable else items}
    if pa.types.is_map(t):
        if not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)):
            raise SchemaError(f"column {name!r}: Avro maps have string keys, not {t.key_type}")
        values = _avro(t.item_type, name, namespace)
        return {"type": "map", "values": ["null", values] if t.item_field.nullable else values}
    raise SchemaError(f"column {name!r}: no Avro type for Arrow's {t}")
