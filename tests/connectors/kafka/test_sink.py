"""format("sluice_kafka") writes on a real broker (LocalKafka), counted by a read_committed consumer: Spark's Kafka sink
columns, a topic per row, the modes, and every bad input refused with the option, column, key or limit named."""

import time
import uuid
from collections import defaultdict

import pytest

import sluice
from sluice.testing import read_committed

pytestmark = pytest.mark.spark


def make_topic(kafka, partitions=2, **config):
    name = f"t-{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions=partitions, config=config or None)
    return name


def opts(kafka, topic=None, **more):
    base = {"kafka.bootstrap.servers": kafka.bootstrap_servers}
    if topic:
        base["topic"] = topic
    return {**base, **more}


def test_a_batch_write_lands_once_per_row(spark, kafka):
    topic = make_topic(kafka)
    df = spark.range(0, 3000, 1, 2).selectExpr("CAST(id AS STRING) AS key", "CAST(id * 10 AS STRING) AS value")
    df.write.format("sluice_kafka").options(**opts(kafka, topic)).mode("append").save()
    records = read_committed(kafka.client_config(), topic)
    assert sorted(int(r.value) for r in records) == [i * 10 for i in range(3000)]
    assert all(int(r.key) * 10 == int(r.value) for r in records)
    assert sluice.last_write_summary()["records"] == 3000


def test_keys_land_where_javas_partitioner_puts_them(spark, kafka):
    """murmur2 of the key, as Spark's Kafka sink and Java producers choose the partition (librdkafka's own default
    would not): the partition of a few keys computed by Kafka's Utils.murmur2 (positive % 3)."""
    topic = make_topic(kafka, partitions=3)
    spark.createDataFrame([("a", "1"), ("b", "2"), ("c", "3"), ("sluice", "4")], "key string, value string") \
        .write.format("sluice_kafka").options(**opts(kafka, topic)).mode("append").save()
    placed = {r.key: r.partition for r in read_committed(kafka.client_config(), topic)}
    assert placed == {b"a": murmur2_partition(b"a", 3), b"b": murmur2_partition(b"b", 3),
                      b"c": murmur2_partition(b"c", 3), b"sluice": murmur2_partition(b"sluice", 3)}


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Utils.murmur2 (org.apache.kafka.common.utils), then toPositive(hash) % partitions."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(key[i * 4:i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_a_topic_per_row(spark, kafka):
    a, b = make_topic(kafka), make_topic(kafka)
    df = spark.range(0, 100, 1, 2).selectExpr(f"IF(id % 3 = 0, '{a}', '{b}') AS topic", "CAST(id AS STRING) AS value")
    df.write.format("sluice_kafka").options(**opts(kafka)).mode("append").save()
    assert sorted(int(r.value) for r in read_committed(kafka.client_config(), a)) == list(range(0, 100, 3))
    assert sorted(int(r.value) for r in read_committed(kafka.client_config(), b)) == \
        [i for i in range(100) if i % 3]
    # The topic option overrides the column, as in Spark's Kafka sink.
    c = make_topic(kafka)
    df.write.format("sluice_kafka").options(**opts(kafka, c)).mode("append").save()
    assert len(read_committed(kafka.client_config(), c)) == 100


def test_headers_partition_and_timestamp_columns(spark, kafka):
    topic = make_topic(kafka, partitions=3)
    df = spark.createDataFrame(
        [(b"k1", b"v1", [("trace", b"t-1"), ("n", b"1")], 2, "2026-01-02 03:04:05.678"),
         (None, None, [], None, None),
         (b"k3", b"v3", None, 0, "1999-12-31 23:59:59.001")],
        "key binary, value binary, headers array<struct<key:string,value:binary>>, partition int, ts string") \
        .selectExpr("key", "value", "headers", "partition", "to_timestamp(ts) AS timestamp")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        df.write.format("sluice_kafka").options(**opts(kafka, topic)).mode("append").save()
    finally:
        spark.conf.unset("spark.sql.session.timeZone")
    got = {r.value: r for r in read_committed(kafka.client_config(), topic)}
    assert set(got) == {b"v1", None, b"v3"}
    assert got[b"v1"].partition == 2 and got[b"v1"].key == b"k1"
    assert list(got[b"v1"].headers) == [("trace", b"t-1"), ("n", b"1")]
    assert got[b"v1"].timestamp == 1767323045678
    assert got[b"v3"].partition == 0 and got[b"v3"].timestamp == 946684799001
    assert got[None].key is None, "a null value is a tombstone, written as such"
    assert not got[b"v3"].headers


