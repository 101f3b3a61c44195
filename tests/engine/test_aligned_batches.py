"""AlignedBatchCreator: the same input gives the same batches, whatever the timing, the chunking and the retries
(what a store's per-batch idempotency token, e.g. ClickHouse's insert_deduplication_token, relies on)."""

import random
import threading
from concurrent.futures import Future

from sluice._errors import RetryableError
from sluice.engine import AlignedBatchCreator, AsyncSinkWriter, Batch, SimpleBatchCreator, SinkConfig, Store


class FlakyStore(Store):
    """Fails a random share of first attempts (retryable), acknowledges the rest from another thread; records the
    row ranges it stored."""

    name = "flaky"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.stored: list[tuple[int, int]] = []
        self.failures = 0
        self.lock = threading.Lock()

    def submit(self, batch: Batch) -> Future[None]:
        future: Future[None] = Future()
        fail = batch.attempt == 0 and self.rng.random() < 0.3

        def finish() -> None:
            with self.lock:
                if fail:
                    self.failures += 1
                    future.set_exception(RetryableError("try again"))
                    return
                self.stored.append((batch.entries[0], batch.entries[-1]))
            future.set_result(None)

        threading.Timer(self.rng.random() / 500, finish).start()
        return future


def run(creator, seed: int, rows: int = 5_000) -> tuple[list[tuple[int, int]], int]:
    rng = random.Random(seed)
    store = FlakyStore(rng)
    config = SinkConfig(batch_max_size=300, flush_buffer_timeout=rng.choice([1, 5, 1000]), requests_max_buffered=2_000,
                        requests_max_inflight=4, retry_delay_ms=1)
    with AsyncSinkWriter(store, config, batch_creator=creator) as writer:
        start = 0
        while start < rows:  # the input arrives in chunks of random sizes (Spark's batches differ between runs)
            size = min(rows - start, rng.randint(1, 700))
            writer.write_chunk(list(range(start, start + size)), [8] * size)
            start += size
        writer.finish()
    return sorted(store.stored), store.failures


def test_the_same_input_is_cut_into_the_same_batches_whatever_the_timing_and_the_retries():
    first, failures_a = run(AlignedBatchCreator(300), seed=1)
    second, failures_b = run(AlignedBatchCreator(300), seed=2)
    assert failures_a and failures_b, "no batch failed: the retries were not exercised"
    assert first == second == [(k, min(k + 299, 4_999)) for k in range(0, 5_000, 300)]
    # The negative control: the engine's default creator cuts where the timing and the chunks happen to fall.
    assert run(SimpleBatchCreator(), seed=1)[0] != run(SimpleBatchCreator(), seed=2)[0]
