"""Per-task write statistics: gathered on executors, merged and summarized on the driver."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

# Latency histogram buckets: 8 per power of two, from 1 microsecond. Mergeable across tasks and
# small enough for a commit message, with <10% error on percentiles.
_BUCKETS_PER_OCTAVE = 8


def _bucket(seconds: float) -> int:
    micros = max(seconds * 1e6, 1.0)
    return int(math.log2(micros) * _BUCKETS_PER_OCTAVE)


latency_bucket = _bucket


def latency_bucket_range(bucket: int) -> tuple[float, float]:
    """Latencies in seconds, [low, high), that fall in histogram bucket `bucket` for sure: the bucket a hair narrower
    at both edges, so that a float's rounding there never puts a latency inside it into its neighbour. A writer
    that counts many latencies keeps the last range and calls `latency_bucket` only for one outside it."""
    high = 2 ** ((bucket + 1) / _BUCKETS_PER_OCTAVE) * 0.999999e-6
    low = float("-inf") if bucket <= 0 else 2 ** (bucket / _BUCKETS_PER_OCTAVE) * 1.000001e-6
    return low, high


def _bucket_upper_ms(bucket: int) -> float:
    return 2 ** ((bucket + 1) / _BUCKETS_PER_OCTAVE) / 1000.0


@dataclass(frozen=True)
class LiveStats:
    """One task's write as it runs, handed to an observer every few seconds (live metrics, docs/metrics.md). Counters
    count from the task's start; the rest is the state at `at` (the writer's clock)."""

    records: int  # acknowledged by the store (Flink: numRecordsSend)
    bytes: int  # numBytesSend
    batches: int
    failed_records: int  # records of requests that failed, retried or not (numRecordsSendErrors)
    retries: int
    throttles: int
    inflight_requests: int
    inflight_records: int
    window: int  # the AIMD window: in-flight records allowed
    buffered: int  # entries waiting for a batch
    last_send_ms: float | None  # the last acknowledged request's round trip (currentSendTime)
    at: float
    rate_wait_s: float = 0.0  # seconds batches waited for the write's rate cap (sink.rate.*)
    dead_letters: int = 0  # records the store refused, sent to the dead-letter target (errors.tolerance=all)


@dataclass
class WriteStats:
    records: int = 0
    bytes: int = 0
    batches: int = 0
    retries: int = 0
    throttles: int = 0
    peak_inflight: int = 0
    tasks: int = 1
    flush_reasons: Counter[str] = field(default_factory=Counter)
    latency_buckets: Counter[int] = field(default_factory=Counter)
    replays_skipped: int = 0  # tasks of a micro-batch the sink had committed before (a replay), written nothing
    rate_wait_s: float = 0.0  # seconds batches waited for the rate cap (sink.rate.*), summed over tasks
    dead_letters: int = 0  # records the store refused, sent to the dead-letter target (errors.tolerance=all)
    splits: int = 0  # batches split in two to find the record the store refused

    def record_latency(self, seconds: float) -> None:
        self.latency_buckets[_bucket(seconds)] += 1

    def latency_ms(self, quantile: float) -> float | None:
        total = sum(self.latency_buckets.values())
        if not total:
            return None
        rank = max(1, math.ceil(quantile * total))
        seen = 0
        for bucket in sorted(self.latency_buckets):
            seen += self.latency_buckets[bucket]
            if seen >= rank:
                return _bucket_upper_ms(bucket)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records, "bytes": self.bytes, "batches": self.batches, "retries": self.retries,
            "throttles": self.throttles, "peak_inflight": self.peak_inflight, "tasks": self.tasks,
            "flush_reasons": dict(self.flush_reasons),
            "latency_buckets": {str(k): v for k, v in self.latency_buckets.items()},
            "replays_skipped": self.replays_skipped, "rate_wait_s": self.rate_wait_s,
            "dead_letters": self.dead_letters, "splits": self.splits,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WriteStats:
        return cls(
            data["records"], data["bytes"], data["batches"], data["retries"], data["throttles"],
            data["peak_inflight"], data.get("tasks", 1), Counter(data["flush_reasons"]),
            Counter({int(k): v for k, v in data["latency_buckets"].items()}), data.get("replays_skipped", 0),
            data.get("rate_wait_s", 0.0), data.get("dead_letters", 0), data.get("splits", 0),
        )

    @classmethod
    def merge(cls, parts: list[WriteStats]) -> WriteStats:
        out = cls(tasks=0)
        for part in parts:
            out.records += part.records
            out.bytes += part.bytes
            out.batches += part.batches
            out.retries += part.retries
            out.throttles += part.throttles
            out.peak_inflight = max(out.peak_inflight, part.peak_inflight)
            out.tasks += part.tasks
            out.flush_reasons.update(part.flush_reasons)
            out.latency_buckets.update(part.latency_buckets)
            out.replays_skipped += part.replays_skipped
            out.rate_wait_s += part.rate_wait_s
            out.dead_letters += part.dead_letters
            out.splits += part.splits
        return out

    def summary(self) -> dict[str, Any]:
        """The flat dict users read (sluice.last_write_summary())."""
        p50, p99 = self.latency_ms(0.50), self.latency_ms(0.99)
        return {
            "records": self.records, "bytes": self.bytes, "batches": self.batches, "tasks": self.tasks,
            "retries": self.retries, "throttles": self.throttles, "peak_inflight": self.peak_inflight,
            "flush_reasons": dict(sorted(self.flush_reasons.items())),
            "submit_latency_p50_ms": None if p50 is None else round(p50, 3),
            "submit_latency_p99_ms": None if p99 is None else round(p99, 3),
            "replays_skipped": self.replays_skipped, "rate_wait_s": round(self.rate_wait_s, 3),
            "dead_letters": self.dead_letters,
        }

    def summary_line(self) -> str:
        s = self.summary()
        reasons = ",".join(f"{k}={v}" for k, v in s["flush_reasons"].items()) or "-"
        return (
            f"records={s['records']} bytes={s['bytes']} batches={s['batches']} tasks={s['tasks']} "
            f"retries={s['retries']} throttles={s['throttles']} rate_wait={s['rate_wait_s']}s "
            f"dead_letters={s['dead_letters']} "
            f"peak_inflight={s['peak_inflight']} "
            f"flush=[{reasons}] submit_p50={s['submit_latency_p50_ms']}ms submit_p99={s['submit_latency_p99_ms']}ms"
        )
