"""AsyncSinkWriter: ring buffer -> buffer manager -> batches -> store, with the three modes of the sink-modes design.

Threads: the caller's thread (a Spark task) pushes chunks of encoded entries into a small bounded ring
(the sink-modes design's thread-safe ring buffer) and blocks when it is full. One buffer-manager thread owns all
other state (lent to the caller, under the lock, while the manager waits with nothing to do and the store
acknowledges every batch at once: `_cut_here`, and `_run_here` for a chunk that goes as a run without entering the
buffer): it admits chunks while fewer than `requests_max_buffered` entries
wait, cuts batches with the BatchCreator when a trigger fires (batch records, batch bytes, timeout, checkpoint),
submits them while the user's rate cap (token buckets, sink.rate.*) and the AIMD rate limiter allow, handles
completions (re-adding failed entries at the head, splitting a batch refused for one of its records when
errors.tolerance=all), and reports the write to an optional observer (live metrics) every few seconds.

Over 400 lines on purpose: the manager thread's state and the loop that owns it are one unit (the refusals' split
and route too: they put entries back in its buffer and count in its stats; and the caller's thread's `_cut_here` and
`_run_here`, which do the manager's work on that state under its lock); split, each half would reach into the other's
fields.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from sluice._errors import OptionError, RecordTooLargeError, RefusedRecords, RetryEntries, SinkError
from sluice.engine._batch import (
    Batch,
    BatchCreator,
    BatchRun,
    RequestInfo,
    SimpleBatchCreator,
)
from sluice.engine._buffer import (
    Chunk,
    DequeRequestBuffer,
    Ints,
    RequestBuffer,
    largest_size,
    running_array,
    sizes_from_running,
    total_bytes,
)
from sluice.engine._config import PARTITION_ORDERED, SinkConfig
from sluice.engine._ratelimit import AIMDRateLimiter, RateCap
from sluice.engine._stats import LiveStats, WriteStats, latency_bucket, latency_bucket_range
from sluice.engine._store import ErrorKind, Store, WriteContext, completed_future

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

log = logging.getLogger("sluice.engine")

_MAX_BACKOFF_S = 30.0
_ACKNOWLEDGED = completed_future()  # the one shared future of every batch a store acknowledged at once
_NO_KEYS: frozenset[Hashable] = frozenset()


def _sizes_made(running: Ints | None, call: str) -> Ints:
    """Each entry's size, for a caller that handed only the running sums (sizes None)."""
    if running is None:
        raise ValueError(f"{call}: sizes is None and no running sums were given; hand one of them")
    return sizes_from_running(running)


