"""The test Kafka (sluice.testing.LocalKafka, LocalKafkaCluster): records produced and read back, transactions as a
read_committed consumer sees them (a read_uncommitted one, the negative control, sees the aborted records too), a
restart on the same data, SASL over TLS with a wrong password and a missing CA refused, and a three-broker cluster
writing with acks=all through the loss of a broker (a topic that needs all three replicas, the negative control,
cannot). One single-node broker for the module (a start takes ~5 s)."""

import os
import uuid

import pytest
from confluent_kafka import KafkaError, Producer

from sluice.testing import LocalKafka, count_committed, read_committed


@pytest.fixture(scope="module")
def kafka():
    with LocalKafka() as server:
        yield server


def new_topic(kafka, partitions: int = 1) -> str:
    """A topic of its own for a test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    kafka.create_topic(name, partitions)
    return name


def produce(config: dict, topic: str, count: int, *, start: int = 0, **settings) -> None:
    producer = Producer({**config, **settings})
    errors: list = []
    for i in range(start, start + count):
        producer.produce(topic, key=f"k{i % 7}".encode(), value=f"v{i}".encode(), headers=[("n", str(i).encode())],
                         on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(60) == 0
    assert errors == []


def test_produce_and_read(kafka):
    assert kafka.bootstrap_servers == f"127.0.0.1:{kafka.port}" and kafka.pid
    topic = new_topic(kafka, 3)
    produce(kafka.client_config(), topic, 90)
    records = read_committed(kafka.client_config(), topic)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(90))
    assert {r.partition for r in records} == {0, 1, 2}
    for r in records:  # a key's records share a partition; headers and timestamps come back
        assert r.headers == [("n", r.value[1:])] and r.timestamp > 0
    by_key = {}
    for r in records:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in by_key.values())
    assert (kafka.folder / "server.log").stat().st_size > 0  # the log4j binding works: the broker logs


def test_unknown_topic_is_not_created(kafka):
    producer = Producer(kafka.client_config(**{"message.timeout.ms": 3000}))
    errors: list = []
    producer.produce("no_such_topic", b"v", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(30)
    # librdkafka waits for the topic to appear until the message times out.
    assert [e.code() for e in errors] in ([KafkaError.UNKNOWN_TOPIC_OR_PART], [KafkaError._MSG_TIMED_OUT])
    topic = kafka.admin().list_topics("no_such_topic", timeout=10).topics["no_such_topic"]
    assert topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_transactions_read_committed(kafka):
    topic = new_topic(kafka, 2)
    producer = Producer(kafka.client_config(**{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"c", value=f"committed{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"a", value=f"aborted{i}".encode())
    producer.flush(30)  # the aborted records are in the log before the abort
    producer.abort_transaction(30)
    committed = read_committed(kafka.client_config(), topic)
    assert [r.value for r in committed] == [f"committed{i}".encode() for i in range(5)]
    # The negative control: without read_committed the aborted records are read too.
    everything = read_committed(kafka.client_config(), topic, isolation="read_uncommitted")
    assert sorted(r.value for r in everything) == sorted(
        [f"committed{i}".encode() for i in range(5)] + [f"aborted{i}".encode() for i in range(3)])
    # Transaction markers take offsets: the partition of key "a" ends past its records.
    assert count_committed(kafka.client_config(), topic) == 5


def test_open_transaction_holds_back_read_committed(kafka):
    topic = new_topic(kafka)
    produce(kafka.client_config(), topic, 2)
    producer = Producer(kafka.client_config(**{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open")
    producer.flush(30)
    produce(kafka.client_config(), topic, 2, start=2)  # after the open transaction's record
    assert [r.value for r in read_committed(kafka.client_config(), topic)] == [b"v0", b"v1"]
    producer.commit_transaction(30)
    assert [r.value for r in read_committed(kafka.client_config(), topic)] == [b"v0", b"v1", b"open", b"v2", b"v3"]


def test_kill_and_restart_keep_records(kafka):
    topic = new_topic(kafka, 2)
    produce(kafka.client_config(), topic, 40, acks="all")
    pid, port = kafka.pid, kafka.port
    kafka.kill()
    assert kafka.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    kafka.start()
    assert kafka.port == port and kafka.pid != pid
    assert count_committed(kafka.client_config(), topic) == 40
    kafka.stop(keep_data=True)  # a clean shutdown
    kafka.start()
    produce(kafka.client_config(), topic, 10, start=40)
    assert count_committed(kafka.client_config(), topic) == 50


def test_missing_jars_name_the_make_target(monkeypatch, tmp_path):
    monkeypatch.setenv("SLUICE_KAFKA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="make check-kafka"):
        LocalKafka().start()


def authentication_errors(config: dict) -> list:
    """The errors a producer reports while trying to reach the broker with `config` (until it reports one)."""
    errors: list = []
    producer = Producer({**config, "error_cb": errors.append})
    for _ in range(100):
        producer.poll(0.2)
        if errors:
            break
    return errors


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl(mechanism):
    with LocalKafka(sasl=mechanism, tls=True, heap_mb=256) as server:
        config = server.client_config()
        assert config["security.protocol"] == "SASL_SSL" and config["sasl.mechanism"] == mechanism
        assert server.ca_pem and server.ca_path.read_text() == server.ca_pem
        topic = "secured"
        server.create_topic(topic, 1)
        produce(config, topic, 5)
        assert count_committed(config, topic) == 5
        wrong = authentication_errors({**config, "sasl.password": "wrong"})
        assert wrong and wrong[0].code() == KafkaError._AUTHENTICATION
        # TLS is on: without the broker's certificate to verify against, the client refuses it.
        no_ca = {k: v for k, v in config.items() if k != "ssl.ca.location"}
        no_ca["ssl.ca.location"] = "probe"  # librdkafka's own default trust store, which lacks the test certificate
        untrusted = authentication_errors(no_ca)
        assert untrusted and untrusted[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT)
        assert server.password not in (server.folder / "server.log").read_text()


def test_cluster_survives_a_broker_killed(kafka_cluster):
    cluster = kafka_cluster
    replicated, strict = f"replicated-{uuid.uuid4().hex[:8]}", f"strict-{uuid.uuid4().hex[:8]}"
    assert len(cluster.bootstrap_servers.split(",")) == 3
    cluster.create_topic(replicated, 2)
    cluster.create_topic(strict, 1, {"min.insync.replicas": "3"})
    admin = cluster.admin()
    topics = admin.list_topics(timeout=10).topics
    assert all(len(p.replicas) == 3 and len(p.isrs) == 3 for t in (replicated, strict)
               for p in topics[t].partitions.values())
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, replicated)
    described = admin.describe_configs([resource])[resource].result(30)
    assert described["min.insync.replicas"].value == "2"
    config = cluster.client_config()
    produce(config, replicated, 50, acks="all", **{"enable.idempotence": True})
    leader = topics[replicated].partitions[0].leader
    victim = next(b for b in cluster.brokers if b.node_id == leader)
    victim.kill()
    try:
        produce(config, replicated, 50, start=50, acks="all", **{"enable.idempotence": True})
        # The negative control: a topic that needs all three replicas in sync refuses acks=all writes now.
        producer = Producer({**config, "acks": "all", "retries": 0, "message.timeout.ms": 20000})
        errors: list = []
        producer.produce(strict, b"v", on_delivery=lambda err, _msg: errors.append(err))
        producer.flush(30)
        assert [e.code() for e in errors] in (
            [KafkaError.NOT_ENOUGH_REPLICAS], [KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND])
    finally:
        victim.start()
    assert count_committed(config, replicated) == 100
