"""How a store plugs into the engine: one submit call per batch (or per run of full batches, where the store takes
them), and a classification of its errors."""

from __future__ import annotations

import base64
import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sluice._errors import RecordError, RetryableError, SinkError, ThrottledError
from sluice.engine._batch import Batch, BatchRun

if TYPE_CHECKING:
    import pyarrow as pa


class ErrorKind(enum.Enum):
    RETRYABLE = "retryable"
    THROTTLED = "throttled"  # retryable, and counted as a throttle
    FATAL = "fatal"
    # A record of the batch is refused for what it holds (RecordError): sent again, it fails again. Fatal unless
    # errors.tolerance=all, which splits the batch until the record is alone and sends it aside.
    RECORD = "record"


@dataclass(frozen=True)
class WriteContext:
    """Who is writing: enough for a store to name staging data and for the driver to dedupe replays.

    `write_id` is fixed on the driver when the write is planned (streaming: query id), `epoch` is the
    micro-batch id from the checkpoint (None for batch writes), `attempt` the Spark task attempt.
    """

    write_id: str = "local"
    epoch: int | None = None
    partition_id: int = 0
    attempt: int = 0
    task_attempt_id: int = 0


class Store(ABC):
    """A store's side of the engine.

    `submit` is called by the buffer-manager thread and must not block for long: return a Future that
    completes with None on success or with an exception on failure. `classify` decides whether a
    failure is retried. Transactional stores also implement `open` and `pre_commit` on the executor
    and provide a driver-side `Committer`.
    """

    name: ClassVar[str] = "store"
    supports_transactions: ClassVar[bool] = False
    max_record_bytes: int | None = None
    max_batch_records: int | None = None
    max_batch_bytes: int | None = None
    # Batches the engine's congestion window (AIMDRateLimiter) starts at. One suits a store that answers each batch
    # on its own; a store that acknowledges batches together (Kafka's, once its producer's queue drained) needs
    # several in flight from the start, or every batch waits for the one before it to be acknowledged.
    window_start_batches: int = 1

    @property
    def target(self) -> str:
        """What is written to, for messages (e.g. 'basin/stream'). Never contains credentials."""
        return "-"

    def open(self, context: WriteContext) -> None:
        """Called once before the first submit (a transactional store begins its transaction here)."""

    @abstractmethod
    def submit(self, batch: Batch) -> Future[None]:
        """Send one batch; the future fails with the store's exception when the request fails."""

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        """Optional: send a run of full batches in one call; None (this default): not taken, the engine submits each
        batch, and offers no run again in this write. For a store whose client queues requests or takes many batches
        at once (a producer, a pipelined connection, `sluice_null`): in Python a call per batch costs microseconds,
        and at batches of 500 rows that is a fifth of what the rows cost to read (docs/engine.md, "At batches of
        500").

        The engine hands a run only for a plain write (no partition keys, no rate cap, no retries pending) and only
        as many batches as its congestion window lets be in flight together (any number once every batch so far was
        acknowledged at once), and counts each batch as if submitted alone. The store writes a run's batches in
        their order (a globally ordered write relies on it). The future completes once every batch of the run is
        written; when it fails, every batch of the run is classified and retried alone, in order, through `submit`,
        with the run's error, and the window halves once: a run partly written is written again, as a batch would be
        (at-least-once)."""
        return None

    def classify(self, error: BaseException) -> ErrorKind:
        if isinstance(error, RecordError):
            return ErrorKind.RECORD
        if isinstance(error, ThrottledError):
            return ErrorKind.THROTTLED
        if isinstance(error, RetryableError):
            return ErrorKind.RETRYABLE
        return ErrorKind.FATAL

    def explain(self, error: SinkError) -> SinkError:
        """A chance to turn a failure into a clearer one (e.g. what to do about a 401). Default: unchanged."""
        return error

    def refused_rows(self, entries: Sequence[Any]) -> pa.Table | Sequence[Mapping[str, object]]:
        """The rows refused entries came from, for the dead-letter target: a pyarrow Table of the user's columns
        (ArrowRows.take gives it for stores whose entries are its row numbers) or a list of JSON-able dicts. The
        entries are not sent again: a store that keeps rows for them lets go of them here. Default: each entry as
        it is, under the key "entry" (bytes as UTF-8 text, or base64 where it is not)."""
        return [{"entry": _jsonable(entry)} for entry in entries]

    def pre_commit(self) -> Any:
        """After everything is acknowledged: prepare and return a JSON-able message for the driver."""
        return None

    def close(self) -> None:
        """Release connections. Called once, also after failures."""


class BlockingStore(Store):
    """A store whose client is a blocking call: implement `write_batch`; the engine runs it on threads."""

    io_threads: int = 8

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    @abstractmethod
    def write_batch(self, batch: Batch) -> None:
        """Write one batch or raise."""

    def submit(self, batch: Batch) -> Future[None]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix=f"sluice-{self.name}")
        return self._pool.submit(self.write_batch, batch)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class Committer(ABC):
    """Driver side of a transactional store: sees every task's pre_commit message for one epoch."""

    @abstractmethod
    def commit(self, messages: list[Any], context: WriteContext) -> None:
        """Make the epoch visible. Must be a no-op when the same (write_id, epoch) was committed before."""

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        """Discard what the tasks prepared."""

    def commit_with(self, messages: list[Any], context: WriteContext, companion: Committer,
                    companion_messages: list[Any]) -> bool:
        """Commit the epoch together with `companion`'s (the write's dead-letter target) in one transaction, when both
        live in one transactional store this committer can reach: True when done. False (the default): they commit
        one after the other, the companion first, each once per (write id, epoch)."""
        return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _acknowledged() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


# One finished future serves every success: it can no longer change (set_result, set_exception and cancel refuse or
# do nothing once it is done), and a Future costs a condition variable and two locks per batch to make.
_ACKNOWLEDGED = _acknowledged()


def completed_future(error: BaseException | None = None) -> Future[None]:
    """A finished future: acknowledged (shared, immutable) or failed with `error`."""
    if error is None:
        return _ACKNOWLEDGED
    fut: Future[None] = Future()
    fut.set_exception(error)
    return fut
