"""Typed payloads through a real schema registry (Apicurio, Confluent's API) and a real broker: key.format and
value.format on the sink and the source. Round trips of every format; v1 and v2 records read with the latest schema;
a schema the registry refuses under BACKWARD with nothing sent; the registry gone mid-read with the per-process
cache carrying on; exactly-once Avro writes counted by a decoding read_committed consumer; a bad payload named by
partition and offset. Each with its negative control."""

import datetime as dt
import json
import uuid
from collections import Counter
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka import Producer

import sluice
from sluice.connector import OptionError, RegistryClient, RegistrySettings
from sluice.connectors.kafka._format_options import payload_format, payloads_of
from sluice.connectors.kafka._options import READ_SPEC, WRITE_SPEC
from sluice.formats._registry import forget_cached_schemas
from sluice.testing import count_written, read_committed
from tests.connectors.kafka.test_exactly_once import fails_once_committed

pytestmark = pytest.mark.spark

FORMAT = "sluice_kafka"


def typed(kafka, registry, topic, fmt="avro-confluent", **more):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "value.format": fmt,
            "schema-registry.url": registry.ccompat_url, **more}


def reading(kafka, registry, topic, fmt="avro-confluent", **more):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic, "value.format": fmt,
            "schema-registry.url": registry.ccompat_url, **more}


def set_compatibility(registry, subject, level):
    RegistryClient(RegistrySettings(registry.ccompat_url)).set_compatibility(subject, level)


# ------------------------------------------------------------------ options, before any server is asked


def test_format_options_are_checked_before_any_read_or_write():
    base = {"kafka.bootstrap.servers": "localhost:9092", "subscribe": "t"}
    with pytest.raises(OptionError, match=r"Did you mean 'value.format'"):
        READ_SPEC.parse({**base, "value.formt": "avro-confluent"})
    with pytest.raises(OptionError, match=r"value.subject only apply with a value format"):
        READ_SPEC.parse({**base, "value.subject": "s"})
    with pytest.raises(OptionError, match=r"schema-registry\.url"):
        READ_SPEC.parse({**base, "value.format": "avro-confluent"})
    with pytest.raises(OptionError, match=r"only apply with key\.format or value.format"):
        READ_SPEC.parse({**base, "schema-registry.url": "http://r:8081"})
    with pytest.raises(OptionError, match=r"value\.schema or value\.schema-version, not both"):
        READ_SPEC.parse({**base, "value.format": "avro-confluent", "schema-registry.url": "http://r:8081",
                         "value.schema": '"string"', "value.schema-version": "2"})
    with pytest.raises(OptionError, match="one topic known before the read"):
        READ_SPEC.parse({**base, "subscribe": "a,b", "value.format": "avro-confluent",
                         "schema-registry.url": "http://r:8081"})
    with pytest.raises(OptionError, match="must be one of raw, avro-confluent"):
        WRITE_SPEC.parse({"kafka.bootstrap.servers": "b:9092", "topic": "t", "value.format": "avro"})
    # the negative control: the same options, complete, parse; the secret is in no repr
    opts = READ_SPEC.parse({**base, "value.format": "avro-confluent", "schema-registry.url": "http://r:8081",
                            "schema-registry.basic-auth.user-info": "me:s3cret-pw"})
    payloads = payloads_of(opts, sink=False)
    assert payloads.value.format == "avro-confluent" and payloads.key.raw
    assert "s3cret-pw" not in repr(opts) and "s3cret-pw" not in repr(payloads)
    with pytest.raises(OptionError) as refused:
        READ_SPEC.parse({**base, "value.format": "avro-confluent", "schema-registry.url": "http://r:8081",
                         "schema-registry.basic-auth.user-info": "no-colon-secret"})
    assert "no-colon-secret" not in str(refused.value)


# ------------------------------------------------------------------ round trips

AVRO_ALL = json.dumps({
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "buyer", "type": {"type": "record", "name": "Buyer", "fields": [
            {"name": "name", "type": "string"}, {"name": "vip", "type": "boolean"}]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "double"}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ]})


def avro_rows(spark):
    return spark.createDataFrame(
        [("k1", 1, Decimal("12.34"), dt.datetime(2026, 1, 2, 3, 4, 5, 6, dt.UTC), dt.date(2026, 1, 2),
          ("ann", True), ["a", "b"], {"w": 1.5}, "NEW", None),
         ("k2", 2, Decimal("-0.01"), dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=dt.UTC), dt.date(1970, 1, 1),
          ("bob", False), [], {}, "PAID", "fragile")],
        "key string, id long, price decimal(10,2), at timestamp, day date, buyer struct<name:string,vip:boolean>, "
        "tags array<string>, attrs map<string,double>, state string, note string")


