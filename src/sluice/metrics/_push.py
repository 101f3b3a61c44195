"""The executor's side: a task's reports sent to the collector while it writes (one thread, the latest report
only: a slow collector makes reports coarser, never the write slower)."""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from typing import Any

from sluice.metrics._report import LookupReport, MetricsTarget, ReadReport, SourceReport, TaskIdentity, TaskReport

log = logging.getLogger("sluice.metrics")

_TIMEOUT_S = 2.0


class MetricsPusher:
    """`offer` (the engine's observer, on its manager thread; a read or lookup task's batch loop) never blocks;
    `close` sends the final report. Writes send `TaskReport`s of `LiveStats` to /push, reads `ReadReport`s of
    `ReadStats` to /push/read, lookups `LookupReport`s to /push/lookup (each report type's `path`)."""

    def __init__(self, target: MetricsTarget, task: TaskIdentity,
                 report: type[TaskReport] | type[ReadReport] | type[LookupReport] = TaskReport) -> None:
        self.target = target
        self.task = task
        self._report = report
        self._path = report.path
        self._cond = threading.Condition()
        self._latest: Any = None
        self._closing = False
        self._dead = False  # the collector could not be reached: stop trying for this task
        self._thread = threading.Thread(target=self._run, name="sluice-metrics-push", daemon=True)
        self._thread.start()

    def offer(self, stats: Any) -> None:
        with self._cond:
            self._latest = stats
            self._cond.notify()

    def close(self, final: Any) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self._send(self._report(self.task, final, done=True))

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._latest is not None or self._closing)
                if self._closing:
                    return
                stats, self._latest = self._latest, None
            assert stats is not None
            self._send(self._report(self.task, stats, done=False))

    def _send(self, report: TaskReport | ReadReport | LookupReport) -> None:
        if self._dead:
            return
        try:
            post(self.target, self._path, report.to_json())
        except Exception as e:  # metrics never fail a write; the URL carries no secret, the token is a header
            self._dead = True
            log.warning("sluice: live metrics for %s task %d not sent to %s (%s: %s); the write goes on without them",
                        self.task.format, self.task.partition, self.target.url, type(e).__name__, e)


def auth_headers(target: MetricsTarget) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.token}"} if target.token else {}


def post(target: MetricsTarget, path: str, body: dict[str, Any]) -> None:
    """One report to the collector (raises what urllib raises)."""
    headers = {"Content-Type": "application/json", **auth_headers(target)}
    request = urllib.request.Request(target.url.rstrip("/") + path, data=json.dumps(body).encode(), headers=headers,
                                     method="POST")
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as answer:
        answer.read()


class SourceReporter:
    """A streaming source's driver side reports its lag once per committed micro-batch (a synchronous request
    of at most 2 s; after a failure it says why once and stops)."""

    def __init__(self, target: MetricsTarget | None) -> None:
        self.target = target

    @classmethod
    def on_driver(cls) -> SourceReporter:
        """The reporter of a stream started now: to the collector sluice.metrics.find_target finds, else nowhere."""
        from sluice.metrics._server import find_target

        return cls(find_target())

    def report(self, report: SourceReport) -> None:
        if self.target is None:
            return
        try:
            post(self.target, "/push/source", report.to_json())
        except Exception as e:
            log.warning("sluice: source metrics of %s %s not sent to %s (%s: %s); reading goes on without them",
                        report.format, report.source, self.target.url, type(e).__name__, e)
            self.target = None
