"""The engine reports a running write to its observer (live metrics): while requests are in flight, after they are
answered, and after failures; an observer that fails never fails the write."""

import logging
import queue
import threading

from sluice import RetryableError
from sluice.engine import AsyncSinkWriter, LiveStats, SinkConfig
from tests.engine.helpers import ManualStore

CONFIG = SinkConfig(retry_delay_ms=1, flush_buffer_timeout=60_000, batch_max_size=2, requests_max_buffered=10,
                    requests_max_inflight=1)


def next_matching(reports: "queue.Queue[LiveStats]", predicate, timeout: float = 5.0) -> LiveStats:
    """The first report satisfying `predicate` (reports arrive every observe_every_s; each is an event)."""
    while True:
        report = reports.get(timeout=timeout)
        if predicate(report):
            return report


def test_a_write_is_reported_while_in_flight_and_after_its_answers():
    store, reports = ManualStore(), queue.Queue()
    with AsyncSinkWriter(store, CONFIG, observer=reports.put, observe_every_s=0.02) as w:
        w.write_chunk(["a", "b", "c", "d"], [10, 10, 10, 10])
        store.wait_submits(1)
        held = next_matching(reports, lambda r: r.inflight_requests == 1)
        assert (held.records, held.inflight_records, held.buffered, held.last_send_ms) == (0, 2, 2, None)
        store.complete_all()
        store.wait_submits(1)
        store.complete_all()
        w.flush()
        done = next_matching(reports, lambda r: r.records == 4)
    assert (done.bytes, done.batches, done.inflight_requests, done.buffered, done.failed_records) == (40, 2, 0, 0, 0)
    assert done.last_send_ms is not None and done.last_send_ms >= 0
    assert w.live().records == 4


def test_failed_requests_count_their_records_and_the_window_shrinks():
    store, reports = ManualStore(), queue.Queue()
    with AsyncSinkWriter(store, CONFIG, observer=reports.put, observe_every_s=0.02) as w:
        w.write_chunk(["a", "b"], [1, 1])
        store.wait_submits(1)
        before = next_matching(reports, lambda r: r.inflight_requests == 1).window
        store.complete_all(RetryableError("try again"))
        store.wait_submits(1)
        failed = next_matching(reports, lambda r: r.failed_records == 2)
        assert failed.retries == 1 and failed.window < before
        store.complete_all()  # the window let one of the two entries go again; the other follows its answer
        store.wait_submits(1)
        store.complete_all()
        w.flush()
    assert w.stats.records == 2


def test_the_reports_come_from_the_observer_hook():
    """The negative control: with the hook switched off (an interval no write outlives), no report arrives while
    the same request is held in flight, so the reports above are the hook's, not the test's own doing."""
    store, reports = ManualStore(), queue.Queue()
    with AsyncSinkWriter(store, CONFIG, observer=reports.put, observe_every_s=3600) as w:
        w.write_chunk(["a", "b"], [1, 1])
        store.wait_submits(1)
        try:
            reports.get(timeout=0.5)
            raise AssertionError("a report arrived with the hook switched off")
        except queue.Empty:
            pass
        store.complete_all()
        w.flush()


def test_an_observer_that_fails_is_dropped_and_the_write_goes_on(caplog):
    store, calls, called = ManualStore(), [], threading.Event()

    def broken(report: LiveStats) -> None:
        calls.append(report)
        called.set()
        raise RuntimeError("the collector is gone")

    with caplog.at_level(logging.WARNING, logger="sluice.engine"), \
            AsyncSinkWriter(store, CONFIG, observer=broken, observe_every_s=0.01) as w:
        w.write_chunk(["a", "b", "c", "d"], [1, 1, 1, 1])
        store.wait_submits(1)
        assert called.wait(5)
        store.complete_all()
        store.wait_submits(1)
        store.complete_all()
        w.flush()
    assert w.stats.records == 4 and len(calls) == 1
    assert [r.message for r in caplog.records].count(
        "sluice: the write's metrics observer failed; no more live metrics for this task") == 1
