"""Runs of full batches handed to a store in one call (Store.submit_run): the batches `submit` would have been handed,
counted as if each went alone, bounded like them by the window, and each retried alone when a run fails."""

import threading
from concurrent.futures import Future

import numpy as np

from sluice._errors import RetryableError
from sluice.engine import AIMDRateLimiter, AsyncSinkWriter, Batch, BatchRun, SinkConfig, Store, completed_future


class BatchStore(Store):
    """Acknowledges every batch at once; records each call: ("batch", [batch]) or ("run", its batches)."""

    name = "batches"

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Batch]]] = []

    def submit(self, batch: Batch) -> Future[None]:
        self.calls.append(("batch", [batch]))
        return completed_future()

    def delivered(self) -> list[tuple[list[int], int, int, list[int], int]]:
        return [(list(b.entries), b.size_bytes, b.record_count, [int(s) for s in b.sizes], b.attempt)
                for _, batches in self.calls for b in batches]


class RunStore(BatchStore):
    def submit_run(self, run: BatchRun) -> Future[None] | None:
        self.calls.append(("run", run.batches()))
        return completed_future()


def _write(store: Store, config: SinkConfig) -> AsyncSinkWriter:
    """20,250 row numbers in chunks of 10,000, 250 and 10,000 (sizes 1..7 bytes): 40 full batches of 500 and a
    remainder the finish sends."""
    sizes = (np.arange(20_250) % 7 + 1).astype(np.int64)
    with AsyncSinkWriter(store, config) as w:
        for start, stop in ((0, 10_000), (10_000, 10_250), (10_250, 20_250)):
            w.write_chunk(range(start, stop), sizes[start:stop])
        w.finish()
    return w


def test_a_store_taking_runs_is_handed_the_batches_submit_would_be_in_fewer_calls_and_counted_alike():
    config = SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000)
    alone, runs = BatchStore(), RunStore()
    w_alone, w_runs = _write(alone, config), _write(runs, config)
    assert runs.delivered() == alone.delivered()
    assert len(alone.calls) == 41
    assert len(runs.calls) <= 5, [(kind, len(batches)) for kind, batches in runs.calls]
    assert {kind for kind, _ in runs.calls} == {"run", "batch"}  # the batch across chunks and the remainder: submit
    for stats in (w_alone.stats, w_runs.stats):
        assert (stats.records, stats.batches, stats.bytes) == (20_250, 41, int((np.arange(20_250) % 7 + 1).sum()))
    assert w_runs.stats.flush_reasons == w_alone.stats.flush_reasons
    assert sum(w_runs.stats.latency_buckets.values()) == sum(w_alone.stats.latency_buckets.values()) == 41


def test_a_store_that_declines_a_run_is_handed_each_batch_and_offered_no_run_again():
    class Declining(BatchStore):
        offered = 0

        def submit_run(self, run: BatchRun) -> Future[None] | None:
            self.offered += 1
            return None

    store = Declining()
    _write(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000))
    assert [kind for kind, _ in store.calls] == ["batch"] * 41
    assert store.offered == 1  # declined once: not offered again in this write
    assert [entries for entries, *_ in store.delivered()] == [list(range(s, min(s + 500, 20_250)))
                                                              for s in range(0, 20_250, 500)]


class OrderedFailingRunStore(RunStore):
    """Fails its second run (the first is one batch: the window's start) with a retryable error, once."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        self.runs += 1
        if self.runs == 2:
            return completed_future(RetryableError("injected: the run's request failed"))
        return super().submit_run(run)


def test_under_global_order_a_failed_runs_batches_go_again_in_their_order():
    store = OrderedFailingRunStore()
    w = _write(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000, mode="global-ordered",
                                 retry_delay_ms=1))
    written = [e for entries, *_ in store.delivered() for e in entries]
    assert written == list(range(20_250))  # every entry once, in order: the failed run's batches went again in order
    assert [kind for kind, _ in store.calls].count("run") >= 2 and w.stats.retries == 19


class FailingRunStore(BatchStore):
    """Fails its first run with a retryable error; acknowledges everything else at once. Its window starts at 20
    batches, so that the first run is a whole chunk's."""

    window_start_batches = 20

    def __init__(self) -> None:
        super().__init__()
        self.failed: list[Batch] = []
        self.window_after_failure = 0
        self.writer: AsyncSinkWriter | None = None

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        if not self.failed:
            self.failed = run.batches()
            return completed_future(RetryableError("injected: the run's request failed"))
        self.calls.append(("run", run.batches()))
        return completed_future()

    def submit(self, batch: Batch) -> Future[None]:
        if batch.attempt and not self.window_after_failure:
            assert self.writer is not None
            self.window_after_failure = self.writer._limiter.window
        return super().submit(batch)


