"""The write's rate cap (sink.rate.*): the token bucket on a clock the test gives, the engine holding requests back on
it, and the options refused by name. Counts what was admitted by when; nothing here is timed."""

from __future__ import annotations

import itertools
import sys
import threading
from concurrent.futures import Future
from typing import Any

import pytest

from sluice import OptionError, ThrottledError
from sluice.engine import SINK_SPEC, AsyncSinkWriter, Batch, SinkConfig, Store, completed_future
from sluice.engine._ratelimit import TokenBucket
from tests.engine.helpers import ManualStore


def test_a_bucket_admits_at_most_rate_times_t_plus_burst():
    rate, burst = 100.0, 50.0
    bucket, now, admitted = TokenBucket(rate, burst, 0.0), 0.0, 0
    for cost in [7, 50, 1, 30, 13, 50, 2] * 20:
        now = bucket.ready_at(cost, now)  # the writer waits until then
        bucket.take(cost, now)
        admitted += cost
        assert admitted <= rate * now + burst + 1e-6, (admitted, now)
    # and it is a rate, not a stall: everything went by the time the cap allows it
    assert now <= (admitted - burst) / rate + 1e-6


def test_a_cost_bigger_than_the_burst_goes_once_the_bucket_is_full_and_the_next_pays_its_debt():
    bucket = TokenBucket(10.0, 10.0, 0.0)
    bucket.take(10, 0.0)  # empty
    assert bucket.ready_at(25, 0.0) == pytest.approx(1.0)  # waits for a full bucket, not for 25 tokens (never)
    bucket.take(25, 1.0)
    assert bucket.ready_at(5, 1.0) == pytest.approx(3.0)  # 15 of debt, then 5: 2 s at 10/s


class _TimedStore(Store):
    """Acknowledges every batch at once and notes the writer's clock when each was submitted."""

    name = "timed"

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.submits: list[tuple[float, int]] = []

    def submit(self, batch: Batch) -> Future[None]:
        self.submits.append((self.now[0], batch.record_count))
        return completed_future()


def _write_3000(step: float = 0.2, **config: Any) -> tuple[list[tuple[float, int]], AsyncSinkWriter]:
    """3,000 records in one chunk, batches of 100, on a clock that only moves while the writer waits, by `step` per
    wait (at least the longest wait: every wait is over at once in real time)."""
    now = [0.0]

    def clock() -> float:
        if sys._getframe(1).f_code.co_name == "_wait_seconds":
            now[0] += step
        return now[0]

    store = _TimedStore(now)
    cfg = SinkConfig(**{"batch_max_size": 100, "requests_max_buffered": 5000, "flush_buffer_timeout": 60_000, **config})
    with AsyncSinkWriter(store, cfg, clock=clock) as w:
        w.write_chunk(range(3000), [10] * 3000)
        w.flush()
    return store.submits, w


def _over_the_cap(submits: list[tuple[float, int]], rate: float, burst: float) -> list[tuple[float, int]]:
    """Submissions at which more had been sent since the writer started than rate * t + burst."""
    sent, over = 0, []
    for at, records in submits:
        sent += records
        if sent > rate * at + burst + 1e-6:
            over.append((at, sent))
    return over


def test_the_engine_holds_requests_back_to_the_cap():
    # 2,000 records/s shared by 2 tasks: this task's share is 1,000/s, with a burst of one second's share
    submits, w = _write_3000(rate_records_per_second=2000, rate_tasks=2)
    assert sum(n for _, n in submits) == 3000 and w.stats.records == 3000
    assert _over_the_cap(submits, 1000.0, 1000.0) == []
    assert submits[-1][0] >= 2.0 - 1e-9  # the 2,000 records past the burst took two seconds of the writer's clock
    assert w.stats.rate_wait_s > 0 and w.live().rate_wait_s == w.stats.rate_wait_s


def test_under_a_cap_batches_are_cut_no_larger_than_its_burst():
    """A store's batches of 1,000 under a 500 records/s share: cut to 500 (one second), so no batch goes over the
    cap into debt at once."""
    submits, _ = _write_3000(step=1.0, batch_max_size=1000, rate_records_per_second=500, rate_tasks=1)
    assert {n for _, n in submits} == {500} and _over_the_cap(submits, 500.0, 500.0) == []


def test_without_a_cap_everything_goes_at_once():
    """The negative control: the same write with no cap sends all of it at one clock reading."""
    submits, w = _write_3000()
    assert {at for at, _ in submits} == {submits[0][0]}
    assert _over_the_cap(submits, 1000.0, 1000.0) != []
    assert w.stats.rate_wait_s == 0


def test_a_bytes_cap_holds_back_a_batch_bigger_than_its_burst_and_then_sends_it():
    # 10 bytes a record: a batch of 100 is 1,000 bytes, twice the 500-byte burst of a 500 bytes/s cap
    submits, _ = _write_3000(step=2.0, rate_bytes_per_second=500, rate_tasks=1)
    assert sum(n for _, n in submits) == 3000
    times = [at for at, _ in submits]
    assert all(b - a >= 2.0 - 1e-9 for a, b in itertools.pairwise(times))  # 1,000 bytes at 500/s


def test_the_stores_throttling_still_works_beneath_the_cap():
    """A store that says 'slow down' gets its retry and its shrunk AIMD window, cap or not."""
    store = ManualStore()
    cfg = SinkConfig(retry_delay_ms=1, flush_buffer_timeout=60_000, rate_records_per_second=1_000_000, rate_tasks=1)
    with AsyncSinkWriter(store, cfg) as w:
        w.write_chunk(["a", "b"], [1, 1])
        flusher = threading.Thread(target=w.flush)
        flusher.start()
        store.wait_submits(1)
        window = w._limiter.window
        store.complete_all(ThrottledError("slow down"))
        assert store.wait_submits(1)[-1].attempt == 1  # retried
        store.complete_all()
        flusher.join(10)
        assert not flusher.is_alive()
    assert w.stats.throttles == 1 and w.stats.records == 2 and w._limiter.window < window + 10


@pytest.mark.parametrize(("options", "message"), [
    ({"sink.rate.records-per-second": "5000"}, r"sink.rate.records-per-second caps the whole write.*sink.rate.tasks"),
    ({"sink.rate.tasks": "4"}, r"sink.rate.tasks only shares a rate cap.*no cap is set"),
    ({"sink.rate.records-per-second": "0", "sink.rate.tasks": "1"}, r"'sink.rate.records-per-second' must be >= 1"),
    ({"sink.rate.bytes-per-second": "fast", "sink.rate.tasks": "1"}, r"'sink.rate.bytes-per-second' must be a whole"),
    ({"sink.rate.records-per-second": "3", "sink.rate.tasks": "4"}, r"leaves each less than 1 per second"),
    ({"sink.rate.record-per-second": "5"}, r"sink.rate.records-per-second"),  # did you mean
])
def test_nonsensical_rate_options_are_refused_by_name(options, message):
    with pytest.raises(OptionError, match=message):
        SINK_SPEC.parse(options)


def test_the_caps_reach_the_config_typed_and_shared():
    config = SinkConfig.of(SINK_SPEC.parse({"sink.rate.records-per-second": "5000", "sink.rate.tasks": "4",
                                            "sink.rate.bytes-per-second": "1000000"}))
    assert (config.rate_records_per_second, config.rate_bytes_per_second, config.rate_tasks) == (5000, 1_000_000, 4)
    assert config.task_rate() == (1250.0, 250_000.0)
    assert SinkConfig.of(SINK_SPEC.parse({})).task_rate() == (None, None)
