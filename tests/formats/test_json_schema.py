"""The JSON Schema payload format: bulk decode and encode against json.loads and jsonschema-rs as the references."""

from __future__ import annotations

import datetime as dt
import json

import jsonschema_rs
import pyarrow as pa
import pytest

from sluice.formats._codec import PayloadError, RegisteredSchema
from sluice.formats._json_schema import JsonSchemaFormat
from sluice.formats._json_schema_types import JsonSchemaError

FORMAT = JsonSchemaFormat()
UTC = dt.UTC

ROW_TYPE = pa.struct([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("name", pa.string()),
    pa.field("score", pa.float64()),
    pa.field("ok", pa.bool_()),
    pa.field("at", pa.timestamp("us", tz="UTC")),
    pa.field("day", pa.date32()),
    pa.field("tags", pa.list_(pa.string())),
    pa.field("inner", pa.struct([pa.field("x", pa.int64(), nullable=False), pa.field("y", pa.string())])),
    pa.field("items", pa.list_(pa.struct([pa.field("k", pa.string(), nullable=False)]))),
])
ROWS = [
    {"id": 1, "name": "a\nb \"q\" é", "score": 1.5, "ok": True, "at": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, UTC),
     "day": dt.date(2024, 2, 29), "tags": ["x", None], "inner": {"x": -3, "y": None}, "items": [{"k": "v"}]},
    {"id": 2, "name": None, "score": None, "ok": None, "at": None, "day": None, "tags": None, "inner": None,
     "items": []},
]


def schema(document: dict | str, schema_id: int = 1) -> RegisteredSchema:
    text = document if isinstance(document, str) else json.dumps(document)
    return RegisteredSchema(schema_id, "JSON", text)


def bodies(*values: object) -> pa.BinaryArray:
    return pa.array([v if isinstance(v, bytes) or v is None else json.dumps(v).encode() for v in values], pa.binary())


def test_round_trip_of_each_type_checked_by_json_loads_and_jsonschema_rs():
    derived = schema(FORMAT.schema_from_arrow(ROW_TYPE, "Rec"))
    assert FORMAT.reader_type(derived) == ROW_TYPE
    rows = pa.array(ROWS, ROW_TYPE)
    encoded = FORMAT.encode(rows, derived)
    validator = jsonschema_rs.validator_for(json.loads(derived.text))
    parsed = [json.loads(b) for b in encoded.to_pylist()]
    assert all(validator.is_valid(p) for p in parsed)
    assert parsed[0]["name"] == "a\nb \"q\" é" and parsed[0]["day"] == "2024-02-29"
    assert dt.datetime.fromisoformat(parsed[0]["at"]) == ROWS[0]["at"]
    decoded = FORMAT.decode(encoded, derived, derived)
    assert decoded.type == ROW_TYPE
    assert decoded.to_pylist() == ROWS


def test_raw_newlines_and_offsets_in_bodies_decode():
    reader = schema(FORMAT.schema_from_arrow(ROW_TYPE, "Rec"))
    pretty = json.dumps({"id": 7, "at": "2024-01-01T02:00:00+02:00", "inner": {"x": 1}}, indent=2).encode()
    decoded = FORMAT.decode(bodies(pretty, b'{"id":\r\n8}', None), reader, reader).to_pylist()
    assert [d and d["id"] for d in decoded] == [7, 8, None]
    assert decoded[0]["at"] == dt.datetime(2024, 1, 1, tzinfo=UTC)


def test_evolution_by_name_added_property_is_null_unknown_is_ignored():
    v1 = schema({"type": "object", "properties": {"id": {"type": "integer"}, "old": {"type": "string"}},
                 "required": ["id"]})
    v2 = schema({"type": "object", "properties": {"id": {"type": "integer"}, "new": {"type": ["string", "null"]}},
                 "required": ["id"]}, 2)
    written = FORMAT.encode(pa.array([{"id": 1, "old": "gone"}], FORMAT.reader_type(v1)), v1)
    assert FORMAT.decode(written, v1, v2).to_pylist() == [{"id": 1, "new": None}]


