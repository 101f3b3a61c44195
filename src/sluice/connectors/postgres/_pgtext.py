"""PostgreSQL's text output form of a value (what pgoutput sends, DateStyle ISO, TimeZone UTC) as Arrow: a whole
column in one pyarrow cast where the type allows; arrays and bytea value by value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connectors.postgres._client import PostgresError


class UntypedValueError(PostgresError):
    """A changed value that does not convert to its column's type (a record the change reader cannot type)."""

# +-infinity of dates and timestamps read as the last and first instant Spark holds, as the batch reader (and
# Spark's JDBC reader) read them.
_INFINITY = {"date": ("9999-12-31", "0001-01-01"), "timestamp": ("9999-12-31 23:59:59.999999", "0001-01-01 00:00:00")}


def text_to_arrow(raw: pa.Array, pg_type: str, target: pa.DataType, column: str) -> pa.Array:
    """A column of PostgreSQL text output values (an Arrow string array) as `target` (the batch reader's type)."""
    try:
        if pa.types.is_string(target) or pa.types.is_large_string(target):
            if pg_type == "character" or pg_type.startswith("character("):  # char(n): as its ::text, unpadded
                raw = pc.utf8_rtrim(raw, characters=" ")
            return raw.cast(target)
        if pa.types.is_boolean(target):
            return pc.equal(raw, "t")
        if pa.types.is_binary(target):  # bytea in hex output: \x0102...
            return pa.array([None if v is None else bytes.fromhex(v[2:]) for v in raw.to_pylist()], target)
        if pa.types.is_list(target):
            items = [None if v is None else _parse_array(v) for v in raw.to_pylist()]
            offsets = np.cumsum([0] + [0 if v is None else len(v) for v in items], dtype=np.int32)
            flat = pa.array([x for v in items if v is not None for x in v], pa.string())
            values = text_to_arrow(flat, pg_type.removesuffix("[]"), target.value_type, column)
            return pa.ListArray.from_arrays(pa.array(offsets), values, type=target,
                                            mask=pa.array([v is None for v in items]))
        if pa.types.is_date(target) or pa.types.is_timestamp(target):
            last, first = _INFINITY["date" if pa.types.is_date(target) else "timestamp"]
            if getattr(target, "tz", None):
                last, first = f"{last}+00", f"{first}+00"
            raw = pc.if_else(pc.equal(raw, "infinity"), last, pc.if_else(pc.equal(raw, "-infinity"), first, raw))
            return raw.cast(target)
        if pa.types.is_floating(target) or pa.types.is_integer(target) or pa.types.is_decimal(target):
            return raw.cast(target)
    except (pa.ArrowInvalid, ValueError) as e:
        hint = " (numeric NaN and +-Infinity have no Spark decimal)" if pa.types.is_decimal(target) else ""
        raise UntypedValueError(f"column '{column}' ({pg_type}): a changed value does not convert to "
                                f"{target}: {e}{hint}") from None
    raise PostgresError(f"column '{column}' ({pg_type}) has no conversion to {target} in the change reader")


def type_columns(texts: dict[str, pa.Array], pg_types: dict[str, str], schema: pa.Schema
                 ) -> tuple[dict[str, pa.Array], dict[int, tuple[str, UntypedValueError]]]:
    """Each column of text values typed as `schema` says, and the rows holding a value that does not convert:
    {row: (column, error)}, the first such column of each row. With such rows, the columns are typed without
    them (rows in their order, the untyped ones left out)."""
    typed: dict[str, pa.Array] = {}
    bad: dict[int, tuple[str, UntypedValueError]] = {}
    for name, raw in texts.items():
        pg_type, target = pg_types.get(name, "text"), schema.field(name).type
        try:
            typed[name] = text_to_arrow(raw, pg_type, target, name)
        except UntypedValueError:
            # Rare: find the values at fault one by one, so only their rows are refused.
            for row, value in enumerate(raw.to_pylist()):
                if value is None or row in bad:
                    continue
                try:
                    text_to_arrow(pa.array([value], raw.type), pg_type, target, name)
                except UntypedValueError as e:
                    bad[row] = (name, e)
    if bad:
        keep = pa.array(np.isin(np.arange(len(next(iter(texts.values())))), list(bad), invert=True))
        typed = {name: text_to_arrow(raw.filter(keep), pg_types.get(name, "text"), schema.field(name).type, name)
                 for name, raw in texts.items()}
    return typed, bad


def _parse_array(text: str) -> list[str | None]:
    """A one-dimensional PostgreSQL array literal of simple values ({1,2,NULL}, {"a b",c})."""
    inner = text[text.index("{") + 1:text.rindex("}")]
    items: list[str | None] = []
    pos = 0
    while pos < len(inner):
        if inner[pos] == '"':
            end = pos + 1
            buf = []
            while inner[end] != '"':
                if inner[end] == "\\":
                    end += 1
                buf.append(inner[end])
                end += 1
            items.append("".join(buf))
            pos = end + 2
        else:
            end = inner.find(",", pos)
            end = len(inner) if end < 0 else end
            token = inner[pos:end]
            items.append(None if token == "NULL" else token)
            pos = end + 1
    return items