SIMPLE = "key string, id long, name string, score double, point struct<x:int,y:int>, tags array<string>"
SIMPLE_ROWS = [("k1", 1, "ann", 0.5, (1, 2), ["a"]), ("k2", 2, "bob", -1.0, (3, 4), [])]


@pytest.mark.parametrize("fmt", ["avro-confluent", "protobuf-confluent", "json-confluent"])
def test_round_trip(spark, kafka, registry, new_topic, fmt):
    """The sink encodes under a registered schema (Avro: one given with every logical type; Protobuf and JSON
    Schema: derived from the DataFrame), the source decodes to the same rows, the value's fields as columns.
    Negative control: read raw, each value is Confluent's framing (magic 0, the subject's schema id) and no field
    is a column."""
    topic = new_topic()
    if fmt == "avro-confluent":
        df, more = avro_rows(spark), {"value.schema": AVRO_ALL}
    else:
        df, more = spark.createDataFrame(SIMPLE_ROWS, SIMPLE), {}
    sluice.write(df, FORMAT, typed(kafka, registry, topic, fmt, **more))
    read = spark.read.format(FORMAT).options(**reading(kafka, registry, topic, fmt)).load()
    fields = [c for c in df.columns if c != "key"]
    got = sorted(read.selectExpr("CAST(key AS STRING) AS key", *fields).collect())
    assert [tuple(r) for r in got] == [tuple(r) for r in sorted(df.collect())]
    struct = spark.read.format(FORMAT).options(**reading(kafka, registry, topic, fmt, **{"value.fields": "struct"}))
    assert sorted(r.value.id for r in struct.load().collect()) == [1, 2]

    raw = spark.read.format(FORMAT).options(**kafka_bootstrap(kafka), subscribe=topic).load()
    latest = RegistryClient(payloads_of(READ_SPEC.parse(reading(kafka, registry, topic, fmt)), False).registry) \
        .latest(f"{topic}-value")
    assert not set(fields) & set(raw.columns)
    assert {(bytes(r.value)[0], int.from_bytes(bytes(r.value)[1:5], "big")) for r in raw.collect()} == \
        {(0, latest.schema_id)}


def kafka_bootstrap(kafka):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers}


def test_a_typed_key(spark, kafka, registry, new_topic):
    """key.format: the struct column key is encoded under its own subject (<topic>-key) and read back as a struct.
    Negative control: read raw, the key is Confluent's framing with that subject's schema id."""
    topic = new_topic()
    df = spark.createDataFrame([((7, "eu"), "ann")], "key struct<id:long,region:string>, name string")
    sluice.write(df, FORMAT, typed(kafka, registry, topic, **{"key.format": "avro-confluent"}))
    read = spark.read.format(FORMAT).options(**reading(kafka, registry, topic, **{"key.format": "avro-confluent"}))
    assert [(r.key.id, r.key.region, r.name) for r in read.load().collect()] == [(7, "eu", "ann")]
    raw = spark.read.format(FORMAT).options(**kafka_bootstrap(kafka), subscribe=topic).load().collect()
    key_id = RegistryClient(RegistrySettings(registry.ccompat_url)).latest(f"{topic}-key").schema_id
    assert [(bytes(r.key)[0], int.from_bytes(bytes(r.key)[1:5], "big")) for r in raw] == [(0, key_id)]


# ------------------------------------------------------------------ evolution and compatibility


def test_v1_and_v2_records_are_read_with_the_latest_schema(spark, kafka, registry, new_topic):
    """v1 records (id, name), then v2 (a field added with a default): the latest schema reads both, v1's records
    with the default. Negative control: value.schema-version=1 reads v2's records without the new field."""
    topic = new_topic()
    set_compatibility(registry, f"{topic}-value", "BACKWARD")
    v1 = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})
    sluice.write(spark.createDataFrame([(1, "ann")], "id long, name string"), FORMAT,
                 typed(kafka, registry, topic, **{"value.schema": v1}))
    v2 = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None}]})
    sluice.write(spark.createDataFrame([(2, "bob", "b@x")], "id long, name string, email string"), FORMAT,
                 typed(kafka, registry, topic, **{"value.schema": v2}))
    latest = spark.read.format(FORMAT).options(**reading(kafka, registry, topic)).load()
    assert sorted((r.id, r.name, r.email) for r in latest.collect()) == [(1, "ann", None), (2, "bob", "b@x")]
    first = spark.read.format(FORMAT).options(**reading(kafka, registry, topic, **{"value.schema-version": "1"}))
    first = first.load()
    assert "email" not in first.columns and sorted((r.id, r.name) for r in first.collect()) == [(1, "ann"),
                                                                                                (2, "bob")]


