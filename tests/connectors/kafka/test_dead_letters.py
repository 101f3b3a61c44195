"""Records Kafka refuses for what they hold go to a dead-letter target with errors.tolerance=all, on a real broker: a
record over the topic's max.message.bytes (found before it is sent, or refused by the broker), and with none (the
default) the write fails naming the limit."""

import json
import uuid
from dataclasses import replace

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

import sluice
from sluice.testing import read_committed

pytestmark = pytest.mark.spark

LIMIT = 2000
OVERSIZED = (7, 150, 299)


def make_topic(kafka, partitions=1, **config):
    name = f"t-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions=partitions, config=config or None)
    return name


def rows(spark):
    """300 rows, those of OVERSIZED over LIMIT bytes: one Spark partition, so a refused batch is the whole write."""
    big = " OR ".join(f"id = {i}" for i in OVERSIZED)
    return spark.range(0, 300, 1, 1).selectExpr("concat('order-', id) AS key",
                                                f"IF({big}, repeat('x', 3000), concat('small-', id)) AS value")


def dead_letter_options(kafka, topic, dead):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "errors.tolerance": "all",
            "errors.deadletter.format": "sluice_kafka", "errors.deadletter.topic": dead,
            "errors.deadletter.kafka.bootstrap.servers": kafka.bootstrap_servers}


def test_a_record_over_max_message_bytes_goes_to_a_dead_letter_topic(spark, kafka):
    topic, dead = make_topic(kafka, **{"max.message.bytes": str(LIMIT)}), make_topic(kafka)
    rows(spark).write.format("sluice_kafka").options(**dead_letter_options(kafka, topic, dead)).mode("append").save()

    stored = read_committed(kafka.client_config(), topic)
    assert sorted(r.key.decode() for r in stored) == sorted(f"order-{i}" for i in range(300) if i not in OVERSIZED)
    letters = read_committed(kafka.client_config(), dead)
    assert sorted(json.loads(r.value)["key"] for r in letters) == sorted(f"order-{i}" for i in OVERSIZED)
    assert all(json.loads(r.value)["value"] == "x" * 3000 for r in letters), "the row as the user's columns"
    headers = dict(letters[0].headers)
    assert headers["__sluice.errors.error_class"] == b"OversizedRecordError"
    assert f"over the limit of {LIMIT} bytes per record".encode() in headers["__sluice.errors.error_message"]
    assert headers["__sluice.errors.connector"] == b"sluice_kafka"
    assert topic.encode() in headers["__sluice.errors.target"]
    assert sluice.last_write_summary()["dead_letters"] == 3


def test_without_tolerance_an_oversized_record_fails_the_write_naming_the_limit(spark, kafka):
    topic, dead = make_topic(kafka, **{"max.message.bytes": str(LIMIT)}), make_topic(kafka)
    with pytest.raises(Exception, match=f"key 'order-150' is 3091 bytes, over the limit of {LIMIT} bytes per record"):
        rows(spark).write.format("sluice_kafka") \
            .options(**{"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}).mode("append").save()
    assert read_committed(kafka.client_config(), topic) == []
    assert read_committed(kafka.client_config(), dead) == []


@pytest.mark.parametrize("capped", [True, False])
def test_many_small_records_fit_a_topic_with_a_small_limit(spark, kafka, capped):
    """librdkafka's record batches stay within the topic's max.message.bytes (batch.size capped at it): records that
    each fit are never refused for the batch they were put in. The control sets librdkafka's default batch.size."""
    topic = make_topic(kafka, **{"max.message.bytes": str(LIMIT)})
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}
    df = spark.range(0, 2000, 1, 1).selectExpr("CAST(id AS STRING) AS key", "repeat('v', 40) AS value")
    if not capped:
        with pytest.raises(Exception, match="MSG_SIZE_TOO_LARGE"):
            df.write.format("sluice_kafka").options(**options, **{"kafka.batch.size": "1000000"}) \
                .mode("append").save()
        return
    df.write.format("sluice_kafka").options(**options).mode("append").save()
    assert len(read_committed(kafka.client_config(), topic)) == 2000


@pytest.mark.parametrize("tolerant", [True, False])
def test_a_record_the_broker_refuses_as_too_large_goes_aside_alone(kafka, tolerant):
    """The broker's MSG_SIZE_TOO_LARGE for a record librdkafka put alone in its batch (larger than batch.size) names
    that record: it goes aside, the rest is stored. The plan assumes Kafka's default limit, as the driver does without
    the DescribeConfigs right, so the encoder lets the record through to the broker."""
    from sluice.connectors.kafka import KafkaDataSource
    from sluice.connectors.kafka._sink import KafkaEncoder
    from sluice.engine import AsyncSinkWriter, WriteContext

    topic = make_topic(kafka, **{"max.message.bytes": str(LIMIT)})
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "kafka.batch.size": "1500"}
    if tolerant:
        options.update({"errors.tolerance": "all", "errors.deadletter.format": "sluice_null"})
    source = KafkaDataSource(options)
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    plan = source._plan(schema, overwrite=False, streaming=False)
    plan = replace(plan, record_limit=1_048_588)
    task = plan.open_task(WriteContext(write_id="w", partition_id=0))
    assert isinstance(task.encode, KafkaEncoder) and task.encode.limit == 1_048_588
    refused = []
    batch = pa.RecordBatch.from_pydict({"key": [f"k{i}" for i in range(50)],
                                        "value": ["x" * 3000 if i in (3, 40) else f"v{i}" for i in range(50)]})
    with AsyncSinkWriter(task.store, plan.config, context=WriteContext(write_id="w", partition_id=0),
                         on_refused=lambda entries, errors: refused.append(
                             (task.store.refused_rows(entries), errors))) as writer:
        encoded = task.encode(batch)
        writer.write_chunk(encoded.entries, encoded.sizes)
        if not tolerant:
            with pytest.raises(Exception, match=r"MSG_SIZE_TOO_LARGE.*over the topic's max\.message\.bytes"):
                writer.finish()
            return
        writer.finish()
    keys = sorted(key for table, _ in refused for key in table.column("key").to_pylist())
    assert keys == ["k3", "k40"]
    assert all("MSG_SIZE_TOO_LARGE" in str(e) for _, errors in refused for e in errors)
    stored = read_committed(kafka.client_config(), topic)
    assert sorted(r.key.decode() for r in stored) == sorted(f"k{i}" for i in range(50) if i not in (3, 40))