class _Checkpoint:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class AsyncSinkWriter:
    """Buffers entries and writes them to a Store in batches, honouring the configured sink mode.

    Use from one thread: `write_chunk` (or `write`) any number of times, then `finish()` at the end of
    the task or micro-batch (the checkpoint): it returns once everything is acknowledged, and gives
    the store's pre-commit message. `close()` always, e.g. through `with AsyncSinkWriter(...)`.
    """

    def __init__(
        self,
        store: Store,
        config: SinkConfig,
        *,
        context: WriteContext | None = None,
        buffer: RequestBuffer | None = None,
        batch_creator: BatchCreator | None = None,
        ring_capacity: int = 2,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        observer: Callable[[LiveStats], None] | None = None,
        observe_every_s: float = 1.0,
        on_refused: Callable[[Sequence[Any], list[BaseException]], None] | None = None,
    ) -> None:
        if config.transactional and not store.supports_transactions:
            raise OptionError(
                f"sink.transactional=true, but the {store.name} store has no transactions; "
                "remove sink.transactional or use a transactional store."
            )
        config.check_store_limits(store.name, store)
        self.store = store
        self.config = config
        self.context = context or WriteContext()
        self._keyed = config.mode == PARTITION_ORDERED
        mode_creator, mode_buffer = config.mode_batching()
        self._buffer = buffer or mode_buffer
        self._creator = batch_creator or mode_creator
        self._limiter = AIMDRateLimiter(config.batch_max_size, config.effective_max_inflight,
                                        start_batches=store.window_start_batches)
        self._hold = config.flush_on_checkpoint
        # The usual unordered or globally ordered write: full batches go through _send_full (see there).
        self._plain = not self._keyed and not self._hold and type(self._creator) is SimpleBatchCreator \
            and type(self._buffer) is DequeRequestBuffer
        # A store that may take a run of full batches in one call (Store.submit_run): asked by _send_full.
        self._takes_runs = type(store).submit_run is not Store.submit_run
        self._clock = clock
        records_per_s, bytes_per_s = config.task_rate()
        # The task's share of the write's rate cap; None (no cap) leaves the pump as it is without one.
        self._cap = None if records_per_s is None and bytes_per_s is None else \
            RateCap(records_per_s, bytes_per_s, clock())
        # A chunk handed its running sums may go to the store as a run without entering the buffer (_run_here).
        self._direct = self._plain and self._takes_runs and self._cap is None
        # Under a cap, batches no larger than its burst (one second of the share): a larger one goes into debt at
        # once, a whole batch over the cap (a store cutting tens of thousands of rows a batch, as COPY does).
        self._batch_records = config.batch_max_size if records_per_s is None else \
            max(1, min(config.batch_max_size, int(records_per_s)))
        self._batch_bytes = config.flush_buffer_size if bytes_per_s is None else \
            max(1, store.max_record_bytes or 1, min(config.flush_buffer_size, int(bytes_per_s)))
        self._rng = rng or random.Random()
        self.stats = WriteStats()
        # Called by the manager thread, which owns the state it reports, every observe_every_s while it runs.
        self._observer = observer
        self._observe_every_s = observe_every_s
        self._next_observation = clock() + observe_every_s
        self._failed_records = 0
        self._last_send_s: float | None = None
        # _send_full's last latency bucket and its range: a run's first batch usually falls in it again.
        self._last_bucket: tuple[int, float, float] = (0, 0.0, 0.0)
        # Where records the store refuses go with errors.tolerance=all (the entries and one error each), called by the
        # manager thread; None: a refused record fails the write.
        self._on_refused = on_refused if config.errors.tolerates else None
        self._refused_early = 0  # refused on the caller's thread (refused_by_caller), added to the stats by flush()

        # Shared between the caller and the manager thread, guarded by _cond.
        self._lock = threading.RLock()  # _cond's: taken alone (a C call) where nothing waits or notifies at once
        self._cond = threading.Condition(self._lock)
        self._ring: deque[Chunk | list[Chunk] | _Checkpoint] = deque()  # a list: one write_keyed call's chunks
        # Two waiting chunks keep the manager busy while the caller encodes the next. More only keep more entries alive
        # (10,000 Python objects per Spark Arrow batch) out of the CPU's caches: a ring of 4 cost a third more CPU per
        # row than 2 for bytes entries (the engine's profile in docs/engine.md; bench/engine_throughput.py).
        self._ring_capacity = ring_capacity
        self._completions: deque[tuple[Batch, float, Future[None]]] = deque()
        self._failure: SinkError | None = None
        self._closing = False
        self._idle = False  # the manager thread waits (or wakes, the lock not yet taken back): see _cut_here
        self._idle_waiters = 0  # threads in _wait_idle
        # Whether submit returned the shared acknowledged future (completed_future()) for every batch so far (None: no
        # batch sent yet); set by _send_full and _submit. A future another thread completes is never "at once".
        self._acks_at_once: bool | None = None

        # Owned by the manager thread.
        self._busy_keys: set[Hashable] = set()
        self._deadline: float | None = None
        self._timeout_flush = False
        self._timeout_left = 0  # entries a timeout flush still sends: as many as were buffered when it fired
        self._pumped_at = clock()  # when the last pump looked at what is sendable
        self._retry_pending = 0
        self._checkpoints: list[_Checkpoint] = []
        # A batch cut and waiting for the rate cap's tokens: (batch, flush reason, since when), sent at _capped_until.
        self._capped: tuple[Batch, str, float] | None = None
        self._capped_until = 0.0

        self.store.open(self.context)
        self._thread = threading.Thread(target=self._run, name=f"sluice-{store.name}-buffer", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- caller side
    def write(self, entry: Any, size: int, key: Hashable = None) -> None:
        self.write_chunk([entry], [size], key)

    def write_chunk(self, entries: Sequence[Any], sizes: Ints | None, key: Hashable = None,
                    running: Ints | None = None) -> None:
        """Add entries (in order) that share one partition key. Blocks while the buffer is full.

        `entries` a list, or a range (row numbers); `sizes` a list of ints or a numpy integer array: a range and an
        array cost the engine nothing per entry (_buffer.py). `running`, a numpy array or a memoryview of integers:
        the sizes' running sums (entry i's: the bytes of entries 0 to i), when the caller has them without a pass
        (`binary_running_sums`): the engine then sums no size. With them, `sizes` may be None: each entry's size is
        then made from them only where one is needed (entries that wait in the buffer, a run's `sizes` when its store
        reads them). The writer keeps what it is given as it is (a copy per chunk was a pass over every row): do not
        change it after handing it over."""
        if not len(entries):
            return
        if running is not None:
            if len(running) != len(entries):
                raise ValueError(f"{len(entries)} entries but {len(running)} running sums")
            if self._direct:
                with self._lock:
                    if self._run_here(entries, sizes, running):
                        return
        self._put(self._chunk(entries, sizes, key, running))

    def _chunk(self, entries: Sequence[Any], sizes: Ints | None, key: Hashable, running: Ints | None = None,
               start: int = 0) -> Chunk:
        if type(running) is memoryview:  # binary_running_sums': a chunk searches its sums with numpy
            running = running_array(running)
        if sizes is None:
            sizes = _sizes_made(running, "write_chunk")
        if len(entries) != len(sizes):
            raise ValueError(f"{len(entries)} entries but {len(sizes)} sizes")
        limit = self.store.max_record_bytes
        if limit is not None and self._on_refused is not None and largest_size(sizes) > limit:
            entries, sizes = self._refuse_oversized(entries, sizes, limit)
            running = None
        if limit is not None:
            largest = largest_size(sizes)
            if largest > limit:
                index = [int(size) for size in sizes].index(largest)
                raise RecordTooLargeError(
                    f"{self.store.name}: record {index} of this chunk is {largest} bytes, over the store's limit of "
                    f"{limit} bytes per record ({self.store.target}); split or shrink it. Nothing of this "
                    "chunk was sent.",
                    store=self.store.name, target=self.store.target, batch_records=1,
                )
        if type(entries) is not list and type(entries) is not range:
            entries = list(entries)
        if type(sizes) is not list and getattr(sizes, "dtype", None) is None:
            sizes = list(sizes)
        return Chunk(entries, sizes, key if self._keyed else None, start=start, running=running)

    def _refuse_oversized(self, entries: Sequence[Any], sizes: Ints, limit: int) -> tuple[Sequence[Any], Ints]:
        """errors.tolerance=all: entries over the store's record limit go aside from the caller's thread; the rest
        are the chunk."""
        keep = [i for i, size in enumerate(sizes) if int(size) <= limit]
        over = [i for i, size in enumerate(sizes) if int(size) > limit]
        errors: list[BaseException] = [RecordTooLargeError(
            f"{self.store.name}: a record of {int(sizes[i])} bytes is over the store's limit of {limit} bytes per "
            f"record ({self.store.target})", store=self.store.name, target=self.store.target, batch_records=1)
            for i in over]
        self._refuse_early([entries[i] for i in over], errors)
        return [entries[i] for i in keep], [int(sizes[i]) for i in keep]

    def _refuse_early(self, entries: Sequence[Any], errors: list[BaseException]) -> None:
        if self._on_refused is None:
            raise SinkError(f"{self.store.name}: {len(entries)} record(s) were refused: {errors[0]}",
                            store=self.store.name, target=self.store.target, cause=errors[0])
        self._on_refused(entries, errors)
        self.count_refused(len(entries))

    def count_refused(self, n: int) -> None:
        """From the caller's thread: `n` records refused before they reached the buffer (over the store's record
        limit, or refused by the encoder) and sent aside, counted like the store's refusals (flush() checks the
        bound)."""
        with self._cond:
            self._refused_early += n

    def write_keyed(self, entries: Sequence[Any], sizes: Ints | None, keys: Sequence[Hashable] | NDArray[np.integer],
                    names: Sequence[Hashable] | None = None, running: Ints | None = None) -> None:
        """Add entries with a partition key each; entries of one key keep their relative order.

        With `names`, `keys` are integer codes and entry i's partition key is names[keys[i]] (exact keys
        grouped as fast as integer buckets). `sizes` and `running` as write_chunk's."""
        if not self._keyed:
            self.write_chunk(entries, sizes, running=running)
            return
        import numpy as np

        if sizes is None:  # a key's entries are taken apart: each needs its size
            sizes = _sizes_made(running, "write_keyed")

        key_array = np.asarray(keys)
        if key_array.dtype.kind not in "iu":  # arbitrary hashables: group in Python
            groups: dict[Hashable, list[int]] = {}
            for index, key in enumerate(keys):
                groups.setdefault(key, []).append(index)
            self._put([self._chunk([entries[i] for i in indexes], [sizes[i] for i in indexes], key)
                       for key, indexes in groups.items()])
            return
        # Integer buckets: a stable sort groups them and keeps each key's order, without a Python loop per key.
        order = np.argsort(key_array, kind="stable")
        sorted_keys = key_array[order]
        bounds = (np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1).tolist()
        positions = order.tolist()
        ordered_entries = [entries[i] for i in positions]
        ordered_sizes = (cast("NDArray[np.integer]", sizes)[order] if getattr(sizes, "dtype", None) is not None
                         else [sizes[i] for i in positions])
        chunks = []
        for start, end in zip([0, *bounds], [*bounds, len(positions)], strict=True):
            code = int(sorted_keys[start])
            chunks.append(self._chunk(ordered_entries[start:end], ordered_sizes[start:end],
                                      code if names is None else names[code]))
        # One hand-over to the manager thread for all keys of the call: with many keys (a write routed into 1,000
        # streams) a hand-over per key made the caller and the manager trade the ring lock per handful of rows.
        self._put(chunks)

    def flush(self) -> None:
        """The checkpoint: return once every entry written so far is acknowledged by the store."""
        marker = _Checkpoint()
        self._put(marker)
        marker.done.wait()
        self._raise_failure()
        with self._cond:  # the manager thread is idle now: the stats are the caller's to read and change
            early, self._refused_early = self._refused_early, 0
        if early:
            self.stats.dead_letters += early
            bound = self.config.errors.over_bound(self.stats.dead_letters, 0)
            if bound is not None:
                raise SinkError(f"{self.store.name} ({self.store.target}), this task alone: {bound}",
                                store=self.store.name, target=self.store.target)

    def finish(self) -> Any:
        """flush(), then the store's pre-commit message (transactions are prepared here)."""
        self.flush()
        return self.store.pre_commit()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self.store.close()

    def __enter__(self) -> AsyncSinkWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def failure(self) -> SinkError | None:
        return self._failure

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _put(self, item: Chunk | list[Chunk] | _Checkpoint) -> None:
        with self._cond:
            while len(self._ring) >= self._ring_capacity and self._failure is None and not self._closing:
                self._cond.wait()
            self._raise_failure()
            if self._closing:
                raise SinkError("the sink writer is closed", store=self.store.name, target=self.store.target)
            if type(item) is Chunk and self._cut_here(item):
                return
            self._ring.append(item)
            self._cond.notify_all()

    def _cut_here(self, chunk: Chunk) -> bool:
        """Under the lock, on the caller's thread: while the manager thread waits with nothing buffered, pending or in
        flight, for a plain write to a store that has acknowledged every batch at once (submit returned
        completed_future(): sluice_null, Kafka in a transaction), admit the chunk and run the manager's pump here, as
        the manager would have, instead of waking it. In Spark a wake per Arrow batch cost the task's worker ~0.1 ms of
        CPU (the thread switches, and the two threads wanting the GIL while the task reads the next batch from its
        socket): 1.43-1.48x the bare Arrow writer's CPU with one batch per Arrow batch, 1.28-1.30x without the wake
        (docs/results/engine.md, 2026-12-07). The manager cannot run meanwhile: it sleeps in its wait, or wakes into
        the lock this thread holds. What the pump leaves (a partial batch with its timeout, a batch in flight, a failure
        to handle) wakes it as a hand-over would have. False: the chunk goes through the ring."""
        if not self._may_cut_here():
            return False
        try:
            self._admit(chunk)
            self._pump()
        except BaseException as error:
            raise self._crashed_here(error) from error
        self._wake_for_what_is_left()
        return True

    def _may_cut_here(self) -> bool:
        """Under the lock: whether the caller's thread may do the manager's work now (_cut_here)."""
        return self._idle and bool(self._acks_at_once) and self._failure is None and not self._closing \
            and not (self._ring or self._completions or self._checkpoints or self._buffer.size())

    def _crashed_here(self, error: BaseException) -> SinkError:
        """As on the manager thread: a bug in its work on the caller's thread fails the write, never hangs it."""
        log.exception("sluice buffer manager crashed")
        failure = SinkError(f"{self.store.name}: sink engine failed: {error!r}", store=self.store.name,
                            target=self.store.target, cause=error)
        self._fail(failure)
        return failure

    def _wake_for_what_is_left(self) -> None:
        """After the manager's work on the caller's thread: what it left (a partial batch with its timeout, a batch in
        flight, a failure to handle) wakes the manager as a hand-over would have."""
        if self._buffer.size() or self._limiter.inflight_requests or self._completions:
            self._cond.notify_all()

    def _run_here(self, entries: Sequence[Any], sizes: Ints | None, running: Ints) -> bool:
        """Under the lock, on the caller's thread, where _cut_here would cut a chunk handed its running sums: its full
        batches (at the steady batch size, none over the byte limit) go to the store in one run (Store.submit_run)
        without entering the buffer, and only what follows the last of them enters it, as _cut_here admits a chunk.
        In a Spark task each step costs several times what it costs on batches already read: each Arrow batch comes
        after the read of the next from the worker's socket, and finds the CPU's caches cold (docs/engine.md, "Runs
        straight from a chunk's running sums"). False: nothing was sent; the chunk goes through _put."""
        limit = self._batch_records
        count = len(entries) // limit
        if not count or self._limiter.window < limit or not self._may_cut_here():  # window: batch_size_limit's
            return False
        largest = self.store.max_record_bytes
        if largest is not None and (sizes is None or largest_size(sizes) > largest):
            return False  # _chunk measures the records against the store's limit
        last = count * limit
        ends = cast("NDArray[np.integer]", running)[limit - 1:last:limit].tolist()
        run_bytes = [end - before for before, end in zip([0, *ends], ends, strict=False)]
        if max(run_bytes) > self._batch_bytes:
            return False
        try:
            sent = self._send_run(entries, sizes, running, limit, run_bytes)
            if sent is None:
                return False
            taken = sent[0] * limit
            if taken == len(entries) and self._acks_at_once:
                return True  # nothing left, nothing in flight: the manager has nothing to learn
            if taken < len(entries):
                self._admit(self._chunk(entries, sizes, None, running, start=taken))
        except BaseException as error:
            raise self._crashed_here(error) from error
        self._wake_for_what_is_left()
        return True

    def _wait_idle(self) -> None:
        """Return once the manager thread waits (for tests: what a caller's next chunk then finds)."""
        with self._cond:
            self._idle_waiters += 1
            while not self._idle and self._failure is None and not self._closing:
                self._cond.wait()
            self._idle_waiters -= 1

    # ----------------------------------------------------------------- manager thread
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # a bug here must fail the task, never hang it
            log.exception("sluice buffer manager crashed")
            self._fail(SinkError(f"{self.store.name}: sink engine failed: {error!r}", store=self.store.name,
                                 target=self.store.target, cause=error))

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not (self._completions or self._closing or self._admissible()):
                    # One wait per cycle: whatever woke us (a put, a completion, a deadline or backoff
                    # passing), the pump below re-evaluates every trigger.
                    self._idle = True  # a caller's chunk may be cut on its thread meanwhile (_cut_here)
                    if self._idle_waiters:
                        self._cond.notify_all()
                    self._cond.wait(self._wait_seconds())
                    self._idle = False
                if self._closing:
                    return
                completions = list(self._completions)
                self._completions.clear()
                admitted: list[Chunk | list[Chunk] | _Checkpoint] = []
                while self._ring and self._admissible():
                    item = self._ring.popleft()
                    admitted.append(item)
                    if isinstance(item, _Checkpoint):
                        self._checkpoints.append(item)
                    else:
                        for chunk in item if isinstance(item, list) else (item,):
                            self._admit(chunk)
                if admitted:
                    self._cond.notify_all()  # the caller may be waiting for room in the ring
            shared = None  # a failure halves the window once per failed future, not per batch of a run sharing it
            for batch, started, future in completions:
                self._on_complete(batch, started, future.exception(), future is not shared)
                shared = future
            self._pump()
            self._finish_checkpoints()
            self._observe()

    def live(self) -> LiveStats:
        """The write as it stands; exact when read by the manager thread or after finish()."""
        last = self._last_send_s
        return LiveStats(
            self.stats.records, self.stats.bytes, self.stats.batches, self._failed_records, self.stats.retries,
            self.stats.throttles, self._limiter.inflight_requests, self._limiter.inflight_records,
            self._limiter.window, self._buffer.size(), None if last is None else last * 1000.0, self._clock(),
            self.stats.rate_wait_s, self.stats.dead_letters + self._refused_early)

    def _observe(self) -> None:
        if self._observer is None or self._clock() < self._next_observation:
            return
        self._next_observation = self._clock() + self._observe_every_s
        try:
            self._observer(self.live())
        except Exception:  # metrics never fail a write: say why once, then stop observing
            log.warning("sluice: the write's metrics observer failed; no more live metrics for this task",
                        exc_info=True)
            self._observer = None

    def _admissible(self) -> bool:
        if not self._ring or self._failure is not None:
            return False
        return isinstance(self._ring[0], _Checkpoint) or self._buffer.size() < self.config.requests_max_buffered

    def _admit(self, chunk: Chunk) -> None:
        if not self._buffer.size() and not self._hold:
            self._deadline = self._clock() + self.config.flush_buffer_timeout / 1000.0
        self._buffer.add_chunk(chunk)

    def _wait_seconds(self) -> float | None:
        if self._failure is not None:
            return None  # nothing more will be sent; wait for close()
        # Judged at the time the last pump judged readiness: a retry whose backoff ended since then was not sent
        # by it and must not be taken for "sendable, so nothing to wait for" (that waited forever).
        judged = self._pumped_at
        times = [self._next_observation] if self._observer is not None else []
        if self._deadline is not None and not self._timeout_flush:
            times.append(self._deadline)
        if self._capped is not None:
            times.append(self._capped_until)
        if self._buffer.size():
            ready = self._creator.next_ready_at(self._request_info(judged), self._buffer)
            if ready > judged:
                times.append(ready)
        return max(0.0, min(times) - self._clock()) if times else None

    def _request_info(self, now: float, partial: bool = True) -> RequestInfo:
        return RequestInfo(
            self._limiter.batch_size_limit(self._batch_records),
            self._batch_bytes, now, frozenset(self._busy_keys) if self._busy_keys else _NO_KEYS,
            bool(self._checkpoints), partial,
        )

    def _flush_reason(self, limit: int) -> tuple[str, bool] | None:
        """Why a batch may be cut now, and whether it may be partial (see `RequestInfo.partial`).

        Partition-ordered writes count a size trigger only for a full batch of one key: with thousands of keys
        buffered, cutting as soon as the buffer held `limit` entries in all sent batches of one or two entries.
        Their keys wait instead for more entries, the buffer filling up, the timeout or the checkpoint."""
        size = self._buffer.size()
        if self._retry_pending:
            return "retry", True
        if self._keyed and not self._hold and (other := self._partial_reason()):
            return other  # it cuts the fullest key too, full or not
        if not self._hold:
            if size >= limit:
                return "batch-size", not self._keyed
            if self._buffer.total_size_bytes() >= self._batch_bytes:
                return "batch-bytes", not self._keyed
        return self._partial_reason()

    def _partial_reason(self) -> tuple[str, bool] | None:
        if self._checkpoints:
            return "checkpoint", True
        if (self._hold or self._keyed) and self._buffer.size() >= self.config.requests_max_buffered:
            return "buffer-full", True
        if self._timeout_flush:
            return "timeout", True
        return None

    def _pump(self) -> None:
        if self._failure is not None:
            return
        now = self._pumped_at = self._clock()
        if self._deadline is not None and now >= self._deadline and not self._timeout_flush:
            # Flush what is buffered now, then start the clock again: with entries arriving all the time the buffer
            # never empties, and flushing until it did would end the waiting of partition-ordered keys for good.
            self._timeout_flush, self._timeout_left = True, self._buffer.size()
        if self._capped is not None and not self._release_capped(now):
            return
        if self._plain and self._cap is None and not self._retry_pending and not self._timeout_flush:
            self._send_full(now)
        info: RequestInfo | None = None
        while self._buffer.size():
            # One request info serves batch after batch while the window and the busy keys stay as they were (an
            # unordered write acknowledged at once: the whole pump); it is a frozen dataclass of six fields.
            if info is None or self._busy_keys or info.busy_keys \
                    or info.batch_size != self._limiter.batch_size_limit(self._batch_records):
                info = self._request_info(now)
            if self._limiter.should_block(min(info.batch_size, self._buffer.size())):
                break
            trigger = self._flush_reason(info.batch_size)
            if trigger is None:
                break
            reason, partial = trigger
            batch = self._creator.create_next_batch(info if partial else self._request_info(now, False), self._buffer)
            if batch is None:
                break
            if batch.attempt or batch.split:
                reason = "retry" if batch.attempt else "split"
                self._retry_pending -= batch.record_count
            if self._cap is not None and not self._cap_allows(batch, reason, now):
                break
            self._send(batch, reason, now)
            if self._plain and self._cap is None and not self._retry_pending and not self._timeout_flush:
                self._send_full(now)  # the batch across two chunks is cut: the next chunk's full batches as a run
        if not self._buffer.size():
            self._deadline = None
            self._timeout_flush = False

    def _send_full(self, now: float) -> None:
        """The loop below for full batches of a plain write (no rate cap, nothing to retry, no timeout flush), cut
        as SimpleBatchCreator would from the head chunk (DequeRequestBuffer.full_run), sent while the limiter
        allows, with the same statistics. A store acknowledging a batch at once (sluice_null, a client that
        buffers) is counted in local sums, written back once per run instead of per batch: the per-batch work, a
        Taken, a RequestInfo, the trigger, the limiter's calls and a histogram update, cost ~3 us a batch, ~12 ms of
        a 2M-row task in batches of 500 (bench/engine_cut.py). A batch left in flight goes on as _submit sends it.
        The loop below cuts whatever this leaves (the partial batches, a batch across chunks, retries)."""
        limiter, stats, clock, store = self._limiter, self.stats, self._clock, self.store
        buffer = cast(DequeRequestBuffer, self._buffer)
        cap, acknowledged = limiter.cap, _ACKNOWLEDGED
        batches = records = size = 0  # acknowledged at once
        latencies: dict[int, int] = {}
        bucket, low, high = self._last_bucket  # the last bucket seen and its latency range [low, high)
        same = 0  # latencies in that bucket since it was last written to `latencies`
        latency = None
        inflight = 0  # in flight beside the last batch acknowledged at once (grows in a run: nothing completes)
        try:
            while True:
                limit = limiter.batch_size_limit(self._batch_records)
                if buffer.size() < limit or limiter.should_block(limit):
                    return
                run = buffer.full_run(limit, self._batch_bytes, now)
                if run is None:
                    return
                chunk, run_bytes = run
                entries, sizes, start = chunk.entries, chunk.sizes, chunk.start
                whole = not start and len(entries) == limit  # the chunk is the batch: no slices
                steady = limit == self._batch_records
                if self._takes_runs and steady:
                    sent = self._send_run(entries[start:] if start else entries,
                                          sizes[start:] if start else sizes, None, limit, run_bytes)
                    if sent is not None:
                        buffer.take_run(sent[0], limit, sent[1])
                        continue
                taken = 0
                later = later_bytes = 0  # of the run's batches, those left in flight
                # Window increases not applied yet: while batches are acknowledged at once at a steady size, nothing
                # reads the window; applied before anything does (a batch left in flight, the run's end).
                grown = 0
                try:
                    for taken, batch_bytes in enumerate(run_bytes, 1):  # noqa: B007 (taken: read after the loop)
                        stop = start + limit
                        batch = Batch(entries, batch_bytes, limit, None, 0, sizes) if whole else \
                            Batch(entries[start:stop], batch_bytes, limit, None, 0, sizes[start:stop])
                        start = stop
                        started = clock()
                        try:
                            future = store.submit(batch)
                        except BaseException as error:  # a store that raises instead of failing the future
                            future = completed_future(error)
                        if future is acknowledged or (future.done() and not future.cancelled()
                                                      and future.exception() is None):
                            # on_submit and on_complete at once: nothing stays in flight; the window grows to its cap
                            latency = clock() - started
                            if low <= latency < high:
                                same += 1
                            else:
                                if same:
                                    latencies[bucket] = latencies.get(bucket, 0) + same
                                bucket = latency_bucket(latency)
                                low, high = latency_bucket_range(bucket)
                                same = 1
                            inflight = limiter.inflight_requests
                            if future is not acknowledged:
                                self._acks_at_once = False  # at once, but not the shared future (see _cut_here)
                            if steady:
                                grown += 1
                                continue  # a batch as large as sink.batch.max-size: a larger window cannot change it
                            limiter.window = min(cap, limiter.window + limiter.increase)
                        else:
                            if grown:
                                limiter.window, grown = min(cap, limiter.window + limiter.increase * grown), 0
                            self._acks_at_once = False
                            later += 1
                            later_bytes += batch_bytes
                            limiter.on_submit(limit)
                            stats.flush_reasons["batch-size"] += 1
                            stats.peak_inflight = max(stats.peak_inflight, limiter.inflight_requests)
                            future.add_done_callback(partial(self._post_completion, batch, started))
                            if limiter.should_block(limit):
                                return
                        if limiter.batch_size_limit(self._batch_records) != limit:
                            break  # the window moved the batch size: cut again at the new one
                finally:
                    if grown:
                        limiter.window = min(cap, limiter.window + limiter.increase * grown)
                    taken_bytes = sum(run_bytes[:taken])
                    buffer.take_run(taken, limit, taken_bytes)
                    batches += taken - later
                    records += (taken - later) * limit
                    size += taken_bytes - later_bytes
                    if taken > later and self._acks_at_once is None:
                        self._acks_at_once = True
        finally:
            self._last_bucket = (bucket, low, high)
            if same:
                latencies[bucket] = latencies.get(bucket, 0) + same
            if batches:
                stats.flush_reasons["batch-size"] += batches
                stats.peak_inflight = max(stats.peak_inflight, inflight + 1)
                stats.records += records
                stats.bytes += size
                stats.batches += batches
                buckets = stats.latency_buckets
                for number, count in latencies.items():
                    buckets[number] += count
                self._last_send_s = latency

    def _send_run(self, entries: Sequence[Any], sizes: Ints | None, running: Ints | None, limit: int,
                  run_bytes: list[int]) -> tuple[int, int] | None:
        """A store that takes runs (Store.submit_run) is handed full batches of `limit` entries from `entries` on
        (`run_bytes`: each one's bytes; `sizes` or, from the first entry, their `running` sums) in one call: as many as
        the window lets be in flight together. Returns how many, and their bytes: the caller takes them from where
        they were. None: the store did not take the run, nothing was sent. A run acknowledged at once is counted here
        (_count_run_at_once); one left in flight or failed is counted batch by batch, as _submit counts a batch:
        each completes, and is retried, alone."""
        limiter = self._limiter
        # Every batch so far acknowledged at once: the per-batch path sends this store batch after batch, each done
        # before the next goes, never waiting on the window or sink.requests.max-inflight (under global order too:
        # the store writes a run's batches in their order), so a run of them may be as long.
        n = len(run_bytes) if self._acks_at_once else min(len(run_bytes), limiter.requests_allowed(limit))
        stop = n * limit
        if stop != len(entries):
            entries = entries[:stop]
            sizes = None if sizes is None else sizes[:stop]
            running = None if running is None else running[:stop]
        if n < len(run_bytes):
            run_bytes = run_bytes[:n]
        batch_run = BatchRun(entries, sizes, limit, run_bytes, running)
        started = self._clock()
        try:
            future = self.store.submit_run(batch_run)
        except BaseException as error:  # a store that raises instead of failing the future
            future = completed_future(error)
        if future is None:
            # Declined: the store's answer for this write (Kafka's outside a transaction).
            self._takes_runs = self._direct = False
            return None
        taken_bytes = sum(run_bytes)
        if future is _ACKNOWLEDGED or (future.done() and not future.cancelled() and future.exception() is None):
            if future is not _ACKNOWLEDGED:
                self._acks_at_once = False  # at once, but not the shared future (see _cut_here)
            elif self._acks_at_once is None:
                self._acks_at_once = True
            self._count_run_at_once(n, limit, taken_bytes, self._clock() - started)
            return n, taken_bytes
        self._acks_at_once = False
        batches = batch_run.batches()
        stats = self.stats
        for _ in range(n):
            limiter.on_submit(limit)
        stats.flush_reasons["batch-size"] += n
        stats.peak_inflight = max(stats.peak_inflight, limiter.inflight_requests)
        future.add_done_callback(partial(self._post_run_completion, batches, started))
        return n, taken_bytes

    def _count_run_at_once(self, n: int, limit: int, taken_bytes: int, took: float) -> None:
        """A run of `n` batches the store acknowledged at once, counted as `n` batches submitted alone (statistics,
        flush reasons, the window's growth), each taking an equal share of the call's time."""
        stats, limiter = self.stats, self._limiter
        share = self._last_send_s = took / n
        bucket, low, high = self._last_bucket
        if not low <= share < high:
            bucket = latency_bucket(share)
            self._last_bucket = bucket, *latency_bucket_range(bucket)
        stats.latency_buckets[bucket] += n
        limiter.window = min(limiter.cap, limiter.window + limiter.increase * n)
        stats.flush_reasons["batch-size"] += n
        stats.peak_inflight = max(stats.peak_inflight, limiter.inflight_requests + n)
        stats.records += n * limit
        stats.bytes += taken_bytes
        stats.batches += n

    def _post_run_completion(self, batches: list[Batch], started: float, future: Future[None]) -> None:
        # A failed run's batches are each put back at the head of the buffer: last first, so that they go again in
        # their order (global order).
        failed = future.cancelled() or future.exception() is not None
        with self._cond:
            self._completions.extend((batch, started, future) for batch in (reversed(batches) if failed else batches))
            self._cond.notify_all()

    def _send(self, batch: Batch, reason: str, now: float) -> None:
        self._submit(batch, reason)
        if self._timeout_flush:
            self._timeout_left -= batch.record_count
            if self._timeout_left <= 0:
                self._timeout_flush = False
                self._deadline = now + self.config.flush_buffer_timeout / 1000.0

    def _cap_allows(self, batch: Batch, reason: str, now: float) -> bool:
        """Whether the rate cap lets `batch` go now (its tokens taken); else it is held until the cap allows it:
        the loop waits for that time like for a deadline, and nothing else is cut meanwhile."""
        assert self._cap is not None
        ready = self._cap.ready_at(batch.record_count, batch.size_bytes, now)
        if ready > now:
            self._capped, self._capped_until = (batch, reason, now), ready
            return False
        self._cap.take(batch.record_count, batch.size_bytes, now)
        return True

    def _release_capped(self, now: float) -> bool:
        """Send the batch held for the rate cap if the cap allows it now; False: it waits on."""
        assert self._capped is not None and self._cap is not None
        batch, reason, since = self._capped
        ready = self._cap.ready_at(batch.record_count, batch.size_bytes, now)
        if ready > now:
            self._capped_until = ready
            return False
        self._capped = None
        self._cap.take(batch.record_count, batch.size_bytes, now)
        self.stats.rate_wait_s += now - since
        self._send(batch, reason, now)
        return True

    def _submit(self, batch: Batch, reason: str) -> None:
        self._limiter.on_submit(batch.record_count)
        if self._keyed:
            self._busy_keys.add(batch.partition_key)
        self.stats.flush_reasons[reason] += 1
        self.stats.peak_inflight = max(self.stats.peak_inflight, self._limiter.inflight_requests)
        started = self._clock()
        try:
            future = self.store.submit(batch)
        except BaseException as error:  # a store that raises instead of failing the future
            future = completed_future(error)
        if future is _ACKNOWLEDGED or (future.done() and not future.cancelled() and future.exception() is None):
            # Acknowledged already (a store that holds nothing in flight): counted here, not sent round through the
            # completion queue, which cost a lock, a notify and a turn of the loop per batch (and the shared future
            # is known without asking it, which takes its lock three times).
            if future is not _ACKNOWLEDGED:
                self._acks_at_once = False
            self._on_complete(batch, started, None)
            return
        self._acks_at_once = False
        future.add_done_callback(lambda f: self._post_completion(batch, started, f))

    def _post_completion(self, batch: Batch, started: float, future: Future[None]) -> None:
        with self._cond:
            self._completions.append((batch, started, future))
            self._cond.notify_all()

    def _on_complete(self, batch: Batch, started: float, error: BaseException | None, shrink: bool = True) -> None:
        self._limiter.on_complete(batch.record_count, error is None, shrink)
        if self._keyed:
            self._busy_keys.discard(batch.partition_key)
        if error is None:
            self.stats.records += batch.record_count
            self.stats.bytes += batch.size_bytes
            self.stats.batches += 1
            self._last_send_s = self._clock() - started
            self.stats.record_latency(self._last_send_s)
            return
        if self._failure is not None:
            return
        entries, sizes = batch.entries, batch.sizes
        if isinstance(error, RefusedRecords):
            if not self._refuse([batch.entries[i] for i in error.positions], error.errors, batch):
                return
            retried = error.retry.positions if error.retry is not None else []
            stored = batch.record_count - len(error.positions) - len(retried)
            self.stats.records += stored
            gone = set(error.positions) | set(retried)
            self.stats.bytes += total_bytes([int(size) for i, size in enumerate(batch.sizes) if i not in gone])
            if error.retry is None:
                return
            entries = [batch.entries[i] for i in retried]
            sizes = [int(batch.sizes[i]) for i in retried] if len(batch.sizes) else []
            error = error.retry.cause
        elif isinstance(error, RetryEntries):  # the rest of the batch was stored
            entries = [batch.entries[i] for i in error.positions]
            sizes = [int(batch.sizes[i]) for i in error.positions] if len(batch.sizes) else []
            stored = batch.record_count - len(entries)
            self.stats.records += stored
            self.stats.bytes += batch.size_bytes - total_bytes(sizes)
            error = error.cause
        self._failed_records += len(entries)
        kind = self.store.classify(error)
        noun = "record" if batch.record_count == 1 else "records"
        where = f"batch of {batch.record_count} {noun} ({batch.size_bytes} bytes) to {self.store.target}"
        if kind is ErrorKind.RECORD and self._on_refused is not None:
            if len(entries) == 1:
                self._refuse(entries, [error], batch)
            else:
                self._split(batch, entries, sizes)
            return
        if kind is ErrorKind.RECORD:
            self._fail(self.store.explain(SinkError(
                f"{self.store.name}: {where} failed: {error}. A record was refused for what it holds; nothing of "
                "the batch was stored. Fix the record, or set errors.tolerance=all and errors.deadletter.format to "
                "send such records aside.", store=self.store.name, target=self.store.target,
                batch_records=batch.record_count, cause=error)))
            return
        if kind is ErrorKind.FATAL:
            self._fail(self.store.explain(SinkError(
                f"{self.store.name}: {where} failed: {error}", store=self.store.name, target=self.store.target,
                batch_records=batch.record_count, cause=error)))
            return
        if kind is ErrorKind.THROTTLED:
            self.stats.throttles += 1
        if batch.attempt >= self.config.max_retries:
            self._fail(self.store.explain(SinkError(
                f"{self.store.name}: {where} still failing after {batch.attempt + 1} attempts "
                f"(sink.max-retries={self.config.max_retries}): {error}",
                store=self.store.name, target=self.store.target, batch_records=batch.record_count, cause=error,
            )))
            return
        self.stats.retries += 1
        delay = min(_MAX_BACKOFF_S, self.config.retry_delay_ms / 1000.0 * 2**batch.attempt)
        delay *= self._rng.uniform(0.5, 1.0)  # jitter spreads out retries of parallel tasks
        retry = Chunk(entries, sizes, batch.partition_key, batch.attempt + 1, self._clock() + delay, split=batch.split)
        self._buffer.add_chunk(retry, prioritize=True)
        self._retry_pending += len(entries)
        log.debug("%s: retrying %s in %.3fs: %s", self.store.name, where, delay, error)

    def _split(self, batch: Batch, entries: Sequence[Any], sizes: Ints) -> None:
        """A batch the store refused for one of its records, without saying which: its halves go again at once, at the
        head and in order (so per-key and global order hold), until the record is alone (a binary search: about
        2 log2(n) more requests per refused record in a batch of n)."""
        if not len(sizes):
            sizes = [batch.size_bytes // max(1, len(entries))] * len(entries)
        half = len(entries) // 2
        now = self._clock()
        # The second half enters the head first, so the first half is ahead of it.
        for part, part_sizes in ((entries[half:], sizes[half:]), (entries[:half], sizes[:half])):
            self._buffer.add_chunk(Chunk(part, part_sizes, batch.partition_key, batch.attempt, now, split=True),
                                   prioritize=True)
        self._retry_pending += len(entries)
        self.stats.splits += 1

    def _refuse(self, entries: Sequence[Any], errors: list[BaseException], batch: Batch) -> bool:
        """Send refused entries aside (errors.tolerance=all); without a route, or past errors.max-records, fail the
        write. True when the write goes on."""
        if self._on_refused is None:
            first = errors[0] if errors else None
            more = f" and {len(entries) - 1} more" if len(entries) > 1 else ""
            self._fail(self.store.explain(SinkError(
                f"{self.store.name}: a record{more} of a batch of {batch.record_count} to {self.store.target} was "
                f"refused: {first}. Nothing of this task's write counts as done. Fix the record, or set "
                "errors.tolerance=all and errors.deadletter.format to send such records aside.",
                store=self.store.name, target=self.store.target, batch_records=len(entries), cause=first)))
            return False
        self.stats.dead_letters += len(entries)
        try:
            self._on_refused(entries, errors)
        except BaseException as error:  # the dead-letter route failing fails the write: nothing is dropped
            self._fail(SinkError(f"{self.store.name}: {len(entries)} refused record(s) could not be sent to the "
                                 f"dead-letter target: {error!r}", store=self.store.name, target=self.store.target,
                                 batch_records=len(entries), cause=error))
            return False
        bound = self.config.errors.over_bound(self.stats.dead_letters, 0)
        if bound is not None:
            self._fail(SinkError(f"{self.store.name} ({self.store.target}), this task alone: {bound}",
                                 store=self.store.name, target=self.store.target))
            return False
        return True

    def _finish_checkpoints(self) -> None:
        if not self._checkpoints:
            return
        drained = not self._buffer.size() and not self._limiter.inflight_requests and self._capped is None
        if drained or self._failure is not None:
            for marker in self._checkpoints:
                marker.done.set()
            self._checkpoints.clear()

    def _fail(self, error: SinkError) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = error
            for marker in self._checkpoints:
                marker.done.set()
            for item in self._ring:
                if isinstance(item, _Checkpoint):
                    item.done.set()
            self._cond.notify_all()
