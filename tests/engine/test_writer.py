import threading
import time
from dataclasses import replace

import pytest

from sluice import RecordTooLargeError, RetryableError, SinkError, ThrottledError
from sluice.connector import RetryEntries
from sluice.engine import AIMDRateLimiter, AsyncSinkWriter, PartitionKeyBatchCreator, SinkConfig
from tests.engine.helpers import ManualStore, RecordingStore
from tests.faults import poll_until

FAST = dict(retry_delay_ms=1, flush_buffer_timeout=60_000)


def writer(store, **config):
    return AsyncSinkWriter(store, SinkConfig(**{**FAST, **config}))


def test_batch_size_trigger_flushes_full_batches_only():
    store = ManualStore()
    with writer(store, batch_max_size=3, requests_max_buffered=10) as w:
        w.write_chunk(list(range(7)), [1] * 7)
        batches = store.wait_submits(1)
        assert batches[0].entries == [0, 1, 2]
        store.complete_all()
        store.wait_submits(1)
        store.complete_all()
        time.sleep(0.1)
        assert len(store.pending) == 0  # one entry left: below every trigger, it waits
        assert w.stats.flush_reasons["batch-size"] == 2


def test_byte_trigger_flushes_before_the_record_count_is_reached():
    store = RecordingStore()
    with writer(store, batch_max_size=100, flush_buffer_size=50, requests_max_buffered=200) as w:
        w.write_chunk(list(range(6)), [20] * 6)
        w.flush()
    assert next(b.entries for b in store.batches) == [0, 1]
    assert w.stats.flush_reasons["batch-bytes"] >= 1


def test_timeout_trigger_flushes_a_partial_batch():
    store = RecordingStore()
    with AsyncSinkWriter(store, SinkConfig(batch_max_size=100, flush_buffer_timeout=50)) as w:
        w.write_chunk(["a", "b"], [1, 1])
        deadline = time.monotonic() + 5
        while not store.batches and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.batches and store.batches[0].entries == ["a", "b"]
        assert w.stats.flush_reasons == {"timeout": 1}


def test_checkpoint_waits_for_every_ack():
    store = ManualStore()
    with writer(store, batch_max_size=100) as w:
        w.write_chunk([1, 2, 3], [1, 1, 1])
        done = threading.Event()
        flusher = threading.Thread(target=lambda: (w.flush(), done.set()))
        flusher.start()
        store.wait_submits(1)
        assert not done.wait(0.2), "flush returned before the store acknowledged"
        store.complete_all()
        assert done.wait(5)
        flusher.join()
    assert w.stats.records == 3 and w.stats.flush_reasons == {"checkpoint": 1}


def test_back_pressure_blocks_the_writer_while_the_buffer_is_full():
    store = ManualStore()
    w = writer(store, batch_max_size=2, requests_max_buffered=3, requests_max_inflight=1)
    wrote = []

    def produce():
        for i in range(20):
            w.write_chunk([i], [1])
            wrote.append(i)

    producer = threading.Thread(target=produce)
    producer.start()
    store.wait_submits(1)
    time.sleep(0.3)
    # 2 in flight + at most 3 buffered + the small ring (2 chunks) + the one being put: never all 20.
    assert len(wrote) < 12
    while producer.is_alive() or store.pending:
        store.complete_all()
        time.sleep(0.01)
    w.flush()
    w.close()
    assert wrote == list(range(20)) and w.stats.records == 20


def test_max_inflight_requests_is_honoured():
    store = ManualStore()
    with writer(store, batch_max_size=1, requests_max_buffered=100, requests_max_inflight=3) as w:
        w.write_chunk(list(range(10)), [1] * 10)
        store.wait_submits(1)
        time.sleep(0.2)
        assert len(store.pending) == 1  # AIMD window starts at one batch
        store.complete_all()  # window grows by 10 records per success
        store.wait_submits(3)
        time.sleep(0.2)
        assert len(store.pending) == 3  # capped by max in-flight requests
        while store.pending:
            store.complete_all()
            time.sleep(0.05)
        w.flush()
    assert w.stats.peak_inflight == 3


@pytest.mark.parametrize("start", [3, 1], ids=["three-batches", "negative-control-the-default-one"])
def test_a_store_may_start_the_window_at_several_batches(start):
    """A store that acknowledges batches together (Store.window_start_batches) gets that many in flight before any
    is acknowledged; by default, one."""
    store = ManualStore()
    store.window_start_batches = start
    with writer(store, batch_max_size=2, requests_max_buffered=100, requests_max_inflight=5) as w:
        w.write_chunk(list(range(10)), [1] * 10)
        store.wait_submits(start)
        # Everything admitted and the window full: no batch can go before a completion (no wait for an absence).
        poll_until(lambda: w.live().buffered == 10 - 2 * start and w.live().inflight_records == 2 * start, 5,
                   "the writer holding what its window does not let out")
        live = w.live()
        assert live.window == 2 * start and live.inflight_records + 2 > live.window
        assert len(store.pending) == start
        done = sum(b.record_count for b in store.complete_all())
        while done < 10:
            store.wait_submits(1)
            done += sum(b.record_count for b in store.complete_all())
        w.flush()
    assert w.stats.records == 10