# ------------------------------------------------------------------ the source: payloads that do not decode


def produce_bad_payloads(kafka, topic, good_payload: bytes) -> None:
    """Offsets 3, 4 and 5: a payload without Confluent's magic byte, one of a schema id the registry does not have,
    and a good payload cut short; offset 6 a good record again."""
    from confluent_kafka import Producer

    producer = Producer(kafka.client_config())
    for value in (b"\x07not-avro", b"\x00" + (987_654).to_bytes(4, "big") + good_payload[5:], good_payload[:6],
                  good_payload):
        producer.produce(topic, value, b"k")
    assert producer.flush(30) == 0


def typed_read(kafka, registry, topic, **more):
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic, "value.format": "avro-confluent",
            "schema-registry.url": registry.ccompat_url, **more}


def test_a_kafka_avro_payload_that_does_not_decode_goes_to_the_dead_letters(spark, kafka, registry):
    topic, dead = make_topic(kafka), make_topic(kafka)
    sluice.write(spark.createDataFrame([(1, "ann"), (2, "bo"), (3, "cy")], "id long, name string").coalesce(1),
                 "sluice_kafka", {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                  "value.format": "avro-confluent", "schema-registry.url": registry.ccompat_url})
    good = read_committed(kafka.client_config(), topic)[0].value
    produce_bad_payloads(kafka, topic, good)

    read = spark.read.format("sluice_kafka").options(**typed_read(
        kafka, registry, topic, **{"errors.tolerance": "all", "errors.deadletter.format": "sluice_kafka",
                                   "errors.deadletter.topic": dead,
                                   "errors.deadletter.kafka.bootstrap.servers": kafka.bootstrap_servers})).load()
    assert sorted((r.offset, r.id) for r in read.select("offset", "id").collect()) == [(0, 1), (1, 2), (2, 3), (6, 1)]

    letters = {json.loads(r.value)["offset"]: r for r in read_committed(kafka.client_config(), dead)}
    assert sorted(letters) == [3, 4, 5]
    record = json.loads(letters[3].value)
    assert (record["topic"], record["partition"], record["key"], record["value"]) == (topic, 0, "k", "\x07not-avro")
    reasons = {offset: dict(r.headers)["__sluice.errors.error_message"].decode() for offset, r in letters.items()}
    assert f"{topic} partition 0 offset 3" in reasons[3] and "magic byte 7" in reasons[3]
    assert "schema id 987654" in reasons[4]
    assert f"{topic} partition 0 offset 5" in reasons[5]
    assert all(dict(r.headers)["__sluice.errors.error_class"] == b"BadPayloadError" for r in letters.values())