def test_nullable_forms_and_refs_map_to_columns():
    document = {"definitions": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}},
                "type": "object", "required": ["a", "p"],
                "properties": {"a": {"oneOf": [{"type": "null"}, {"type": "integer"}]},
                               "p": {"$ref": "#/definitions/Point"}, "e": {"enum": ["A", "B"]}}}
    assert FORMAT.reader_type(schema(document)) == pa.struct([
        pa.field("a", pa.int64()), pa.field("p", pa.struct([pa.field("x", pa.float64())]), nullable=False),
        pa.field("e", pa.string())])
    with pytest.raises(JsonSchemaError, match=r"\$\.u: oneOf of 2 non-null"):
        FORMAT.reader_type(schema({"type": "object", "properties": {"u": {"oneOf": [{"type": "integer"},
                                                                                     {"type": "string"}]}}}))


@pytest.mark.parametrize(("bad", "reason"), [
    (b"not json", "Invalid value"),
    (b'{"id": "one"}', "changed from number to string"),
    (b'{"id": 1}{"id": 2}', "2 JSON values"),
    (b"[1]", "changed from object to array"),
])
def test_bad_body_is_named_by_index(bad, reason):
    reader = schema({"type": "object", "properties": {"id": {"type": "integer"}}})
    good = bodies({"id": 1}, {"id": 2}, {"id": 3})
    assert FORMAT.decode(good, reader, reader).to_pylist() == [{"id": 1}, {"id": 2}, {"id": 3}]  # control
    with pytest.raises(PayloadError, match=reason) as caught:
        FORMAT.decode(bodies({"id": 1}, {"id": 2}, bad, {"id": 4}), reader, reader)
    assert caught.value.index == 2


def test_missing_required_property_is_named_by_index_and_column():
    reader = schema({"type": "object", "properties": {"id": {"type": "integer"},
                                                      "in": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                             "required": ["x"]}}, "required": ["id"]})
    assert FORMAT.decode(bodies({"id": 1, "in": {"x": 1}}, {"id": 2}), reader, reader).to_pylist()[1]["in"] is None
    with pytest.raises(PayloadError) as caught:
        FORMAT.decode(bodies({"id": 1}, {"id": 2, "in": {}}), reader, reader)
    assert (caught.value.index, caught.value.column) == (1, "in.x")
    with pytest.raises(PayloadError) as caught:
        FORMAT.decode(bodies({"id": 1}, {"in": {"x": 1}}), reader, reader)
    assert (caught.value.index, caught.value.column) == (1, "id")


def test_row_that_does_not_fit_is_named_by_index_and_column():
    writer = schema(FORMAT.schema_from_arrow(ROW_TYPE, "Rec"))
    loose = pa.struct([pa.field("id", pa.int64()), *list(ROW_TYPE)[1:]])
    FORMAT.encode(pa.array(ROWS, loose), writer)  # control: the same columns, no null id
    with pytest.raises(PayloadError) as caught:
        FORMAT.encode(pa.array([*ROWS, {**ROWS[0], "id": None}], loose), writer)
    assert (caught.value.index, caught.value.column) == (2, "id")
    wrong = pa.array([{"id": 1, "inner": {"x": 1, "y": 5}}, {"id": 2, "inner": None}],
                     pa.struct([pa.field("id", pa.int64()), pa.field("inner", pa.struct([("x", pa.int64()),
                                                                                         ("y", pa.int64())]))]))
    with pytest.raises(PayloadError, match="does not fit") as caught:
        FORMAT.encode(wrong, writer)
    assert (caught.value.index, caught.value.column) == (0, "inner.y")
    extra = pa.array([{"id": 1, "zzz": 1}], pa.struct([("id", pa.int64()), ("zzz", pa.int64())]))
    with pytest.raises(PayloadError, match="additionalProperties") as caught:
        FORMAT.encode(extra, writer)
    assert caught.value.column == "zzz"


def test_constraints_beyond_types_are_validated_per_row():
    writer = schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})
    rows = pa.array([{"n": 0}, {"n": 5}], pa.struct([("n", pa.int64())]))
    assert FORMAT.encode(rows, writer).to_pylist() == [b'{"n":0}', b'{"n":5}']
    with pytest.raises(PayloadError, match="minimum") as caught:
        FORMAT.encode(pa.array([{"n": 0}, {"n": -1}], rows.type), writer)
    assert (caught.value.index, caught.value.column) == (1, "n")


def test_null_row_is_a_null_body():
    writer = schema({"type": "object", "properties": {"n": {"type": "integer"}}})
    rows = pa.array([{"n": 1}, None], pa.struct([("n", pa.int64())]))
    encoded = FORMAT.encode(rows, writer)
    assert encoded.to_pylist() == [b'{"n":1}', None]
    assert FORMAT.decode(encoded, writer, writer).to_pylist() == [{"n": 1}, None]
