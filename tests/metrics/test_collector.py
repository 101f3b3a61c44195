"""The driver's collector (sluice.metrics): task reports in over HTTP, Prometheus' text format out; counters that
only grow while tasks come and go; tokens required off loopback and never shown. No Spark: reports are sent as a
task's pusher sends them."""

import json
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sluice.metrics
from sluice import OptionError
from sluice.engine import LiveStats
from sluice.metrics import MetricsTarget, TaskIdentity, TaskReport
from sluice.metrics._collect import SinkMetrics
from sluice.metrics._push import MetricsPusher


def stats(records: int, inflight: int = 0, failed: int = 0) -> LiveStats:
    return LiveStats(records=records, bytes=10 * records, batches=records // 10, failed_records=failed, retries=0,
                     throttles=0, inflight_requests=inflight, inflight_records=inflight * 10, window=100, buffered=5,
                     last_send_ms=2.5, at=0.0, rate_wait_s=records / 100)


def task(partition: int, fmt: str = "postgres", attempt: int = 0) -> TaskIdentity:
    return TaskIdentity(fmt, "write-1", partition, attempt, 100 + partition, None)


def scrape(server, token: str | None = None) -> dict[tuple[str, str], float]:
    request = urllib.request.Request(server.url + "/metrics",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=5) as answer:
        text = answer.read().decode()
    return {(sample.name, sample.labels.get("format", "")): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_counters_add_ended_tasks_to_running_ones_and_gauges_describe_running_ones():
    metrics = SinkMetrics()
    metrics.add(TaskReport(task(0), stats(100, inflight=2), done=False))
    metrics.add(TaskReport(task(1), stats(50, inflight=1), done=False))
    running = metrics.snapshot()["postgres"]
    assert (running["records"], running["inflight_requests"], running["tasks_running"]) == (150, 3, 2)
    metrics.add(TaskReport(task(0), stats(120), done=True))
    metrics.add(TaskReport(task(0), stats(110, inflight=2), done=False))  # late: sent before the final one
    later = metrics.snapshot()["postgres"]
    assert (later["records"], later["inflight_requests"], later["tasks_running"], later["tasks_ended"]) == \
        (170, 1, 1, 1)


def test_a_task_that_stops_reporting_keeps_its_counters_and_loses_its_gauges():
    now = [0.0]
    metrics = SinkMetrics(stale_after_s=30, clock=lambda: now[0])
    metrics.add(TaskReport(task(0), stats(100, inflight=4), done=False))
    now[0] = 31.0  # its executor died: no final report will come
    gone = metrics.snapshot()["postgres"]
    assert (gone["records"], gone["inflight_requests"], gone["tasks_running"]) == (100, 0, 0)


def test_reports_over_http_become_prometheus_metrics_named_as_flinks():
    with sluice.metrics.serve() as server:
        target = sluice.metrics.find_target()
        assert target == server.target and target.url.startswith("http://127.0.0.1:")
        pusher = MetricsPusher(target, task(0, fmt="clickhouse"))
        pusher.offer(stats(40, inflight=2, failed=3))
        assert server.metrics.wait_for(lambda s: s.get("clickhouse", {}).get("records") == 40, timeout=10)
        live = scrape(server)
        assert live[("sluice_sink_numRecordsSend_total", "clickhouse")] == 40
        assert live[("sluice_sink_numRecordsSendErrors_total", "clickhouse")] == 3
        assert live[("sluice_sink_inflightRequests", "clickhouse")] == 2
        assert live[("sluice_sink_currentSendTime", "clickhouse")] == 2.5
        assert live[("sluice_sink_rateWaitSeconds_total", "clickhouse")] == 0.4  # the rate cap's wait (sink.rate.*)
        pusher.close(stats(60))
        ended = scrape(server)
        assert ended[("sluice_sink_numRecordsSend_total", "clickhouse")] == 60
        assert ended[("sluice_sink_numBytesSend_total", "clickhouse")] == 600
        assert ended[("sluice_sink_tasksRunning", "clickhouse")] == 0
        assert ended[("sluice_sink_tasks_total", "clickhouse")] == 1
    assert sluice.metrics.find_target() is None  # closed: later writes push nothing


def test_a_malformed_report_is_refused_naming_what_is_wrong():
    with sluice.metrics.serve() as server:
        body = json.dumps({"v": 1, "task": {"format": "s2"}, "stats": {}, "done": False}).encode()
        request = urllib.request.Request(server.url + "/push", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 400 and "missing or unknown fields" in refused.value.read().decode()


def test_a_token_is_required_off_loopback_and_on_every_request_and_never_shown():
    with pytest.raises(OptionError, match="without token"):
        sluice.metrics.serve(host="0.0.0.0")
    secret = "metrics-secret-8d1f"
    with sluice.metrics.serve(token=secret) as server:
        assert secret not in repr(server) and secret not in repr(server.target)
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(server)
        assert refused.value.code == 401
        wrong = MetricsPusher(MetricsTarget(server.url, "not-the-token"), task(0))
        wrong.close(stats(5))
        assert server.metrics.snapshot() == {}  # refused: nothing counted
        right = MetricsPusher(server.target, task(0))
        right.close(stats(5))
        assert scrape(server, secret)[("sluice_sink_numRecordsSend_total", "postgres")] == 5


def test_a_source_report_becomes_gauges_labelled_by_its_source():
    from sluice.metrics import SourceReport
    from sluice.metrics._push import SourceReporter

    with sluice.metrics.serve() as server:
        SourceReporter(server.target).report(SourceReport(
            format="postgres_changes", source="sluice_orders", pending_bytes=4096, retained_bytes=65536,
            position="0/1A2B3C", head="0/1A3B3C", at=time.time()))
        found = scrape(server)
        assert found[("sluice_source_pendingBytes", "postgres_changes")] == 4096
        assert found[("sluice_source_retainedBytes", "postgres_changes")] == 65536
        assert ("sluice_source_pendingRecords", "postgres_changes") not in found  # it cannot tell: not a 0
        assert ("sluice_source_timeBehindMs", "postgres_changes") not in found
        body = json.dumps({"v": 1, "source": {"format": "x"}}).encode()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(server.url + "/push/source", data=body, method="POST"),
                                   timeout=5)
        assert refused.value.code == 400


def test_a_read_task_reports_what_it_fetched_and_how_old_its_newest_record_is():
    """ReadObserver.observed, as a read task runs it (outside Spark: one anonymous task): rows and Arrow bytes of
    every batch, and now minus the newest commit time of the last batch (Flink's currentFetchEventTimeLag)."""
    import pyarrow as pa

    from sluice.metrics._reads import ReadObserver

    committed = int(time.time() * 1_000_000) - 3_000_000  # three seconds ago, in microseconds
    stamps = pa.array([committed - 1_000_000, committed], pa.timestamp("us", tz="UTC"))
    batches = [pa.record_batch({"id": pa.array([1, 2]), "_commit_time": stamps}) for _ in range(3)]
    with sluice.metrics.serve() as server:
        observer = ReadObserver.on_driver("postgres_changes", event_time="_commit_time")
        assert observer is not None and observer.target == server.target
        assert list(observer.observed(iter(batches))) == batches  # the batches pass unchanged
        untimed = ReadObserver.on_driver("clickhouse")  # a store whose records carry no commit time
        list(untimed.observed(iter([pa.record_batch({"id": pa.array([7])})])))
        reads = server.reads.snapshot()
        live = scrape(server)
    assert reads["postgres_changes"]["records"] == 6 and reads["postgres_changes"]["tasks_ended"] == 1
    assert reads["postgres_changes"]["bytes"] == sum(b.nbytes for b in batches)
    assert 3000 <= reads["postgres_changes"]["event_lag_ms"] < 60_000
    assert live[("sluice_source_numRecordsIn_total", "postgres_changes")] == 6
    assert 3000 <= live[("sluice_source_currentFetchEventTimeLag", "postgres_changes")] < 60_000
    assert live[("sluice_source_numRecordsIn_total", "clickhouse")] == 1
    assert ("sluice_source_currentFetchEventTimeLag", "clickhouse") not in live  # unknown: left out, never 0
    assert ReadObserver.on_driver("postgres") is None  # no collector: reads are not observed at all


def test_read_counters_add_ended_tasks_and_the_lag_is_the_newest_reports():
    from sluice.metrics import ReadReport, ReadStats
    from sluice.metrics._collect import ReadMetrics

    reads = ReadMetrics()
    reads.add(ReadReport(task(0, "s2"), ReadStats(100, 1000, 1, 250.0, at=10.0), done=True))
    reads.add(ReadReport(task(1, "s2"), ReadStats(50, 500, 1, 900.0, at=5.0), done=False))  # an older report
    reads.add(ReadReport(task(1, "s2"), ReadStats(70, 700, 2, None, at=11.0), done=False))  # no lag: kept as it was
    found = reads.snapshot()["s2"]
    assert (found["records"], found["bytes"], found["tasks_running"], found["tasks_ended"]) == (170, 1700, 1, 1)
    assert (found["event_lag_ms"], found["lag_at"]) == (250.0, 10.0)


def labelled(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics by name and all its labels (the per-split series have three)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_a_split_sources_report_and_read_tasks_give_figures_per_split():
    """A split source's report (typed SplitLags over HTTP) becomes a series per split beside the total; read tasks
    that name their split give each split its own fetch lag; the page's join puts both on one row per split."""
    import pyarrow as pa

    from sluice.metrics import SourceReport, SplitLag
    from sluice.metrics._collect import split_views
    from sluice.metrics._push import SourceReporter
    from sluice.metrics._reads import ReadObserver

    now_us = int(time.time() * 1_000_000)
    def batch(age_s: int):
        return pa.record_batch({"timestamp": pa.array([now_us - age_s * 1_000_000], pa.timestamp("us"))})

    splits = (SplitLag("orders:0", 60, 100, 40), SplitLag("orders:1", 20, 20, 0))
    with sluice.metrics.serve() as server:
        SourceReporter(server.target).report(SourceReport(format="sluice_kafka", source="orders", pending_records=40,
                                                          at=time.time(), splits=splits))
        observer = ReadObserver.on_driver("sluice_kafka", event_time="timestamp")
        list(observer.observed(iter([batch(3600)]), "orders:0"))
        list(observer.observed(iter([batch(5)]), "orders:1"))
        list(observer.observed(iter([batch(7)])))  # a task of no split: the format's lag only
        [report] = server.sources.snapshot()
        lags = server.reads.split_lags()
        found = labelled(server)
        as_json = json.loads(urllib.request.urlopen(server.url + "/metrics.json", timeout=5).read())
    assert report.splits == splits  # typed again on the collector's side, not dicts
    pending = "sluice_source_split_pendingRecords"
    assert found[(pending, (("format", "sluice_kafka"), ("source", "orders"), ("split", "orders:0")))] == 40
    assert found[(pending, (("format", "sluice_kafka"), ("source", "orders"), ("split", "orders:1")))] == 0
    assert found[("sluice_source_pendingRecords", (("format", "sluice_kafka"), ("source", "orders")))] == 40
    fetch = "sluice_source_split_currentFetchEventTimeLag"
    assert 3_600_000 <= found[(fetch, (("format", "sluice_kafka"), ("split", "orders:0")))] < 3_660_000
    assert 5_000 <= found[(fetch, (("format", "sluice_kafka"), ("split", "orders:1")))] < 60_000
    assert [lag.split for lag in lags] == ["orders:0", "orders:1"]
    assert 7_000 <= found[("sluice_source_currentFetchEventTimeLag", (("format", "sluice_kafka"),))] < 60_000
    assert [s["split"] for s in as_json["sources"][0]["splits"]] == ["orders:0", "orders:1"]
    views = split_views([report], lags)
    assert [(v.split, v.pending_records, v.position, v.head) for v in views] == [("orders:0", 40, 60, 100),
                                                                                 ("orders:1", 0, 20, 20)]
    assert views[0].fetch_lag_ms >= 3_600_000 > views[1].fetch_lag_ms


def test_a_split_source_report_with_a_malformed_split_is_refused():
    with pytest.raises(ValueError, match="missing or unknown fields"):
        sluice.metrics.SourceReport.from_json({"v": 1, "source": {
            "format": "s2", "source": "b/s", "pending_bytes": None, "pending_records": 1, "retained_bytes": 0,
            "position": "", "head": "", "at": 0.0, "splits": [{"split": "s", "head": 3}]}})


def test_a_split_fetch_lag_is_the_newest_report_of_that_split():
    from sluice.metrics import ReadReport, ReadStats
    from sluice.metrics._collect import ReadMetrics

    reads = ReadMetrics()
    reads.add(ReadReport(task(0, "s2"), ReadStats(1, 10, 1, 250.0, at=10.0, split="a"), done=True))
    reads.add(ReadReport(task(1, "s2"), ReadStats(1, 10, 1, 900.0, at=5.0, split="a"), done=True))  # older
    reads.add(ReadReport(task(2, "s2"), ReadStats(1, 10, 1, 40.0, at=6.0, split="b"), done=True))
    reads.add(ReadReport(task(3, "s2"), ReadStats(1, 10, 1, None, at=12.0, split="b"), done=True))  # no lag: kept
    assert [(lag.split, lag.lag_ms, lag.at) for lag in reads.split_lags()] == [("a", 250.0, 10.0), ("b", 40.0, 6.0)]