def test_aimd_window_grows_additively_and_halves_on_failure():
    limiter = AIMDRateLimiter(batch_max_size=100, max_inflight_requests=4)
    assert limiter.window == 100
    assert AIMDRateLimiter(100, 4, start_batches=9).window == 400  # a store's start, capped at batch x in-flight
    limiter.on_submit(100)
    assert limiter.should_block(1)
    limiter.on_complete(100, success=True)
    assert limiter.window == 110
    limiter.on_submit(10)
    limiter.on_complete(10, success=False)
    assert limiter.window == 55
    for _ in range(10):
        limiter.on_submit(1)
        limiter.on_complete(1, success=False)
    assert limiter.window == 1
    assert not limiter.should_block(50)  # with nothing in flight one request may always go
    assert limiter.batch_size_limit(100) == 1


def test_retryable_failure_resends_the_same_entries_first_and_counts_it():
    store = ManualStore()
    with writer(store, batch_max_size=2, requests_max_buffered=10, requests_max_inflight=1) as w:
        w.write_chunk(["a", "b", "c", "d"], [1] * 4)
        store.wait_submits(1)
        store.complete_all(RetryableError("try again"))
        retried = store.wait_submits(1)
        assert retried[0].entries == ["a"] and retried[0].attempt == 1  # window halved to 1 record
        store.complete_all()
        while w.stats.records < 4:
            store.complete_all()
            time.sleep(0.01)
        w.flush()
    assert w.stats.retries == 1


def test_a_partly_refused_batch_resends_only_the_refused_entries_in_their_order():
    """Flink's retryForEntries: a bulk store (Elasticsearch) reports per entry; the stored ones are not sent again."""
    store = ManualStore()
    with writer(store, batch_max_size=5, requests_max_inflight=1) as w:
        w.write_chunk(["a", "b", "c", "d", "e"], [1, 2, 3, 4, 5])
        flusher = threading.Thread(target=w.flush)
        flusher.start()
        store.wait_submits(1)
        store.complete_all(RetryEntries("2 of 5 refused", [1, 3], ThrottledError("429")))
        retried = store.wait_submits(1)[0]
        assert retried.entries == ["b", "d"] and retried.sizes == [2, 4] and retried.attempt == 1
        assert w.stats.records == 3 and w.stats.bytes == 9  # a, c and e were stored by the first request
        store.complete_all()
        flusher.join(5)
    assert (w.stats.records, w.stats.bytes, w.stats.retries, w.stats.throttles) == (5, 15, 1, 1)


def test_throttles_are_retried_and_counted():
    store = ManualStore()
    with writer(store, batch_max_size=5) as w:
        w.write_chunk([1, 2], [1, 1])
        flusher = threading.Thread(target=w.flush)
        flusher.start()
        store.wait_submits(1)
        store.complete_all(ThrottledError("slow down"))
        store.wait_submits(1)
        store.complete_all()
        flusher.join(5)
    assert w.stats.throttles == 1 and w.stats.retries == 1 and w.stats.records == 2


def test_exhausted_retries_fail_with_store_target_batch_size_and_cause():
    store = ManualStore()
    w = writer(store, batch_max_size=5, max_retries=2)
    w.write_chunk([1, 2, 3], [1, 1, 1])
    result = {}

    def flush():
        try:
            w.flush()
        except SinkError as e:
            result["error"] = e

    flusher = threading.Thread(target=flush)
    flusher.start()
    for _ in range(3):
        store.wait_submits(1)
        store.complete_all(RetryableError("store unavailable"))
    flusher.join(5)
    w.close()
    error = result["error"]
    text = str(error)
    # Each failure halves the AIMD window, so the retries went out as smaller batches.
    assert text.startswith("manual: batch of 1 record (1 bytes) to manual-target"), text
    assert "3 attempts" in text and "sink.max-retries=2" in text and "store unavailable" in text
    assert error.batch_records == 1 and isinstance(error.cause, RetryableError)


def test_fatal_error_fails_at_once_and_later_writes_raise():
    store = ManualStore()
    w = writer(store, batch_max_size=1)
    w.write_chunk(["x"], [1])
    store.wait_submits(1)
    store.complete_all(ValueError("schema mismatch"))
    with pytest.raises(SinkError, match="schema mismatch"):
        w.flush()
    with pytest.raises(SinkError):
        w.write_chunk(["y"], [1])
    w.close()
    assert len(store.pending) == 0  # nothing was retried


