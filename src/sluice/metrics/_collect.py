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

from sluice.metrics._report import ReadReport, SourceReport, TaskReport

# (exposed name, help, LiveStats field): prometheus_client adds `_total` to counters.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("sluice_sink_numRecordsSend", "Records the store acknowledged.", "records"),
    ("sluice_sink_numBytesSend", "Bytes of the records the store acknowledged.", "bytes"),
    ("sluice_sink_numRecordsSendErrors", "Records of requests that failed (retried or not).", "failed_records"),
    ("sluice_sink_numBatchesSend", "Requests (batches) the store acknowledged.", "batches"),
    ("sluice_sink_retries", "Batches sent again after a retryable failure.", "retries"),
    ("sluice_sink_throttles", "Failures the store classified as throttling.", "throttles"),
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
_RETIRED_KEPT = 10_000  # keys of ended tasks remembered, to ignore their late reports


@dataclass
class _Running:
    report: TaskReport | ReadReport
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

    def add(self, report: TaskReport | ReadReport) -> None:
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

    def _retire(self, key: tuple, report: TaskReport | ReadReport) -> None:
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


class ReadMetrics(TaskMetrics):
    """Reads: records and bytes fetched; the event-time lag of the newest report that had one (read tasks of a
    stream are short: the lag outlives them, as Flink's currentFetchEventTimeLag is the last fetched record's)."""

    counters = tuple(field for _, _, field in READ_COUNTERS)

    def __init__(self, stale_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stale_after_s, clock)
        self._lags: dict[str, tuple[float, float]] = {}  # format -> (report time, lag ms)

    def add(self, report: TaskReport | ReadReport) -> None:
        lag, at = getattr(report.stats, "event_lag_ms", None), report.stats.at
        if lag is not None:
            with self._lock:
                if at >= self._lags.get(report.task.format, (0.0, 0.0))[0]:
                    self._lags[report.task.format] = (at, lag)
        super().add(report)

    def _extra(self, format_name: str, live: list) -> dict[str, float | None]:
        at, lag = self._lags.get(format_name, (None, None))
        return {"event_lag_ms": lag, "lag_at": at}


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


def per_format(kind: type, declared: Iterable[tuple[str, str, str]], snapshot: dict[str, dict[str, float]]) -> Iterator:
    """One metric family of `kind` per (name, doc, field) of `declared`, with each format's value of the field."""
    for name, doc, field in declared:
        family = kind(name, doc, labels=["format"])
        for fmt, values in snapshot.items():
            family.add_metric([fmt], values[field])
        yield family


class PrometheusCollector:
    """A prometheus_client collector over SinkMetrics and SourceMetrics: values computed at scrape time."""

    def __init__(self, metrics: SinkMetrics, sources: SourceMetrics, reads: ReadMetrics) -> None:
        self.metrics = metrics
        self.sources = sources
        self.reads = reads

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from self._source_families(GaugeMetricFamily)
        yield from self._read_families(CounterMetricFamily, GaugeMetricFamily)
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
