"""The Avro format against fastavro as the independent reference: sluice's encoder -> fastavro's reader, fastavro's
writer -> sluice's decoder, schema resolution, bad bodies and Confluent's framing."""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.formats import _wire
from sluice.formats._avro import AvroFormat
from sluice.formats._avro_schema import SchemaError
from sluice.formats._codec import PayloadError, RegisteredSchema

UTC = dt.UTC
NESTED = {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "string"}]}
ALL_TYPES: dict[str, Any] = {
    "type": "record",
    "name": "All",
    "namespace": "t",
    "fields": [
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "bo", "type": "boolean"},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {
            "name": "decf",
            "type": {"type": "fixed", "name": "F8", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 3},
        },
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "tsm", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tsu", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "rec", "type": NESTED},
        {"name": "opt_rec", "type": ["null", "Inner"], "default": None},
        {"name": "arr", "type": {"type": "array", "items": "long"}},
        {"name": "arr_rec", "type": {"type": "array", "items": "Inner"}},
        {"name": "m", "type": {"type": "map", "values": ["null", "string"]}},
        {"name": "multi", "type": ["null", "int", "string"], "default": None},
        {"name": "opt_s", "type": ["null", "string"], "default": None},
        {"name": "opt_l", "type": ["long", "null"], "default": 0},
    ],
}
U = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
RECORDS = [
    {
        "i": -5, "l": 2**40, "f": 1.5, "d": -2.25, "bo": True, "s": "héllo", "b": b"\x00\xff",
        "dec": Decimal("-12345678.91"), "decf": Decimal("4.567"), "fx": b"abcd",
        "tsm": dt.datetime(2024, 1, 2, 3, 4, 5, 6000, tzinfo=UTC),
        "tsu": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        "lts": dt.datetime(2024, 5, 6, 7, 8, 9, 10), "date": dt.date(1999, 12, 31),
        "tm": 3_723_000, "tu": 3_723_000_004,
        "u": str(U), "e": "GREEN", "rec": {"x": 1, "y": "a"}, "opt_rec": {"x": 2, "y": "b"}, "arr": [1, -1, 2**62],
        "arr_rec": [{"x": 3, "y": "c"}], "m": {"k": "v", "n": None}, "multi": 7, "opt_s": "z", "opt_l": None,
    },
    {
        "i": 2**31 - 1, "l": -(2**63), "f": 0.0, "d": 1e300, "bo": False, "s": "", "b": b"",
        "dec": Decimal("0.00"), "decf": Decimal("-999999999.999"), "fx": b"\x00\x00\x00\x00",
        "tsm": dt.datetime(1970, 1, 1, tzinfo=UTC), "tsu": dt.datetime(2262, 1, 1, tzinfo=UTC),
        "lts": dt.datetime(1900, 1, 1), "date": dt.date(1970, 1, 1), "tm": 0, "tu": 0,
        "u": str(uuid.UUID(int=0)), "e": "BLUE", "rec": {"x": -1, "y": ""}, "opt_rec": None, "arr": [],
        "arr_rec": [], "m": {}, "multi": "word", "opt_s": None, "opt_l": 9,
    },
    {
        "i": 0, "l": 0, "f": -3.5, "d": 0.5, "bo": True, "s": "x" * 300, "b": b"y" * 200,
        "dec": Decimal("99999999.99"), "decf": Decimal("0.001"), "fx": b"wxyz",
        "tsm": dt.datetime(2000, 2, 29, tzinfo=UTC), "tsu": dt.datetime(2000, 2, 29, 12, tzinfo=UTC),
        "lts": dt.datetime(2000, 2, 29), "date": dt.date(2000, 2, 29), "tm": 1, "tu": 1,
        "u": str(U), "e": "RED", "rec": {"x": 0, "y": "q"}, "opt_rec": None, "arr": [5] * 70,
        "arr_rec": [{"x": i, "y": str(i)} for i in range(3)], "m": {str(i): str(i) for i in range(70)}, "multi": None,
        "opt_s": None, "opt_l": 0,
    },
]  # fmt: skip


def registered(schema: dict[str, Any], schema_id: int = 1) -> RegisteredSchema:
    return RegisteredSchema(schema_id, "AVRO", json.dumps(schema))


def fastavro_bodies(schema: dict[str, Any], records: list[dict[str, Any]]) -> pa.BinaryArray:
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return pa.array(out, pa.binary())


def fastavro_read(schema: dict[str, Any], bodies: pa.Array) -> list[dict[str, Any]]:
    parsed = fastavro.parse_schema(schema)
    return [fastavro.schemaless_reader(io.BytesIO(b), parsed, parsed) for b in bodies.to_pylist()]