@pytest.mark.parametrize("level", ["BACKWARD", "NONE"], ids=["refused", "negative-control-none"])
def test_an_incompatible_schema_is_refused_by_the_registry_and_nothing_is_sent(spark, kafka, registry, new_topic,
                                                                                level):
    topic = new_topic()
    set_compatibility(registry, f"{topic}-value", level)
    sluice.write(spark.createDataFrame([(1, "ann")], "id long, name string"), FORMAT, typed(kafka, registry, topic))
    assert count_written(kafka.client_config(), topic) == 1
    changed = spark.createDataFrame([("one", "ann")], "id string, name string")  # id's type changed
    if level == "BACKWARD":
        with pytest.raises(Exception, match=r"(?i)incompatible|409"):
            sluice.write(changed, FORMAT, typed(kafka, registry, topic))
        assert count_written(kafka.client_config(), topic) == 1, "nothing was sent"
    else:
        sluice.write(changed, FORMAT, typed(kafka, registry, topic))
        assert count_written(kafka.client_config(), topic) == 2


# ------------------------------------------------------------------ failures


def test_the_writer_schema_cache_carries_on_when_the_registry_is_gone(kafka, registry, new_topic):
    """Records of schema A read (A fetched once), the registry stopped mid-read: more records of A still decode, from
    this process's cache. Negative control: a record of schema B, registered but never fetched, fails, named by its
    partition and offset and the registry's URL. The registry started again (its data kept): B reads."""
    from sluice.connector import Split, frame_payloads
    from sluice.connectors.kafka._datasource import KafkaDataSource
    from sluice.connectors.kafka._reader import KafkaSplitReader

    topic = new_topic()
    avro = payload_format("avro-confluent")
    options = reading(kafka, registry, topic, **{"timeout-ms": "2000"})  # the stopped registry: asked for 2 s
    client = RegistryClient(payloads_of(READ_SPEC.parse(options), False).registry)
    schema_a = client.register(f"{topic}-value", "AVRO", json.dumps(
        {"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"}]}))
    schema_b = client.register(f"{topic}-value", "AVRO", json.dumps(
        {"type": "record", "name": "T", "fields": [{"name": "id", "type": "long"},
                                                   {"name": "n", "type": "int", "default": 0}]}))
    producer = Producer(kafka.client_config())
    for schema, ids in ((schema_a, [1, 2, 3, 4]), (schema_b, [5])):
        rows = pa.StructArray.from_arrays([pa.array(ids, pa.int64())] +
                                          ([pa.array([7], pa.int32())] if schema is schema_b else []),
                                          names=["id", "n"][:1 + (schema is schema_b)])
        for value in frame_payloads(avro.encode(rows, schema), schema.schema_id).to_pylist():
            producer.produce(topic, value)
    assert producer.flush(30) == 0
    forget_cached_schemas()  # registering cached both: this process has seen neither

    source = KafkaDataSource({**options, "value.schema-version": "1"})
    reader = KafkaSplitReader(source._options_resolved(), source.schema())
    split = Split(f"{topic}:0")

    def ids(start, end):
        return [i for batch in reader.read(split, start, end) for i in batch.column("id").to_pylist()]

    assert ids(0, 2) == [1, 2]
    registry.stop(keep_data=True)
    try:
        assert ids(2, 4) == [3, 4], "schema A from this process's cache"
        with pytest.raises(Exception, match=rf"{topic} partition 0 offset 4: .*schema id {schema_b.schema_id}: "
                                            rf".*{registry.ccompat_url}"):
            ids(4, 5)
    finally:
        registry.start()
    assert ids(4, 5) == [5]


