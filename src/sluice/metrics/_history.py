"""The collector's own memory of the last minutes, for the page's charts: every few seconds it samples its metrics
(each sink's records/s and retries, each source's time and records behind, each read's newest-record lag), and keeps
a window of them. No other server: Prometheus keeps the long history; this is what one look at the page needs."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluice.metrics._collect import ReadMetrics, SinkMetrics, SourceMetrics

# (series kind, measure, what it is): the page titles its charts from these.
MEASURES: dict[tuple[str, str], str] = {
    ("sink", "records_per_s"): "records/s the store acknowledged",
    ("sink", "retries"): "batches retried per interval",
    ("source", "time_behind_ms"): "time behind its store's head, ms",
    ("source", "pending_records"): "records behind its store's head",
    ("read", "event_lag_ms"): "newest fetched record behind, ms",
}


@dataclass(frozen=True)
class Series:
    """One line of one chart: `name` is a sink's or read's format, or a source's "format source"."""

    kind: str
    name: str
    measure: str
    points: tuple[tuple[float, float], ...]  # (epoch seconds, value), oldest first

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "measure": self.measure, "title": MEASURES[(self.kind,
                self.measure)], "points": [list(p) for p in self.points]}


class MetricsHistory:
    """Samples of a collector's metrics every `interval_s`, the last `window_s` of them. `sample()` takes one (the
    sampler thread calls it; tests call it with their own clock)."""

    def __init__(self, sinks: SinkMetrics, sources: SourceMetrics, reads: ReadMetrics, *, interval_s: float = 5.0,
                 window_s: float = 900.0, clock: Callable[[], float] = time.time) -> None:
        if interval_s <= 0 or window_s < interval_s:
            raise ValueError(f"interval_s ({interval_s}) must be > 0 and at most window_s ({window_s})")
        self.interval_s, self.window_s = interval_s, window_s
        self._sinks, self._sources, self._reads, self._clock = sinks, sources, reads, clock
        self._keep = int(window_s / interval_s) + 1
        self._series: dict[tuple[str, str, str], deque[tuple[float, float]]] = {}
        self._counted: dict[str, tuple[float, float, float]] = {}  # sink format -> (at, records, retries)
        self._lock = threading.Condition()  # notified on every sample: wait_for() waits on samples, not sleeps
        self._samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        now = self._clock()
        points: list[tuple[str, str, str, float]] = []
        for fmt, values in self._sinks.snapshot().items():
            records, retries = values["records"], values["retries"]
            last = self._counted.get(fmt)
            self._counted[fmt] = (now, records, retries)
            if last is not None and now > last[0]:  # a rate needs two samples; counters never fall
                points.append(("sink", fmt, "records_per_s", max(0.0, records - last[1]) / (now - last[0])))
                points.append(("sink", fmt, "retries", max(0.0, retries - last[2])))
        for report in self._sources.snapshot():
            name = f"{report.format} {report.source}"
            if report.time_behind_ms is not None:
                points.append(("source", name, "time_behind_ms", report.time_behind_ms))
            if report.pending_records is not None:
                points.append(("source", name, "pending_records", report.pending_records))
        for fmt, values in self._reads.snapshot().items():
            if values.get("event_lag_ms") is not None:
                points.append(("read", fmt, "event_lag_ms", values["event_lag_ms"]))
        with self._lock:
            for kind, name, measure, value in points:
                self._series.setdefault((kind, name, measure), deque(maxlen=self._keep)).append((now, float(value)))
            for key, line in list(self._series.items()):  # a line whose writer or source went quiet ages out
                while line and line[0][0] < now - self.window_s:
                    line.popleft()
                if not line:
                    del self._series[key]
            self._samples += 1
            self._lock.notify_all()

    def series(self) -> list[Series]:
        with self._lock:
            return self._lines()

    def _lines(self) -> list[Series]:
        return [Series(kind, name, measure, tuple(line))
                for (kind, name, measure), line in sorted(self._series.items())]

    def to_json(self) -> dict:
        return {"interval_s": self.interval_s, "window_s": self.window_s, "now": self._clock(),
                "series": [s.to_json() for s in self.series()]}

    def wait_for(self, predicate: Callable[[list[Series]], bool], timeout: float) -> bool:
        """Block until `predicate(series())` holds after a sample, or `timeout` seconds pass."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._lines()), timeout)

    # ---- the sampler thread
    def start(self) -> MetricsHistory:
        self._thread = threading.Thread(target=self._run, name="sluice-metrics-history", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
