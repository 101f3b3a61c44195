"""`sluice doctor` on a real Kafka broker: a transaction left open by a producer that was never closed (its process
exited mid-transaction, as a killed exactly-once task's does), under the transactional id sluice's sink gives task
partition 0 of the job's query, after one committed epoch with its marker (the sink's consumer group
sluice-eos-<query>-0); beside it a running job's producer holding a transaction open on another topic. --fix aborts
the stopped job's transaction (read_committed readers move on) and leaves the running one's, which then commits."""

import json
import subprocess
import sys
import uuid

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import OffsetSpec

from sluice.cli import main as cli
from sluice.connectors.kafka import MARKER_GROUP_PREFIX, default_transactional_prefix
from sluice.meta import MetaService

PRODUCER = """
import os, sys
from confluent_kafka import Consumer, Producer, TopicPartition
bootstrap, txn_id, topic, marker, group, mode = sys.argv[1:]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 600000})
producer.init_transactions(30)
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
producer.begin_transaction()
producer.produce(topic, b"epoch 0")
producer.send_offsets_to_transaction([TopicPartition(marker, 0, 1, "records=1")], consumer.consumer_group_metadata(),
                                     30)
producer.commit_transaction(30)
consumer.close()
producer.begin_transaction()
producer.produce(topic, b"epoch 1")
assert producer.flush(30) == 0
print("open", flush=True)
if mode == "die":
    os._exit(0)  # never closed: the transaction stays open on the broker
sys.stdin.readline()
producer.commit_transaction(30)
print("committed", flush=True)
"""


def producer(kafka, query_id, topic, marker, mode):
    """A process producing as task partition 0 of sluice's exactly-once sink in query `query_id` does: its
    transactional id and marker group are the sink's (default transactional-id-prefix)."""
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, kafka.bootstrap_servers,
                             f"{default_transactional_prefix(query_id)}-0", topic, marker,
                             f"{MARKER_GROUP_PREFIX}{query_id}-0", mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "open\n"
    return proc


def stable_lag(kafka, topic):
    """High watermark minus last stable offset of partition 0: records read_committed readers cannot pass."""
    admin = kafka.admin()
    tp = TopicPartition(topic, 0)
    ends = [admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)[tp].result().offset
            for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED)]
    return ends[0] - ends[1]


def test_a_stopped_jobs_open_transaction_is_aborted_and_a_running_jobs_is_left(kafka, tmp_path, capsys):
    meta_url = str(tmp_path / "meta.db")
    meta = MetaService(meta_url)
    suffix = uuid.uuid4().hex[:8]
    dead_topic, live_topic, marker = f"dead_{suffix}", f"live_{suffix}", f"marker_{suffix}"
    for topic in (dead_topic, live_topic, marker):
        kafka.create_topic(topic, 1)
    stopped_q, running_q = str(uuid.uuid4()), str(uuid.uuid4())
    stopped = meta.register_job("to-kafka-stopped", sources=[], sinks=["dead_out"], query_id=stopped_q)
    running = meta.register_job("to-kafka-running", sources=[], sinks=["live_out"], query_id=running_q)
    dead = producer(kafka, stopped_q, dead_topic, marker, "die")
    assert dead.wait(30) == 0
    meta.finish_job(stopped.job_id, "failed")
    live = producer(kafka, running_q, live_topic, marker, "hold")
    try:
        assert stable_lag(kafka, dead_topic) == 1 and stable_lag(kafka, live_topic) == 1

        assert cli(["doctor", "--meta", meta_url, "--kafka", kafka.bootstrap_servers, "--kafka-open-after", "0"]) == 0
        out = capsys.readouterr().out
        for topic in (dead_topic, live_topic):
            assert f"kafka-open-transaction  {topic}[0]  in {kafka.bootstrap_servers}" in out
        assert "1 record(s) past the last stable offset 2" in out, "epoch 0 and its commit marker come before"
        assert f"transactional ids sluice-{stopped_q}-0" in out
        assert f"owner: job {stopped.job_id} (to-kafka-stopped), failed" in out
        assert "safe to remove: yes (its job failed)" in out
        assert f"transactional ids sluice-{running_q}-0" in out
        assert f"owner: job {running.job_id} (to-kafka-running), running" in out
        assert "safe to remove: no (its job runs" in out

        assert cli(["doctor", "--meta", meta_url, "--kafka", kafka.bootstrap_servers, "--kafka-open-after", "3600"]) \
            == 0
        assert "kafka-open-transaction" not in capsys.readouterr().out, "younger than the threshold: not reported"

        assert cli(["doctor", "--meta", meta_url, "--kafka", kafka.bootstrap_servers, "--kafka-open-after", "0",
                    "--fix", "--yes"]) == 0
        out = capsys.readouterr().out
        assert f"done: kafka-open-transaction transactional ids sluice-{stopped_q}-0: fenced" in out
        assert f"not done: kafka-open-transaction transactional ids sluice-{running_q}-0: left as it is" in out
        assert stable_lag(kafka, dead_topic) == 0, "aborted: read_committed readers move on"
        assert stable_lag(kafka, live_topic) == 1, "the running job's transaction is still open"
        live.stdin.write("commit\n")
        live.stdin.flush()
        assert live.stdout.readline() == "committed\n", "not fenced: the running producer commits"
        assert live.wait(30) == 0
        assert stable_lag(kafka, live_topic) == 0
    finally:
        live.kill()
        live.wait()


