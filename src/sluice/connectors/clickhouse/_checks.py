"""What each Arrow chunk must pass before any of it is buffered: values ClickHouse would refuse, or worse, take
silently (an Int8 of 300 wraps to 44; a NULL for a non-Nullable column becomes 0), found with vectorized
compute and reported naming the column, the row's sorting key and what to do."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import OptionError
from sluice.connectors.clickhouse._types import SIGNED, UNSIGNED, CHType

_BOUNDS: dict[str, tuple[int, int]] = {
    **{name: (int(np.iinfo(f"int{bits}").min), int(np.iinfo(f"int{bits}").max)) for name, bits in SIGNED.items()},
    **{name: (0, int(np.iinfo(f"uint{bits}").max)) for name, bits in UNSIGNED.items()},
    "Int128": (-(2**127), 2**127 - 1), "Int256": (-(2**255), 2**255 - 1),
    "UInt128": (0, 2**128 - 1), "UInt256": (0, 2**256 - 1),
    "Date": (0, 65535),  # days since 1970-01-01 (up to 2149-06-06)
    "Date32": (-25567, 120529),  # 1900-01-01 .. 2299-12-31
    "DateTime": (0, 2**32 - 1),  # seconds since 1970-01-01 UTC (up to 2106-02-07)
    "DateTime64": (-2208988800, 10413791999),  # 1900-01-01 00:00:00 .. 2299-12-31 23:59:59 UTC
}
_DATES = ("Date", "Date32")
_TIMES = ("DateTime", "DateTime64")


def _as_int(column: pa.Array, base: str) -> pa.Array:
    if base in _DATES:
        return column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if base in _TIMES and pa.types.is_timestamp(column.type):
        return pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()), 1_000_000)
    if pa.types.is_decimal(column.type):
        return column  # min/max compare exactly; ClickHouse refuses a fraction or an overflow itself
    if pa.types.is_floating(column.type):
        return pc.floor(column)
    if pa.types.is_boolean(column.type):
        return column.cast(pa.int8())
    return column.cast(pa.int64()) if not pa.types.is_unsigned_integer(column.type) else column


def _nested_null(column: pa.Array, kind: CHType) -> str | None:
    """Where a NULL sits inside an Array, Map or Tuple whose elements are not Nullable (None if nowhere)."""
    base = kind.base
    if base.name == "Array":
        values = pc.list_flatten(column)
        element = base.children[0]
        if values.null_count and not element.nullable:
            return f"an element (the array's type is {base})"
        return _nested_null(values, element)
    if base.name == "Map":
        values = column.items
        if values.null_count and not base.children[1].nullable:
            return f"a map value (the map's type is {base})"
        return _nested_null(values, base.children[1])
    if base.name == "Tuple":
        names = list(base.fields) or [f"_{i + 1}" for i in range(len(base.children))]
        for field in column.type:
            child = column.field(field.name)
            element = base.children[names.index(field.name)]
            if child.null_count > column.null_count and not element.nullable:
                return f"field '{field.name}' (the tuple's type is {base})"
            found = _nested_null(child, element)
            if found:
                return found
    return None


def check_chunk(batch: pa.RecordBatch, types: dict[str, CHType], table: str, row_key: Callable[[int], str],
                optional: frozenset[str] = frozenset(), deletes: pa.Array | None = None) -> None:
    """Refuse a chunk with a value its column cannot hold. `deletes` (a boolean mask) marks delete rows, whose
    columns in `optional` may be NULL (ClickHouse stores their defaults: only the key and version matter)."""
    for name, kind in types.items():
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        if column.null_count and not kind.nullable:
            missing = pc.is_null(column)
            if deletes is not None and name in optional:
                missing = pc.and_(missing, pc.invert(deletes))
            count = pc.sum(missing).as_py()
            if count:
                raise OptionError(f"column '{name}' is not Nullable in {table} ({kind}), but {count} row(s) have "
                                  f"no value for it ({row_key(pc.index(missing, True).as_py())}). Nothing of this "
                                  "chunk was sent: fill or filter them, or make the column Nullable.")
        written = column.filter(pc.invert(deletes)) if deletes is not None and name in optional else column
        nested = _nested_null(written, kind) if kind.base.name in ("Array", "Map", "Tuple") else None
        if nested:
            raise OptionError(f"column '{name}' of {table} holds a NULL in {nested}, which is not Nullable. Nothing "
                              "of this chunk was sent: drop or replace those NULLs, or make the element Nullable.")
        base = kind.base.name
        if kind.base.enum_names and column.null_count < len(column):
            unknown = pc.invert(pc.is_in(column, value_set=pa.array(kind.base.enum_names)))
            if pc.any(pc.fill_null(unknown, False)).as_py():
                row = pc.index(pc.fill_null(unknown, False), True).as_py()
                raise OptionError(f"value {column[row].as_py()!r} of column '{name}' is not one of its {base}'s "
                                  f"names {list(kind.base.enum_names)} ({row_key(row)}). Nothing of this chunk was "
                                  "sent: map it to a name, or add the name to the enum (ALTER TABLE ... MODIFY "
                                  "COLUMN).")
        bounds = _BOUNDS.get(base)
        if bounds is None or column.null_count == len(column) or not len(column):
            continue
        values = _as_int(column, base)
        low, high = pc.min_max(values).values()
        if low.as_py() < bounds[0] or high.as_py() > bounds[1]:
            approx = values.cast(pa.float64())  # only to point at a row: uint64 bounds do not fit int64
            outside = pc.or_(pc.less(approx, float(bounds[0])), pc.greater(approx, float(bounds[1])))
            row = max(0, pc.index(outside, True).as_py())
            raise OptionError(f"value {column[row].as_py()} of column '{name}' is outside the range of its "
                              f"ClickHouse type {kind} ({row_key(row)}). Nothing of this chunk was sent: fix or "
                              "filter those rows, or widen the column.")
