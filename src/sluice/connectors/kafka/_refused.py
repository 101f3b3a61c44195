"""Which records of an engine batch Kafka refused for what they hold, from the producer's error reports.

librdkafka reports a refused record with its topic, key and value but no position; the position is found by matching
those against the batch's rows, only when a report came (a record taken costs nothing). Records alike in topic, key
and value are matched in the order they were produced: each such record's refusal is one of theirs.

What counts as per record: MSG_SIZE_TOO_LARGE for a record larger than the producer's batch.size. The broker refuses a
whole record batch over the topic's max.message.bytes; librdkafka adds records to a batch up to batch.size, except a
first one larger than that, which is then alone: the refusal names that record only. (The sink caps batch.size at the
topic's limit, KafkaWritePlan.producer_config, and refuses records over the limit before sending them, so this is
for a limit the driver could not read or a size it estimated short.) A refused batch of smaller records, and the
other invalid records (INVALID_RECORD: a null key on a compacted topic; INVALID_TIMESTAMP), which the broker refuses
with the whole record batch they came in, good records included, stay a task failure rather than send good records
aside."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sluice.connector import RefusedRecords, RetryableError, RetryEntries


def per_record_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset({KafkaError.MSG_SIZE_TOO_LARGE})


class RecordRefusedError(Exception):
    """One record Kafka refused for what it holds; `error` is librdkafka's KafkaError."""

    def __init__(self, message: str, error: Any) -> None:
        super().__init__(message)
        self.error = error


def refused_records(reports: list[tuple[Any, Any, Any, Any, Any]], table: pa.Table, topic: str | None,
                    batch_size: int, retriable: Callable[[Any], bool], describe: Callable[[Any, str, Any, Any], str],
                    ) -> RefusedRecords | None:
    """The batch's outcome as RefusedRecords when every report is a per-record refusal or a passing failure (the
    latter go again), with at least one refusal; None when a report is neither (the batch fails as a whole) or a
    report matches no row. `batch_size`: the producer's batch.size. `reports` are (error, topic, partition, key,
    value); `table` the rows as produced; `describe(error, topic, partition, key)` says what was refused and why."""
    codes = per_record_codes()
    kinds = ["refused" if err.code() in codes and len(key or b"") + len(value or b"") > batch_size
             else "retry" if retriable(err) else None for err, _, _, key, value in reports]
    if None in kinds or "refused" not in kinds:
        return None
    topics = [topic] * table.num_rows if topic else table.column("topic").to_pylist()
    keys = _bytes(table, "key") if "key" in table.column_names else [None] * table.num_rows
    values = _bytes(table, "value")
    where: dict[tuple[Any, Any, Any], deque[int]] = defaultdict(deque)
    for i, identity in enumerate(zip(topics, keys, values, strict=True)):
        where[identity].append(i)
    positions: list[int] = []
    errors: list[BaseException] = []
    retry: list[int] = []
    for kind, (err, record_topic, partition, key, value) in zip(kinds, reports, strict=True):
        found = where.get((record_topic, key, value))
        if not found:
            return None
        position = found.popleft()
        if kind == "retry":
            retry.append(position)
            continue
        positions.append(position)
        errors.append(RecordRefusedError(describe(err, record_topic, partition, key), err))
    again = None
    if retry:
        again = RetryEntries(f"{len(retry)} record(s) failed for a passing reason", sorted(retry),
                             RetryableError("kafka: a record's delivery failed for a passing reason"))
    order = sorted(range(len(positions)), key=positions.__getitem__)
    return RefusedRecords(f"kafka refused {len(positions)} record(s) of a batch of {table.num_rows} for what they hold",
                          [positions[i] for i in order], [errors[i] for i in order], again)


def _bytes(table: pa.Table, name: str) -> list[bytes | None]:
    column = table.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary() if pa.types.is_string(column.type) else pa.large_binary())
    return column.to_pylist()
