"""Request buffers (FLIP-509's RequestBuffer): where entries wait between write() and a batch.

Entries are stored in chunks (a sequence of entries plus one of their sizes) so that cutting a batch of
1000 entries costs a few C-level list operations instead of 1000 Python-level polls. Entries are a list, or a
`range` (row numbers, as `ArrowRows` gives them); sizes a list of ints or a numpy integer array. A range and an array
are sliced and summed without a Python step per entry: a store whose entries stay in Arrow pays the engine per batch,
not per row. The per-entry API (add/poll/peek) is still there for stores and batch creators that want it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import InitVar, dataclass, field
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any, TypeAlias, cast

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

# Byte sizes, row numbers or group codes: a list of ints, or a numpy integer array an encoder made for a whole batch.
Ints: TypeAlias = "Sequence[int] | NDArray[np.integer]"


def total_bytes(sizes: Ints) -> int:
    """The sum of entries' sizes, as an int: a list's summed in C, an array's vectorized."""
    if type(sizes) is list:
        return sum(sizes)
    vectorized = getattr(sizes, "sum", None)
    return int(vectorized()) if vectorized is not None else sum(sizes)


def sizes_from_running(running: Ints) -> NDArray[np.integer]:
    """Each entry's size from the sizes' running sums (entry i's: the bytes of entries 0 to i), in one pass: for what
    needs each entry's size (a chunk in the buffer, a batch handed to `submit`) when the caller handed only the sums."""
    import numpy as np

    sums = np.asarray(running)
    sizes = np.empty_like(sums)
    sizes[:1] = sums[:1]
    np.subtract(sums[1:], sums[:-1], out=sizes[1:])  # one pass, as an encoder's offsets[1:] - offsets[:-1]
    return sizes


def running_array(running: Ints) -> NDArray[np.integer]:
    """Running sums as a numpy array (a memoryview's without a copy), for a chunk's searches and lookups."""
    import numpy as np

    return np.asarray(running)


def largest_size(sizes: Ints) -> int:
    vectorized = getattr(sizes, "max", None) if type(sizes) is not list else None
    return int(vectorized()) if vectorized is not None else max(sizes)


def _joined(pieces: list[Any]) -> Any:
    """One sequence of the pieces a batch took from several chunks: consecutive ranges stay a range, arrays are
    concatenated, anything else becomes a list. (Any: entries or sizes, each of the kind its pieces are.)"""
    if len(pieces) == 1:
        return pieces[0]
    kinds = {type(piece) for piece in pieces}
    if kinds == {range} and all(a.step == b.step == 1 and a.stop == b.start for a, b in pairwise(pieces)):
        return range(pieces[0].start, pieces[-1].stop)
    if len(kinds) == 1 and hasattr(pieces[0], "dtype"):
        import numpy as np

        return np.concatenate(pieces)
    out: list[Any] = []
    for piece in pieces:
        out.extend(piece)
    return out


