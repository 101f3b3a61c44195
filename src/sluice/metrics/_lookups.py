"""Lookup join tasks report their work (`sluice.lookup`, docs/lookup.md): the rows in and out, the store's loads,
and the cache's hits, misses and evictions, as Flink's lookup joins count them (FLIP-221's cache metrics).

A `LookupObserver` is made on the driver when the lookup is planned (no collector found: none, nothing is sent)
and travels to the Python workers inside the plan. Each task keeps a `LookupTally` that the join adds to; the
observer sends it once a second while the task's batches pass, and a last time when the task ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

from sluice.metrics._push import MetricsPusher
from sluice.metrics._report import LookupReport, LookupStats, MetricsTarget, TaskIdentity, current_task

REPORT_EVERY_S = 1.0


class LookupTally:
    """One lookup task's counts so far; added to by the join on the task's one thread."""

    def __init__(self) -> None:
        self.records_in = self.records_out = self.hits = self.misses = 0
        self.loads = self.keys_loaded = self.records_loaded = 0
        self.load_ms: float | None = None

    def looked_up(self, hits: int, misses: int) -> None:
        """A batch's distinct keys: `hits` answered by the cache, `misses` to read from the store."""
        self.hits += hits
        self.misses += misses

    def loaded(self, keys: int, records: int, seconds: float) -> None:
        """One call to the store: `keys` asked, `records` returned, in `seconds`."""
        self.loads += 1
        self.keys_loaded += keys
        self.records_loaded += records
        self.load_ms = seconds * 1000

    def stats(self, evictions: int, cached_records: int) -> LookupStats:
        return LookupStats(self.records_in, self.records_out, self.hits, self.misses, evictions, self.loads,
                           self.keys_loaded, self.records_loaded, self.load_ms, cached_records, time.time())


# The cache's side of a task's stats: (evictions since the task started, rows the process's cache holds now).
CacheCounts = Callable[[], tuple[int, int]]


@dataclass(frozen=True)
class LookupObserver:
    format: str
    target: MetricsTarget
    lookup_id: str  # one planned lookup

    @classmethod
    def on_driver(cls, format_name: str, lookup_id: str) -> LookupObserver | None:
        """The observer of a lookup planned now, or None when no collector runs (sluice.metrics.find_target)."""
        from sluice.metrics._server import find_target

        target = find_target()
        return cls(format_name, target, lookup_id) if target is not None else None

    def observed(self, batches: Iterator[pa.RecordBatch], tally: LookupTally,
                 cache_counts: CacheCounts) -> Iterator[pa.RecordBatch]:
        """A lookup task's output batches, passed on while `tally` is reported (a Python worker)."""
        pusher = MetricsPusher(self.target, self._task(), LookupReport)
        next_report = time.monotonic() + REPORT_EVERY_S
        try:
            for batch in batches:
                if time.monotonic() >= next_report:
                    pusher.offer(tally.stats(*cache_counts()))
                    next_report = time.monotonic() + REPORT_EVERY_S
                yield batch
        finally:
            pusher.close(tally.stats(*cache_counts()))

    def _task(self) -> TaskIdentity:
        return current_task(self.format, self.lookup_id)
