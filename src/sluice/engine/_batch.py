"""Batches and batch creators (FLIP-509): how buffered entries become one request to the store."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sluice.engine._buffer import Ints, KeyedRequestBuffer, RequestBuffer, Taken, sizes_from_running


@dataclass
class Batch:
    """One request to the store: entries in send order, their byte size and count.

    `entries` and `sizes` are what the writer was handed, sliced: lists, or a range of row numbers and a numpy array
    of sizes (_buffer.py), never copied into lists for the store."""

    entries: Sequence[Any]
    size_bytes: int
    record_count: int
    partition_key: Hashable = None
    attempt: int = 0  # 0 on the first submission, n on the n-th retry
    sizes: Ints = field(default_factory=list, repr=False)
    split: bool = False  # half of a batch refused for one of its records (errors.tolerance=all)

    @classmethod
    def of(cls, taken: Taken, partition_key: Hashable = None) -> Batch:
        """The batch of the entries a creator took from its buffer."""
        return cls(taken.entries, taken.size_bytes, len(taken.entries), partition_key, taken.attempt, taken.sizes,
                   taken.split)


class BatchRun:
    """Full batches cut back to back from one chunk, handed to `Store.submit_run` in one call: batch k holds
    `entries[k * batch_records:(k + 1) * batch_records]` and is `batch_bytes[k]` bytes. Each is the batch the engine
    would have handed `submit`; `batches()` makes them.

    `sizes` (each entry's) are made from `running` (their running sums) the first time they are read, when the writer
    was handed only those (`Encoded.running` without sizes): a store that reads only the batches' bytes never pays
    for a pass over every entry."""

    __slots__ = ("_running", "_sizes", "batch_bytes", "batch_records", "entries")

    def __init__(self, entries: Sequence[Any], sizes: Ints | None, batch_records: int, batch_bytes: Sequence[int],
                 running: Ints | None = None) -> None:
        if sizes is None and running is None:
            raise ValueError("a BatchRun needs its entries' sizes or their running sums")
        self.entries = entries
        self._sizes = sizes
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self._running = running

    def __repr__(self) -> str:
        return f"BatchRun({len(self)} batches of {self.batch_records} records, {self.size_bytes} bytes)"

    def __len__(self) -> int:
        return len(self.batch_bytes)

    @property
    def sizes(self) -> Ints:
        """Each entry's size in bytes."""
        if self._sizes is None:
            self._sizes = sizes_from_running(cast("Ints", self._running))
        return self._sizes

    @property
    def record_count(self) -> int:
        return len(self.batch_bytes) * self.batch_records

    @property
    def size_bytes(self) -> int:
        return sum(self.batch_bytes)

    def batches(self) -> list[Batch]:
        """The run's batches, as `submit` would be handed them one by one."""
        n, entries, sizes = self.batch_records, self.entries, self.sizes
        return [Batch(entries[k * n:(k + 1) * n], size, n, None, 0, sizes[k * n:(k + 1) * n])
                for k, size in enumerate(self.batch_bytes)]


@dataclass(frozen=True)
class RequestInfo:
    """What the rate limiter allows for the next batch, and which partition keys are busy."""

    batch_size: int
    max_batch_bytes: int
    now: float
    busy_keys: frozenset[Hashable] = frozenset()
    draining: bool = False  # a checkpoint waits: everything up to the end of the input is buffered
    # False when only a size trigger fired: a creator that groups entries (by partition key) then returns a batch
    # only if it is full, so that a key's entries linger until they fill one (or another trigger fires).
    partial: bool = True


class BatchCreator(ABC):
    @abstractmethod
    def create_next_batch(self, request_info: RequestInfo, buffer: RequestBuffer) -> Batch | None:
        """Return the next batch to submit, or None when nothing may be sent now."""

    def next_ready_at(self, request_info: RequestInfo, buffer: RequestBuffer) -> float:
        """Earliest monotonic time something held back for a retry backoff becomes sendable."""
        return 0.0


class SimpleBatchCreator(BatchCreator):
    """Take entries from the head up to the batch size and byte limits (Flink's default)."""

    def create_next_batch(self, request_info: RequestInfo, buffer: RequestBuffer) -> Batch | None:
        taken = buffer.take(request_info.batch_size, request_info.max_batch_bytes, request_info.now)
        if taken is None:
            return None
        return Batch.of(taken)

    def next_ready_at(self, request_info: RequestInfo, buffer: RequestBuffer) -> float:
        return buffer.head_ready_at()


class AlignedBatchCreator(BatchCreator):
    """Batches at fixed positions of a task's input: batch k holds entries [k * size, (k + 1) * size).

    The entries must be the task's running row numbers (`ArrowRows`). Whatever the timing, the rate limiter or
    the retries, a replayed task cuts the same batches from the same input, which is what a store's
    per-batch idempotency token needs (ClickHouse's insert_deduplication_token). The last, shorter batch is cut
    only when the writer drains at a checkpoint, where the input ends.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def create_next_batch(self, request_info: RequestInfo, buffer: RequestBuffer) -> Batch | None:
        head = buffer.peek()
        if head is None:
            return None
        first = head[0]
        wanted = (first // self.size + 1) * self.size - first  # up to the next boundary
        if buffer.size() < wanted and not request_info.draining:
            return None
        taken = buffer.take(wanted, 1 << 62, request_info.now)
        if taken is None:
            return None
        return Batch.of(taken)

    def next_ready_at(self, request_info: RequestInfo, buffer: RequestBuffer) -> float:
        return buffer.head_ready_at()


_NO_KEY: Hashable = object()


class PartitionKeyBatchCreator(BatchCreator):
    """A batch never mixes partition keys, and a key with a batch in flight is skipped.

    FLIP-509's Cassandra case: batches within one partition key. Skipping busy keys is what keeps
    per-key order while batches of different keys are in flight concurrently. The fullest sendable key goes
    first, so per-key batches stay as large as the buffer allows; when only a size trigger fired
    (`RequestInfo.partial` false) it must hold a full batch (records or bytes), else nothing is cut yet.
    """

    def create_next_batch(self, request_info: RequestInfo, buffer: RequestBuffer) -> Batch | None:
        if not isinstance(buffer, KeyedRequestBuffer):
            raise TypeError("PartitionKeyBatchCreator needs a KeyedRequestBuffer")
        best: Hashable = _NO_KEY  # None is a key: chunks given without one (a dead-letter writer's) share it
        for key in buffer.fullest_keys():
            if key not in request_info.busy_keys and buffer.key_ready_at(key) <= request_info.now:
                best = key
                break
        if best is _NO_KEY:
            return None
        if not request_info.partial and buffer.key_size(best) < request_info.batch_size \
                and buffer.key_size_bytes(best) < request_info.max_batch_bytes:
            return None
        taken = buffer.take(request_info.batch_size, request_info.max_batch_bytes, request_info.now, best)
        if taken is None:
            return None
        return Batch.of(taken, best)

    def next_ready_at(self, request_info: RequestInfo, buffer: RequestBuffer) -> float:
        assert isinstance(buffer, KeyedRequestBuffer)
        times = [buffer.key_ready_at(k) for k in buffer.delayed_keys() if k not in request_info.busy_keys]
        return min(times, default=0.0)