@dataclass
class Chunk:
    """Entries that entered the buffer together, all with one partition key and retry state."""

    entries: Sequence[Any]  # a list or a range (see the module's docstring)
    sizes: Ints
    key: Hashable = None
    attempt: int = 0  # how many times these entries were already submitted and failed
    ready_at: float = 0.0  # monotonic time before which the chunk must not be sent (retry backoff)
    start: int = 0  # entries before `start` were already taken
    # Half of a batch the store refused for one of its records (errors.tolerance=all): sent as a batch of its own,
    # never merged with its other half or other entries, so that the search for the record narrows.
    split: bool = False
    # The sizes' running sums when the caller has them (a string column's Arrow offsets): `_sums` below, made by
    # no pass over the sizes.
    running: InitVar[Ints | None] = None
    left_bytes: int = field(init=False, repr=False)  # the bytes of the entries not taken yet
    # Sizes as an array: their running sums, made when a batch is first cut inside the chunk (`_running`), so a batch's
    # bytes are two lookups. Not at once: numpy's integer cumsum is ~10x its sum (21 against 2 us for a Spark Arrow
    # batch's 10,000 sizes), and a chunk cut in whole batches (`full_run`) never needs them.
    _sums: Any = field(init=False, repr=False)
    _array: bool = field(init=False, repr=False)  # sizes is a numpy array (not a list), and not empty

    def __post_init__(self, running: Ints | None) -> None:
        self._array = type(self.sizes) is not list and len(self.sizes) > 0
        self._sums = running if self._array else None
        if self._sums is not None:
            self.left_bytes = int(self._sums[-1]) - self._before(self.start)
        else:
            self.left_bytes = total_bytes(self.sizes[self.start:] if self.start else self.sizes)

    def __len__(self) -> int:
        return len(self.entries) - self.start

    def _running(self) -> NDArray[np.integer]:
        sums: NDArray[np.integer] = self._sums if self._sums is not None else \
            cast("NDArray[np.integer]", self.sizes).cumsum()
        self._sums = sums
        return sums

    def _before(self, index: int) -> int:
        return int(self._running()[index - 1]) if index else 0

    def bytes_of(self, start: int, end: int) -> int:
        """The bytes of entries [start, end)."""
        if not self._array:
            return sum(self.sizes[start:end])
        return int(self._running()[end - 1]) - self._before(start) if end > start else 0

    def fitting(self, start: int, end: int, room: int) -> tuple[int, int]:
        """How many entries from `start` (up to `end`) fit in `room` bytes, and their bytes."""
        if not self._array:
            sums = list(accumulate(self.sizes[start:end], initial=0))
            n = bisect_right(sums, room) - 1
            return n, sums[n]
        base = self._before(start)
        n = int(self._running()[start:end].searchsorted(base + room, side="right"))
        return n, self.bytes_of(start, start + n)


@dataclass
class Taken:
    entries: Sequence[Any]
    sizes: Ints
    size_bytes: int
    attempt: int
    split: bool = False


class RequestBuffer(ABC):
    """Holds buffered entries. Only the sink's buffer-manager thread touches it: no locking needed."""

    @abstractmethod
    def add_chunk(self, chunk: Chunk, prioritize: bool = False) -> None:
        """Add a chunk at the tail, or at the head when `prioritize` (failed entries being retried)."""

    @abstractmethod
    def take(self, max_records: int, max_bytes: int, now: float, key: Hashable = None) -> Taken | None:
        """Remove up to max_records entries (and max_bytes, but always at least one) from the head."""

    @abstractmethod
    def size(self) -> int: ...

    @abstractmethod
    def total_size_bytes(self) -> int: ...

    @abstractmethod
    def buffered_state(self) -> list[tuple[Any, int]]:
        """Every buffered (entry, size) in send order: what a checkpoint would snapshot."""

    def head_ready_at(self) -> float:
        """Monotonic time before which the head entry must not be sent (a retry's backoff); 0.0: any time. A
        buffer without one order of all entries (keyed) has no head: 0.0."""
        return 0.0

    def add(self, entry: Any, size: int, prioritize: bool = False, key: Hashable = None) -> None:
        self.add_chunk(Chunk([entry], [size], key), prioritize)

    def poll(self) -> tuple[Any, int] | None:
        taken = self.take(1, 1 << 62, float("inf"))
        return (taken.entries[0], taken.sizes[0]) if taken else None

    def peek(self) -> tuple[Any, int] | None:
        state = self.buffered_state()
        return state[0] if state else None

    def is_empty(self) -> bool:
        return self.size() == 0

    def __len__(self) -> int:
        return self.size()


class _ChunkBuffer(RequestBuffer):
    """sluice's buffers: they count entries and bytes as chunks come and go, and hold chunks in send order."""

    def __init__(self) -> None:
        self._count = 0
        self._bytes = 0

    def _chunks_in_order(self) -> Iterator[Chunk]:
        raise NotImplementedError

    def size(self) -> int:
        return self._count

    def total_size_bytes(self) -> int:
        return self._bytes

    def buffered_state(self) -> list[tuple[Any, int]]:
        out: list[tuple[Any, int]] = []
        for chunk in self._chunks_in_order():
            out.extend(zip(chunk.entries[chunk.start:], chunk.sizes[chunk.start:], strict=True))
        return out


_LOOKED_UP = 32  # full_run: the most batches whose bytes it sums at once


