"""JSON Schema <-> Arrow types: the reader type of a registered JSON Schema, and a draft-7 schema for an Arrow struct.

The mapping (JSON Schema Validation, section 7.3 for `format`): integer -> int64, number -> double, boolean -> bool,
string -> string (format date-time -> timestamp[us, UTC], date -> date32), array -> list, object with properties ->
struct. A property is nullable when it is not `required`, or when its type admits null (`"type": [T, "null"]`, or
`oneOf`/`anyOf` of null and T, as Confluent's generated schemas write it). Local `$ref`s (`#/definitions/...`,
`#/$defs/...`) are followed. What has no Arrow column type (an object without properties, a union of two non-null
types) is refused with the property's path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa

from sluice._errors import SluiceError

TIMESTAMP = pa.timestamp("us", tz="UTC")
_SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}
_FORMATS = {"date-time": TIMESTAMP, "date": pa.date32()}


class JsonSchemaError(SluiceError):
    """A JSON Schema text sluice cannot map to columns (names the property's path)."""


@dataclass(frozen=True)
class ParsedJsonSchema:
    """A registered JSON Schema, parsed once per text: the document and the Arrow type of its records."""

    document: dict[str, Any]
    arrow_type: pa.StructType


@lru_cache(maxsize=256)
def parse_json_schema(text: str) -> ParsedJsonSchema:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonSchemaError(f"the registered JSON Schema is not JSON: {e}") from None
    if not isinstance(document, dict):
        raise JsonSchemaError("the registered JSON Schema is not an object")
    arrow_type, _ = _arrow_type(document, document, "$")
    if not pa.types.is_struct(arrow_type):
        raise JsonSchemaError(f"the registered JSON Schema describes {arrow_type}, not an object with properties: a "
                              "record must be an object")
    return ParsedJsonSchema(document, arrow_type)


def resolve(schema: Any, root: dict[str, Any], path: str) -> dict[str, Any]:
    """Follow local `$ref`s (JSON Pointer into the same document)."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise JsonSchemaError(f"{path}: $ref {ref!r} is not local to the schema (only '#/...' references are "
                                  "followed)")
        target: Any = root
        for part in (p for p in ref[1:].split("/") if p):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise JsonSchemaError(f"{path}: $ref {ref!r} names nothing in the schema")
            target = target[part]
        schema = target
        seen += 1
        if seen > 64:
            raise JsonSchemaError(f"{path}: $ref {ref!r} is recursive; a recursive type has no column type")
    if schema is True or schema == {}:
        raise JsonSchemaError(f"{path}: the schema admits any value; give it a type")
    if not isinstance(schema, dict):
        raise JsonSchemaError(f"{path}: {schema!r} is not a schema object")
    return schema


def _arrow_type(schema: Any, root: dict[str, Any], path: str, depth: int = 0) -> tuple[pa.DataType, bool]:
    """(type, admits null) of one subschema."""
    if depth > 32:
        raise JsonSchemaError(f"{path}: nested more than 32 deep (a recursive $ref?); a recursive type has no column "
                              "type")
    schema = resolve(schema, root, path)
    for key in ("oneOf", "anyOf"):
        if key in schema:
            branches = [resolve(b, root, f"{path}.{key}") for b in schema[key]]
            others = [b for b in branches if b.get("type") != "null"]
            if len(others) != 1:
                raise JsonSchemaError(f"{path}: {key} of {len(others)} non-null schemas has no single column type "
                                      "(only a union of null and one type maps to a nullable column)")
            inner, _ = _arrow_type(others[0], root, path, depth + 1)
            return inner, len(others) < len(branches)
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _arrow_type(schema["allOf"][0], root, path, depth + 1)
    kind = schema.get("type")
    nullable = False
    if isinstance(kind, list):
        nullable = "null" in kind
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise JsonSchemaError(f"{path}: type {kind!r} has no single column type (only [T, 'null'] does)")
        kind = kinds[0]
    if kind is None:
        if "properties" in schema:
            kind = "object"
        elif "items" in schema:
            kind = "array"
        elif "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
            kind = "string"
        else:
            raise JsonSchemaError(f"{path}: no 'type'; give the property a type")
    if kind in _SCALARS:
        if kind == "string" and schema.get("format") in _FORMATS:
            return _FORMATS[schema["format"]], nullable
        return _SCALARS[kind], nullable
    if kind == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            raise JsonSchemaError(f"{path}: an array needs one 'items' schema (tuples have no column type)")
        element, element_null = _arrow_type(items, root, f"{path}[]", depth + 1)
        return pa.list_(pa.field("item", element, nullable=element_null)), nullable
    if kind == "object":
        properties = schema.get("properties")
        if not properties:
            raise JsonSchemaError(f"{path}: an object without 'properties' has no column type")
        required = set(schema.get("required", ()))
        fields = []
        for name, sub in properties.items():
            child, child_null = _arrow_type(sub, root, f"{path}.{name}", depth + 1)
            fields.append(pa.field(name, child, nullable=child_null or name not in required))
        return pa.struct(fields), nullable
    raise JsonSchemaError(f"{path}: type {kind!r} has no column type")


def json_schema_for(arrow_type: pa.StructType, name: str) -> str:
    """A draft-7 JSON Schema for rows of `arrow_type`: every column a property, required unless nullable, nullable
    ones as [T, "null"]. Decimals are numbers (JSON numbers as Flink's JSON writes them; a decimal of more than 15
    digits is not exact as a double, so it is refused: cast it to string first)."""
    document: dict[str, Any] = {"$schema": "http://json-schema.org/draft-07/schema#", "title": name}
    document.update(_schema_of(pa.field(name, arrow_type, nullable=False), name))
    return json.dumps(document, separators=(",", ":"))


def _schema_of(field: pa.Field, path: str) -> dict[str, Any]:
    t = field.type
    out: dict[str, Any]
    if pa.types.is_struct(t):
        out = {"type": "object", "properties": {f.name: _schema_of(f, f"{path}.{f.name}") for f in t},
               "required": [f.name for f in t if not f.nullable], "additionalProperties": False}
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        out = {"type": "array", "items": _schema_of(t.value_field, f"{path}[]")}
    elif pa.types.is_map(t):
        # An object of free keys has no column type on the read side (pyarrow's JSON reader reads no maps).
        raise JsonSchemaError(f"column {path!r}: a map has no JSON Schema sluice reads back; make it a list of "
                              "key/value structs (map_entries)")
    elif pa.types.is_boolean(t):
        out = {"type": "boolean"}
    elif pa.types.is_integer(t):
        out = {"type": "integer"}
    elif pa.types.is_floating(t):
        out = {"type": "number"}
    elif pa.types.is_decimal(t):
        if t.precision > 15:
            raise JsonSchemaError(f"column {path!r}: {t} has more digits than a JSON number keeps exactly (15); cast "
                                  "it to string to keep it exact")
        out = {"type": "number"}
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        out = {"type": "string"}
    elif pa.types.is_timestamp(t):
        out = {"type": "string", "format": "date-time"}
    elif pa.types.is_date(t):
        out = {"type": "string", "format": "date"}
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        out = {"type": "string", "contentEncoding": "base64"}
    else:
        raise JsonSchemaError(f"column {path!r}: {t} has no JSON Schema type")
    if field.nullable:
        out["type"] = [out["type"], "null"]
    return out
