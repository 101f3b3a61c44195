"""Exactly-once into Kafka across a broker killed mid-transaction, on three brokers (replication factor 3,
min.insync.replicas=2): the leader of the topic's partition is SIGKILLed while the task's transaction is open."""

import uuid
from collections import Counter

import pytest

from sluice.testing import count_written, read_committed
from tests.faults import Striker, held_at, poll_until

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(kafka_cluster):
    return kafka_cluster  # the suite's three brokers (tests/conftest.py)


def leader_of(cluster, topic) -> int:
    metadata = cluster.admin().list_topics(topic, timeout=30)
    return metadata.topics[topic].partitions[0].leader


def test_a_broker_killed_mid_transaction(spark, cluster, small_arrow_batches, tmp_path):
    topic, hold = f"eo-{uuid.uuid4().hex[:10]}", tmp_path / "hold"
    cluster.create_topic(topic, partitions=1)
    hold.touch()
    df = spark.range(0, 3000, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(1500, str(hold), 50, 0.02), "id long, pad string") \
        .selectExpr("concat(CAST(id AS STRING), ':', pad) AS value")  # ~1 KB: reaches the writer as it is made
    seen = {}

    def strike():
        try:
            poll_until(lambda: count_written(cluster.client_config(), topic) >= 300, 120,
                       f"the sink sending 300 records into {topic}")
            leader = leader_of(cluster, topic)
            broker = next(b for b in cluster.brokers if b.node_id == leader)
            broker.kill()
            seen["killed"] = leader
        finally:
            hold.unlink()

    striker = Striker(strike)
    striker.start()
    options = {"kafka.bootstrap.servers": cluster.bootstrap_servers, "topic": topic, "sink.mode": "global-ordered",
               "sink.transactional": "true", "sink.batch.max-size": "50", "sink.flush-buffer.timeout": "50",
               "timeout-ms": "60000"}
    try:
        df.write.format("sluice_kafka").options(**options).mode("append").save()
    finally:
        striker.join()
    assert "killed" in seen
    values = [int(r.value.split(b':')[0]) for r in read_committed(cluster.client_config(), topic)]
    counts = Counter(values)
    assert (len(values), len(counts)) == (3000, 3000), f"{len(values) - len(counts)} duplicates"
    assert values == list(range(3000)), "exactly once, and in order"
