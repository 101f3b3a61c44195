"""The Avro format's bulk decode and encode (sluice.formats._avro) against fastavro one record at a time, on one
process: records/s over N records of a 15-field schema (a decimal, timestamps, a date, an enum, a uuid, a nested
record, an array, a map and nullable unions), in batches of --batch records (a Kafka fetch's size).

  decode: sluice's AvroFormat.decode (scan, one container block, datafusion's arrow-avro reader, Spark's types)
          vs fastavro.schemaless_reader per record + pa.Table.from_pylist (the per-record Python path)
  encode: AvroFormat.encode (numpy/pyarrow.compute) vs fastavro.schemaless_writer per record from to_pylist rows

Also the first call's warm-up (datafusion's SessionContext) and the fixed cost of one decode call (10 records).
Run: `flock /tmp/sluice-bench.lock .venv/bin/python -m bench.formats_avro [--records 1000000] [--batch 10000]`.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from decimal import Decimal

import fastavro
import numpy as np
import pyarrow as pa

from sluice.formats._avro import AvroFormat
from sluice.formats._codec import RegisteredSchema

SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "updated", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "rate", "type": "float"},
        {"name": "paid", "type": "boolean"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED", "DONE"]}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "address",
            "type": {
                "type": "record",
                "name": "Address",
                "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": "int"}],
            },
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
    ],
}


def rows(n: int, fmt: AvroFormat, schema: RegisteredSchema) -> pa.StructArray:
    rng = np.random.default_rng(7)
    ids = np.arange(n, dtype=np.int64)
    st = fmt.reader_type(schema)
    uuids = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    hexs = [u.tobytes().hex() for u in uuids[: min(n, 1000)]]
    cols = {
        "id": pa.array(ids),
        "customer": pa.array([f"customer-{i % 5000}" for i in range(n)]),
        "amount": pa.array(
            [Decimal(int(v)).scaleb(-2) for v in rng.integers(-(10**9), 10**9, n)], pa.decimal128(12, 2)
        ),
        "created": pa.array(1_700_000_000_000_000 + ids * 1000, pa.timestamp("us", tz="UTC")),
        "updated": pa.array(np.where(ids % 3 == 0, None, 1_700_000_000_000 + ids), pa.timestamp("ms", tz="UTC")),
        "day": pa.array((19_000 + ids % 400).astype(np.int32), pa.date32()),
        "quantity": pa.array(rng.integers(1, 100, n).astype(np.int32)),
        "price": pa.array(rng.random(n) * 100),
        "rate": pa.array(rng.random(n).astype(np.float32)),
        "paid": pa.array(ids % 2 == 0),
        "status": pa.array(np.array(["NEW", "PAID", "SHIPPED", "DONE"])[ids % 4]),
        "ref": pa.array([f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}" for h in hexs] * (n // len(hexs) + 1))[:n],
        "note": pa.array(np.where(ids % 2 == 0, None, "a short note")),
        "address": pa.StructArray.from_arrays(
            [pa.array([f"city-{i % 300}" for i in range(n)]), pa.array((ids % 99999).astype(np.int32))],
            names=["city", "zip"],
        ),
        "tags": pa.array([["a", "bb"] if i % 2 else ["ccc"] for i in range(n)]),
        "attrs": pa.array([[("k", i), ("j", -i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
    }
    return pa.StructArray.from_arrays([cols[f.name].cast(f.type) for f in st], fields=list(st))


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>12,.0f} records/s ({seconds:.2f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--fastavro-records", type=int, default=200_000, help="the per-record baseline's share")
    args = ap.parse_args()
    fmt = AvroFormat()
    schema = RegisteredSchema(1, "AVRO", json.dumps(SCHEMA))
    data = rows(args.records, fmt, schema)
    b = args.batch
    batches = [data.slice(i, b) for i in range(0, len(data), b)]

    t0 = time.perf_counter()
    first = fmt.encode(batches[0].slice(0, 10), schema)
    fmt.decode(first, schema, schema)
    warmup = time.perf_counter() - t0

    t0 = time.perf_counter()
    encoded = [fmt.encode(x, schema) for x in batches]
    enc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    decoded = [fmt.decode(x, schema, schema) for x in encoded]
    dec_s = time.perf_counter() - t0
    assert decoded[0].to_pylist()[:3] == batches[0].to_pylist()[:3]
    calls = 50
    t0 = time.perf_counter()
    for _ in range(calls):
        fmt.decode(first, schema, schema)
    per_call = (time.perf_counter() - t0) / calls

    m = min(args.fastavro_records, len(data))
    parsed = fastavro.parse_schema(SCHEMA)
    pyrows = data.slice(0, m).to_pylist()
    for r in pyrows:  # fastavro wants the uuid as a string and a dict for the map
        r["attrs"] = dict(r["attrs"])
    t0 = time.perf_counter()
    fa_bodies = []
    for r in pyrows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, r)
        fa_bodies.append(buf.getvalue())
    fa_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, m, b):
        recs = [fastavro.schemaless_reader(io.BytesIO(x), parsed, parsed) for x in fa_bodies[i : i + b]]
        pa.Table.from_pylist(recs)
    fa_dec = time.perf_counter() - t0

    n = len(data)
    print(f"{n:,} records of {len(SCHEMA['fields'])} fields, batches of {b:,}")
    print(f"first call (datafusion's SessionContext, 10 records): {warmup * 1000:.0f} ms")
    print(f"one decode call of 10 records, warm: {per_call * 1000:.2f} ms")
    print(f"decode  sluice   {rate(n, dec_s)}   [{n / b:.0f} calls, {dec_s / (n / b) * 1000:.1f} ms a call]")
    print(f"decode  fastavro {rate(m, fa_dec)}   (schemaless_reader per record + Table.from_pylist, {m:,} records)")
    print(f"encode  sluice   {rate(n, enc_s)}")
    print(f"encode  fastavro {rate(m, fa_enc)}   (schemaless_writer per record, {m:,} records)")
    print(f"ratios: decode {fa_dec / m / (dec_s / n):.1f}x, encode {fa_enc / m / (enc_s / n):.1f}x")


if __name__ == "__main__":
    main()
