"""Read tasks report what they fetch (Flink's source metrics: numRecordsIn, numBytesIn, currentFetchEventTimeLag),
so a long batch read shows its progress and a stream how fresh its records are, on the page and at /metrics; a
split source's tasks name their split, so the lag is also told per split (a Kafka topic partition, an S2 stream).

A `ReadObserver` is made on the driver when a read is planned (no collector found: no observer, nothing is
counted) and travels to the executors inside the reader; `observed()` wraps a task's batches. Counting is per
batch (rows and Arrow bytes); the event time is read from the last batch before each report, once a second.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.metrics._push import MetricsPusher
from sluice.metrics._report import MetricsTarget, ReadReport, ReadStats, TaskIdentity, current_task

REPORT_EVERY_S = 1.0
_PER_MS = {"s": 1e-3, "ms": 1.0, "us": 1e3, "ns": 1e6}


@dataclass(frozen=True)
class ReadObserver:
    format: str
    target: MetricsTarget
    read_id: str  # one planned read (a batch read, or a stream's reader)
    event_time: str | None = None  # a timestamp column holding when each record was committed, if any

    @classmethod
    def on_driver(cls, format_name: str, event_time: str | None = None) -> ReadObserver | None:
        """The observer of a read planned now, or None when no collector runs (see sluice.metrics.find_target)."""
        from sluice.metrics._server import find_target

        target = find_target()
        return cls(format_name, target, uuid.uuid4().hex, event_time) if target is not None else None

    def observed(self, batches: Iterator[pa.RecordBatch], split: str | None = None) -> Iterator[pa.RecordBatch]:
        """A read task's batches, counted and reported while they pass (an executor). `split`: the split the task
        reads (a split source's), so that its fetch lag is also told per split."""
        pusher = MetricsPusher(self.target, self._task(), ReadReport)
        records = size = count = 0
        last: Any = None
        next_report = time.monotonic() + REPORT_EVERY_S
        try:
            for batch in batches:
                records += batch.num_rows
                size += batch.nbytes
                count += 1
                last = batch
                if time.monotonic() >= next_report:
                    pusher.offer(ReadStats(records, size, count, self._lag_ms(last), time.time(), split))
                    next_report = time.monotonic() + REPORT_EVERY_S
                yield batch
        finally:
            pusher.close(ReadStats(records, size, count, self._lag_ms(last), time.time(), split))

    def observed_parts(self, parts: Iterable[tuple[str, Iterator[pa.RecordBatch]]]) -> Iterator[pa.RecordBatch]:
        """A read task's batches from several splits in turn (a split source's group of small ranges), counted as
        one task's; each report carries every split's fetch lag so far (`ReadStats.split_lags`), so a split read
        between two reports still has its own."""
        pusher = MetricsPusher(self.target, self._task(), ReadReport)
        records = size = count = 0
        lags: dict[str, float] = {}
        lag: float | None = None
        next_report = time.monotonic() + REPORT_EVERY_S

        def stats() -> ReadStats:
            return ReadStats(records, size, count, lag, time.time(), None, tuple(lags.items()))

        try:
            for split, batches in parts:
                last: Any = None
                for batch in batches:
                    records += batch.num_rows
                    size += batch.nbytes
                    count += 1
                    last = batch
                    if time.monotonic() >= next_report:
                        pusher.offer(stats())
                        next_report = time.monotonic() + REPORT_EVERY_S
                    yield batch
                if (split_lag := self._lag_ms(last)) is not None:
                    lags[split] = lag = split_lag
        finally:
            pusher.close(stats())

    def _lag_ms(self, batch: Any) -> float | None:
        """Now minus the newest commit time in `batch` (Flink's currentFetchEventTimeLag)."""
        if self.event_time is None or batch is None or batch.num_rows == 0:
            return None
        index = batch.schema.get_field_index(self.event_time)
        if index < 0 or not pa.types.is_timestamp(batch.schema.field(index).type):
            return None  # a user's schema without the column
        newest = pc.max(batch.column(index))
        if not newest.is_valid:
            return None
        ms: float = newest.cast(pa.int64()).as_py() / _PER_MS[batch.schema.field(index).type.unit]
        return max(0.0, time.time() * 1000 - ms)

    def _task(self) -> TaskIdentity:
        return current_task(self.format, self.read_id)


def observed(observer: ReadObserver | None, batches: Iterator[pa.RecordBatch],
             split: str | None = None) -> Iterator[pa.RecordBatch]:
    """`batches`, reported to the collector when a read has an observer (`split`: the split they are of, if any)."""
    return batches if observer is None else observer.observed(batches, split)


def observed_parts(observer: ReadObserver | None,
                   parts: Iterable[tuple[str, Iterator[pa.RecordBatch]]]) -> Iterator[pa.RecordBatch]:
    """Several splits' batches in turn as one read task's (`ReadObserver.observed_parts`), or as they come without
    an observer."""
    if observer is None:
        return (batch for _, batches in parts for batch in batches)
    return observer.observed_parts(parts)