def test_partition_ordered_keeps_each_keys_order(spark, kafka):
    topic = make_topic(kafka, partitions=3)
    df = spark.range(0, 6000, 1, 2).selectExpr("CAST(id % 50 AS STRING) AS key", "CAST(id AS STRING) AS value")
    sluice.write(df, "sluice_kafka", opts(kafka, topic, **{"sink.mode": "partition-ordered",
                                                           "sink.batch.max-size": "100"}))
    by_key = defaultdict(list)
    for r in sorted(read_committed(kafka.client_config(), topic), key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append(int(r.value))
    assert len(by_key) == 50 and sum(len(v) for v in by_key.values()) == 6000
    assert all(values == sorted(values) for values in by_key.values()), "each key's records in the input's order"


# ---------------------------------------------------------------------------------------------- bad input


def test_an_unknown_topic_is_refused_before_the_write(spark, kafka):
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=r"topic\(s\) \['no-such-topic'\] do not exist"):
        df.write.format("sluice_kafka").options(**opts(kafka, "no-such-topic")).mode("append").save()


def test_an_unknown_topic_in_the_topic_column_is_refused_naming_it(spark, kafka):
    known = make_topic(kafka)
    df = spark.range(0, 10, 1, 1).selectExpr(f"IF(id < 5, '{known}', 'not-there') AS topic",
                                             "CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="topic 'not-there' \\(column 'topic'\\) does not exist"):
        df.write.format("sluice_kafka").options(**opts(kafka)).mode("append").save()
    assert read_committed(kafka.client_config(), known) == [], "refused before any row of the batch was sent"


def test_unreachable_servers_fail_within_the_timeout_naming_them(spark):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    started = time.monotonic()
    with pytest.raises(Exception, match=f"kafka.bootstrap.servers=127.0.0.1:{port} answered within 2000 ms") as e:
        df.write.format("sluice_kafka").options(**{"kafka.bootstrap.servers": f"127.0.0.1:{port}", "topic": "t",
                                                   "timeout-ms": "2000", "kafka.sasl.password": "hunter2-secret"}) \
            .mode("append").save()
    assert time.monotonic() - started < 30
    assert "hunter2-secret" not in str(e.value)


def test_a_record_over_the_topics_limit_is_refused_naming_its_key_and_the_limit(spark, kafka):
    topic = make_topic(kafka, partitions=1, **{"max.message.bytes": "2000"})
    df = spark.range(0, 10, 1, 1).selectExpr("concat('order-', id) AS key",
                                             "IF(id = 7, repeat('x', 3000), 'small') AS value")
    with pytest.raises(Exception, match="key 'order-7' is 3089 bytes, over the limit of 2000 bytes"):
        df.write.format("sluice_kafka").options(**opts(kafka, topic)).mode("append").save()
    assert read_committed(kafka.client_config(), topic) == [], "nothing of the refused batch was sent"


@pytest.mark.parametrize(("select", "message"), [
    (["CAST(id AS STRING) AS key"], "needs a 'value' column"),
    (["id AS key", "CAST(id AS STRING) AS value"], "column 'key' is bigint; Kafka's key must be string or binary"),
    (["CAST(id AS STRING) AS value", "id AS extra"], r"also has \['extra'\], which would be dropped"),
    (["CAST(id AS STRING) AS value", "CAST(id AS STRING) AS headers"], "column 'headers' is string"),
])
def test_wrong_columns_are_refused_before_the_write(spark, kafka, select, message):
    topic = make_topic(kafka)
    with pytest.raises(Exception, match=message):
        spark.range(3).selectExpr(*select).write.format("sluice_kafka").options(**opts(kafka, topic)) \
            .mode("append").save()
    assert read_committed(kafka.client_config(), topic) == []


@pytest.mark.parametrize(("extra", "message"), [
    ({"kafka.transactional.id": "x"}, "sink.transactional=true"),
    ({"kafka.no.such.setting": "1"}, "No such configuration property"),
    ({"topik": "x"}, "Did you mean 'topic'"),
    ({"transaction.timeout-ms": "5000"}, "only applies to sink.transactional=true"),
])
def test_bad_options_are_refused_before_the_write(spark, kafka, extra, message):
    topic = make_topic(kafka)
    with pytest.raises(Exception, match=message):
        spark.range(3).selectExpr("CAST(id AS STRING) AS value").write.format("sluice_kafka") \
            .options(**opts(kafka, topic, **extra)).mode("append").save()


def test_secrets_stay_out_of_the_plan_and_errors(spark, kafka):
    from sluice.connectors.kafka import KafkaDataSource

    source = KafkaDataSource({"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": "t",
                              "kafka.sasl.password": "hunter2-secret", "kafka.sasl.username": "u",
                              "kafka.ssl.keystore.password": "store-secret", "kafka.sasl.oauthbearer.config": "x"})
    shown = repr(source.write_options())
    assert "hunter2-secret" not in shown and "store-secret" not in shown and "<redacted>" in shown


def test_a_partition_the_topic_lacks_fails_the_write_naming_it(spark, kafka):
    topic = make_topic(kafka, partitions=2)
    df = spark.range(0, 1, 1, 1).selectExpr("'k' AS key", "'v' AS value", "5 AS partition")
    with pytest.raises(Exception, match="the partition column names a partition the topic does not have"):
        df.write.format("sluice_kafka").options(**opts(kafka, topic)).mode("append").save()
    assert read_committed(kafka.client_config(), topic) == []