class DequeRequestBuffer(_ChunkBuffer):
    """FIFO buffer: the default, for unordered and globally ordered sinks."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: deque[Chunk] = deque()

    def _chunks_in_order(self) -> Iterator[Chunk]:
        return iter(self._chunks)

    def add_chunk(self, chunk: Chunk, prioritize: bool = False) -> None:
        if not len(chunk):
            return
        if prioritize:
            self._chunks.appendleft(chunk)
        else:
            self._chunks.append(chunk)
        self._count += len(chunk)
        self._bytes += chunk.left_bytes

    def head_ready_at(self) -> float:
        return self._chunks[0].ready_at if self._chunks else 0.0

    def has_delayed(self) -> bool:
        """Whether a chunk waits for a retry backoff. Only retried chunks have one, and they enter at the head."""
        return bool(self._chunks) and self._chunks[0].ready_at != 0.0

    def peek(self) -> tuple[Any, int] | None:
        if not self._chunks:
            return None
        head = self._chunks[0]
        return head.entries[head.start], int(head.sizes[head.start])

    def take(self, max_records: int, max_bytes: int, now: float, key: Hashable = None) -> Taken | None:
        if not self._chunks or self._chunks[0].ready_at > now:
            return None
        entry_pieces: list[Sequence[Any]] = []
        size_pieces: list[Ints] = []
        count = total = attempt = 0
        split = False
        while self._chunks and count < max_records:
            chunk = self._chunks[0]
            if chunk.ready_at > now or (count and (chunk.attempt != attempt or chunk.split or split)):
                break  # a batch never mixes retried entries with fresh ones (retries are counted exactly) nor a split
            attempt, split = chunk.attempt, chunk.split
            start = chunk.start
            stop = min(len(chunk.entries), start + max_records - count)
            whole = not start and stop == len(chunk.entries)
            window_bytes = chunk.left_bytes if stop == len(chunk.entries) else chunk.bytes_of(start, stop)
            if total + window_bytes <= max_bytes:  # the usual case: the whole window fits, no per-entry pass
                end, taken_bytes = stop, window_bytes
            else:
                n, taken_bytes = chunk.fitting(start, stop, max_bytes - total)
                if n == 0 and not count:
                    n, taken_bytes = 1, int(chunk.sizes[start])  # an entry larger than max_bytes still goes, alone
                if n == 0:
                    break
                end, whole = start + n, False
            # A chunk taken whole is handed over as it is (no copy of its lists); a range or an array slices in O(1).
            entry_pieces.append(chunk.entries if whole else chunk.entries[start:end])
            size_pieces.append(chunk.sizes if whole else chunk.sizes[start:end])
            count += end - start
            total += taken_bytes
            chunk.start = end
            chunk.left_bytes -= taken_bytes
            if not len(chunk):
                self._chunks.popleft()
            if end < stop:
                break  # stopped by max_bytes
        if not count:
            return None
        self._count -= count
        self._bytes -= total
        return Taken(_joined(entry_pieces), _joined(size_pieces), total, attempt, split)

    def full_run(self, max_records: int, max_bytes: int, now: float) -> tuple[Chunk, list[int]] | None:
        """The head chunk and the bytes of its next batches of exactly `max_records` fresh entries (at most
        _LOOKED_UP of them), each what `take(max_records, max_bytes, now)` would cut, from the chunk's `start` on;
        None where `take` would cut differently (a batch across chunks, over `max_bytes`, retried entries or a split):
        `take` cuts those. Nothing is taken: the caller cuts the batches it sends and gives back how many
        (`take_run`), so that it can stop after any one with the buffer as `take` would have left it."""
        if not self._chunks:
            return None
        chunk = self._chunks[0]
        if chunk.ready_at > now or chunk.attempt or chunk.split:
            return None
        sizes, start = chunk.sizes, chunk.start
        count = min(_LOOKED_UP, (len(chunk.entries) - start) // max_records)
        if not count:
            return None
        last = start + count * max_records
        if not chunk._array:
            run = [sum(sizes[s:s + max_records]) for s in range(start, last, max_records)]
        elif count == 1 and last == len(chunk.entries):
            run = [chunk.left_bytes]  # the chunk is one batch: its bytes are known
        elif chunk._sums is not None:
            ends = chunk._sums[start + max_records - 1:last:max_records].tolist()
            run = [end - before for before, end in zip([chunk._before(start), *ends], ends, strict=False)]
        else:  # each batch's bytes in one pass over a (batches, max_records) view, no running sum of every entry
            run = cast("NDArray[np.integer]", sizes)[start:last].reshape(count, max_records).sum(axis=1).tolist()
        for n, taken_bytes in enumerate(run):
            if taken_bytes > max_bytes:
                return (chunk, run[:n]) if n else None
        return chunk, run

    def take_run(self, batches: int, max_records: int, taken_bytes: int) -> None:
        """Take the first `batches` batches of the last `full_run` (their bytes summed: `taken_bytes`)."""
        if not batches:
            return
        chunk = self._chunks[0]
        chunk.start += batches * max_records
        chunk.left_bytes -= taken_bytes
        self._count -= batches * max_records
        self._bytes -= taken_bytes
        if chunk.start == len(chunk.entries):
            self._chunks.popleft()


class KeyedRequestBuffer(_ChunkBuffer):
    """Partition key -> FIFO list, for partition-ordered sinks (the sink-modes design, 3b).

    Keys are indexed by how many entries they hold, so that the fullest key is found without looking at every
    buffered key: a write routed over 20,000 Cassandra partitions or S2 streams cuts each batch in time
    proportional to the keys it skips (busy or backing off), not to the keys buffered.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lists: dict[Hashable, DequeRequestBuffer] = {}
        self._by_size: dict[int, dict[Hashable, None]] = {}  # entries held -> keys, in the order they got there
        self._sizes: list[int] = []  # the keys of _by_size, ascending
        self._delayed: set[Hashable] = set()  # keys holding entries in a retry backoff

    def _chunks_in_order(self) -> Iterator[Chunk]:
        for sub in self._lists.values():
            yield from sub._chunks_in_order()

    def _move(self, key: Hashable, old: int, new: int) -> None:
        if old == new:
            return
        if old:
            bucket = self._by_size[old]
            del bucket[key]
            if not bucket:
                del self._by_size[old]
                del self._sizes[bisect_left(self._sizes, old)]
        if new:
            found = self._by_size.get(new)
            if found is None:
                found = self._by_size[new] = {}
                insort(self._sizes, new)
            found[key] = None

    def add_chunk(self, chunk: Chunk, prioritize: bool = False) -> None:
        if not len(chunk):
            return
        sub = self._lists.get(chunk.key)
        if sub is None:
            sub = self._lists[chunk.key] = DequeRequestBuffer()
        before, before_bytes = sub.size(), sub.total_size_bytes()
        sub.add_chunk(chunk, prioritize)
        self._move(chunk.key, before, sub.size())
        if chunk.ready_at:
            self._delayed.add(chunk.key)
        self._count += len(chunk)
        self._bytes += sub.total_size_bytes() - before_bytes

    def partition_keys(self) -> Sequence[Hashable]:
        """Keys that have buffered entries, oldest first."""
        return list(self._lists)

    def fullest_keys(self) -> Iterator[Hashable]:
        """Keys with buffered entries, the most entries first (equal counts: the first to reach it first).

        Lazy: a caller stops at the first key it can use. Do not change the buffer while iterating."""
        for size in reversed(self._sizes):
            yield from self._by_size[size]

    def delayed_keys(self) -> Sequence[Hashable]:
        """Keys with entries in a retry backoff: the only ones whose `key_ready_at` can lie in the future."""
        return list(self._delayed)

    def key_ready_at(self, key: Hashable) -> float:
        return self._lists[key].head_ready_at()

    def key_size(self, key: Hashable) -> int:
        sub = self._lists.get(key)
        return sub.size() if sub else 0

    def key_size_bytes(self, key: Hashable) -> int:
        sub = self._lists.get(key)
        return sub.total_size_bytes() if sub else 0

    def take(self, max_records: int, max_bytes: int, now: float, key: Hashable = None) -> Taken | None:
        sub = self._lists.get(key)
        if sub is None:
            return None
        before = sub.size()
        taken = sub.take(max_records, max_bytes, now)
        if taken:
            self._count -= len(taken.entries)
            self._bytes -= taken.size_bytes
            self._move(key, before, sub.size())
            if not sub.size():
                # Re-inserting later puts the key at the end: keys are served round-robin.
                del self._lists[key]
            if key in self._delayed and not sub.has_delayed():
                self._delayed.discard(key)
        return taken
