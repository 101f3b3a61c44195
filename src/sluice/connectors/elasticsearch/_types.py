"""Spark types as search-engine mappings, and Arrow columns as the JSON a bulk request carries.

Timestamps become ISO-8601 text with microseconds (`date_nanos` keeps them; `date` would round to milliseconds),
dates `yyyy-MM-dd`, decimals of up to 15 digits doubles (exact: 15 digits survive a double), binary base64
(`binary`), structs objects, arrays arrays of their element's type (every field of a search engine may hold several
values). Maps have no mapping of their own and are refused.
"""

from __future__ import annotations

import base64

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from sluice.connector import OptionError

MAX_DECIMAL_DIGITS = 15


def field_mapping(name: str, data_type: T.DataType, text_columns: frozenset[str]) -> dict:
    """The mapping of one field (`name` is its dotted path, for text_columns and errors)."""
    if isinstance(data_type, T.StringType):
        return {"type": "text"} if name in text_columns else {"type": "keyword"}
    simple = {T.LongType: "long", T.IntegerType: "integer", T.ShortType: "short", T.ByteType: "byte",
              T.DoubleType: "double", T.FloatType: "float", T.BooleanType: "boolean", T.BinaryType: "binary",
              T.DateType: "date", T.TimestampType: "date_nanos", T.TimestampNTZType: "date_nanos"}
    for spark, mapped in simple.items():
        if isinstance(data_type, spark):
            return {"type": mapped}
    if isinstance(data_type, T.DecimalType):
        check_decimal(name, data_type)
        return {"type": "double"}
    if isinstance(data_type, T.ArrayType):
        return field_mapping(name, data_type.elementType, text_columns)
    if isinstance(data_type, T.StructType):
        return {"properties": {f.name: field_mapping(f"{name}.{f.name}", f.dataType, text_columns)
                               for f in data_type.fields}}
    raise OptionError(f"column '{name}' is {data_type.simpleString()}, which has no search-engine mapping sluice "
                      "writes (maps: use a struct, or to_json() into a string column).")


def check_decimal(name: str, data_type: T.DecimalType) -> None:
    if data_type.precision > MAX_DECIMAL_DIGITS:
        raise OptionError(f"column '{name}' is {data_type.simpleString()}: search engines keep numbers as doubles, "
                          f"exact to {MAX_DECIMAL_DIGITS} digits. Cast it to decimal({MAX_DECIMAL_DIGITS},s) or "
                          "less, or to a string.")


def mapping(schema: T.StructType, text_columns: frozenset[str]) -> dict:
    return {"properties": {f.name: field_mapping(f.name, f.dataType, text_columns) for f in schema.fields}}


def _needs_conversion(data_type: pa.DataType) -> bool:
    if pa.types.is_struct(data_type):
        return any(_needs_conversion(data_type.field(i).type) for i in range(data_type.num_fields))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _needs_conversion(data_type.value_type)
    return (pa.types.is_timestamp(data_type) or pa.types.is_date(data_type) or pa.types.is_decimal(data_type)
            or pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type))


def _validity(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def json_column(array: pa.Array) -> pa.Array:
    """`array` with every value in a form json.dumps writes as the search engine reads it."""
    data_type = array.type
    if not _needs_conversion(data_type):
        return array
    if pa.types.is_timestamp(data_type):
        utc = array.cast(pa.timestamp("us", "UTC")) if data_type.tz else array.cast(pa.timestamp("us"))
        return pc.strftime(utc, format="%Y-%m-%dT%H:%M:%SZ" if data_type.tz else "%Y-%m-%dT%H:%M:%S")
    if pa.types.is_date(data_type):
        return array.cast(pa.string())
    if pa.types.is_decimal(data_type):
        return array.cast(pa.float64())
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return pa.array([None if v is None else base64.b64encode(v).decode() for v in array.to_pylist()],
                        pa.string())
    if pa.types.is_struct(data_type):
        children = [json_column(array.field(i)) for i in range(data_type.num_fields)]
        names = [data_type.field(i).name for i in range(data_type.num_fields)]
        return pa.StructArray.from_arrays(children, names, mask=_validity(array))
    # A list: its values converted; offsets index the unsliced values, so they stay valid.
    return pa.ListArray.from_arrays(array.offsets, json_column(array.values), mask=_validity(array))


def json_rows(batch: pa.RecordBatch, columns: list[str]) -> list[dict]:
    """The rows of `columns` as dicts of JSON-ready values (conversion in Arrow, one to_pylist)."""
    table = pa.RecordBatch.from_arrays([json_column(batch.column(c)) for c in columns], names=columns)
    return table.to_pylist()
