"""JSON Schema payloads (Confluent's JSON Schema serializer: the body is the record as UTF-8 JSON text), in bulk.

Decode: the bodies joined by newlines are one newline-delimited JSON document, read by pyarrow's JSON reader
(rapidjson, multithreaded) with the reader schema's Arrow type as its explicit schema: no Python per record. JSON
text's whitespace may hold raw newlines (a newline inside a string must be escaped, RFC 8259 section 7), so they
become spaces first and a body stays one line. Evolution is JSON's own: properties are read by name, a property the
record lacks is null, one the reader does not know is ignored; a required property that is missing, or a value of
the wrong type, refuses the record. The failing body is found only on the error path, by bisection.

Encode: polars writes a batch's rows as compact JSON objects (vectorized); the rows are checked against the schema
at the Arrow level first (columns, types, required and non-null properties), and jsonschema-rs validates each row
only when the schema has constraints beyond those (minimum, pattern, enum, ...).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from sluice.formats._codec import PayloadError, RegisteredSchema
from sluice.formats._json_schema_check import check_rows, has_constraints
from sluice.formats._json_schema_types import TIMESTAMP, json_schema_for, parse_json_schema

__all__ = ["JsonSchemaFormat"]

_BLOCK = 4 << 20  # pyarrow's JSON reader parses blocks in parallel; fewer, larger chunks are cheaper to combine


def _readable(t: pa.DataType, dates: bool = False) -> pa.DataType:
    """The type pyarrow's JSON reader reads into (it parses no dates: they are read as strings and cast after), all
    nullable (a required property's nulls are found after, by row)."""
    if pa.types.is_date(t) and not dates:
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_readable(f.type, dates)).with_nullable(True) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_readable(t.value_type, dates)).with_nullable(True))
    return t