def as_spark(record: dict[str, Any]) -> dict[str, Any]:
    """A fastavro record as sluice's Arrow rows give it (maps as pairs, the multi-branch union as members)."""
    out = dict(record)
    out["m"] = list(record["m"].items())
    multi = record["multi"]
    out["multi"] = None if multi is None else {"member0": multi if isinstance(multi, int) else None,
                                                "member1": multi if isinstance(multi, str) else None}  # fmt: skip
    return out


def test_decode_every_type_as_fastavro_wrote_it() -> None:
    fmt = AvroFormat()
    schema = registered(ALL_TYPES)
    decoded = fmt.decode(fastavro_bodies(ALL_TYPES, RECORDS), schema, schema)
    assert decoded.type == fmt.reader_type(schema)
    assert decoded.to_pylist() == [as_spark(r) for r in RECORDS]
    types = {f.name: f.type for f in decoded.type}
    assert types["tsm"] == pa.timestamp("us", tz="UTC") and types["lts"] == pa.timestamp("us")
    assert types["dec"] == pa.decimal128(10, 2) and types["e"] == pa.string() and types["u"] == pa.string()
    assert types["multi"] == pa.struct([("member0", pa.int32()), ("member1", pa.string())])


def test_encode_every_type_for_fastavro() -> None:
    fmt = AvroFormat()
    schema = registered(ALL_TYPES)
    rows = pa.array([as_spark(r) for r in RECORDS], fmt.reader_type(schema))
    bodies = fmt.encode(rows, schema)
    back = fastavro_read(ALL_TYPES, bodies)
    for got, want in zip(back, RECORDS, strict=True):
        tm, tu = got["tm"], got["tu"]  # fastavro gives times of day; Spark's types keep them as int and long
        got |= {"u": str(got["u"]), "tm": _micros(tm) // 1000, "tu": _micros(tu)}
        assert got == want
    assert bodies.to_pylist() == fastavro_bodies(ALL_TYPES, RECORDS).to_pylist()  # byte for byte, as Java writes


def _micros(t: dt.time) -> int:
    return ((t.hour * 60 + t.minute) * 60 + t.second) * 10**6 + t.microsecond


FLAT = {"type": "record", "name": "Flat", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "score", "type": "double"}, {"name": "ok", "type": "boolean"}]}  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "id": st.integers(-(2**63), 2**63 - 1), "name": st.none() | st.text(max_size=20),
    "score": st.floats(allow_nan=False), "ok": st.booleans()}), min_size=1, max_size=20))  # fmt: skip
def test_round_trip_property(records: list[dict[str, Any]]) -> None:
    fmt = AvroFormat()
    schema = registered(FLAT)
    bodies = fastavro_bodies(FLAT, records)
    decoded = fmt.decode(bodies, schema, schema)
    assert decoded.to_pylist() == records
    assert fmt.encode(decoded, schema).to_pylist() == bodies.to_pylist()


V1 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "int"}, {"name": "gone", "type": "string"},
    {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["FREE", "PRO", "GOLD"]}}]}  # fmt: skip
V2 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "long"},
    {"name": "tier", "type": {"type": "enum", "name": "Tier", "symbols": ["FREE", "PRO", "OTHER"], "default": "OTHER"}},
    {"name": "country", "type": "string", "default": "NL"},
    {"name": "nick", "type": ["null", "string"], "default": None}]}  # fmt: skip
V1_RECORDS = [{"id": 1, "gone": "a", "tier": "PRO"}, {"id": 2, "gone": "b", "tier": "GOLD"}]


def test_v1_bodies_read_with_v2() -> None:
    fmt = AvroFormat()
    out = fmt.decode(fastavro_bodies(V1, V1_RECORDS), registered(V1, 1), registered(V2, 2))
    assert out.type == fmt.reader_type(registered(V2, 2))
    assert out.to_pylist() == [
        {"id": 1, "tier": "PRO", "country": "NL", "nick": None},
        {"id": 2, "tier": "OTHER", "country": "NL", "nick": None},
    ]
    want = fastavro_read_resolved(V1, V2, fastavro_bodies(V1, V1_RECORDS))
    assert out.to_pylist() == want


def fastavro_read_resolved(writer: dict[str, Any], reader: dict[str, Any], bodies: pa.Array) -> list[dict[str, Any]]:
    w, r = fastavro.parse_schema(writer), fastavro.parse_schema(reader)
    return [fastavro.schemaless_reader(io.BytesIO(b), w, r) for b in bodies.to_pylist()]


