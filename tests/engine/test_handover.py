"""The hand-over of a chunk to the engine: cut on the caller's thread while the manager thread waits idle, for a store
that acknowledges every batch at once; through the manager thread otherwise. Counted by the thread each batch was
submitted from."""

import threading
from concurrent.futures import Future

from sluice.engine import AsyncSinkWriter, Batch, SinkConfig, Store, completed_future


class ThreadRecordingStore(Store):
    """Acknowledges every batch at once; records each batch's entries and the thread that submitted it."""

    name = "threads"

    def __init__(self) -> None:
        self.submits: list[tuple[list, int]] = []
        self.submitted = threading.Semaphore(0)

    def submit(self, batch: Batch) -> Future[None]:
        self.submits.append((list(batch.entries), threading.get_ident()))
        self.submitted.release()
        return completed_future()


def test_chunks_are_cut_on_the_callers_thread_while_the_manager_waits_for_a_store_that_acknowledges_at_once():
    store = ThreadRecordingStore()
    caller = threading.get_ident()
    with AsyncSinkWriter(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000)) as w:
        w.write_chunk(range(0, 1000), [10] * 1000)  # the first chunk: the manager learns the store acknowledges at once
        w.flush()
        for start in range(1000, 4000, 1000):
            w._wait_idle()
            w.write_chunk(range(start, start + 1000), [10] * 1000)
        w.flush()
    assert [entries for entries, _ in store.submits] == [list(range(s, s + 500)) for s in range(0, 4000, 500)]
    assert [thread == caller for _, thread in store.submits] == [False] * 2 + [True] * 6
    assert w.stats.records == 4000 and w.stats.batches == 8 and w.stats.bytes == 40_000
    assert w.stats.flush_reasons == {"batch-size": 8}


def test_a_remainder_left_by_the_callers_cut_still_goes_at_the_timeout():
    store = ThreadRecordingStore()
    caller = threading.get_ident()
    with AsyncSinkWriter(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=50)) as w:
        w.write_chunk(range(0, 500), [10] * 500)
        w.flush()
        w._wait_idle()
        w.write_chunk(range(500, 1250), [10] * 750)  # a full batch cut here, 250 entries left for the timeout
        assert store.submitted.acquire(timeout=5) and store.submitted.acquire(timeout=5)
        assert store.submitted.acquire(timeout=5), "the remainder was never sent: the manager did not learn of it"
        assert [(len(entries), thread == caller) for entries, thread in store.submits] == \
            [(500, False), (500, True), (250, False)]
        assert w.stats.flush_reasons == {"batch-size": 2, "timeout": 1}


class LaterStore(ThreadRecordingStore):
    """Acknowledges each batch from another thread, after submit returned."""

    def submit(self, batch: Batch) -> Future[None]:
        self.submits.append((list(batch.entries), threading.get_ident()))
        future: Future[None] = Future()
        threading.Thread(target=future.set_result, args=(None,)).start()
        return future


def test_a_store_that_acknowledges_later_is_only_called_from_the_manager_thread():
    store = LaterStore()
    with AsyncSinkWriter(store, SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000)) as w:
        for start in range(0, 3000, 1000):
            w.write_chunk(range(start, start + 1000), [10] * 1000)
            w.flush()
            w._wait_idle()
    assert w.stats.records == 3000 and len(store.submits) == 6
    assert threading.get_ident() not in {thread for _, thread in store.submits}