class JsonSchemaFormat:
    """The JSON Schema format (the registry's schemaType JSON). Holds nothing but parse caches: pickles to tasks."""

    def reader_type(self, reader: RegisteredSchema) -> pa.StructType:
        return parse_json_schema(reader.text).arrow_type

    def decode(self, bodies: pa.BinaryArray, writer: RegisteredSchema, reader: RegisteredSchema) -> pa.StructArray:
        final = self.reader_type(reader)
        read_schema = pa.schema(list(_readable(final)))
        valid = bodies.is_valid()
        has_nulls = bodies.null_count > 0
        lines = bodies.fill_null(b"{}") if has_nulls else bodies
        try:
            table = _read(lines, read_schema)
            if table.num_rows != len(bodies):
                raise pa.ArrowInvalid(f"{table.num_rows} JSON values in {len(bodies)} bodies")
            struct = pa.StructArray.from_arrays(
                [c.combine_chunks() for c in table.columns], fields=list(read_schema))
            struct = struct.cast(_readable(final, dates=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            index, reason = _first_bad(lines, read_schema, final)
            raise PayloadError(index, f"not a JSON record of the reader schema: {reason}") from None
        out = _retag(pa.StructArray.from_arrays(struct.flatten(), fields=list(_readable(final, dates=True)),
                                                mask=pc.invert(valid) if has_nulls else None), final)
        missing = _first_missing(out)
        if missing is not None:
            raise PayloadError(missing[0], "a required property is missing or null", column=missing[1])
        return out

    def schema_from_arrow(self, arrow_type: pa.StructType, name: str) -> str:
        return json_schema_for(arrow_type, name)

    def encode(self, rows: pa.StructArray, writer: RegisteredSchema) -> pa.BinaryArray:
        parsed = parse_json_schema(writer.text)
        check_rows(rows, parsed.document)
        bodies = _json_bodies(rows)
        if has_constraints(parsed.document):
            _validate_each(bodies, writer.text)
        return bodies


def _joined(bodies: pa.BinaryArray) -> pa.Buffer:
    """The bodies as one newline-delimited document. Raw newlines and carriage returns inside a body can only be
    JSON whitespace (RFC 8259 section 7: strings escape them), so they become spaces and every body stays one line;
    the scan for them is one numpy pass over the data buffer, the rewrite happens only when there are some."""
    data = bodies.buffers()[2]
    # One comparison pass: bytes up to 13 are tab, newline, carriage return or controls JSON does not allow raw.
    if data is not None and (np.frombuffer(data, dtype=np.uint8) <= 13).any():
        bodies = pc.replace_substring(pc.replace_substring(bodies, b"\n", b" "), b"\r", b" ")
    joined = pc.binary_join_element_wise(bodies, pa.scalar(b"", pa.binary()), b"\n")
    _, offsets, data = joined.buffers()
    if not len(joined) or data is None:
        return pa.py_buffer(b"")
    ends = np.frombuffer(offsets, dtype=np.int32)
    return data.slice(int(ends[joined.offset]), int(ends[joined.offset + len(joined)] - ends[joined.offset]))


def _read(lines: pa.BinaryArray, schema: pa.Schema) -> pa.Table:
    document = _joined(lines)
    longest = pc.max(pc.binary_length(lines)).as_py() or 0
    # A line never straddles blocks: a block holds the longest body (pyarrow refuses a straddling object).
    options = pj.ReadOptions(block_size=max(_BLOCK, 2 * longest + 2))
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(pa.BufferReader(document), read_options=options, parse_options=parse)


def _first_bad(lines: pa.Array, schema: pa.Schema, final: pa.StructType) -> tuple[int, str]:
    """The error path: bisect to the first body the reader refuses (each body on its own is read the same way)."""
    lo, hi = 0, len(lines)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fails(lines[lo:mid], schema, final) is not None:
            hi = mid
        else:
            lo = mid
    return lo, _fails(lines[lo:hi], schema, final) or "unreadable"


def _fails(lines: pa.Array, schema: pa.Schema, final: pa.StructType) -> str | None:
    try:
        table = _read(lines, schema)
        if table.num_rows != len(lines):
            return f"{table.num_rows} JSON values where one object was expected"
        table.cast(pa.schema(list(_readable(final, dates=True))))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        return str(e)
    return None


def _retag(array: pa.Array, t: pa.DataType) -> pa.Array:
    """`array` as type `t`, which differs only in fields' nullability (a cast would refuse a non-nullable child's
    nulls under a null parent, which Arrow's layout allows)."""
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays([_retag(c, f.type) for c, f in zip(array.flatten(), t, strict=True)],
                                          fields=list(t), mask=mask)
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(array.offsets, _retag(array.values, t.value_type), type=t, mask=mask)
    return array


def _first_missing(array: pa.Array, path: str = "") -> tuple[int, str] | None:
    """The first row whose non-nullable (required) property is null, through structs and lists."""
    if not pa.types.is_struct(array.type):
        return None
    found: list[tuple[int, str]] = []
    for field, child in zip(array.type, array.flatten(), strict=True):
        name = f"{path}{field.name}"
        if not field.nullable and child.null_count:
            nulls = pc.and_(child.is_null(), array.is_valid())
            first = pc.index(nulls, True).as_py()
            if first >= 0:
                found.append((first, name))
        inner = _first_missing(child, f"{name}.")
        if inner is not None:
            found.append(inner)
        if pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type):
            inner = _first_missing(child.flatten(), f"{name}[].")
            if inner is not None:
                parents = pc.list_parent_indices(child)
                found.append((parents[inner[0]].as_py(), inner[1]))
    return min(found) if found else None


def _json_bodies(rows: pa.StructArray) -> pa.BinaryArray:
    """One compact JSON object per row (polars, vectorized): timestamps as RFC 3339 in UTC, binary as base64."""
    import polars as pl

    columns = []
    for field, column in zip(rows.type, rows.flatten(), strict=True):
        if pa.types.is_timestamp(field.type):
            column = column.cast(pa.timestamp("us", tz=field.type.tz)).cast(TIMESTAMP)
        columns.append(column)
    frame = pl.from_arrow(pa.table(columns, names=[f.name for f in rows.type]))
    assert isinstance(frame, pl.DataFrame)
    binary = [name for name, dtype in frame.schema.items() if dtype == pl.Binary]
    if binary:
        frame = frame.with_columns([pl.col(name).bin.encode("base64") for name in binary])
    narrow = [name for name, dtype in frame.schema.items() if isinstance(dtype, pl.Decimal)]
    if narrow:
        frame = frame.with_columns([pl.col(name).cast(pl.Float64) for name in narrow])
    encoded = frame.select(pl.struct(pl.all()).struct.json_encode().cast(pl.Binary).alias("j"))["j"].to_arrow()
    encoded = encoded.cast(pa.binary())
    if rows.null_count:  # a null row is a null value (a tombstone), not an object of nulls
        encoded = pc.if_else(rows.is_valid(), encoded, pa.scalar(None, pa.binary()))
    return encoded


@lru_cache(maxsize=64)
def _validator(text: str) -> Any:
    import jsonschema_rs

    return jsonschema_rs.validator_for(json.loads(text))


def _validate_each(bodies: pa.BinaryArray, text: str) -> None:
    """Per-row validation, only for schemas with constraints the Arrow-level check does not cover."""
    validator = _validator(text)
    for index, body in enumerate(bodies.to_pylist()):
        if body is None:
            continue
        for error in validator.iter_errors(json.loads(body)):
            path = [str(p) for p in error.instance_path]
            raise PayloadError(index, f"does not validate against the registered JSON Schema: {error.message}",
                               column=".".join(path) or None)