def test_a_failed_run_has_each_of_its_batches_retried_alone_and_halves_the_window_once():
    store = FailingRunStore()
    config = SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000, max_retries=3, retry_delay_ms=1)
    sizes = np.full(20_000, 10, dtype=np.int64)
    with AsyncSinkWriter(store, config) as w:
        store.writer = w
        for start in (0, 10_000):
            w.write_chunk(range(start, start + 10_000), sizes[start:start + 10_000])
        w.finish()
    assert len(store.failed) == 20
    retried = [batches[0] for kind, batches in store.calls if kind == "batch" and batches[0].attempt]
    assert sorted(list(b.entries) for b in retried) == [list(b.entries) for b in store.failed]
    assert {b.attempt for b in retried} == {1}
    assert store.window_after_failure == 5_000  # 10,000 halved once, not once per batch of the run
    assert sorted(e for entries, *_ in store.delivered() for e in entries) == list(range(20_000))
    assert w.stats.retries == 20 and w.stats.records == 20_000 and w.stats.batches == 40


class LaterRunStore(BatchStore):
    """Takes runs and acknowledges each from another thread, after submit_run returned; records the engine's
    in-flight count as each run arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.writer: AsyncSinkWriter | None = None
        self.lengths: list[int] = []
        self.window_allowed: list[int] = []

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        assert self.writer is not None
        limiter = self.writer._limiter
        self.window_allowed.append(limiter.requests_allowed(run.batch_records))
        self.lengths.append(len(run))
        self.calls.append(("run", run.batches()))
        future: Future[None] = Future()
        threading.Thread(target=future.set_result, args=(None,)).start()
        return future


def test_a_run_left_in_flight_is_bounded_by_the_window_and_each_batch_completes_alone():
    store = LaterRunStore()
    sizes = np.full(30_000, 10, dtype=np.int64)
    with AsyncSinkWriter(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000)) as w:
        store.writer = w
        for start in range(0, 30_000, 10_000):
            w.write_chunk(range(start, start + 10_000), sizes[start:start + 10_000])
        w.finish()
    assert store.lengths[0] == 1  # the window starts at one batch
    assert all(length <= allowed for length, allowed in zip(store.lengths, store.window_allowed, strict=True))
    assert sorted(e for entries, *_ in store.delivered() for e in entries) == list(range(30_000))
    assert w.stats.batches == 60 and w.stats.records == 30_000
    assert w._limiter.inflight_requests == 0 and w._limiter.inflight_records == 0
    assert w._limiter.window > 500  # each batch of each run counted a success


def test_requests_allowed_is_how_many_should_block_lets_go_one_after_another():
    for window, cap_requests, inflight, records_each in [(500, 10, 0, 500), (400, 10, 0, 500), (5000, 10, 0, 500),
                                                          (5000, 4, 0, 500), (5000, 10, 3, 500), (2000, 10, 1, 700),
                                                          (1000, 10, 2, 500), (1000, 2, 2, 100)]:
        limiter = AIMDRateLimiter(window, cap_requests)
        limiter.window = window
        for _ in range(inflight):
            limiter.on_submit(records_each)
        allowed = limiter.requests_allowed(records_each)
        let_go = 0
        while not limiter.should_block(records_each):
            limiter.on_submit(records_each)
            let_go += 1
        assert allowed == let_go, (window, cap_requests, inflight, records_each)
