"""The partial cache of lookup joins (Flink's `lookup.cache = PARTIAL`): the rows of recently looked-up keys, kept
in each Python worker process and reused by every task that process serves, micro-batch after micro-batch.

Spark reuses its Python workers between tasks (`spark.python.worker.reuse`, on by default): a worker process
serves task after task of the same executor, so its cache outlives a micro-batch. Nothing more is promised: an
executor may start new workers (more tasks at once than idle workers, a worker that died, an executor lost), and
each starts with an empty cache; two workers never share one. The cache is an optimization, never a source of rows
a store would not give: a key's rows are what one lookup read, used until `expire-after-write` passes or the key
is evicted.

One cache per planned lookup (`cache_for(lookup_id)`): two lookups in one job never see each other's rows. Bounded
by rows (`max-rows`), least recently used keys first out. Counted: hits, misses, evictions (by size or expiry).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import pyarrow as pa

from sluice.source._lookup import LookupCacheSettings


@dataclass(frozen=True)
class CacheStats:
    """What a cache counted since its process started it."""

    hits: int
    misses: int
    evictions: int
    rows: int  # rows held now
    keys: int  # keys held now


class LookupCache:
    """Keys -> their rows (an Arrow table of 0 or more rows); see the module's docstring."""

    def __init__(self, settings: LookupCacheSettings) -> None:
        self.max_rows = settings.partial_cache_max_rows
        self.ttl_s = settings.partial_cache_expire_after_write
        self.cache_missing = settings.partial_cache_cache_missing_key
        self._entries: OrderedDict[Hashable, tuple[pa.Table, float]] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    @staticmethod
    def _weight(rows: pa.Table) -> int:
        return max(1, rows.num_rows)  # a key without rows takes a place too

    def get_many(self, keys: Iterable[Hashable]) -> tuple[list[pa.Table], list[int]]:
        """(the cached rows of the keys found, the positions in `keys` of those not found or expired)."""
        found: list[pa.Table] = []
        missing: list[int] = []
        now = time.monotonic()
        with self._lock:
            for position, key in enumerate(keys):
                entry = self._entries.get(key)
                if entry is not None and self.ttl_s and now - entry[1] > self.ttl_s:
                    self._drop(key)
                    entry = None
                if entry is None:
                    missing.append(position)
                    continue
                self._entries.move_to_end(key)
                found.append(entry[0])
            self.hits += len(found)
            self.misses += len(missing)
        return found, missing

    def put_many(self, items: Iterable[tuple[Hashable, pa.Table]]) -> None:
        """Keep each key's rows (a key with an empty table: only with cache-missing-key), evicting the least
        recently used beyond max-rows."""
        now = time.monotonic()
        with self._lock:
            for key, rows in items:
                if rows.num_rows == 0 and not self.cache_missing:
                    continue
                if key in self._entries:
                    self._drop(key, evicted=False)
                self._entries[key] = (rows, now)
                self._rows += self._weight(rows)
            while self._rows > self.max_rows and self._entries:
                self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable, evicted: bool = True) -> None:
        rows, _ = self._entries.pop(key)
        self._rows -= self._weight(rows)
        self.evictions += evicted

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self.hits, self.misses, self.evictions, self._rows, len(self._entries))


_CACHES: dict[str, LookupCache] = {}
_CACHES_LOCK = threading.Lock()


def cache_for(lookup_id: str, settings: LookupCacheSettings) -> LookupCache | None:
    """The cache of the lookup `lookup_id` in this process (made on first use), or None with lookup.cache=none."""
    if not settings.enabled:
        return None
    with _CACHES_LOCK:
        cache = _CACHES.get(lookup_id)
        if cache is None:
            cache = _CACHES[lookup_id] = LookupCache(settings)
        return cache


def cache_stats(lookup_id: str) -> CacheStats | None:
    """This process's counts for the lookup `lookup_id`, None when it has no cache here."""
    with _CACHES_LOCK:
        cache = _CACHES.get(lookup_id)
    return cache.stats() if cache is not None else None
