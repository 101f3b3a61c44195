"""Small in-process stores for the engine's unit tests."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from sluice.engine import Batch, Store, completed_future


class ManualStore(Store):
    """Every submit returns a pending future the test completes by hand."""

    name = "manual"

    def __init__(self, max_record_bytes: int | None = None) -> None:
        self.max_record_bytes = max_record_bytes
        self.pending: list[tuple[Batch, Future[None]]] = []
        self.submitted = threading.Semaphore(0)
        self.lock = threading.Lock()

    @property
    def target(self) -> str:
        return "manual-target"

    def submit(self, batch: Batch) -> Future[None]:
        future: Future[None] = Future()
        with self.lock:
            self.pending.append((batch, future))
        self.submitted.release()
        return future

    def wait_submits(self, n: int, timeout: float = 5.0) -> list[Batch]:
        for _ in range(n):
            assert self.submitted.acquire(timeout=timeout), "expected a submit that never came"
        with self.lock:
            return [b for b, _ in self.pending]

    def complete_all(self, error: BaseException | None = None) -> list[Batch]:
        with self.lock:
            pending, self.pending = self.pending, []
        for _, future in pending:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
        return [b for b, _ in pending]


class RecordingStore(Store):
    """Accepts every batch at once and records it."""

    name = "recording"

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.first_submit = threading.Event()

    def submit(self, batch: Batch) -> Future[None]:
        self.batches.append(batch)
        self.first_submit.set()
        return completed_future()
