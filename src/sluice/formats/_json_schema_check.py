"""Rows against a JSON Schema at the Arrow level, in bulk: the columns a record needs, their types, and null where the
schema admits none. What this cannot see (minimum, pattern, enum, ...) is jsonschema-rs's, per row, and only when
the schema has such keywords (`has_constraints`)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._codec import PayloadError
from sluice.formats._json_schema_types import resolve

# Keywords the Arrow-level check covers, or annotations that constrain nothing.
_STRUCTURAL = frozenset({
    "$schema", "$id", "id", "$ref", "$comment", "title", "description", "default", "examples", "type", "properties",
    "required", "items", "format", "definitions", "$defs", "oneOf", "anyOf", "allOf", "additionalProperties",
    "contentEncoding", "contentMediaType", "readOnly", "writeOnly", "deprecated",
})


def has_constraints(schema: Any) -> bool:
    """Whether the schema says more than the Arrow-level check covers (then each row is validated)."""
    if isinstance(schema, list):
        return any(has_constraints(s) for s in schema)
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in ("properties", "definitions", "$defs"):
            if any(has_constraints(s) for s in value.values()):
                return True
        elif key == "additionalProperties":
            if value is not False and value is not True:
                return True
        elif key in ("items", "oneOf", "anyOf", "allOf"):
            if has_constraints(value):
                return True
        elif key not in _STRUCTURAL and not key.startswith(("connect.", "x-")):
            return True
    return False


def check_rows(rows: pa.StructArray, document: dict[str, Any]) -> None:
    _check_object(rows, document, document, "", rows.is_valid())


def _first(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def _types(schema: dict[str, Any], root: dict[str, Any], path: str) -> tuple[set[str], dict[str, Any]]:
    """The JSON types a subschema admits (with "null"), and the branch that says the non-null one."""
    for key in ("oneOf", "anyOf"):
        if key in schema:
            kinds: set[str] = set()
            chosen = schema
            for branch in schema[key]:
                branch_kinds, branch_schema = _types(resolve(branch, root, path), root, path)
                kinds |= branch_kinds
                if branch_kinds - {"null"}:
                    chosen = branch_schema
            return kinds, chosen
    kind = schema.get("type")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind is None:
        return {"any"}, schema
    return ({kind} if isinstance(kind, str) else set(kind)), schema


def _fits(t: pa.DataType, kinds: set[str]) -> bool:
    if "any" in kinds:
        return True
    if pa.types.is_integer(t):
        return bool(kinds & {"integer", "number"})
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number" in kinds
    if pa.types.is_boolean(t):
        return "boolean" in kinds
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return "string" in kinds
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "array" in kinds
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "object" in kinds
    return False


def _check_object(rows: pa.StructArray, schema: Any, root: dict[str, Any], path: str, valid: pa.Array) -> None:
    schema = resolve(schema, root, path or "$")
    properties: dict[str, Any] = schema.get("properties", {})
    names = [f.name for f in rows.type]
    if not pc.any(valid).as_py():
        return
    first_row = _first(valid)
    for name in schema.get("required", ()):
        if name not in names:
            raise PayloadError(first_row, "the schema requires this property and the rows have no such column",
                               column=f"{path}{name}")
    children = rows.flatten()  # respects a slice's offset (StructArray.field does not)
    for i, field in enumerate(rows.type):
        column_name = f"{path}{field.name}"
        if field.name not in properties:
            if schema.get("additionalProperties") is False:
                raise PayloadError(first_row, "not a property of the schema (its additionalProperties is false); "
                                   "drop the column or register a schema that has it", column=column_name)
            continue
        sub = resolve(properties[field.name], root, column_name)
        kinds, chosen = _types(sub, root, column_name)
        column = children[i]
        present = pc.and_(valid, column.is_valid())
        if column.null_count and "null" not in kinds and "any" not in kinds:
            nulls = pc.and_(valid, column.is_null())
            if pc.any(nulls).as_py():
                raise PayloadError(_first(nulls), "null, and the schema's property admits no null (give it type "
                                   "[T, \"null\"], or fill the column)", column=column_name)
        if not _fits(field.type, kinds):
            if pc.any(present).as_py():
                raise PayloadError(_first(present), f"a {field.type} value does not fit the schema's type "
                                   f"{sorted(kinds)}", column=column_name)
            continue
        if pa.types.is_struct(field.type):
            _check_object(column, chosen, root, f"{column_name}.", present)
        elif (pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type)
              and isinstance(chosen.get("items"), dict)):
            parents = pc.list_parent_indices(column)
            try:
                values = column.flatten()
                _check_object(values, chosen["items"], root, f"{column_name}[].", values.is_valid())
            except PayloadError as e:
                raise PayloadError(parents[e.index].as_py(), e.reason, column=e.column) from None
