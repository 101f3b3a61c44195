"""The sink and the source on every Kafka line the tests pin (sluice.testing._kafka.KAFKA_VERSIONS: 4.1 and 3.9):
an exactly-once batch write counted by a read_committed consumer, the same write re-run with its write id adding
nothing (the commit marker, KIP-447's offsets in a transaction), and the source reading it all back. One broker of
each version, started for its test."""

import re
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

import sluice
from sluice.testing import LocalKafka, read_committed
from sluice.testing._kafka import KAFKA_VERSIONS

pytestmark = pytest.mark.spark

ROWS = 1000


@pytest.mark.parametrize("version", KAFKA_VERSIONS)
def test_an_exactly_once_write_is_read_back_on_each_kafka_line(spark, version):
    with LocalKafka(version=version) as kafka:
        assert f"Kafka version: {version}" in (kafka.folder / "server.log").read_text()  # the broker that runs
        topic = f"v_{uuid.uuid4().hex[:10]}"
        kafka.create_topic(topic, 2)
        rows = spark.range(0, ROWS, 1, 2).selectExpr("CAST(id AS STRING) AS value")
        options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "sink.mode": "global-ordered",
                   "sink.transactional": "true", "sink.write-id": f"versions-{version}"}
        sluice.write(rows, "sluice_kafka", options)
        sluice.write(rows, "sluice_kafka", options)  # re-run with its write id: every task's marker says done
        committed = read_committed(kafka.client_config(), topic)
        assert sorted(int(r.value) for r in committed) == list(range(ROWS))
        admin = kafka.admin()  # kept until its futures are done: its end would fail them
        ends = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in (0, 1)})
        assert sum(f.result(30).offset for f in ends.values()) > ROWS  # commit markers took offsets: transactions
        back = spark.read.format("sluice_kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
            .option("subscribe", topic).load().selectExpr("CAST(value AS STRING) AS value").collect()
        assert sorted(int(r.value) for r in back) == list(range(ROWS))


def test_a_version_the_tests_do_not_pin_is_refused_naming_the_pinned_ones():
    pinned = ", ".join(KAFKA_VERSIONS)
    with pytest.raises(ValueError, match=re.escape(f"'2.8.2' is not one the tests pin: one of {pinned}")):
        LocalKafka(version="2.8.2")
