"""The driver's side: every task's latest report, folded into one set of metrics per format, exposed to Prometheus.

Counters (Flink's connector metric names where one exists: numRecordsSend, numBytesSend, numRecordsSendErrors) add
the final reports of ended tasks to the latest reports of running ones, so they only grow while tasks come and go.
Gauges (in-flight requests and records, the AIMD window, buffered records, currentSendTime) describe running tasks.
A task that stops reporting (its executor died) is retired after `stale_after_s`: its last counters stay, its
gauges go, and a late report of it is ignored.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from sluice.metrics._report import LookupReport, ReadReport, SourceReport, TaskReport

# (exposed name, help, LiveStats field): prometheus_client adds `_total` to counters.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sluice_sink_numRecordsSend", "Records the store acknowledged.", "records"),
    ("sluice_sink_numBytesSend", "Bytes of the records the store acknowledged.", "bytes"),
    ("sluice_sink_numRecordsSendErrors", "Records of requests that failed (retried or not).", "failed_records"),
    ("sluice_sink_numBatchesSend", "Requests (batches) the store acknowledged.", "batches"),
    ("sluice_sink_retries", "Batches sent again after a retryable failure.", "retries"),
    ("sluice_sink_throttles", "Failures the store classified as throttling.", "throttles"),
    ("sluice_sink_rateWaitSeconds", "Seconds batches waited for the write's rate cap (sink.rate.*).", "rate_wait_s"),
    ("sluice_sink_deadLetterRecords",
     "Records the store refused, sent to the dead-letter target (errors.tolerance=all).", "dead_letters"),
)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("sluice_sink_inflightRequests", "Requests sent and not yet answered, over running tasks.", "inflight_requests"),
    ("sluice_sink_inflightRecords", "Records in requests not yet answered, over running tasks.", "inflight_records"),
    ("sluice_sink_aimdWindow", "In-flight records the AIMD rate limiters allow, over running tasks.", "window"),
    ("sluice_sink_pendingRecords", "Records buffered and not yet in a request, over running tasks.", "buffered"),
)
# Reads (Flink's source metrics): numRecordsIn, numBytesIn; currentFetchEventTimeLag is the latest report's.
READ_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sluice_source_numRecordsIn", "Records read tasks fetched.", "records"),
    ("sluice_source_numBytesIn", "Arrow bytes of the batches read tasks fetched.", "bytes"),
)
# Lookup joins (sluice.lookup): Flink's lookup cache metrics (FLIP-221) plus evictions, and the rows in and out.
LOOKUP_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sluice_lookup_numRecordsIn", "DataFrame rows lookup tasks enriched.", "records_in"),
    ("sluice_lookup_numRecordsOut", "Rows lookup tasks gave back (several per key with several rows; inner joins "
     "drop the unmatched).", "records_out"),
    ("sluice_lookup_hitCount", "Distinct keys of a batch the cache answered.", "hits"),
    ("sluice_lookup_missCount", "Distinct keys of a batch read from the store (every key without a cache).",
     "misses"),
    ("sluice_lookup_evictionCount", "Cached keys dropped for the cache's size or expiry.", "evictions"),
    ("sluice_lookup_loadCount", "Calls to the store (one per batch with keys to read).", "loads"),
    ("sluice_lookup_numKeysLoaded", "Keys the store was asked for.", "keys_loaded"),
    ("sluice_lookup_numRecordsLoaded", "Rows the store returned.", "records_loaded"),
)
LOOKUP_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("sluice_lookup_numCachedRecords", "Rows held in the caches of running lookup tasks' worker processes.",
     "cached_records"),
)
_RETIRED_KEPT = 10_000  # keys of ended tasks remembered, to ignore their late reports
_SPLITS_KEPT = 10_000  # splits whose fetch lag is remembered (the least recently reported go first)


@dataclass
class _Running:
    report: TaskReport | ReadReport | LookupReport
    seen: float


class TaskMetrics:
    """Every task's latest report, folded per format. Thread-safe: reports arrive on the server's thread, scrapes
    on another. Subclasses name the stats' fields that are counters and gauges."""

    counters: tuple[str, ...] = ()
    gauges: tuple[str, ...] = ()

    def __init__(self, stale_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Condition()  # notified on every report: wait_for() waits on events, not sleeps
        self._running: dict[tuple, _Running] = {}
        self._ended: dict[str, dict[str, float]] = {}  # format -> counter field -> sum over ended tasks
        self._ended_tasks: dict[str, int] = {}
        self._retired: OrderedDict[tuple, None] = OrderedDict()

    def add(self, report: TaskReport | ReadReport | LookupReport) -> None:
        key = report.task.key
        with self._lock:
            if key in self._retired:
                return
            if report.done:
                self._running.pop(key, None)
                self._retire(key, report)
            else:
                self._running[key] = _Running(report, self._clock())
            self._lock.notify_all()

    def wait_for(self, predicate: Callable[[dict[str, dict[str, float]]], bool], timeout: float) -> bool:
        """Block until `predicate(snapshot())` holds (checked on every report), or `timeout` seconds pass."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._snapshot()), timeout)

    def _retire(self, key: tuple, report: TaskReport | ReadReport | LookupReport) -> None:
        ended = self._ended.setdefault(report.task.format, {})
        for field in self.counters:
            ended[field] = ended.get(field, 0) + getattr(report.stats, field)
        self._ended_tasks[report.task.format] = self._ended_tasks.get(report.task.format, 0) + 1
        self._retired[key] = None
        while len(self._retired) > _RETIRED_KEPT:
            self._retired.popitem(last=False)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """format -> metric field -> value (counters, gauges, `tasks_running`, `tasks_ended`, and the
        subclass's `_extra`)."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, dict[str, float]]:
        now = self._clock()
        for key, running in list(self._running.items()):
            if now - running.seen > self.stale_after_s:
                del self._running[key]
                self._retire(key, running.report)
        formats = set(self._ended) | {r.report.task.format for r in self._running.values()}
        out: dict[str, dict[str, float]] = {}
        for name in sorted(formats):
            live = [r.report.stats for r in self._running.values() if r.report.task.format == name]
            values = {field: self._ended.get(name, {}).get(field, 0) + sum(getattr(s, field) for s in live)
                      for field in self.counters}
            values |= {field: sum(getattr(s, field) for s in live) for field in self.gauges}
            values |= {"tasks_running": len(live), "tasks_ended": self._ended_tasks.get(name, 0)}
            out[name] = values | self._extra(name, live)
        return out

    def _extra(self, format_name: str, live: list) -> dict[str, float | None]:
        return {}


class SinkMetrics(TaskMetrics):
    counters = tuple(field for _, _, field in COUNTERS)
    gauges = tuple(field for _, _, field in GAUGES)

    def _extra(self, format_name: str, live: list) -> dict[str, float | None]:
        sends = [s.last_send_ms for s in live if s.last_send_ms is not None]
        return {"send_ms": max(sends) if sends else 0.0}


@dataclass(frozen=True)
class SplitFetchLag:
    """Flink's currentFetchEventTimeLag of one split (a Kafka topic partition, an S2 stream): the newest report,
    among the read tasks of that split, that had an event time."""

    format: str
    split: str
    lag_ms: float
    at: float  # epoch seconds of that report


class ReadMetrics(TaskMetrics):
    """Reads: records and bytes fetched; the event-time lag of the newest report that had one, per format and, for
    split sources, per split (read tasks of a stream are short: the lag outlives them, as Flink's
    currentFetchEventTimeLag is the last fetched record's)."""

    counters = tuple(field for _, _, field in READ_COUNTERS)

    def __init__(self, stale_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stale_after_s, clock)
        self._lags: dict[str, tuple[float, float]] = {}  # format -> (report time, lag ms)
        self._split_lags: OrderedDict[tuple[str, str], SplitFetchLag] = OrderedDict()  # (format, split) -> newest

    def add(self, report: TaskReport | ReadReport | LookupReport) -> None:
        lag, at = getattr(report.stats, "event_lag_ms", None), report.stats.at
        if lag is not None:
            fmt, split = report.task.format, getattr(report.stats, "split", None)
            per_split = [*([(split, lag)] if split is not None else []), *getattr(report.stats, "split_lags", ())]
            with self._lock:
                if at >= self._lags.get(fmt, (0.0, 0.0))[0]:
                    self._lags[fmt] = (at, lag)
                for name, split_lag in per_split:
                    known = self._split_lags.get((fmt, name))
                    if known is None or at >= known.at:
                        self._split_lags[(fmt, name)] = SplitFetchLag(fmt, name, split_lag, at)
                        self._split_lags.move_to_end((fmt, name))
                        while len(self._split_lags) > _SPLITS_KEPT:
                            self._split_lags.popitem(last=False)
        super().add(report)

    def split_lags(self) -> list[SplitFetchLag]:
        """Every split's fetch lag, by format and split."""
        with self._lock:
            return sorted(self._split_lags.values(), key=lambda lag: (lag.format, lag.split))

    def _extra(self, format_name: str, live: list) -> dict[str, float | None]:
        at, lag = self._lags.get(format_name, (None, None))
        return {"event_lag_ms": lag, "lag_at": at}


class LookupMetrics(TaskMetrics):
    """Lookup joins: rows in and out, the cache's hits, misses and evictions, the store's loads; the latest load's
    duration among running tasks."""

    counters = tuple(field for _, _, field in LOOKUP_COUNTERS)
    gauges = tuple(field for _, _, field in LOOKUP_GAUGES)

    def _extra(self, format_name: str, live: list) -> dict[str, float | None]:
        loads = [(s.at, s.load_ms) for s in live if s.load_ms is not None]
        return {"load_ms": max(loads)[1] if loads else None}


class SourceMetrics:
    """The latest lag report of each streaming source (format, source); one that stops reporting for
    `stale_after_s` (its query ended) is dropped."""

    def __init__(self, stale_after_s: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._lock = threading.Condition()
        self._latest: dict[tuple[str, str], SourceReport] = {}

    def add(self, report: SourceReport) -> None:
        with self._lock:
            self._latest[(report.format, report.source)] = report
            self._lock.notify_all()

    def snapshot(self) -> list[SourceReport]:
        with self._lock:
            now = self._clock()
            for key, report in list(self._latest.items()):
                if now - report.at > self.stale_after_s:
                    del self._latest[key]
            return sorted(self._latest.values(), key=lambda r: (r.format, r.source))

    def wait_for(self, predicate: Callable[[list[SourceReport]], bool], timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: predicate(sorted(self._latest.values(), key=lambda r: r.source)),
                                       timeout)


@dataclass(frozen=True)
class SplitView:
    """One split of a streaming split source, as the page shows it: how far behind its head it is, in records
    (the source's report) and in time (its read tasks' currentFetchEventTimeLag)."""

    format: str
    source: str
    split: str
    position: int
    head: int
    pending_records: int
    fetch_lag_ms: float | None  # None: no read task of the split reported an event time yet
    at: float  # when the source reported, epoch seconds


def split_views(reports: Iterable[SourceReport], lags: Iterable[SplitFetchLag]) -> list[SplitView]:
    """The splits of every source report, each with its read tasks' fetch lag (same format and split id)."""
    fetched = {(lag.format, lag.split): lag.lag_ms for lag in lags}
    return [SplitView(r.format, r.source, s.split, s.position, s.head, s.pending_records,
                      fetched.get((r.format, s.split)), r.at) for r in reports for s in r.splits]


def per_format(kind: type, declared: Iterable[tuple[str, str, str]], snapshot: dict[str, dict[str, float]]) -> Iterator:
    """One metric family of `kind` per (name, doc, field) of `declared`, with each format's value of the field."""
    for name, doc, field in declared:
        family = kind(name, doc, labels=["format"])
        for fmt, values in snapshot.items():
            family.add_metric([fmt], values[field])
        yield family


class PrometheusCollector:
    """A prometheus_client collector over the sinks', sources', reads' and lookups' metrics: values computed at
    scrape time."""

    def __init__(self, metrics: SinkMetrics, sources: SourceMetrics, reads: ReadMetrics,
                 lookups: LookupMetrics) -> None:
        self.metrics = metrics
        self.sources = sources
        self.reads = reads
        self.lookups = lookups

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from self._source_families(GaugeMetricFamily)
        yield from self._read_families(CounterMetricFamily, GaugeMetricFamily)
        yield from self._lookup_families(CounterMetricFamily, GaugeMetricFamily)
        snapshot = self.metrics.snapshot()
        gauges = (*GAUGES, ("sluice_sink_currentSendTime", "The slowest running task's last request, in ms.",
                            "send_ms"), ("sluice_sink_tasksRunning", "Tasks writing now.", "tasks_running"))
        yield from per_format(CounterMetricFamily, COUNTERS, snapshot)
        yield from per_format(GaugeMetricFamily, gauges, snapshot)
        yield from per_format(CounterMetricFamily, (("sluice_sink_tasks", "Tasks whose write ended.", "tasks_ended"),),
                              snapshot)

    def _read_families(self, counter: type, gauge: type) -> Iterator:
        snapshot = self.reads.snapshot()
        yield from per_format(counter, READ_COUNTERS, snapshot)
        lag = gauge("sluice_source_currentFetchEventTimeLag", "When the newest record a read task fetched was "
                    "committed, behind when it was fetched, ms (S2: record timestamps; change capture: commit times).",
                    labels=["format"])
        running = gauge("sluice_source_tasksRunning", "Read tasks fetching now.", labels=["format"])
        for fmt, values in snapshot.items():
            if values["event_lag_ms"] is not None:
                lag.add_metric([fmt], values["event_lag_ms"])
            running.add_metric([fmt], values["tasks_running"])
        yield lag
        yield running
        per_split = gauge("sluice_source_split_currentFetchEventTimeLag", "currentFetchEventTimeLag of one split of "
                          "a split source (Kafka: a topic partition; S2: a stream), ms.", labels=["format", "split"])
        for found in self.reads.split_lags():
            per_split.add_metric([found.format, found.split], found.lag_ms)
        yield per_split

    def _lookup_families(self, counter: type, gauge: type) -> Iterator:
        snapshot = self.lookups.snapshot()
        yield from per_format(counter, LOOKUP_COUNTERS, snapshot)
        yield from per_format(gauge, (*LOOKUP_GAUGES, ("sluice_lookup_tasksRunning", "Lookup tasks running now.",
                                                       "tasks_running")), snapshot)
        latest = gauge("sluice_lookup_latestLoadTime", "The latest store call of a running lookup task, ms.",
                       labels=["format"])
        for fmt, values in snapshot.items():
            if values["load_ms"] is not None:
                latest.add_metric([fmt], values["load_ms"])
        yield latest

    def _source_families(self, gauge: type) -> Iterator:
        reports = self.sources.snapshot()
        for name, doc, value in (
                ("sluice_source_pendingBytes", "Bytes the source is behind its store's head (PostgreSQL: WAL "
                 "between the slot's confirmed position and the server's).", lambda r: r.pending_bytes),
                ("sluice_source_pendingRecords", "Records the source is behind its store's head (S2: records past "
                 "the committed positions).", lambda r: r.pending_records),
                ("sluice_source_timeBehindMs", "How far the committed position is behind the head in time, ms "
                 "(the table store: its newest barrier minus the committed one).", lambda r: r.time_behind_ms),
                ("sluice_source_retainedBytes", "What the source makes its store keep (PostgreSQL: WAL the slot "
                 "holds back).", lambda r: r.retained_bytes),
                ("sluice_source_lastReportTime", "When the source last reported, epoch seconds.", lambda r: r.at)):
            family = gauge(name, doc, labels=["format", "source"])
            for report in reports:
                if value(report) is not None:  # what a source cannot tell is left out, never shown as 0
                    family.add_metric([report.format, report.source], value(report))
            yield family
        per_split = gauge("sluice_source_split_pendingRecords", "Records one split of a split source is behind its "
                          "head (Kafka: a topic partition's offsets; S2: a stream's seq nums).",
                          labels=["format", "source", "split"])
        for report in reports:
            for split in report.splits:
                per_split.add_metric([report.format, report.source, split.split], split.pending_records)
        yield per_split
