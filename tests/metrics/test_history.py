"""The collector's history for the page's charts: rates from counters between samples, what a source cannot tell
left out, a window that forgets, and the route that serves it (token required as for /metrics). No Spark."""

import json
import time
import urllib.error
import urllib.request

import pytest

import sluice.metrics
from sluice.engine import LiveStats
from sluice.metrics import SourceReport, TaskIdentity, TaskReport
from sluice.metrics._collect import ReadMetrics, SinkMetrics, SourceMetrics
from sluice.metrics._history import MetricsHistory


def stats(records: int, retries: int = 0) -> LiveStats:
    return LiveStats(records=records, bytes=10 * records, batches=records // 10, failed_records=0, retries=retries,
                     throttles=0, inflight_requests=0, inflight_records=0, window=100, buffered=0, last_send_ms=1.0,
                     at=0.0)


def lines(history: MetricsHistory) -> dict[tuple[str, str, str], list[tuple[float, float]]]:
    return {(s.kind, s.name, s.measure): list(s.points) for s in history.series()}


def test_rates_come_from_the_counters_between_two_samples_and_the_window_forgets():
    now = [1000.0]
    sinks, sources = SinkMetrics(clock=lambda: now[0]), SourceMetrics(stale_after_s=30, clock=lambda: now[0])
    history = MetricsHistory(sinks, sources, ReadMetrics(), interval_s=5, window_s=60, clock=lambda: now[0])
    task = TaskIdentity("postgres", "w", 0, 0, 1, None)
    sinks.add(TaskReport(task, stats(100), done=False))
    history.sample()
    assert lines(history) == {}, "one sample of a counter is no rate yet"
    now[0] += 5
    sinks.add(TaskReport(task, stats(600, retries=2), done=False))
    sources.add(SourceReport(format="tablestore", source="orders", at=now[0], time_behind_ms=1500.0))
    history.sample()
    assert lines(history) == {("sink", "postgres", "records_per_s"): [(1005.0, 100.0)],
                              ("sink", "postgres", "retries"): [(1005.0, 2.0)],
                              ("source", "tablestore orders", "time_behind_ms"): [(1005.0, 1500.0)]}
    # The task ends: its counts stay in the counters, so the rate goes to 0 rather than below.
    now[0] += 5
    sinks.add(TaskReport(task, stats(600, retries=2), done=True))
    history.sample()
    assert lines(history)[("sink", "postgres", "records_per_s")][-1] == (1010.0, 0.0)
    # Later only the last minute's points are kept; the source's report went stale (30 s) and its line aged out.
    for _ in range(20):
        now[0] += 5
        history.sample()
    kept = lines(history)
    assert all(t >= now[0] - 60 for t, _ in kept[("sink", "postgres", "records_per_s")])
    assert ("source", "tablestore orders", "time_behind_ms") not in kept


def test_a_bad_interval_is_refused_naming_it():
    with pytest.raises(ValueError, match="interval_s"):
        MetricsHistory(SinkMetrics(), SourceMetrics(), ReadMetrics(), interval_s=0)


def test_the_server_samples_by_itself_and_serves_the_history_only_with_its_token():
    task = TaskIdentity("sluice_null", "w", 0, 0, 1, None)
    server = sluice.metrics._server.MetricsServer("127.0.0.1", 0, None, "t0ken", history_interval_s=0.05).start()
    try:
        server.metrics.add(TaskReport(task, stats(10), done=False))
        assert server.history.wait_for(lambda series: any(len(s.points) >= 2 for s in series), timeout=10), \
            "the sampler thread took no two samples in 10 s"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/metrics/history.json", timeout=5)
        assert refused.value.code == 401
        request = urllib.request.Request(server.url + "/metrics/history.json",
                                         headers={"Authorization": "Bearer t0ken"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = json.loads(answer.read())
    finally:
        server.close()
    assert body["interval_s"] == 0.05 and body["window_s"] == 900.0 and body["now"] <= time.time()
    shown = {(s["kind"], s["name"], s["measure"]): s for s in body["series"]}
    assert shown[("sink", "sluice_null", "records_per_s")]["title"] == "records/s the store acknowledged"
    assert len(shown[("sink", "sluice_null", "records_per_s")]["points"]) >= 2