def test_the_doctor_reaches_a_broker_over_sasl_ssl_with_a_client_certificate(secured_kafka, tmp_path, capsys):
    """A broker that demands SASL on TLS and a client certificate (ssl.client.auth=required), reached from a
    --kafka-options file of format("sluice_kafka")'s own kafka.* options: a transaction left open there is found.
    The negative control: the same file but for the certificate fails naming the broker and its TLS alert, the
    password and the key in no output."""
    secured = secured_kafka
    mine = secured.client_ca.client_certificate("sluice")
    opts = {"kafka.bootstrap.servers": secured.bootstrap_servers, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": secured.username,
            "kafka.sasl.password": secured.password, "kafka.ssl.ca.pem": secured.ca_pem,
            "kafka.ssl.certificate.pem": mine.cert_pem, "kafka.ssl.key.pem": mine.key_pem, "subscribe": "t"}
    topic = f"open_{uuid.uuid4().hex[:8]}"
    secured.create_topic(topic, 1)
    from confluent_kafka import Producer

    holder = Producer(secured.client_config(**{"transactional.id": f"holder-{topic}"}))
    holder.init_transactions(30)
    holder.begin_transaction()
    holder.produce(topic, b"open")
    assert holder.flush(30) == 0
    options = tmp_path / "kafka.json"
    options.write_text(json.dumps(opts))
    try:
        meta = str(tmp_path / "meta.db")
        assert cli(["doctor", "--meta", meta, "--kafka-options", str(options), "--kafka-open-after", "0"]) == 0
        captured = capsys.readouterr()
        assert f"kafka-open-transaction  {topic}[0]  in {secured.bootstrap_servers}" in captured.out
        assert secured.password not in captured.out + captured.err
        assert mine.key_pem.strip() not in captured.out + captured.err

        del opts["kafka.ssl.certificate.pem"], opts["kafka.ssl.key.pem"]
        # The broker's alert comes at once; librdkafka retries until timeout-ms (the source's option) ends.
        options.write_text(json.dumps({**opts, "timeout-ms": 5000}))
        assert cli(["doctor", "--meta", meta, "--kafka-options", str(options)]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"sluice: kafka: no broker of kafka.bootstrap.servers="
                                       f"{secured.bootstrap_servers} answered within 5000 ms (timeout-ms)")
        assert 'TLS failed: the broker refused the client certificate (TLS alert "bad certificate"' \
            in captured.err
        assert "Traceback" not in captured.err and secured.password not in captured.err
    finally:
        holder.abort_transaction(30)