def test_a_store_that_raises_in_submit_is_handled_like_a_failed_future():
    class Raising(RecordingStore):
        def submit(self, batch):
            raise RuntimeError("connection refused")

    w = AsyncSinkWriter(Raising(), SinkConfig(max_retries=0, retry_delay_ms=1))
    w.write_chunk(["x"], [1])
    with pytest.raises(SinkError, match="connection refused"):
        w.flush()
    w.close()


def test_oversized_record_fails_naming_limit_and_size_and_sends_nothing():
    store = ManualStore(max_record_bytes=100)
    with writer(store, flush_buffer_size=1000) as w:
        with pytest.raises(RecordTooLargeError, match=r"record 1 .* 150 bytes.*limit of 100 bytes"):
            w.write_chunk(["ok", "big"], [10, 150])
        w.flush()
    assert store.pending == []


def test_global_ordered_keeps_one_request_in_flight():
    store = ManualStore()
    with writer(store, mode="global-ordered", batch_max_size=1, requests_max_inflight=50) as w:
        w.write_chunk(list(range(5)), [1] * 5)
        for expected in range(5):
            batch = store.wait_submits(1)
            time.sleep(0.02)
            assert len(store.pending) == 1 and batch[0].entries == [expected]
            store.complete_all()
        w.flush()


def test_partition_ordered_runs_different_keys_concurrently_but_never_one_key_twice():
    store = ManualStore()
    with writer(store, mode="partition-ordered", batch_max_size=1, requests_max_buffered=100,
                requests_max_inflight=10) as w:
        w.write_keyed(["a1", "b1", "a2", "b2"], [1] * 4, ["a", "b", "a", "b"])
        store.complete_all()  # grow the window past one batch
        time.sleep(0.2)
        keys = [b.partition_key for b, _ in store.pending]
        assert len(keys) == len(set(keys))
        while w.stats.records < 4:
            store.complete_all()
            time.sleep(0.01)
        w.flush()
    assert w.stats.peak_inflight == 2


class _PartialAlways(PartitionKeyBatchCreator):
    """The negative control: a creator that cuts whatever a key holds whenever any trigger fires."""

    def create_next_batch(self, request_info, buffer):
        return super().create_next_batch(replace(request_info, partial=True), buffer)


@pytest.mark.parametrize("creator", [None, _PartialAlways()], ids=["lingering", "control-partial-cuts"])
def test_partition_ordered_keys_linger_until_they_fill_a_batch(creator):
    """With many keys buffered, a size trigger cuts only full batches of one key: the 300 entries that arrive
    first (3 for each of 100 keys) wait for each key's fourth. Cutting on the buffer's total instead (the
    control) sends 100 batches of 3 and 100 of 1."""
    store = RecordingStore()
    cfg = SinkConfig(**FAST, mode="partition-ordered", batch_max_size=4, requests_max_buffered=1000,
                     requests_max_inflight=500)
    with AsyncSinkWriter(store, cfg, batch_creator=creator) as w:
        keys = [k for k in range(100) for _ in range(3)]
        w.write_keyed([f"{k}-first" for k in keys], [1] * 300, keys)
        if creator is not None:
            assert store.first_submit.wait(5), "the control never cut a batch"  # before the fourth entries
        w.write_keyed([f"{k}-last" for k in range(100)], [1] * 100, list(range(100)))
        w.flush()
    assert w.stats.records == 400
    sizes = sorted(b.record_count for b in store.batches)
    if creator is None:
        assert sizes == [4] * 100, f"keys did not linger until full: batch sizes {sizes}"
    else:
        assert sizes[0] < 4, sizes


