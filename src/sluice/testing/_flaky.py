"""An in-process store that fails, throttles and delays at random while checking ordering rules."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor

from sluice._errors import RetryableError, ThrottledError
from sluice.engine import Batch, Store


class FatalStoreError(Exception):
    pass


class FlakyStore(Store):
    name = "flaky"

    def __init__(self, *, fail_rate: float = 0.0, throttle_rate: float = 0.0, fatal_rate: float = 0.0,
                 max_delay_s: float = 0.0, seed: int = 0, threads: int = 4,
                 max_record_bytes: int | None = None) -> None:
        self.fail_rate = fail_rate
        self.throttle_rate = throttle_rate
        self.fatal_rate = fatal_rate
        self.max_delay_s = max_delay_s
        self.max_record_bytes = max_record_bytes
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="flaky")
        self.accepted: list[Batch] = []  # in the order the store applied them
        self.submitted: list[Batch] = []
        self.inflight = 0
        self.max_inflight_seen = 0
        self.inflight_keys: Counter[Hashable] = Counter()
        self.violations: list[str] = []  # two batches of one key in flight at once

    @property
    def target(self) -> str:
        return "memory"

    def submit(self, batch: Batch) -> Future[None]:
        with self._lock:
            self.submitted.append(batch)
            self.inflight += 1
            self.max_inflight_seen = max(self.max_inflight_seen, self.inflight)
            if batch.partition_key is not None:
                self.inflight_keys[batch.partition_key] += 1
                if self.inflight_keys[batch.partition_key] > 1:
                    self.violations.append(f"key {batch.partition_key} has two batches in flight")
            roll = self._rng.random()
            delay = self._rng.uniform(0, self.max_delay_s) if self.max_delay_s else 0.0
        error: Exception | None = None
        if roll < self.fatal_rate:
            error = FatalStoreError("injected fatal error")
        elif roll < self.fatal_rate + self.fail_rate:
            error = RetryableError("injected retryable error")
        elif roll < self.fatal_rate + self.fail_rate + self.throttle_rate:
            error = ThrottledError("injected throttle")
        future: Future[None] = Future()
        self._pool.submit(self._complete, batch, error, delay, future)
        return future

    def _complete(self, batch: Batch, error: Exception | None, delay: float, future: Future[None]) -> None:
        if delay:
            time.sleep(delay)
        with self._lock:
            self.inflight -= 1
            if batch.partition_key is not None:
                self.inflight_keys[batch.partition_key] -= 1
            if error is None:
                self.accepted.append(batch)
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    def accepted_entries(self) -> list:
        return [e for b in self.accepted for e in b.entries]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
