"""Consumers kept for a Python worker's life, keyed by their settings, as Spark's Kafka source caches its own
(KafkaDataConsumer's pool): Spark reuses a Python worker for task after task, and a read task that takes a warm
consumer skips the bootstrap, the metadata request and the connection to the partition's leader, which at hundreds
of small partitions cost more than their records.

A task takes a consumer (`lent`), assigns its partition and gives it back unassigned and drained, so nothing is
fetched for it between tasks and nothing of one task's partition reaches the next (librdkafka also drops fetches of
an earlier assignment by their fetch version, and the reader checks each fetch's partition and first offset); a
task that fails closes its consumer instead (its state is not known).

A consumer idle for IDLE_TIMEOUT_S is closed, as Spark's pool evicts its own after `spark.kafka.consumer.cache.timeout`
(5 minutes): a worker that once read a cluster no longer read, or no longer there, does not keep its connections,
its fetch threads and its reconnection attempts for the rest of its life.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

IDLE_PER_SETTINGS = 2  # warm consumers kept per settings: a worker runs one read task at a time
IDLE_TIMEOUT_S = 300.0  # Spark's spark.kafka.consumer.cache.timeout default
_EVICT_EVERY_S = 60.0  # Spark's spark.kafka.consumer.cache.evictorThreadRunInterval default

_lock = threading.Lock()
_idle: dict[str, list[tuple[Any, float]]] = {}  # settings -> (consumer, when it was given back)
_evictor: threading.Thread | None = None


def _key(config: dict[str, Any]) -> str:
    return json.dumps(sorted(config.items()), default=repr)


@contextmanager
def lent(config: dict[str, Any]) -> Iterator[Any]:
    """A consumer of `config`, warm when this worker has one idle, given back unassigned when the block ends."""
    from confluent_kafka import Consumer

    key = _key(config)
    with _lock:
        idle = _idle.get(key)
        consumer = idle.pop()[0] if idle else None
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
            kept.append((consumer, time.monotonic()))
            _start_evictor()
            return
    consumer.close()


def evict_idle(now: float | None = None) -> int:
    """Closes the consumers idle for IDLE_TIMEOUT_S or longer at `now` (monotonic seconds); how many."""
    now = time.monotonic() if now is None else now
    with _lock:
        stale = [c for kept in _idle.values() for c, since in kept if now - since >= IDLE_TIMEOUT_S]
        for key in list(_idle):
            _idle[key] = [(c, since) for c, since in _idle[key] if now - since < IDLE_TIMEOUT_S]
            if not _idle[key]:
                del _idle[key]
    for consumer in stale:
        consumer.close()
    return len(stale)


def _start_evictor() -> None:
    """A daemon thread of this worker that evicts every _EVICT_EVERY_S (called under _lock)."""
    global _evictor
    if _evictor is not None and _evictor.is_alive():
        return

    def run() -> None:
        while True:
            time.sleep(_EVICT_EVERY_S)
            evict_idle()

    _evictor = threading.Thread(target=run, name="sluice-kafka-consumer-evictor", daemon=True)
    _evictor.start()


@atexit.register
def close_idle() -> None:
    """Closes the idle consumers (a worker's end, or a test that wants none kept)."""
    with _lock:
        idle = [c for kept in _idle.values() for c, _since in kept]
        _idle.clear()
    for consumer in idle:
        consumer.close()
