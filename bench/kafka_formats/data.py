"""The benchmark's records: an order of 15 fields (a decimal, a timestamp, a date, a nested record, an array, an
optional string), its Avro schema, the Spark expressions that make N of them from ids, and the untimed producer that
writes them once into a topic in Confluent's wire format (fastavro per record: setup, not a contender)."""

from __future__ import annotations

import io
import json
import struct
import time
from typing import Any

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Order", "namespace": "bench.kafka_formats",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
        {"name": "quantity", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "discount", "type": "float"},
        {"name": "paid", "type": "boolean"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ship_date", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "city", "type": "string"},
            {"name": "zip", "type": "string"}, {"name": "country", "type": "string"}]}},
        {"name": "payload", "type": "bytes"},
        {"name": "version", "type": "int"},
    ],
}
SCHEMA_JSON = json.dumps(AVRO_SCHEMA)
FIELDS = [f["name"] for f in AVRO_SCHEMA["fields"]]

# Each field from the row's id (spark.range's `id`), in the schema's order and Spark types; coalesce(...) with a
# literal makes a column non-nullable where the schema's field is not optional, so that Spark's schema is the Avro
# schema's (what a DataFrame-derived schema would be, and no nullable-to-required warning from to_avro).
EXPRESSIONS = {
    "id": "id",
    "customer": "coalesce(concat('customer-', CAST(id % 100000 AS STRING)), '')",
    "email": "CASE WHEN id % 5 = 0 THEN NULL ELSE concat('user', CAST(id AS STRING), '@example.com') END",
    "quantity": "coalesce(CAST(id % 100 AS INT), 0)",
    "price": "CAST(id AS DOUBLE) * 0.37",
    "discount": "coalesce(CAST((id % 20) / 100.0 AS FLOAT), CAST(0 AS FLOAT))",
    "paid": "coalesce(id % 3 = 0, false)",
    "amount": "coalesce(CAST((id % 1000000000) / 100.0 AS DECIMAL(12, 2)), CAST(0 AS DECIMAL(12, 2)))",
    "created_at": "timestamp_micros(1767225600000000 + id * 1000003)",
    "ship_date": "coalesce(date_add(DATE'2026-01-01', CAST(id % 365 AS INT)), DATE'2026-01-01')",
    "status": "element_at(array('new', 'paid', 'shipped', 'returned'), CAST(id % 4 AS INT) + 1)",
    "tags": "transform(array(concat('t', CAST(id % 7 AS STRING)), concat('t', CAST(id % 11 AS STRING))), "
            "t -> coalesce(t, ''))",
    "address": "named_struct('street', coalesce(concat(CAST(id % 1000 AS STRING), ' Main Street'), ''), 'city', "
               "coalesce(concat('city-', CAST(id % 500 AS STRING)), ''), 'zip', "
               "coalesce(lpad(CAST(id % 100000 AS STRING), 5, '0'), ''), 'country', 'NL')",
    "payload": "coalesce(unhex(md5(CAST(id AS STRING))), X'')",
    "version": "1",
}
assert list(EXPRESSIONS) == FIELDS
CHUNK = 100_000


def confluent_header(schema_id: int) -> bytes:
    """Confluent's wire format before the body: the magic byte 0 and the schema id, 4 bytes big-endian."""
    return b"\x00" + struct.pack(">I", schema_id)


def orders(spark: Any, rows: int, partitions: int = 2) -> Any:
    """A cached DataFrame of `rows` orders (key: the id as text, then the schema's fields as columns)."""
    df = spark.range(0, rows, 1, partitions).selectExpr(
        "CAST(CAST(id AS STRING) AS BINARY) AS key", *(f"{e} AS {name}" for name, e in EXPRESSIONS.items())).cache()
    assert df.count() == rows
    return df


def sample_of(df: Any) -> dict[int, dict[str, Any]]:
    """Every 1000th order of `df` by id, as dicts (fastavro's Python values), for checking what the sinks write."""
    return {r["id"]: r for r in df.where("id % 1000 = 0").drop("key").toArrow().to_pylist()}


def produce_avro(df: Any, config: dict[str, Any], topic: str, schema_id: int) -> None:
    """Writes every order of `df` into `topic` as Confluent Avro (key: the id as text), one fastavro encode per
    record."""
    import fastavro
    from confluent_kafka import Producer

    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    header = confluent_header(schema_id)
    producer = Producer({**config, "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none"})
    failed: list[Any] = []
    buffer = io.BytesIO()
    started = time.perf_counter()
    rows = df.count()
    for low in range(0, rows, CHUNK):  # a chunk of ids at a time: the whole DataFrame is more than a driver's heap
        chunk = df.where(f"id >= {low} AND id < {low + CHUNK}").drop("key").toArrow()
        for record in chunk.to_pylist():
            buffer.seek(0)
            buffer.truncate()
            fastavro.schemaless_writer(buffer, parsed, record)
            while True:
                try:
                    producer.produce(topic, header + buffer.getvalue(), str(record["id"]).encode(),
                                     on_delivery=lambda err, _: err and failed.append(err))
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
    left = producer.flush(120)
    if failed or left:
        raise SystemExit(f"producing {topic}: {len(failed)} record(s) refused, {left} unacknowledged: {failed[:1]}")
    print(f"  produced {topic} in {time.perf_counter() - started:.1f} s (untimed setup)", flush=True)


def check_avro_sample(records: list[Any], schema_text: str, schema_id: int, sample: dict[int, dict[str, Any]],
                      what: str) -> None:
    """Decodes the sampled ids among `records` (KafkaRecord) with fastavro and compares them with what was made:
    a contender that wrote another wire format, schema id or value fails the run."""
    import fastavro

    parsed = fastavro.parse_schema(json.loads(schema_text))
    checked = 0
    for r in records:
        key = int(r.key)
        if key not in sample:
            continue
        if r.value[:5] != confluent_header(schema_id):
            raise SystemExit(f"{what}: record of key {key} starts {r.value[:5]!r}, not Confluent's header of "
                             f"schema id {schema_id}")
        got = fastavro.schemaless_reader(io.BytesIO(r.value[5:]), parsed, parsed)
        if got != sample[key]:
            raise SystemExit(f"{what}: record of key {key} decodes to {got}, not {sample[key]}")
        checked += 1
    if checked != len(sample):
        raise SystemExit(f"{what}: {checked} of the {len(sample)} sampled keys found")
