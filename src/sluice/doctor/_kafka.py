"""Kafka: transactions left open (they hold read_committed readers back at the last stable offset, KIP-98) and the
transactional ids sluice's exactly-once sink uses for the MetaService's jobs.

confluent-kafka 2.16's AdminClient has no ListTransactions / DescribeTransactions / DescribeProducers (KIP-664 is
in the Java admin client only), so which producer holds a partition cannot be read from Python. What can:
- the partitions whose last stable offset (ListOffsets, read_committed) lags their high watermark, and since when
  (the timestamp of the first record at the last stable offset: the oldest open transaction's first record);
- the transactional ids of a job: sluice's exactly-once sink gives task partition n of query Q the id
  `sluice-Q-n` (default transactional-id-prefix) and commits its marker as consumer group `sluice-eos-Q-n`
  (_txn.py), so the marker groups name every task partition that ever committed.
--fix aborts what a stopped job's ids left open the way a restarted task does: `init_transactions()` with the id
fences its last producer and aborts its open transaction (KIP-98). A user's own transactional-id-prefix is not
known to the MetaService: such ids are not found.

Every client reaches the brokers through the connection settings the doctor was given (_reach.py: TLS, a client
certificate, SASL, as the jobs' `kafka.*` options); brokers that do not answer are reported as the sink reports them
(the broker's TLS alert, a failed authentication).
"""

from __future__ import annotations

import time
from typing import Any

from sluice._errors import SluiceError
from sluice.connectors.kafka import MARKER_GROUP_PREFIX, default_transactional_prefix
from sluice.connectors.kafka._checks import unreachable
from sluice.doctor._model import KAFKA_TXN, Finding, Verdict
from sluice.doctor._owners import Owners
from sluice.doctor._reach import KafkaReach


def examine(reach: KafkaReach, owners: Owners, open_after_s: float) -> list[Finding]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    admin = AdminClient(reach.client.config(error_cb=errors.append, log_level=0))
    try:
        topics = admin.list_topics(timeout=reach.timeout_s).topics
    except KafkaException as e:
        admin.poll(0.5)  # serves error_cb: what librdkafka saw on the way (refused, authentication, TLS)
        raise unreachable(reach.client, reach.timeout_ms, e, errors) from None
    bootstrap = reach.client.bootstrap_servers
    stuck = _lagging_partitions(admin, reach, topics)
    now = time.time()
    old = [(tp, lso, hw, age) for tp, lso, hw, first in stuck if (age := now - first) >= open_after_s]
    ids = _sluice_transactional_ids(admin, reach.timeout_s)
    found = []
    for topic, partition, lso, hw, age in ((tp[0], tp[1], lso, hw, age) for tp, lso, hw, age in old):
        found.append(Finding(
            KAFKA_TXN, bootstrap, f"{topic}[{partition}]",
            f"{hw - lso:,} record(s) past the last stable offset {lso}, an open transaction since {age:.0f} s ago: "
            "read_committed readers wait", None,
            Verdict(False, "which producer holds it is not readable from Python (no KIP-664 in confluent-kafka); "
                           "--fix aborts the open transactions of stopped jobs' transactional ids, listed below"),
            {"age_s": age, "records": float(hw - lso)}, ()))
    if not old:
        return found  # nothing is held back: a stopped job's ids cost nothing
    for query_id, tasks in sorted(ids.items()):
        owner = owners.by_query.get(query_id)
        if owner is None:
            continue
        txn_ids = tuple(f"{default_transactional_prefix(query_id)}-{n}" for n in sorted(tasks))
        found.append(Finding(
            KAFKA_TXN, bootstrap, f"transactional ids {', '.join(txn_ids)}",
            "may hold one of the open transactions above (Kafka aborts it only after transaction.timeout.ms)",
            owner, owners.verdict(owner), {"ids": float(len(txn_ids))}, txn_ids))
    return found


def _lagging_partitions(admin: Any, reach: KafkaReach, topics: dict[str, Any]
                        ) -> list[tuple[tuple[str, int], int, int, float]]:
    """(topic, partition), last stable offset, high watermark and the first open record's time, of every partition
    whose last stable offset lags its high watermark (internal topics left out)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    parts = [TopicPartition(t, p) for t, meta in topics.items() if not t.startswith("__") for p in meta.partitions]
    if not parts:
        return []
    offsets = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts}, isolation_level=level,
                                     request_timeout=reach.timeout_s)
        offsets[level] = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
    lagging = [(key, lso, offsets[IsolationLevel.READ_UNCOMMITTED][key])
               for key, lso in offsets[IsolationLevel.READ_COMMITTED].items()
               if lso < offsets[IsolationLevel.READ_UNCOMMITTED][key]]
    return [(key, lso, hw, _first_open_record_time(reach, key, lso)) for key, lso, hw in lagging]


def _first_open_record_time(reach: KafkaReach, key: tuple[str, int], lso: int) -> float:
    """When the record at the last stable offset was made: the open transaction's first record."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(reach.client.config(**{"group.id": "sluice-doctor", "enable.auto.commit": False,
                                         "isolation.level": "read_uncommitted"}))
    try:
        consumer.assign([TopicPartition(key[0], key[1], lso)])
        until = time.monotonic() + reach.timeout_s
        while time.monotonic() < until:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                return message.timestamp()[1] / 1000.0
        raise SluiceError(f"reading the record at the last stable offset {lso} of {key[0]}[{key[1]}] on "
                          f"{reach.client.bootstrap_servers} took more than {reach.timeout_ms} ms (timeout-ms): raise "
                          "timeout-ms in the options file, or check that the broker serves that partition")
    finally:
        consumer.close()


def _sluice_transactional_ids(admin: Any, timeout_s: float) -> dict[str, set[int]]:
    """Write id -> the task partitions that committed through sluice's exactly-once sink (its marker groups)."""
    listing = admin.list_consumer_groups(request_timeout=timeout_s).result()
    ids: dict[str, set[int]] = {}
    for group in listing.valid:
        name = group.group_id
        if name.startswith(MARKER_GROUP_PREFIX):
            write_id, _, task = name[len(MARKER_GROUP_PREFIX):].rpartition("-")
            if task.isdigit():
                ids.setdefault(write_id, set()).add(int(task))
    return ids


def remove(reach: KafkaReach, finding: Finding) -> str:
    """Abort what each id left open: init_transactions() fences the id's last producer and aborts its transaction."""
    from confluent_kafka import Producer

    for txn_id in finding.handle:
        producer = Producer(reach.client.config(**{"transactional.id": txn_id}))
        producer.init_transactions(reach.timeout_s)
        producer.flush(0)
    return f"fenced transactional ids {', '.join(finding.handle)}: any transaction they left open is aborted"
