"""What each Arrow chunk must pass before any of it is buffered: values ClickHouse would refuse, or worse, take
silently (an Int8 of 300 wraps to 44; a NULL for a non-Nullable column becomes 0), found with vectorized
compute and refused as a `RecordError` naming the column, the first row's sorting key, every row of the chunk
that fails the check (`rows`: with errors.tolerance=all those go aside and the rest is written) and what to do."""

from __future__ import annotations

import decimal
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import RecordError
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
_WHAT_TO_DO = "errors.tolerance=all sends such rows aside and writes the rest"


def _as_int(column: pa.Array, base: str) -> pa.Array:
    if base in _DATES:
        return column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if base in _TIMES and pa.types.is_timestamp(column.type):
        return pc.divide(column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64()), 1_000_000)
    if pa.types.is_decimal(column.type):
        return column  # compared exactly; ClickHouse refuses a fraction or an overflow itself
    if pa.types.is_floating(column.type):
        return pc.floor(column)
    if pa.types.is_boolean(column.type):
        return column.cast(pa.int8())
    return column.cast(pa.int64()) if not pa.types.is_unsigned_integer(column.type) else column


def _beyond(values: pa.Array, bound: int, high: bool) -> pa.Array | None:
    """Where `values` pass `bound` (above it when `high`, else below), compared exactly; None when no value of the
    type can (the bound lies outside the type's own range)."""
    if pa.types.is_floating(values.type):
        near = float(bound)  # the nearest float: a value past the bound is past or at it, by rounding's direction
        if high:
            return pc.greater_equal(values, near) if near > bound else pc.greater(values, near)
        return pc.less_equal(values, near) if near < bound else pc.less(values, near)
    try:
        scalar = pa.scalar(decimal.Decimal(bound) if pa.types.is_decimal(values.type) else bound, values.type)
    except (pa.ArrowInvalid, OverflowError, decimal.InvalidOperation):
        return None
    return pc.greater(values, scalar) if high else pc.less(values, scalar)


def _outside(values: pa.Array, bounds: tuple[int, int]) -> pa.Array | None:
    sides = [m for m in (_beyond(values, bounds[0], False), _beyond(values, bounds[1], True)) if m is not None]
    if not sides:
        return None
    return sides[0] if len(sides) == 1 else pc.or_(sides[0], sides[1])


def _flattened(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A list or map column's values and the row of each (from the offsets: list_parent_indices does not take
    maps, and a sliced column's .values / .items hold the values of rows outside the slice too)."""
    offsets = np.asarray(column.offsets, dtype=np.int64)
    child = column.values if isinstance(column, pa.ListArray | pa.LargeListArray) and \
        not isinstance(column, pa.MapArray) else column.items
    values = child.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return values, np.repeat(np.arange(len(column), dtype=np.int64), np.diff(offsets))


def _rows_of(mask: np.ndarray, parents: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    out[parents[mask]] = True
    return out


def _bools(mask: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _nested_null(column: pa.Array, kind: CHType) -> tuple[str, np.ndarray] | None:
    """Where a NULL sits inside an Array, Map or Tuple whose elements are not Nullable, and the rows holding one
    (a boolean per row of `column`); None if nowhere."""
    base = kind.base
    n = len(column)
    if base.name in ("Array", "Map"):
        values, parents = _flattened(column)
        element = base.children[0] if base.name == "Array" else base.children[1]
        what = f"an element (the array's type is {base})" if base.name == "Array" else \
            f"a map value (the map's type is {base})"
        if values.null_count and not element.nullable:
            return what, _rows_of(_bools(pc.is_null(values)), parents, n)
        found = _nested_null(values, element)
        return None if found is None else (found[0], _rows_of(found[1], parents, n))
    if base.name == "Tuple":
        names = list(base.fields) or [f"_{i + 1}" for i in range(len(base.children))]
        for field in column.type:
            child = column.field(field.name)
            element = base.children[names.index(field.name)]
            if child.null_count > column.null_count and not element.nullable:
                mask = pc.and_(pc.is_null(child), pc.is_valid(column))
                return f"field '{field.name}' (the tuple's type is {base})", _bools(mask)
            found = _nested_null(child, element)
            if found:
                return found
    return None


def _refuse(message: str, mask: np.ndarray) -> None:
    raise RecordError(message, rows=np.flatnonzero(mask).tolist())


def check_chunk(batch: pa.RecordBatch, types: dict[str, CHType], table: str, row_key: Callable[[int], str],
                optional: frozenset[str] = frozenset(), deletes: pa.Array | None = None) -> None:
    """Refuse the rows of a chunk with a value their column cannot hold (RecordError with their positions).
    `deletes` (a boolean mask) marks delete rows, whose columns in `optional` may be NULL (ClickHouse stores their
    defaults: only the key and version matter)."""
    kept = None if deletes is None else ~_bools(deletes)
    for name, kind in types.items():
        if name not in batch.schema.names:
            continue
        column = batch.column(name)
        may_skip = kept is not None and name in optional  # a delete row's optional column holds anything
        if column.null_count and not kind.nullable:
            missing = _bools(pc.is_null(column))
            if may_skip:
                missing &= kept
            if missing.any():
                first = int(np.argmax(missing))
                _refuse(f"column '{name}' is not Nullable in {table} ({kind}), but {int(missing.sum())} row(s) have "
                        f"no value for it ({row_key(first)}). Those rows were not sent: fill or filter them, or make "
                        f"the column Nullable ({_WHAT_TO_DO}).", missing)
        nested = _nested_null(column, kind) if kind.base.name in ("Array", "Map", "Tuple") else None
        if nested is not None:
            where, rows = nested
            if may_skip:
                rows &= kept
            if rows.any():
                _refuse(f"column '{name}' of {table} holds a NULL in {where}, which is not Nullable "
                        f"({row_key(int(np.argmax(rows)))}; {int(rows.sum())} row(s)). Those rows were not sent: "
                        f"drop or replace those NULLs, or make the element Nullable ({_WHAT_TO_DO}).", rows)
        base = kind.base.name
        if kind.base.enum_names and column.null_count < len(column):
            unknown = pc.fill_null(pc.invert(pc.is_in(column, value_set=pa.array(kind.base.enum_names))), False)
            if pc.any(unknown).as_py():
                mask = _bools(unknown)
                row = int(np.argmax(mask))
                _refuse(f"value {column[row].as_py()!r} of column '{name}' is not one of its {base}'s names "
                        f"{list(kind.base.enum_names)} ({row_key(row)}; {int(mask.sum())} row(s)). Those rows were "
                        "not sent: map them to a name, or add the name to the enum (ALTER TABLE ... MODIFY COLUMN) "
                        f"({_WHAT_TO_DO}).", mask)
        bounds = _BOUNDS.get(base)
        if bounds is None or column.null_count == len(column) or not len(column):
            continue
        values = _as_int(column, base)
        low, high = pc.min_max(values).values()
        if low.as_py() < bounds[0] or high.as_py() > bounds[1]:
            outside = _outside(values, bounds)
            mask = _bools(outside) if outside is not None else np.zeros(len(column), dtype=bool)
            row = int(np.argmax(mask))
            _refuse(f"value {column[row].as_py()} of column '{name}' is outside the range of its ClickHouse type "
                    f"{kind} ({row_key(row)}; {int(mask.sum())} row(s)). Those rows were not sent: fix or filter "
                    f"them, or widen the column ({_WHAT_TO_DO}).", mask)