def test_a_timeout_flushes_what_was_buffered_then_keys_wait_again_though_the_buffer_never_emptied():
    """Partition-ordered, on a clock the test moves: key k has a batch in flight and one entry waiting, so the
    buffer never empties. The timeout at t=2 sends the two entries buffered then (k's waits behind its busy key, so
    b, arriving during the flush, goes in its place); c, arriving after, waits for a full batch or the checkpoint.
    Flushing until the buffer emptied sent c at once (and k's entry) as timeouts."""
    now = [0.0]
    store = ManualStore()
    cfg = SinkConfig(**{**FAST, "flush_buffer_timeout": 1000}, mode="partition-ordered", batch_max_size=4,
                     requests_max_buffered=100, requests_max_inflight=10)
    with AsyncSinkWriter(store, cfg, clock=lambda: now[0]) as w:
        w.write_keyed(["w"] * 4, [1] * 4, ["w"] * 4)  # one acknowledged batch opens the AIMD window to 14 entries
        store.wait_submits(1)
        store.complete_all()
        # k: a full batch, sent and left in flight, and a fifth entry that waits behind its busy key (the buffer is
        # not empty from here on, and its deadline is t=1)
        w.write_keyed(["k"] * 5, [1] * 5, ["k"] * 5)
        store.wait_submits(1)
        now[0] = 2.0  # past the deadline
        w.write_keyed(["a"], [1], ["a"])
        assert [b.entries for b in store.wait_submits(1)][-1] == ["a"]
        w.write_keyed(["b"], [1], ["b"])
        assert [b.entries for b in store.wait_submits(1)][-1] == ["b"]  # the flush's second entry
        w.write_keyed(["c"], [1], ["c"])
        done = threading.Thread(target=w.flush)
        done.start()
        while done.is_alive():
            store.complete_all()
            done.join(0.01)
    assert dict(w.stats.flush_reasons) == {"batch-size": 2, "timeout": 2, "checkpoint": 2}, w.stats.flush_reasons


def test_flush_on_checkpoint_holds_data_until_the_checkpoint():
    store = RecordingStore()
    cfg = SinkConfig(mode="partition-ordered", flush_on_checkpoint=True, batch_max_size=2, requests_max_buffered=100,
                     flush_buffer_timeout=10)
    with AsyncSinkWriter(store, cfg) as w:
        w.write_keyed(list(range(10)), [1] * 10, [0] * 10)
        time.sleep(0.2)
        assert store.batches == []  # neither size nor timeout flushed
        w.flush()
    assert sum(b.record_count for b in store.batches) == 10
    assert set(w.stats.flush_reasons) == {"checkpoint"}


def test_flush_on_checkpoint_still_bounds_memory_at_max_buffered():
    store = RecordingStore()
    cfg = SinkConfig(mode="partition-ordered", flush_on_checkpoint=True, batch_max_size=2, requests_max_buffered=4)
    with AsyncSinkWriter(store, cfg) as w:
        for i in range(10):
            w.write_keyed([i], [1], [0])
        w.flush()
    assert w.stats.flush_reasons["buffer-full"] >= 1 and w.stats.records == 10


def test_transactional_needs_a_transactional_store():
    from sluice import OptionError

    with pytest.raises(OptionError, match="no transactions"):
        AsyncSinkWriter(RecordingStore(), SinkConfig(mode="global-ordered", transactional=True))


def test_store_limits_bound_the_options():
    from sluice import OptionError

    store = RecordingStore()
    store.max_batch_records = 500
    with pytest.raises(OptionError, match=r"sink.batch.max-size=1000 exceeds recording's limit of 500"):
        AsyncSinkWriter(store, SinkConfig())


def test_stats_percentiles_and_merge():
    from sluice.engine import WriteStats

    a, b = WriteStats(), WriteStats()
    for ms in (1, 1, 1, 100):
        a.record_latency(ms / 1000)
    b.record_latency(0.002)
    a.records, b.records = 3, 4
    merged = WriteStats.from_dict(WriteStats.merge([a, b]).to_dict())
    assert merged.records == 7 and merged.tasks == 2
    assert 0.9 <= merged.latency_ms(0.5) <= 1.2
    assert 90 <= merged.latency_ms(0.99) <= 110


@pytest.mark.parametrize("mode", ["unordered", "partition-ordered"])
def test_a_retry_that_becomes_ready_between_the_pump_and_the_wait_is_still_sent(mode):
    """Regression (a partition-ordered Spark write hung in CI): the manager judged what was ready at the pump's
    clock reading but computed its wait from a later one; a retry backoff ending in between left it waiting with
    no timeout. This clock only moves when the wait is computed, so the backoff always ends in between."""
    import sys

    now = [100.0]

    def clock():
        if sys._getframe(1).f_code.co_name == "_wait_seconds":
            now[0] += 0.010  # 10 ms pass between the pump and the wait; the backoff is at most 5 ms
        return now[0]

    store = ManualStore()
    config = SinkConfig(**{**FAST, "retry_delay_ms": 5, "mode": mode,
                           **({"partition_key": ("k",)} if mode == "partition-ordered" else {})})
    with AsyncSinkWriter(store, config, clock=clock) as w:
        w.write_chunk(["a"], [1], key="k1" if mode == "partition-ordered" else None)
        flusher = threading.Thread(target=w.flush)
        flusher.start()
        store.wait_submits(1)
        store.complete_all(RetryableError("again"))
        assert store.wait_submits(1)[0].attempt == 1, "the retry is sent"
        store.complete_all()
        flusher.join(10)
        assert not flusher.is_alive(), "the checkpoint completes"
