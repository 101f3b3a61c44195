"""Consumers kept for a Python worker's life, keyed by their settings, as Spark's Kafka source caches its own
(KafkaDataConsumer's pool): Spark reuses a Python worker for task after task, and a read task that takes a warm
consumer skips the bootstrap, the metadata request and the connection to the partition's leader, which at hundreds
of small partitions cost more than their records.

A task takes a consumer (`lent`), assigns its partition and gives it back unassigned and drained, so nothing is
fetched for it between tasks and nothing of one task's partition reaches the next (librdkafka also drops fetches of
an earlier assignment by their fetch version, and the reader checks each fetch's partition and first offset); a
task that fails closes its consumer instead (its state is not known).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

IDLE_PER_SETTINGS = 2  # warm consumers kept per settings: a worker runs one read task at a time

_lock = threading.Lock()
_idle: dict[str, list[Any]] = {}


def _key(config: dict[str, Any]) -> str:
    return json.dumps(sorted(config.items()), default=repr)


@contextmanager
def lent(config: dict[str, Any]) -> Iterator[Any]:
    """A consumer of `config`, warm when this worker has one idle, given back unassigned when the block ends."""
    from confluent_kafka import Consumer

    key = _key(config)
    with _lock:
        idle = _idle.get(key)
        consumer = idle.pop() if idle else None
    if consumer is None:
        consumer = Consumer(config)
    try:
        yield consumer
    except BaseException:
        consumer.close()
        raise
    consumer.resume(consumer.assignment())  # what a read paused (a range read before the others) is not kept so
    consumer.unassign()
    while consumer.consume(10_000, timeout=0):  # what the assignment left queued goes now, not to the next task
        pass
    with _lock:
        kept = _idle.setdefault(key, [])
        if len(kept) < IDLE_PER_SETTINGS:
            kept.append(consumer)
            return
    consumer.close()


@atexit.register
def close_idle() -> None:
    """Closes the idle consumers (a worker's end, or a test that wants none kept)."""
    with _lock:
        idle = [c for kept in _idle.values() for c in kept]
        _idle.clear()
    for consumer in idle:
        consumer.close()
