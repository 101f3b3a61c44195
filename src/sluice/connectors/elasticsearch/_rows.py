"""With errors.tolerance=all, the row each bulk entry came from, so a refused document goes to the dead letters as the
user's columns (mapping.exclude, routing, version and op columns included), not as the JSON sent to the index.

A bulk entry stays the bytes the request is made of (the hot path is unchanged); beside it, the task's Arrow rows
(`ArrowRows`) and a map from each live entry object to its row number. The map is filled and emptied with C-level
`map`/`zip` over a chunk's entries, no Python step per row; without errors.tolerance=all nothing of this exists.
An entry is keyed by `id()`: the engine passes the same objects around (batches, retries) until they are
acknowledged or refused, when their key is dropped, so a key never outlives its entry.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pyarrow as pa

from sluice.connector import ArrowRows


class EntryRows:
    """A task's map from bulk entries to the Arrow rows they were encoded from. Thread-safe: the task thread adds,
    the store's threads release and take."""

    def __init__(self) -> None:
        self._rows = ArrowRows()
        self._numbers: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, batch: pa.RecordBatch, entries: Sequence[bytes]) -> None:
        """`entries` encoded from `batch`, one per row, in order."""
        numbers, _ = self._rows.add(batch)
        with self._lock:
            self._numbers.update(zip(map(id, entries), numbers, strict=True))

    def _pop(self, entries: Sequence[bytes]) -> list[int]:
        with self._lock:
            return list(map(self._numbers.pop, map(id, entries)))

    def release(self, entries: Sequence[bytes]) -> None:
        """Entries the index stored (or skipped as stale): their rows are no longer needed."""
        if entries:
            self._rows.release(self._pop(entries))

    def take(self, entries: Sequence[bytes]) -> pa.Table:
        """The rows of refused entries, in entry order, forgotten as they are handed over."""
        return self._rows.take(self._pop(entries))
