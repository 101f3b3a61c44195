"""Protobuf messages <-> Arrow types: the columns of a message, and a proto3 .proto text for an Arrow struct.

Mapping (Spark has no unsigned types): int32/sint32/sfixed32 -> int32; int64/sint64/sfixed64 -> int64; uint32/fixed32
-> int64; uint64/fixed64 -> decimal(20, 0) (as Spark's from_protobuf with upcast.unsigned.ints); bool, float,
double, string, bytes -> themselves; an enum -> its value's name as a string; a message -> a struct (null when
unset); repeated -> a list, map<K, V> -> a map (neither is ever null: Protobuf has no null list); a field with
presence (proto3 `optional`, a oneof member, proto2 optional) -> nullable, the others are never null (Protobuf's
defaults). Well-known types: google.protobuf.Timestamp -> timestamp[us, UTC], Duration -> duration[us], the wrappers
(StringValue, Int64Value, ...) -> their nullable value. A recursive message has no column type and is refused.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sluice.formats._protobuf_descriptors import ProtobufSchemaError

TIMESTAMP = pa.timestamp("us", tz="UTC")
UINT64 = pa.decimal128(20, 0)
WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(), "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(), "google.protobuf.UInt64Value": UINT64,
    "google.protobuf.Int32Value": pa.int32(), "google.protobuf.UInt32Value": pa.int64(),
    "google.protobuf.BoolValue": pa.bool_(), "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
WELL_KNOWN = {"google.protobuf.Timestamp": TIMESTAMP, "google.protobuf.Duration": pa.duration("us"), **WRAPPERS}

# FieldDescriptor.TYPE_* numbers (descriptor.proto's FieldDescriptorProto.Type).
TYPE_DOUBLE, TYPE_FLOAT, TYPE_INT64, TYPE_UINT64, TYPE_INT32, TYPE_FIXED64, TYPE_FIXED32, TYPE_BOOL = range(1, 9)
TYPE_STRING, TYPE_GROUP, TYPE_MESSAGE, TYPE_BYTES, TYPE_UINT32, TYPE_ENUM = range(9, 15)
TYPE_SFIXED32, TYPE_SFIXED64, TYPE_SINT32, TYPE_SINT64 = range(15, 19)
SCALARS = {
    TYPE_DOUBLE: pa.float64(), TYPE_FLOAT: pa.float32(), TYPE_INT64: pa.int64(), TYPE_UINT64: UINT64,
    TYPE_INT32: pa.int32(), TYPE_FIXED64: UINT64, TYPE_FIXED32: pa.int64(), TYPE_BOOL: pa.bool_(),
    TYPE_STRING: pa.string(), TYPE_BYTES: pa.binary(), TYPE_UINT32: pa.int64(), TYPE_ENUM: pa.string(),
    TYPE_SFIXED32: pa.int32(), TYPE_SFIXED64: pa.int64(), TYPE_SINT32: pa.int32(), TYPE_SINT64: pa.int64(),
}


def is_map(field: Any) -> bool:
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def value_type(field: Any, seen: tuple[str, ...]) -> pa.DataType:
    """The Arrow type of one value of the field (an element, for a repeated field)."""
    if field.type in (TYPE_MESSAGE, TYPE_GROUP):
        return message_type(field.message_type, seen, field.full_name)
    return SCALARS[field.type]


def field_arrow(field: Any, seen: tuple[str, ...] = ()) -> pa.Field:
    if is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return pa.field(field.name, pa.map_(value_type(key, seen), value_type(value, seen)), nullable=False)
    if field.is_repeated:
        return pa.field(field.name, pa.list_(pa.field("item", value_type(field, seen), nullable=False)),
                        nullable=False)
    return pa.field(field.name, value_type(field, seen), nullable=bool(field.has_presence))


def message_type(message: Any, seen: tuple[str, ...] = (), where: str = "") -> pa.DataType:
    if message.full_name in WELL_KNOWN:
        return WELL_KNOWN[message.full_name]
    if message.full_name in seen:
        raise ProtobufSchemaError(f"field {where!r}: message {message.full_name} contains itself; a recursive "
                                  "message has no column type")
    inner = (*seen, message.full_name)
    return pa.struct([field_arrow(f, inner) for f in message.fields])


# -- a .proto for an Arrow struct ---------------------------------------------------------------------------------

_PROTO_SCALARS = [
    (pa.types.is_boolean, "bool"), (pa.types.is_int8, "int32"), (pa.types.is_int16, "int32"),
    (pa.types.is_int32, "int32"), (pa.types.is_int64, "int64"), (pa.types.is_uint8, "uint32"),
    (pa.types.is_uint16, "uint32"), (pa.types.is_uint32, "uint32"), (pa.types.is_uint64, "uint64"),
    (pa.types.is_float32, "float"), (pa.types.is_float64, "double"), (pa.types.is_string, "string"),
    (pa.types.is_large_string, "string"), (pa.types.is_binary, "bytes"), (pa.types.is_large_binary, "bytes"),
    (pa.types.is_decimal, "string"), (pa.types.is_date32, "int32"),
]


_SCALAR_NAMES = frozenset(proto for _, proto in _PROTO_SCALARS)


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Value"


def _identifier(name: str, path: str) -> str:
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
        raise ProtobufSchemaError(f"column {path!r}: {name!r} is not a Protobuf field name (letters, digits, _); "
                                  "rename it")
    return name


def proto_for(arrow_type: pa.StructType, name: str) -> str:
    """A proto3 file with one message for rows of `arrow_type`. Nullable scalars are `optional`; structs are nested
    messages; lists are repeated (a list of lists is refused); maps are map<K, V> (keys integral or string);
    timestamps are google.protobuf.Timestamp; decimals are strings (exact; Protobuf has no decimal); dates are int32
    days since 1970-01-01."""
    imports: set[str] = set()
    body = _message(arrow_type, _identifier(name, name), name, imports, "")
    head = ['syntax = "proto3";', ""]
    head += [f'import "{i}";' for i in sorted(imports)]
    return "\n".join([*head, "", body, ""]) if imports else "\n".join([*head, body, ""])


def _message(t: pa.StructType, name: str, path: str, imports: set[str], indent: str) -> str:
    lines = [f"{indent}message {name} {{"]
    nested: list[str] = []
    for number, field in enumerate(t, start=1):
        fname = _identifier(field.name, f"{path}.{field.name}")
        ft = field.type
        if pa.types.is_list(ft) or pa.types.is_large_list(ft):
            element = _type_name(ft.value_type, f"{path}.{fname}", _camel(fname), imports, nested, indent)
            lines.append(f"{indent}  repeated {element} {fname} = {number};")
        elif pa.types.is_map(ft):
            key = _type_name(ft.key_type, f"{path}.{fname}", "", imports, nested, indent)
            if key not in _SCALAR_NAMES or key in ("float", "double", "bytes") or pa.types.is_decimal(ft.key_type):
                raise ProtobufSchemaError(f"column {path}.{fname!r}: a map key of {ft.key_type} has no Protobuf "
                                          "map key type (integers, bool, string)")
            value = _type_name(ft.item_type, f"{path}.{fname}", _camel(fname) + "Value", imports, nested, indent)
            lines.append(f"{indent}  map<{key}, {value}> {fname} = {number};")
        else:
            type_name = _type_name(ft, f"{path}.{fname}", _camel(fname), imports, nested, indent)
            scalar = type_name in _SCALAR_NAMES
            lines.append(f"{indent}  {'optional ' if scalar and field.nullable else ''}{type_name} {fname} = "
                         f"{number};")
    return "\n".join([lines[0], *nested, *lines[1:], f"{indent}}}"])


def _type_name(t: pa.DataType, path: str, nested_name: str, imports: set[str], nested: list[str],
               indent: str) -> str:
    for check, proto in _PROTO_SCALARS:
        if check(t):
            return proto
    if pa.types.is_timestamp(t):
        imports.add("google/protobuf/timestamp.proto")
        return "google.protobuf.Timestamp"
    if pa.types.is_struct(t):
        nested.append(_message(t, nested_name, path, imports, indent + "  "))
        return nested_name
    raise ProtobufSchemaError(f"column {path!r}: {t} has no Protobuf type here (a list of lists or of maps needs a "
                              "message between them)")
