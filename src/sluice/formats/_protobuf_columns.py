"""Parsed Protobuf messages -> Arrow columns, one field at a time over all messages.

Each field's values come out of the upb runtime in one C-level pass (`map(attrgetter(name), messages)`), straight
into `pa.array`; presence likewise (`HasField`); repeated fields and maps are flattened with itertools into one
values array and offsets. Python runs per field, not per record and field.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, methodcaller
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._protobuf_types import (
    TYPE_ENUM,
    TYPE_GROUP,
    TYPE_MESSAGE,
    UINT64,
    WRAPPERS,
    field_arrow,
    is_map,
)

_LEN = len


def _offsets(containers: list[Any]) -> pa.Array:
    lengths = np.fromiter(map(_LEN, containers), dtype=np.int32, count=len(containers))
    offsets = np.zeros(len(containers) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.array(offsets)


def _absent(messages: list[Any], name: str) -> np.ndarray:
    has = np.fromiter(map(methodcaller("HasField", name), messages), dtype=bool, count=len(messages))
    return ~has


def message_columns(messages: list[Any], descriptor: Any, mask: np.ndarray | None = None) -> pa.StructArray:
    """A struct array of `messages` (all of `descriptor`'s type); `mask` marks rows that are null."""
    arrow_mask = pa.array(mask) if mask is not None and mask.any() else None
    fields = [field_arrow(f) for f in descriptor.fields]
    children = [field_column(messages, f, a.type) for f, a in zip(descriptor.fields, fields, strict=True)]
    if not fields:
        return pa.array([{}] * len(messages), pa.struct([]), mask=mask)
    return pa.StructArray.from_arrays(children, fields=fields, mask=arrow_mask)


def field_column(messages: list[Any], field: Any, arrow_type: pa.DataType) -> pa.Array:
    getter = attrgetter(field.name)
    if is_map(field):
        maps = list(map(getter, messages))
        offsets = _offsets(maps)
        entry = field.message_type
        items = list(chain.from_iterable(map(methodcaller("items"), maps)))
        keys = [k for k, _ in items]
        values = [v for _, v in items]
        key_array = values_column(keys, entry.fields_by_name["key"], arrow_type.key_type)
        value_array = values_column(values, entry.fields_by_name["value"], arrow_type.item_type)
        return pa.MapArray.from_arrays(offsets, key_array, value_array, type=arrow_type)
    if field.is_repeated:
        lists = list(map(getter, messages))
        offsets = _offsets(lists)
        flat = list(chain.from_iterable(lists))
        return pa.ListArray.from_arrays(offsets, values_column(flat, field, arrow_type.value_type), type=arrow_type)
    values = list(map(getter, messages))
    mask = _absent(messages, field.name) if field.has_presence else None
    return values_column(values, field, arrow_type, mask)


def values_column(values: list[Any], field: Any, arrow_type: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """Values of one field (singular values, or a repeated field's elements) as an array of `arrow_type`."""
    if field.type in (TYPE_MESSAGE, TYPE_GROUP):
        full_name = field.message_type.full_name
        if full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
            seconds = np.fromiter(map(attrgetter("seconds"), values), dtype=np.int64, count=len(values))
            nanos = np.fromiter(map(attrgetter("nanos"), values), dtype=np.int64, count=len(values))
            return pa.array(seconds * 1_000_000 + nanos // 1000, arrow_type, mask=mask)
        if full_name in WRAPPERS:
            inner = field.message_type.fields_by_name["value"]
            return values_column(list(map(attrgetter("value"), values)), inner, arrow_type, mask)
        return message_columns(values, field.message_type, mask)
    if field.type == TYPE_ENUM:
        return _enum_names(values, field.enum_type, mask)
    if arrow_type == UINT64:
        return pa.array(np.array(values, dtype=np.uint64), mask=mask).cast(UINT64)
    return pa.array(values, arrow_type, mask=mask)


def _enum_names(numbers: list[int], enum: Any, mask: np.ndarray | None) -> pa.Array:
    """Enum numbers -> their names, in bulk; a number the schema does not name (written by a newer schema: proto3
    enums are open) keeps its number as text."""
    values = pa.array(numbers, pa.int32())
    known = pa.array([v.number for v in enum.values], pa.int32())
    names = pa.array([v.name for v in enum.values], pa.string())
    positions = pc.index_in(values, value_set=known)
    out = pc.take(names, positions)
    if out.null_count:
        out = pc.coalesce(out, values.cast(pa.string()))
    if mask is not None:
        out = pc.if_else(pa.array(mask), pa.scalar(None, pa.string()), out)
    return out
