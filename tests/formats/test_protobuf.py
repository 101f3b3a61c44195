"""The Protobuf payload format. The reference is protobuf's own runtime with message classes built from hand-written
descriptors (descriptor_pb2), not from protoc's output of the .proto text the format compiles."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2

from sluice.formats._codec import PayloadError, RegisteredSchema
from sluice.formats._protobuf import ProtobufFormat, ProtobufSchemaError
from sluice.formats._protobuf_descriptors import decode_indexes, encode_indexes

FORMAT = ProtobufFormat()
UTC = dt.UTC

PROTO = """
syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

message Rec {
  enum Color { RED = 0; GREEN = 1; }
  message Inner { double x = 1; repeated string tags = 2; }
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5; sint64 s64 = 6;
  fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10; bool flag = 11; string text = 12;
  bytes raw = 13; float fl = 14; double db = 15; Color color = 16; Inner inner = 17; repeated int64 nums = 18;
  repeated Inner inners = 19; map<string, int32> counts = 20; map<int64, Inner> by_id = 21;
  oneof choice { string pick_s = 22; int64 pick_i = 23; }
  google.protobuf.Timestamp at = 24; google.protobuf.StringValue label = 25; optional int32 maybe = 26;
}
message Other { string z = 1; }
"""
F = descriptor_pb2.FieldDescriptorProto


def reference_classes() -> dict[str, type]:
    """t.Rec and t.Other built from a hand-written FileDescriptorProto (the independent reference)."""
    file = descriptor_pb2.FileDescriptorProto(name="ref.proto", package="t", syntax="proto3",
                                              dependency=["google/protobuf/timestamp.proto",
                                                          "google/protobuf/wrappers.proto"])
    rec = file.message_type.add(name="Rec")
    file.message_type.add(name="Other").field.add(name="z", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    rec.enum_type.add(name="Color").value.extend([descriptor_pb2.EnumValueDescriptorProto(name="RED", number=0),
                                                  descriptor_pb2.EnumValueDescriptorProto(name="GREEN", number=1)])
    inner = rec.nested_type.add(name="Inner")
    inner.field.add(name="x", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    inner.field.add(name="tags", number=2, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    for key, value, entry_name in ((F.TYPE_STRING, F.TYPE_INT32, "CountsEntry"), (F.TYPE_INT64, F.TYPE_MESSAGE,
                                                                                   "ByIdEntry")):
        entry = rec.nested_type.add(name=entry_name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=key, label=F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=value, label=F.LABEL_OPTIONAL,
                        type_name=".t.Rec.Inner" if value == F.TYPE_MESSAGE else None)
    rec.oneof_decl.add(name="choice")
    rec.oneof_decl.add(name="_maybe")
    plain = [("i32", F.TYPE_INT32), ("i64", F.TYPE_INT64), ("u32", F.TYPE_UINT32), ("u64", F.TYPE_UINT64),
             ("s32", F.TYPE_SINT32), ("s64", F.TYPE_SINT64), ("f32", F.TYPE_FIXED32), ("f64", F.TYPE_FIXED64),
             ("sf32", F.TYPE_SFIXED32), ("sf64", F.TYPE_SFIXED64), ("flag", F.TYPE_BOOL), ("text", F.TYPE_STRING),
             ("raw", F.TYPE_BYTES), ("fl", F.TYPE_FLOAT), ("db", F.TYPE_DOUBLE)]
    for number, (name, kind) in enumerate(plain, start=1):
        rec.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL)
    add = rec.field.add
    add(name="color", number=16, type=F.TYPE_ENUM, type_name=".t.Rec.Color", label=F.LABEL_OPTIONAL)
    add(name="inner", number=17, type=F.TYPE_MESSAGE, type_name=".t.Rec.Inner", label=F.LABEL_OPTIONAL)
    add(name="nums", number=18, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    add(name="inners", number=19, type=F.TYPE_MESSAGE, type_name=".t.Rec.Inner", label=F.LABEL_REPEATED)
    add(name="counts", number=20, type=F.TYPE_MESSAGE, type_name=".t.Rec.CountsEntry", label=F.LABEL_REPEATED)
    add(name="by_id", number=21, type=F.TYPE_MESSAGE, type_name=".t.Rec.ByIdEntry", label=F.LABEL_REPEATED)
    add(name="pick_s", number=22, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(name="pick_i", number=23, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, oneof_index=0)
    add(name="at", number=24, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp", label=F.LABEL_OPTIONAL)
    add(name="label", number=25, type=F.TYPE_MESSAGE, type_name=".google.protobuf.StringValue",
        label=F.LABEL_OPTIONAL)
    add(name="maybe", number=26, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL, oneof_index=1, proto3_optional=True)
    pool = descriptor_pool.DescriptorPool()
    for known in (timestamp_pb2, wrappers_pb2):
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(known.DESCRIPTOR.serialized_pb))
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"t.{name}")) for name in ("Rec",
                                                                                                        "Other")}


REF = reference_classes()
SCHEMA = RegisteredSchema(1, "PROTOBUF", PROTO)
AT = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, UTC)
FULL = {"i32": -2**31, "i64": -2**63, "u32": 2**32 - 1, "u64": 2**64 - 1, "s32": -5, "s64": -6, "f32": 7, "f64": 8,
        "sf32": -9, "sf64": -10, "flag": True, "text": "é\n", "raw": b"\x00\xff", "fl": 1.5, "db": -2.25,
        "color": "GREEN", "inner": {"x": 0.5, "tags": ["a", "b"]}, "nums": [1, -1], "inners": [{"x": 1.0, "tags": []}],
        "counts": [("k", 3)], "by_id": [(7, {"x": 2.0, "tags": ["t"]})], "pick_s": None, "pick_i": 42, "at": AT,
        "label": "L", "maybe": 0}
EMPTY = {"i32": 0, "i64": 0, "u32": 0, "u64": 0, "s32": 0, "s64": 0, "f32": 0, "f64": 0, "sf32": 0, "sf64": 0,
         "flag": False, "text": "", "raw": b"", "fl": 0.0, "db": 0.0, "color": "RED", "inner": None, "nums": [],
         "inners": [], "counts": [], "by_id": [], "pick_s": None, "pick_i": None, "at": None, "label": None,
         "maybe": None}


def reference_message(row: dict) -> bytes:
    kwargs = {k: v for k, v in row.items() if v is not None}
    kwargs = {**kwargs, "counts": dict(row["counts"]), "by_id": dict(row["by_id"])}
    if row["u64"]:
        kwargs["u64"] = int(row["u64"])
    if row["label"] is not None:
        kwargs["label"] = {"value": row["label"]}
    return REF["Rec"](**kwargs).SerializeToString()


def expected(row: dict) -> dict:
    return {**row, "u64": Decimal(row["u64"])}


def test_decode_each_type_of_messages_the_reference_serialized():
    bodies = pa.array([b"\x00" + reference_message(r) for r in (FULL, EMPTY)] + [None], pa.binary())
    decoded = FORMAT.decode(bodies, SCHEMA, SCHEMA)
    assert decoded.type == FORMAT.reader_type(SCHEMA)
    assert decoded.to_pylist() == [expected(FULL), expected(EMPTY), None]
    fields = {f.name: f for f in decoded.type}
    assert fields["at"].type == pa.timestamp("us", tz="UTC") and fields["u64"].type == pa.decimal128(20, 0)
    assert fields["maybe"].nullable and fields["pick_i"].nullable and not fields["i32"].nullable


def test_encode_each_type_read_back_by_the_reference():
    rows = pa.array([expected(FULL), expected(EMPTY), None], FORMAT.reader_type(SCHEMA))
    bodies = FORMAT.encode(rows, SCHEMA).to_pylist()
    assert bodies[2] is None
    assert all(body[:1] == b"\x00" for body in bodies[:2])  # Confluent's indexes of the file's first message
    parsed = REF["Rec"].FromString(bodies[0][1:])
    assert parsed == REF["Rec"].FromString(reference_message(FULL))
    assert parsed.WhichOneof("choice") == "pick_i" and parsed.HasField("maybe")
    assert not REF["Rec"].FromString(bodies[1][1:]).HasField("maybe")


def test_message_indexes_follow_confluents_encoding():
    assert encode_indexes([0]) == b"\x00"
    assert encode_indexes([1]) == b"\x02\x02"  # zigzag count 1, zigzag index 1
    assert decode_indexes(b"\x04\x02\x00rest") == ([1, 0], 3)
    assert decode_indexes(b"\x00rest") == ([0], 1)
    with pytest.raises(ValueError, match="truncated"):
        decode_indexes(b"\x04\x02")


def test_the_message_named_by_the_indexes_is_read():
    rec = ProtobufFormat(message="t.Rec")
    body = encode_indexes([0]) + reference_message(FULL)
    assert rec.decode(pa.array([body], pa.binary()), SCHEMA, SCHEMA).to_pylist() == [expected(FULL)]
    other = encode_indexes([1]) + REF["Other"](z="q").SerializeToString()
    assert FORMAT.decode(pa.array([other], pa.binary()), SCHEMA, SCHEMA).to_pylist() == [{"z": "q"}]
    assert ProtobufFormat(message="t.Other").encode(pa.array([{"z": "q"}]), SCHEMA).to_pylist() == [other]
    with pytest.raises(PayloadError, match=r"written as message t\.Other") as caught:
        rec.decode(pa.array([body, other], pa.binary()), SCHEMA, SCHEMA)
    assert caught.value.index == 1


def test_evolution_by_field_number():
    v1 = RegisteredSchema(1, "PROTOBUF", 'syntax = "proto3"; message M { int64 id = 1; string old = 2; }')
    v2 = RegisteredSchema(2, "PROTOBUF", 'syntax = "proto3"; message M { int64 id = 1; optional string new = 3; '
                                         'reserved 2; }')
    written = FORMAT.encode(pa.array([{"id": 5, "old": "gone"}], FORMAT.reader_type(v1)), v1)
    assert FORMAT.decode(written, v1, v2).to_pylist() == [{"id": 5, "new": None}]
    newer = FORMAT.encode(pa.array([{"id": 6, "new": "n"}], FORMAT.reader_type(v2)), v2)
    assert FORMAT.decode(newer, v2, v1).to_pylist() == [{"id": 6, "old": ""}]


def test_bad_body_is_named_by_index():
    schema = RegisteredSchema(3, "PROTOBUF", 'syntax = "proto3"; message M { string s = 1; }')
    good = [b"\x00" + REF["Other"](z=str(i)).SerializeToString() for i in range(3)]
    assert len(FORMAT.decode(pa.array(good, pa.binary()), schema, schema)) == 3  # control
    truncated = b"\x00\x0a\x05ab"  # field 1, length 5, 2 bytes
    with pytest.raises(PayloadError, match="not a Protobuf M") as caught:
        FORMAT.decode(pa.array([*good[:2], truncated, good[2]], pa.binary()), schema, schema)
    assert caught.value.index == 2
    with pytest.raises(PayloadError, match="message indexes") as caught:
        FORMAT.decode(pa.array([good[0], b"\x04"], pa.binary()), schema, schema)
    assert caught.value.index == 1


def test_row_that_does_not_fit_is_named_by_index_and_column():
    schema = RegisteredSchema(4, "PROTOBUF", 'syntax = "proto3"; message M { int32 n = 1; optional string s = 2; '
                                             "message I { int32 x = 1; } I i = 3; }")
    row_type = pa.struct([("n", pa.int64()), ("s", pa.string()), ("i", pa.struct([("x", pa.int64())]))])
    ok = pa.array([{"n": 1, "s": None, "i": None}, {"n": 2**31 - 1, "s": "x", "i": {"x": 1}}], row_type)
    assert len(FORMAT.encode(ok, schema)) == 2  # control: a null where the field has presence, an int32's maximum
    cases = [({"n": 2**31, "s": "x", "i": None}, "n", "out of range"),
             ({"n": None, "s": "x", "i": None}, "n", "no presence"),
             ({"n": 1, "s": None, "i": {"x": None}}, "i.x", "no presence")]
    for bad, column, reason in cases:
        with pytest.raises(PayloadError, match=reason) as caught:
            FORMAT.encode(pa.array([ok.to_pylist()[0], bad], row_type), schema)
        assert (caught.value.index, caught.value.column) == (1, column)
    extra = pa.array([{"n": 1, "zz": 1}], pa.struct([("n", pa.int64()), ("zz", pa.int64())]))
    with pytest.raises(PayloadError, match="no field 'zz'") as caught:
        FORMAT.encode(extra, schema)
    assert caught.value.column == "zz"


def test_schema_from_arrow_compiles_and_round_trips():
    arrow_type = pa.struct([
        pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
        pa.field("price", pa.decimal128(9, 2)),
        pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("tags", pa.list_(pa.field("item", pa.string(), False)),
                                                               nullable=False),
        pa.field("inner", pa.struct([pa.field("x", pa.float64())])),
        pa.field("kv", pa.map_(pa.string(), pa.int32()), nullable=False)])
    text = FORMAT.schema_from_arrow(arrow_type, "Row")
    assert "optional string price" in text and "google.protobuf.Timestamp at" in text
    schema = RegisteredSchema(5, "PROTOBUF", text)
    read_type = FORMAT.reader_type(schema)
    assert read_type.field("price").type == pa.string()  # decimals are strings: Protobuf has no decimal
    rows = pa.array([{"id": 1, "name": None, "price": Decimal("1.25"), "at": AT, "tags": ["a"], "inner": {"x": None},
                      "kv": [("k", 1)]}], arrow_type)
    decoded = FORMAT.decode(FORMAT.encode(rows, schema), schema, schema).to_pylist()
    assert decoded == [{**rows.to_pylist()[0], "price": "1.25"}]


def test_refusals_of_schemas():
    with pytest.raises(ProtobufSchemaError, match="does not compile"):
        FORMAT.reader_type(RegisteredSchema(6, "PROTOBUF", "message M { nope }"))
    with pytest.raises(ProtobufSchemaError, match="contains itself"):
        FORMAT.reader_type(RegisteredSchema(7, "PROTOBUF", 'syntax = "proto3"; message N { N next = 1; }'))
    with pytest.raises(ProtobufSchemaError, match="list of lists"):
        FORMAT.schema_from_arrow(pa.struct([("ll", pa.list_(pa.list_(pa.int32())))]), "R")
