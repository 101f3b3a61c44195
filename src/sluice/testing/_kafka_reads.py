"""What a test reads back from a LocalKafka: every record of a topic as a `read_committed` consumer sees it, and how
many offsets its logs hold, committed or not."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple, cast

if TYPE_CHECKING:
    from confluent_kafka import Message


class KafkaRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: int  # milliseconds since the epoch


def _record(m: Message) -> KafkaRecord:
    """A consumed record (one without error): librdkafka sets its topic, partition and offset, and gives its headers
    as (key, bytes or None) pairs (the stub's other header forms are for producing)."""
    topic, partition, offset = m.topic(), m.partition(), m.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"a consumed record without topic, partition or offset: {m!r}")
    headers = cast("list[tuple[str, bytes | None]]", m.headers() or [])
    return KafkaRecord(topic, partition, offset, m.key(), m.value(), list(headers), m.timestamp()[1])


def read_committed(config: dict[str, Any], topic: str, *, isolation: str = "read_committed",
                   timeout: float = 60) -> list[KafkaRecord]:
    """Every record of every partition of `topic`, from the beginning to the end a `read_committed` consumer sees
    (the last stable offset: records of open transactions and everything after them are not read yet), in partition
    then offset order. `isolation="read_uncommitted"` reads to the end of the log, aborted records included."""
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer({**config, "group.id": f"sluice-read-{uuid.uuid4().hex}", "isolation.level": isolation,
                         "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
        pending = set(metadata.partitions)
        records: list[KafkaRecord] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic!r}: partitions {sorted(pending)} did not reach their end within "
                                   f"{timeout:.0f} s")
            for m in consumer.consume(10_000, timeout=0.5):
                error = m.error()
                if error is None:
                    records.append(_record(m))
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(m.partition())
                else:
                    raise KafkaException(error)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def count_committed(config: dict[str, Any], topic: str, *, timeout: float = 60) -> int:
    """How many records of `topic` a `read_committed` consumer reads (read_committed's notes)."""
    return len(read_committed(config, topic, timeout=timeout))


def count_written(config: dict[str, Any], topic: str, *, timeout: float = 30) -> int:
    """Offsets in the logs of every partition of `topic`, committed, aborted or open (the high watermarks): what
    writers have sent so far, transaction markers included."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**config, "group.id": "sluice-watermarks", "isolation.level": "read_uncommitted"})
    try:
        parts = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts)
    finally:
        consumer.close()