def test_resolution_without_defaults_is_refused_naming_what() -> None:
    fmt = AvroFormat()
    bodies = fastavro_bodies(V1, V1_RECORDS)
    no_field_default = json.loads(json.dumps(V2))
    del no_field_default["fields"][2]["default"]
    with pytest.raises(SchemaError, match=r"'country'.*no default"):
        fmt.decode(bodies, registered(V1, 1), registered(no_field_default, 3))
    no_enum_default = json.loads(json.dumps(V2))
    del no_enum_default["fields"][1]["type"]["default"]
    with pytest.raises(PayloadError, match="'GOLD'") as e:
        fmt.decode(bodies, registered(V1, 1), registered(no_enum_default, 4))
    assert e.value.index == 1


def test_a_corrupt_body_is_named_by_index() -> None:
    fmt = AvroFormat()
    schema = registered(FLAT)
    good = fastavro_bodies(FLAT, [{"id": i, "name": "n", "score": 1.0, "ok": True} for i in range(9)]).to_pylist()
    fmt.decode(pa.array(good, pa.binary()), schema, schema)  # negative control: all nine decode
    for bad, why in [(good[5] + b"\x00", "trailing bytes"), (good[5][:-3], "EOF"), (b"\x02\x09", "union branch")]:
        bodies = pa.array([*good[:5], bad, *good[6:]], pa.binary())
        with pytest.raises(PayloadError, match=why) as e:
            fmt.decode(bodies, schema, schema)
        assert e.value.index == 5


def test_bad_utf8_found_by_the_reader_is_named_by_index() -> None:
    fmt = AvroFormat()
    schema = registered(FLAT)
    rows = [{"id": i, "name": "n", "score": 1.0, "ok": True} for i in range(6)]
    bodies = fastavro_bodies(FLAT, rows).to_pylist()
    bodies[4] = bodies[4].replace(b"\x02n", b"\x02\xff")
    with pytest.raises(PayloadError) as e:
        fmt.decode(pa.array(bodies, pa.binary()), schema, schema)
    assert e.value.index == 4


