"""A chunk handed its sizes' running sums, to a store that takes runs and acknowledges at once: its full batches go as
one run from the caller's thread without the chunk entering the buffer, each entry's size made only where one is
needed (AsyncSinkWriter._run_here). Counted by the chunks the writer makes and the sizes it derives."""

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from sluice._errors import RecordTooLargeError, RetryableError
from sluice.engine import AsyncSinkWriter, Batch, BatchRun, SinkConfig, Store, _buffer, _writer, completed_future

CONFIG = SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000)


class RunStore(Store):
    """Takes runs and acknowledges everything at once; records each batch (entries, bytes, sizes), the thread that
    handed it, and whether a run's sizes were made when it came."""

    name = "runs"

    def __init__(self, read_sizes: bool = False) -> None:
        self.read_sizes = read_sizes
        self.batches: list[tuple[list[int], int, list[int] | None, int]] = []
        self.sizes_given: list[bool] = []

    def submit(self, batch: Batch) -> Future[None]:
        self.batches.append((list(batch.entries), batch.size_bytes, [int(s) for s in batch.sizes],
                             threading.get_ident()))
        return completed_future()

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        self.sizes_given.append(run._sizes is not None)
        for batch in run.batches() if self.read_sizes else []:
            self.submit(batch)
        if not self.read_sizes:
            n = run.batch_records
            self.batches += [(list(run.entries[k * n:(k + 1) * n]), size, None, threading.get_ident())
                             for k, size in enumerate(run.batch_bytes)]
        return completed_future()


@pytest.fixture
def counted(monkeypatch):
    """How many chunks the writer makes, and how many times it makes sizes from running sums."""
    counts = {"chunks": 0, "sizes": 0}

    class CountedChunk(_buffer.Chunk):
        def __post_init__(self, running):
            counts["chunks"] += 1
            super().__post_init__(running)

    def sizes_from_running(running):
        counts["sizes"] += 1
        return _buffer.sizes_from_running(running)

    monkeypatch.setattr(_writer, "Chunk", CountedChunk)
    monkeypatch.setattr(_writer, "sizes_from_running", sizes_from_running)
    monkeypatch.setattr("sluice.engine._batch.sizes_from_running", sizes_from_running)
    return counts


SIZES = (np.arange(4_000) % 7 + 1).astype(np.int32)


def _write(store: Store, direct: bool = True, config: SinkConfig = CONFIG) -> AsyncSinkWriter:
    """Four chunks of 1,000 row numbers, each handed only its running sums, the manager idle before each after the
    first (which teaches the writer that the store acknowledges at once)."""
    with AsyncSinkWriter(store, config) as w:
        w._direct = w._direct and direct
        for start in range(0, 4_000, 1_000):
            if start:
                w._wait_idle()
            w.write_chunk(range(start, start + 1_000), None, running=SIZES[start:start + 1_000].cumsum())
            if not start:
                w.flush()
        w.finish()
    return w


def test_full_batches_go_as_a_run_from_the_callers_thread_without_a_chunk_or_a_size_made(counted):
    store = RunStore()
    w = _write(store)
    assert [entries for entries, *_ in store.batches] == [list(range(s, s + 500)) for s in range(0, 4_000, 500)]
    assert [size for _, size, *_ in store.batches] == [int(SIZES[s:s + 500].sum()) for s in range(0, 4_000, 500)]
    assert [thread == threading.get_ident() for *_, thread in store.batches] == [False] * 2 + [True] * 6
    assert counted == {"chunks": 1, "sizes": 1}  # the first chunk only, through the buffer
    assert (w.stats.records, w.stats.batches, w.stats.bytes) == (4_000, 8, int(SIZES.sum()))
    assert w.stats.flush_reasons == {"batch-size": 8} and sum(w.stats.latency_buckets.values()) == 8


def test_without_it_every_chunk_enters_the_buffer_with_its_sizes_made(counted):
    """The negative control: the same write with the direct run switched off makes a chunk, and its sizes, each."""
    w = _write(RunStore(), direct=False)
    assert counted == {"chunks": 4, "sizes": 4}
    assert (w.stats.records, w.stats.batches, w.stats.bytes) == (4_000, 8, int(SIZES.sum()))


