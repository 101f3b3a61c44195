"""Whether a DataFrame's columns fit a writer schema, checked on the driver before any task runs: every field of the
schema has a column of a type that converts to it without loss (a narrower integer or float, a decimal of the same
scale and less precision, string for string, a decimal to text and a date to int32 days for Protobuf); a column
the schema lacks would be dropped, and is refused too."""

from __future__ import annotations

import pyarrow as pa

from sluice.connector import OptionError

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_FLOATS = (pa.float32(), pa.float64())


def _widens(have: pa.DataType, want: pa.DataType) -> bool:
    for ladder in (_INTS, _FLOATS):
        if have in ladder and want in ladder:
            return ladder.index(have) <= ladder.index(want)
    if pa.types.is_integer(have) and pa.types.is_floating(want):
        return have.bit_width < 32 or (want == pa.float64() and have.bit_width <= 32)
    return False


def _misfit(have: pa.DataType, want: pa.DataType, path: str) -> str | None:
    """Why a column of type `have` does not fit `want`, naming the nested field; None when it fits."""
    if have == want or _widens(have, want):
        return None
    texts = (pa.string(), pa.large_string())
    blobs = (pa.binary(), pa.large_binary())
    if (have in texts and want in texts) or (have in blobs and want in blobs):
        return None
    # Protobuf has no decimal or date: the schema derived from a DataFrame holds them as text and as int32 days since
    # 1970-01-01 (ProtobufFormat.schema_from_arrow), both lossless casts.
    if pa.types.is_decimal(have) and want in texts:
        return None
    if have == pa.date32() and want == pa.int32():
        return None
    if pa.types.is_decimal(have) and pa.types.is_decimal(want):
        if have.scale == want.scale and have.precision <= want.precision:
            return None
        return f"'{path}' is {have}, the schema's is {want} (the scale must be the same, the precision at most)"
    if pa.types.is_timestamp(have) and pa.types.is_timestamp(want):
        if (have.tz is None) == (want.tz is None):
            return None
        kind = "timestamp_ntz (local)" if have.tz is None else "timestamp (an instant)"
        return f"'{path}' is a {kind}; the schema's field is {'an instant' if want.tz else 'a local timestamp'}"
    if pa.types.is_struct(have) and pa.types.is_struct(want):
        return struct_misfit(have, want, path)
    if (pa.types.is_list(have) or pa.types.is_large_list(have)) and \
            (pa.types.is_list(want) or pa.types.is_large_list(want)):
        return _misfit(have.value_type, want.value_type, f"{path}[]")
    if pa.types.is_map(have) and pa.types.is_map(want):
        return _misfit(have.key_type, want.key_type, f"{path}{{key}}") or \
            _misfit(have.item_type, want.item_type, f"{path}{{value}}")
    return f"'{path}' is {have}, which does not convert to the schema's {want}"


def struct_misfit(have: pa.StructType, want: pa.StructType, path: str = "") -> str | None:
    names = {have.field(i).name for i in range(have.num_fields)}
    wanted = {want.field(i).name for i in range(want.num_fields)}
    prefix = f"{path}." if path else ""
    missing = [f"{prefix}{want.field(i).name}" for i in range(want.num_fields) if want.field(i).name not in names]
    if missing:
        return f"column(s) {missing} of the schema are not in the DataFrame"
    extra = [f"{prefix}{have.field(i).name}" for i in range(have.num_fields) if have.field(i).name not in wanted]
    if extra:
        return f"column(s) {extra} are not in the schema (they would be dropped)"
    for i in range(want.num_fields):
        field = want.field(i)
        why = _misfit(have.field(field.name).type, field.type, f"{prefix}{field.name}")
        if why:
            return why
    return None


def check_fit(have: pa.StructType, want: pa.StructType, side: str, subject: str | None) -> None:
    """Refuse, before any task runs, a DataFrame side whose columns do not fit the writer schema's type."""
    why = struct_misfit(have, want)
    if why:
        raise OptionError(
            f"the DataFrame does not fit the {side}'s writer schema (subject {subject}): {why}. Select and cast the "
            f"columns to the schema's, or write with another schema ({side}.schema, {side}.auto-register=true).")


def conform_struct(rows: pa.StructArray, want: pa.StructType) -> pa.StructArray:
    """`rows` (which fit `want`: check_fit) as `want`: fields in the schema's order, types converted."""
    if rows.type == want:
        return rows
    children = [rows.field(want.field(i).name).cast(want.field(i).type) for i in range(want.num_fields)]
    return pa.StructArray.from_arrays(children, fields=list(want), mask=rows.is_null() if rows.null_count else None)
