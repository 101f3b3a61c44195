"""Protobuf and JSON Schema payloads: sluice's bulk decode and encode against the naive per-record path.

Run: `.venv/bin/python -m bench.formats_protojson [--records 1000000]` (one run; records/s, and the ratio).

The records have 15 fields: integers of three widths, a double, a float, a bool, strings, an enum (a string in JSON),
a timestamp, a list of strings, a nested record of two fields, and a nullable string that is null in every other
record. The bodies are the same for both paths (Confluent's body: for Protobuf with its message index byte).

- Protobuf decode: `ProtobufFormat.decode` (upb parses, columns a field at a time) against the naive path of a
  Python consumer: per record `ParseFromString` + `MessageToDict`, then `pa.Table.from_pylist`.
- Protobuf encode: `ProtobufFormat.encode` against `to_pylist` + per record `json_format.ParseDict` + serialize.
- JSON Schema decode: `JsonSchemaFormat.decode` (pyarrow's JSON reader over the joined bodies) against per record
  `json.loads`, then `pa.Table.from_pylist`.
- JSON Schema encode: `JsonSchemaFormat.encode` (polars) against `to_pylist` + per record `json.dumps`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.formats._codec import RegisteredSchema
from sluice.formats._json_schema import JsonSchemaFormat
from sluice.formats._protobuf import ProtobufFormat

PROTO = """
syntax = "proto3";
import "google/protobuf/timestamp.proto";
message Event {
  enum Kind { VIEW = 0; CLICK = 1; BUY = 2; }
  message Where { double lat = 1; string city = 2; }
  int64 id = 1; int32 user = 2; uint32 count = 3; double score = 4; float ratio = 5; bool active = 6;
  string name = 7; string email = 8; Kind kind = 9; google.protobuf.Timestamp at = 10; repeated string tags = 11;
  Where where = 12; optional string note = 13; int64 seq = 14; string country = 15;
}
"""


def rows(n: int) -> pa.StructArray:
    i = np.arange(n, dtype=np.int64)
    at = pa.array(1_700_000_000_000_000 + i * 1_000, pa.timestamp("us", tz="UTC"))
    names = pa.array([f"user-{k % 1000}" for k in range(n)])
    tags = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)),
                                    pa.array(["red", "blue"] * n))
    cities = pa.array(["Lyon", "Oslo"] * (n // 2) + ["Kyiv"] * (n % 2))
    where = pa.StructArray.from_arrays([pa.array(i * 0.001), cities], names=["lat", "city"])
    note = pa.array([None if k % 2 else "n" for k in range(n)], pa.string())
    columns = {
        "id": pa.array(i), "user": pa.array((i % 100_000).astype(np.int32)), "count": pa.array(i % 7),
        "score": pa.array(i * 0.5), "ratio": pa.array((i % 10 / 10).astype(np.float32)),
        "active": pa.array(i % 2 == 0), "name": names, "email": pa.array([f"u{k}@example.com" for k in range(n)]),
        "kind": pa.array(["VIEW", "CLICK", "BUY"] * (n // 3) + ["VIEW"] * (n % 3)), "at": at, "tags": tags,
        "where": where, "note": note, "seq": pa.array(i * 3),
        "country": pa.array(["FR", "NO"] * (n // 2) + ["UA"] * (n % 2)),
    }
    return pa.StructArray.from_arrays(list(columns.values()), names=list(columns))


def timed(label: str, n: int, fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    print(f"  {label:<58} {n / seconds:>12,.0f} records/s  ({seconds:.2f} s)", flush=True)
    return n / seconds


def protobuf(data: pa.StructArray) -> tuple[float, float]:
    from google.protobuf import json_format, message_factory

    fmt = ProtobufFormat()
    schema = RegisteredSchema(1, "PROTOBUF", PROTO)
    typed = data.cast(pa.struct([f.with_type(pa.int64()) if f.name == "count" else f for f in data.type]))
    bodies = fmt.encode(typed, schema)
    cls = message_factory.GetMessageClass(fmt._compiled(schema).first_message())
    n = len(data)
    print(f"Protobuf, {n:,} records of {len(data.type)} fields, {sum(map(len, bodies.to_pylist())) / n:.0f} bytes each")

    def naive_decode() -> pa.Table:
        parse, to_dict = cls.FromString, json_format.MessageToDict
        return pa.Table.from_pylist([to_dict(parse(b[1:]), preserving_proto_field_name=True)
                                     for b in bodies.to_pylist()])

    def naive_encode() -> list[bytes]:
        def one(row: dict[str, Any]) -> bytes:
            row = {**row, "at": row["at"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
            return b"\x00" + json_format.ParseDict({k: v for k, v in row.items() if v is not None},
                                                   cls()).SerializeToString()
        return [one(r) for r in typed.to_pylist()]

    bulk_d = timed("decode: sluice (upb + columns a field at a time)", n, lambda: fmt.decode(bodies, schema, schema))
    naive_d = timed("decode: naive (ParseFromString + MessageToDict + from_pylist)", n, naive_decode)
    bulk_e = timed("encode: sluice (Arrow-level casts + upb constructors)", n, lambda: fmt.encode(typed, schema))
    naive_e = timed("encode: naive (to_pylist + ParseDict + SerializeToString)", n, naive_encode)
    return bulk_d / naive_d, bulk_e / naive_e


def json_schema(data: pa.StructArray) -> tuple[float, float]:
    fmt = JsonSchemaFormat()
    schema = RegisteredSchema(2, "JSON", fmt.schema_from_arrow(data.type, "Event"))
    bodies = fmt.encode(data, schema)
    n = len(data)
    print(f"JSON Schema, {n:,} records, {sum(map(len, bodies.to_pylist())) / n:.0f} bytes each")

    def naive_decode() -> pa.Table:
        loads = json.loads
        return pa.Table.from_pylist([loads(b) for b in bodies.to_pylist()])

    def naive_encode() -> list[bytes]:
        dumps = json.dumps

        def default(value: Any) -> str:
            return value.isoformat() if isinstance(value, dt.datetime) else str(value)
        return [dumps(r, separators=(",", ":"), default=default).encode() for r in data.to_pylist()]

    bulk_d = timed("decode: sluice (pyarrow.json over the joined bodies)", n,
                   lambda: fmt.decode(bodies, schema, schema))
    naive_d = timed("decode: naive (json.loads + from_pylist)", n, naive_decode)
    bulk_e = timed("encode: sluice (Arrow-level check + polars)", n, lambda: fmt.encode(data, schema))
    naive_e = timed("encode: naive (to_pylist + json.dumps)", n, naive_encode)
    return bulk_d / naive_d, bulk_e / naive_e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    data = rows(args.records)
    ratios = {"Protobuf": protobuf(data), "JSON Schema": json_schema(data)}
    print("sluice / naive:")
    for name, (decode, encode) in ratios.items():
        print(f"  {name:<12} decode {decode:.1f}x, encode {encode:.1f}x")


if __name__ == "__main__":
    main()