def test_a_runs_sizes_are_made_when_its_store_reads_them(counted):
    store = RunStore(read_sizes=True)
    _write(store)
    assert store.sizes_given == [True, True, False, False, False]  # the first chunk's two runs, through the buffer
    assert [sizes for _, _, sizes, _ in store.batches] == [SIZES[s:s + 500].tolist() for s in range(0, 4_000, 500)]
    assert counted["sizes"] == 1 + 3  # the first chunk's, then each run's when its batches were read


@pytest.mark.parametrize("kind", [np.asarray, memoryview])  # binary_running_sums gives either
def test_what_follows_the_last_full_batch_waits_in_the_buffer_for_the_next_entries(counted, kind):
    store = RunStore()
    with AsyncSinkWriter(store, CONFIG) as w:
        w.write_chunk(range(0, 500), None, running=kind(SIZES[:500].cumsum()))
        w.flush()
        w._wait_idle()
        w.write_chunk(range(500, 1_750), None, running=kind(SIZES[500:1_750].cumsum()))  # 2 batches, 250 left
        w.write_chunk(range(1_750, 2_000), None, running=kind(SIZES[1_750:2_000].cumsum()))
        w.finish()
    assert [entries for entries, *_ in store.batches] == [list(range(s, s + 500)) for s in range(0, 2_000, 500)]
    assert [size for _, size, *_ in store.batches] == [int(SIZES[s:s + 500].sum()) for s in range(0, 2_000, 500)]
    assert counted["chunks"] == 3  # the first; the 250 left, and the chunk after it, through the buffer
    assert w.stats.flush_reasons == {"batch-size": 4} and w.stats.bytes == int(SIZES[:2_000].sum())


def test_a_record_over_the_stores_limit_is_refused_by_its_index_when_only_running_sums_were_given():
    class LimitedRunStore(RunStore):
        max_record_bytes = 100

    sizes = np.full(1_000, 10, dtype=np.int32)
    sizes[1_234 - 1_000] = 101
    store = LimitedRunStore()
    with AsyncSinkWriter(store, CONFIG) as w:
        w.write_chunk(range(0, 1_000), None, running=np.full(1_000, 10).cumsum())
        w.flush()
        w._wait_idle()
        with pytest.raises(RecordTooLargeError, match="record 234 of this chunk is 101 bytes"):
            w.write_chunk(range(1_000, 2_000), None, running=sizes.cumsum())
        w.finish()
    assert [entries[0] for entries, *_ in store.batches] == [0, 500]  # nothing of the refused chunk was sent


def test_a_failed_run_handed_only_running_sums_has_each_batch_retried_alone_with_its_sizes():
    class FailingOnceRunStore(RunStore):
        failed = False

        def __init__(self) -> None:
            super().__init__()
            self.retried: list[tuple[list[int], list[int]]] = []

        def submit_run(self, run: BatchRun) -> Future[None] | None:
            if not self.failed and run._sizes is None:  # the first run handed straight from running sums
                self.failed = True
                return completed_future(RetryableError("injected: the run's request failed"))
            return super().submit_run(run)

        def submit(self, batch: Batch) -> Future[None]:
            if batch.attempt:
                self.retried.append((list(batch.entries), [int(s) for s in batch.sizes]))
            return super().submit(batch)

    store = FailingOnceRunStore()
    w = _write(store, config=SinkConfig(batch_max_size=500, flush_buffer_timeout=60_000, retry_delay_ms=1))
    assert store.failed
    # The run's 1,000 entries go again (in batches the halved window cuts), each with its size.
    assert [e for entries, _ in store.retried for e in entries] == list(range(1_000, 2_000))
    assert all(sizes == SIZES[entries[0]:entries[-1] + 1].tolist() for entries, sizes in store.retried)
    assert sorted(e for entries, *_ in store.batches for e in entries) == list(range(4_000))
    assert w.stats.records == 4_000 and w.stats.bytes == int(SIZES.sum())
