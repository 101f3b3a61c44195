"""Arrow rows -> values the upb runtime's message constructors take, converted at the Arrow level in bulk.

upb's constructors take dicts for messages, lists for repeated fields, (key, value) pairs for maps, enum names,
datetimes for google.protobuf.Timestamp and timedeltas for Duration, and None for an unset field; what Arrow's
`to_pylist` yields differs only where the column's type differs from the field's (a decimal into a string field, a
date into an int32, a value into a wrapper message), and that is cast here, column by column. A null where Protobuf
has no null (a field without presence, a list element, a map value) refuses the row, by index and column.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._codec import PayloadError
from sluice.formats._protobuf_types import (
    TYPE_BYTES,
    TYPE_DOUBLE,
    TYPE_ENUM,
    TYPE_FLOAT,
    TYPE_GROUP,
    TYPE_MESSAGE,
    TYPE_STRING,
    WRAPPERS,
    is_map,
)

_INTEGERS = (3, 4, 5, 6, 7, 13, 15, 16, 17, 18)  # int64, uint64, int32, fixed64, fixed32, uint32, sfixed*, sint*
_UNSIGNED64 = (4, 6)


def _first(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def prepare_struct(rows: pa.StructArray, message: Any, path: str) -> pa.StructArray:
    """`rows` (a struct array) as the constructor's keyword arguments for `message`."""
    fields = message.fields_by_name
    children, names = [], []
    for field, column in zip(rows.type, rows.flatten(), strict=True):
        column_path = f"{path}{field.name}"
        if field.name not in fields:
            valid = rows.is_valid()
            raise PayloadError(_first(valid) if pc.any(valid).as_py() else 0,
                               f"message {message.full_name} has no field {field.name!r}; drop the column or register "
                               "a schema that has it", column=column_path)
        children.append(_prepare(column, fields[field.name], column_path, rows.is_valid()))
        names.append(field.name)
    return pa.StructArray.from_arrays(children, names=names, mask=rows.is_null() if rows.null_count else None)


def _refuse_nulls(column: pa.Array, valid: pa.Array, path: str, what: str) -> None:
    if column.null_count:
        nulls = pc.and_(column.is_null(), valid)
        if pc.any(nulls).as_py():
            raise PayloadError(_first(nulls), f"null, and {what}", column=path)


def _prepare(column: pa.Array, field: Any, path: str, valid: pa.Array) -> pa.Array:
    """One column for one field; `valid` marks the rows that exist (a null parent's children are not checked)."""
    t = column.type
    if is_map(field):
        if not pa.types.is_map(t):
            raise PayloadError(0, f"a {t} column does not fit map field {field.name!r}", column=path)
        entry = field.message_type
        keys, items = column.keys, column.items
        _refuse_nulls(items, pc.is_valid(items), f"{path}{{}}", "a Protobuf map value cannot be null")
        return pa.MapArray.from_arrays(
            column.offsets, _prepare_values(keys, entry.fields_by_name["key"], path),
            _prepare_values(items, entry.fields_by_name["value"], path),
            mask=column.is_null() if column.null_count else None)
    if field.is_repeated:
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise PayloadError(0, f"a {t} column does not fit repeated field {field.name!r}", column=path)
        values = column.flatten()
        if values.null_count:
            parents = pc.list_parent_indices(column)
            first = _first(values.is_null())
            raise PayloadError(parents[first].as_py(), "a null list element, and Protobuf's repeated fields hold "
                               "no null", column=path)
        prepared = _prepare_values(values, field, path)
        offsets = pc.subtract(column.offsets, column.offsets[0]) if len(column) else column.offsets
        return pa.ListArray.from_arrays(offsets, prepared, mask=column.is_null() if column.null_count else None)
    if not field.has_presence:
        _refuse_nulls(column, valid, path, f"field {field.name!r} has no presence in the schema (Protobuf would "
                      "write its default); declare it `optional` or fill the column")
    return _prepare_values(column, field, path)