def test_a_stream_reads_past_payloads_that_do_not_decode(spark, kafka, registry, tmp_path):
    """The same topic read by a streaming query (availableNow, two micro-batches): it ends with the good records and
    the three bad ones in the dead-letter topic. (The tolerance off: the batch read's negative control below.)"""
    topic, dead = make_topic(kafka), make_topic(kafka)
    sluice.write(spark.createDataFrame([(1, "ann"), (2, "bo"), (3, "cy")], "id long, name string").coalesce(1),
                 "sluice_kafka", {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                                  "value.format": "avro-confluent", "schema-registry.url": registry.ccompat_url})
    produce_bad_payloads(kafka, topic, read_committed(kafka.client_config(), topic)[0].value)
    name = f"dl_{uuid.uuid4().hex[:8]}"
    query = (spark.readStream.format("sluice_kafka").options(**typed_read(
        kafka, registry, topic, **{"errors.tolerance": "all", "errors.deadletter.format": "sluice_kafka",
                                   "errors.deadletter.topic": dead, "max-records-per-trigger": "4",
                                   "errors.deadletter.kafka.bootstrap.servers": kafka.bootstrap_servers}))
             .load().select("offset", "id").writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(tuple(r) for r in spark.table(name).collect()) == [(0, 1), (1, 2), (2, 3), (6, 1)]
    assert sorted(json.loads(r.value)["offset"] for r in read_committed(kafka.client_config(), dead)) == [3, 4, 5]


def test_without_tolerance_a_payload_that_does_not_decode_fails_the_read_naming_its_offset(spark, kafka, registry):
    topic = make_topic(kafka)
    sluice.write(spark.createDataFrame([(1, "ann")], "id long, name string"), "sluice_kafka",
                 {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic,
                  "value.format": "avro-confluent", "schema-registry.url": registry.ccompat_url})
    produce_bad_payloads(kafka, topic, read_committed(kafka.client_config(), topic)[0].value)
    with pytest.raises(Exception, match=rf"{topic} partition 0 offset 1: the value cannot be decoded .*magic byte 7"):
        spark.read.format("sluice_kafka").options(**typed_read(kafka, registry, topic)).load().collect()


# ------------------------------------------------------------------ exactly-once: rows that do not fit the schema


def test_rows_that_do_not_fit_go_aside_once_across_a_rerun_of_an_exactly_once_write(spark, kafka, registry,
                                                                                    tmp_path):
    """Avro values, sink.transactional, dead letters to a transactional topic of their own prefix: each task sends its
    row with a null name aside (RowRefusedError) and commits its records, then its dead letters. Task 1 fails once
    task 0's dead letter is committed; the re-run with the write id sends task 1's only: each good row once in the
    topic, each refused row once in the dead letters. Negative control: another write id sends them all again. (The
    tolerance off: test_formats.py's row that does not fit, refused naming column and key.)"""
    from tests.connectors.kafka.test_exactly_once import fails_once_committed

    topic, dead, marker = make_topic(kafka), make_topic(kafka), tmp_path / "fail"
    marker.touch()
    schema = json.dumps({"type": "record", "name": "T", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})
    rows = [(f"k{i}", i, None if i in (1, 3) else f"n{i}") for i in range(4)]
    guard = fails_once_committed(marker, 3, kafka.client_config(), dead, 1)
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 2), "key string, id long, name string") \
        .select("key", guard("id").alias("id"), "name")
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "value.format": "avro-confluent",
               "schema-registry.url": registry.ccompat_url, "value.schema": schema, "sink.mode": "global-ordered",
               "sink.transactional": "true", "sink.write-id": f"w-{uuid.uuid4().hex[:8]}",
               "errors.tolerance": "all", "errors.deadletter.format": "sluice_kafka", "errors.deadletter.topic": dead,
               "errors.deadletter.kafka.bootstrap.servers": kafka.bootstrap_servers,
               "errors.deadletter.sink.mode": "global-ordered", "errors.deadletter.sink.transactional": "true",
               "errors.deadletter.transactional-id-prefix": f"dl-{uuid.uuid4().hex[:8]}"}

    def letters():
        return sorted(json.loads(r.value)["key"] for r in read_committed(kafka.client_config(), dead))

    with pytest.raises(Exception, match="injected failure at id 3"):
        df.write.format("sluice_kafka").options(**options).mode("append").save()
    assert letters() == ["k1"]
    marker.unlink()
    df.write.format("sluice_kafka").options(**options).mode("append").save()
    assert len(read_committed(kafka.client_config(), topic)) == 2
    assert letters() == ["k1", "k3"]
    record = json.loads(read_committed(kafka.client_config(), dead)[0].value)
    assert record == {"key": "k1", "id": 1, "name": None}, "the row as the DataFrame's columns"
    df.write.format("sluice_kafka").options(**{**options, "sink.write-id": "another"}).mode("append").save()
    assert letters() == ["k1", "k1", "k3", "k3"], "negative control: another write id sends them aside again"


def test_a_transactional_dead_letter_topic_needs_a_prefix_of_its_own(spark, kafka):
    topic = make_topic(kafka)
    with pytest.raises(Exception, match=r"errors\.deadletter\.transactional-id-prefix"):
        spark.range(3).selectExpr("CAST(id AS STRING) AS value").write.format("sluice_kafka").options(**{
            **dead_letter_options(kafka, topic, topic), "sink.mode": "global-ordered", "sink.transactional": "true",
            "errors.deadletter.sink.mode": "global-ordered", "errors.deadletter.sink.transactional": "true"}) \
            .mode("append").save()