def test_a_bad_payload_is_named_by_partition_and_offset(spark, kafka, registry, new_topic):
    """A good record at offset 0, a payload without Confluent's magic byte at 1: the read fails naming partition 0,
    offset 1 and why. Negative control: the read up to offset 1 reads the good record."""
    topic = new_topic()
    sluice.write(spark.createDataFrame([(1,)], "id long"), FORMAT, typed(kafka, registry, topic))
    producer = Producer(kafka.client_config())
    producer.produce(topic, b"\x07not-avro")
    assert producer.flush(30) == 0
    with pytest.raises(Exception, match=rf"{topic} partition 0 offset 1: the value cannot be decoded .*magic"):
        spark.read.format(FORMAT).options(**reading(kafka, registry, topic)).load().collect()
    good = spark.read.format(FORMAT).options(**reading(kafka, registry, topic)) \
        .option("endingOffsets", json.dumps({topic: {"0": 1}})).load()
    assert [r.id for r in good.collect()] == [1]


def test_a_row_that_does_not_fit_is_refused_naming_column_and_key(spark, kafka, registry, new_topic):
    """A null in a field the schema has as non-null: the write fails naming the column and the row's key, and,
    exactly-once, nothing of the task is visible. Negative control: the same write without that row."""
    topic = new_topic()
    schema = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})
    options = typed(kafka, registry, topic, **{"value.schema": schema, "sink.mode": "global-ordered",
                                               "sink.transactional": "true"})
    rows = [("k1", 1, "ann"), ("k2", 2, None), ("k3", 3, "cy")]
    df = spark.createDataFrame(rows, "key string, id long, name string").coalesce(1)
    with pytest.raises(Exception, match=r"the row with key 'k2' .*column 'name'"):
        sluice.write(df, FORMAT, options)
    assert read_committed(kafka.client_config(), topic) == []
    sluice.write(df.where("name IS NOT NULL"), FORMAT, options)
    assert len(read_committed(kafka.client_config(), topic)) == 2


def decoded_ids(kafka, topic, registry_settings) -> list[int]:
    """What a read_committed consumer reads, decoded (Confluent's framing, then Avro)."""
    from sluice.connector import split_payloads

    values = pa.array([r.value for r in read_committed(kafka.client_config(), topic)], pa.binary())
    if not len(values):
        return []
    framed = split_payloads(values)
    schema_ids, bodies = framed.schema_ids, framed.bodies
    client, avro = RegistryClient(registry_settings), payload_format("avro-confluent")
    out = []
    for schema_id in sorted(set(int(i) for i in schema_ids)):
        writer = client.schema_by_id(schema_id)
        mine = pa.array([i for i, s in enumerate(schema_ids) if int(s) == schema_id])
        out += avro.decode(bodies.take(mine), writer, writer).field("id").to_pylist()
    return out


def test_exactly_once_with_avro_values(spark, kafka, registry, new_topic, tmp_path):
    """Task 0 commits, task 1 fails: a read_committed consumer decoding the values sees task 0's rows once; the
    re-run with the write id completes without duplicates. Negative control: another write id writes all again."""
    topic, marker = new_topic(), tmp_path / "fail"
    marker.touch()
    rows = spark.range(0, 200, 1, 2).select(fails_once_committed(marker, 150, kafka.client_config(), topic, 100)
                                            ("id").alias("id"))
    options = typed(kafka, registry, topic, **{"sink.mode": "global-ordered", "sink.transactional": "true",
                                               "sink.write-id": f"avro-{uuid.uuid4().hex[:6]}"})
    settings = payloads_of(WRITE_SPEC.parse(options), sink=True).registry
    with pytest.raises(Exception, match="injected failure at id 150"):
        sluice.write(rows, FORMAT, options)
    assert sorted(decoded_ids(kafka, topic, settings)) == list(range(100))
    marker.unlink()
    sluice.write(rows, FORMAT, options)
    assert sorted(decoded_ids(kafka, topic, settings)) == list(range(200))
    sluice.write(rows, FORMAT, {**options, "sink.write-id": "another"})
    counts = Counter(decoded_ids(kafka, topic, settings))
    assert len(counts) == 200 and set(counts.values()) == {2}


def test_protobuf_writes_a_decimal_and_a_date_under_its_derived_schema(spark, kafka, registry, new_topic):
    """Protobuf has no decimal or date: the schema derived from the DataFrame holds them as text and int32 days, and
    the sink writes the DataFrame's own decimal and date columns under it (read back as those)."""
    topic = new_topic()
    df = spark.createDataFrame([("k1", Decimal("12.34"), dt.date(1970, 1, 3))], "key string, price decimal(10,2), "
                               "day date")
    sluice.write(df, FORMAT, typed(kafka, registry, topic, "protobuf-confluent"))
    read = spark.read.format(FORMAT).options(**reading(kafka, registry, topic, "protobuf-confluent")).load()
    assert [(r.price, r.day) for r in read.collect()] == [("12.34", 2)]