def _seconds_nanos(column: pa.Array) -> pa.StructArray:
    """Microseconds as Timestamp's and Duration's {seconds, nanos}, in bulk (upb's datetime conversion is Python)."""
    micros = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    seconds, rest = np.divmod(micros, 1_000_000)
    return pa.StructArray.from_arrays([pa.array(seconds), pa.array((rest * 1000).astype(np.int32))],
                                      names=["seconds", "nanos"], mask=column.is_null() if column.null_count else None)


def _prepare_values(column: pa.Array, field: Any, path: str) -> pa.Array:
    t = column.type
    kind = field.type
    if kind in (TYPE_MESSAGE, TYPE_GROUP):
        full_name = field.message_type.full_name
        if full_name == "google.protobuf.Timestamp":
            if pa.types.is_timestamp(t) or pa.types.is_date(t):
                return _seconds_nanos(column.cast(pa.timestamp("us", tz="UTC")))
        elif full_name == "google.protobuf.Duration":
            if pa.types.is_duration(t):
                return _seconds_nanos(column.cast(pa.duration("us")))
        elif full_name in WRAPPERS:
            inner = _prepare_values(column, field.message_type.fields_by_name["value"], path)
            return pa.StructArray.from_arrays([inner], names=["value"],
                                              mask=column.is_null() if column.null_count else None)
        elif pa.types.is_struct(t):
            return prepare_struct(column, field.message_type, f"{path}.")
        raise PayloadError(0, f"a {t} column does not fit message field {field.name!r} ({full_name})", column=path)
    if kind == TYPE_STRING and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        if pa.types.is_decimal(t) or pa.types.is_date(t) or pa.types.is_timestamp(t):
            return column.cast(pa.string())
    elif kind == TYPE_BYTES and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return column.cast(pa.binary())
    elif kind in _INTEGERS:
        if pa.types.is_decimal(t):
            return column.cast(pa.uint64() if kind in _UNSIGNED64 else pa.int64())
        if pa.types.is_date32(t):
            return column.cast(pa.int32())
    elif kind in (TYPE_DOUBLE, TYPE_FLOAT) and pa.types.is_decimal(t):
        return column.cast(pa.float64())
    elif kind == TYPE_ENUM:
        return column
    return column


def _message_maps(message: Any, seen: tuple[str, ...] = ()) -> bool:
    """Whether rows of `message` hold a map with message values anywhere (upb takes (key, value) pairs only for
    maps of scalars: those need dicts)."""
    if message.full_name in seen:
        return False
    for field in message.fields:
        if field.message_type is None:
            continue
        if is_map(field):
            value = field.message_type.fields_by_name["value"]
            if value.message_type is not None:
                return True
        elif _message_maps(field.message_type, (*seen, message.full_name)):
            return True
    return False


def map_fixer(message: Any) -> Any:
    """A function that turns a row's maps of messages into dicts, in place, or None when the message has none."""
    if not _message_maps(message):
        return None
    plans = []
    for field in message.fields:
        if field.message_type is None or field.message_type.full_name in WRAPPERS:
            continue
        if is_map(field):
            value = field.message_type.fields_by_name["value"]
            inner = map_fixer(value.message_type) if value.message_type is not None else None
            plans.append((field.name, "map", inner))
        else:
            inner = map_fixer(field.message_type)
            if inner is not None:
                plans.append((field.name, "list" if field.is_repeated else "one", inner))

    def fix(row: dict[str, Any]) -> dict[str, Any]:
        for name, kind, inner in plans:
            value = row.get(name)
            if value is None:
                continue
            if kind == "map":
                row[name] = {k: (inner(v) if inner is not None and v is not None else v) for k, v in value}
            elif kind == "list":
                row[name] = [inner(v) for v in value]
            else:
                row[name] = inner(value)
        return row

    return fix