def test_tombstones_stay_null() -> None:
    fmt = AvroFormat()
    schema = registered(FLAT)
    good = fastavro_bodies(FLAT, [{"id": 1, "name": None, "score": 2.0, "ok": False}]).to_pylist()
    out = fmt.decode(pa.array([None, good[0], None], pa.binary()), schema, schema)
    assert out.to_pylist() == [None, {"id": 1, "name": None, "score": 2.0, "ok": False}, None]


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("id", None, "null"),
        ("tier", "GOLD", "enum"),
        ("amount", Decimal("123456.78"), "precision"),
    ],
)
def test_encode_refuses_a_row_that_does_not_fit(column: str, value: Any, why: str) -> None:
    schema = {"type": "record", "name": "Row", "fields": [
        {"name": "id", "type": "long"},
        {"name": "tier", "type": {"type": "enum", "name": "T", "symbols": ["FREE", "PRO"]}},
        {"name": "amount",
         "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}}]}  # fmt: skip
    arrow = pa.struct([("id", pa.int64()), ("tier", pa.string()), ("amount", pa.decimal128(10, 2))])
    rows = [{"id": i, "tier": "PRO", "amount": Decimal("1.00")} for i in range(4)]
    fmt = AvroFormat()
    fmt.encode(pa.array(rows, arrow), registered(schema))  # negative control: every row fits
    rows[2][column] = value
    with pytest.raises(PayloadError, match=why) as e:
        fmt.encode(pa.array(rows, arrow), registered(schema))
    assert (e.value.index, e.value.column) == (2, column)


def test_schema_from_arrow_reads_back_what_it_encodes() -> None:
    arrow = pa.struct([
        pa.field("id", pa.int64(), nullable=False), ("name", pa.string()), ("price", pa.decimal128(9, 3)),
        ("at", pa.timestamp("us", tz="UTC")), ("day", pa.date32()), ("tags", pa.list_(pa.string())),
        ("attrs", pa.map_(pa.string(), pa.int32())), ("inner", pa.struct([("a", pa.float64())])),
        ("inner2", pa.struct([("a", pa.bool_())]))])  # fmt: skip
    fmt = AvroFormat()
    text = fmt.schema_from_arrow(arrow, "com.example.Row")
    schema = json.loads(text)
    assert schema["fields"][1] == {"name": "name", "type": ["null", "string"], "default": None}
    fastavro.parse_schema(schema)  # a valid schema: nested records got unique names
    rows = pa.array([{"id": 1, "name": "x", "price": Decimal("1.250"), "at": dt.datetime(2024, 1, 1, tzinfo=UTC),
                      "day": dt.date(2024, 1, 1), "tags": ["a", None], "attrs": [("k", 1)], "inner": {"a": 1.0},
                      "inner2": None}], arrow)  # fmt: skip
    bodies = fmt.encode(rows, registered(schema))
    assert fastavro_read(schema, bodies)[0]["price"] == Decimal("1.250")
    assert fmt.decode(bodies, registered(schema), registered(schema)).to_pylist() == rows.to_pylist()


def test_framing_round_trip_and_bad_magic_named() -> None:
    bodies = pa.array([b"abc", None, b""], pa.binary())
    framed = _wire.frame(bodies, 258)
    assert framed.to_pylist() == [b"\x00\x00\x00\x01\x02abc", None, b"\x00\x00\x00\x01\x02"]
    split = _wire.split(framed)
    assert split.schema_ids.tolist() == [258, -1, 258] and split.bad.tolist() == []
    assert split.bodies.to_pylist() == bodies.to_pylist()
    values = pa.array([framed[0].as_py(), b"\x01\x00\x00\x00\x01x", b"\x00\x00"], pa.binary())
    split = _wire.split(values)
    assert split.bad.tolist() == [1, 2] and split.schema_ids.tolist() == [258, -1, -1]
    assert "magic byte 1" in split.first_bad_reason(values)


ITEM_V1 = {
    "type": "record",
    "name": "Item",
    "fields": [{"name": "sku", "type": "string"}, {"name": "n", "type": "int"}],
}
ITEM_V2 = {"type": "record", "name": "Item", "fields": [
    {"name": "sku", "type": "bytes"}, {"name": "n", "type": "double"},
    {"name": "unit", "type": "string", "default": "pc"}]}  # fmt: skip


def nested(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Cart", "fields": [
        {"name": "items", "type": {"type": "array", "items": item}},
        {"name": "by_name", "type": {"type": "map", "values": item["name"]}},
        {"name": "first", "type": ["null", item["name"]], "default": None}]}  # fmt: skip


def test_nested_records_in_arrays_maps_and_unions_resolve() -> None:
    carts = [
        {"items": [{"sku": "a", "n": 1}, {"sku": "b", "n": 2}], "by_name": {"x": {"sku": "c", "n": 3}}, "first": None},
        {"items": [], "by_name": {}, "first": {"sku": "d", "n": 4}},
    ]
    writer, reader = nested(ITEM_V1), nested(ITEM_V2)
    bodies = fastavro_bodies(writer, carts)
    out = AvroFormat().decode(bodies, registered(writer, 1), registered(reader, 2))
    want = fastavro_read_resolved(writer, reader, bodies)
    for w in want:
        w["by_name"] = list(w["by_name"].items())
    assert out.to_pylist() == want


def test_sliced_arrays_decode_and_encode() -> None:
    fmt = AvroFormat()
    schema = registered(ALL_TYPES)
    bodies = fastavro_bodies(ALL_TYPES, RECORDS)
    assert fmt.decode(bodies.slice(1), schema, schema).to_pylist() == [as_spark(r) for r in RECORDS[1:]]
    rows = pa.array([as_spark(r) for r in RECORDS], fmt.reader_type(schema))
    assert fmt.encode(rows.slice(1, 2), schema).to_pylist() == bodies.to_pylist()[1:]


def test_dotted_names_and_references_across_namespaces() -> None:
    inner = {"type": "record", "name": "b.Inner", "fields": [{"name": "v", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "a.Outer",
        "fields": [{"name": "x", "type": inner}, {"name": "y", "type": "b.Inner"}],
    }
    bodies = fastavro_bodies(schema, [{"x": {"v": 1}, "y": {"v": 2}}])
    out = AvroFormat().decode(bodies, registered(schema), registered(schema))
    assert out.to_pylist() == [{"x": {"v": 1}, "y": {"v": 2}}]


def test_a_corrupt_block_count_is_refused_at_once() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "d", "type": {"type": "array", "items": "double"}},
        {"name": "s", "type": {"type": "array", "items": "string"}}]}  # fmt: skip
    fmt = AvroFormat()
    assert fmt.decode(fastavro_bodies(schema, [{"d": [1.0], "s": ["x"]}]), registered(schema), registered(schema))
    huge = b"\xfe\xff\xff\xff\x0f"  # 2**31 - 1 items
    for body, field in [(huge + b"\x00\x00", "'d'"), (b"\x00" + huge + b"\x00", "'s'")]:
        with pytest.raises(PayloadError, match=f"block count of field {field} larger than the rest of the body"):
            fmt.decode(pa.array([body], pa.binary()), registered(schema), registered(schema))
