"""Lookup joins' SDK: a `LookupReader` a connector implements, and the options every lookup shares (the cache).

`sluice.lookup(df, format, options, on=...)` (docs/lookup.md) enriches each row of `df` with the rows a store holds
for its key, as Flink's lookup join does through a connector's `LookupTableSource`. A connector takes part by
declaring `lookup_spec` on its `SourceDataSource` (its connection options, what names the table, and
`LOOKUP_OPTIONS`) and implementing `lookup_reader()`: called once on the driver, it checks the table and the key
columns, resolves the rows' schema (typed as the store's batch read types them), and returns a `LookupReader`,
which is pickled to the Python workers. There its one job is `lookup(keys)`: the rows matching a table of distinct
keys, in bulk, the key columns included. The deduplication, the cache and the join back onto the DataFrame's rows
are sluice's (source/_lookup_join.py), the same for every store.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import StructType

from sluice._options import Option, TypedOptions

log = logging.getLogger("sluice.lookup")

RETRY_DELAY_CAP = 8.0  # seconds: the backoff stops doubling here, so lookup.max-retries bounds the wait

LOOKUP_OPTIONS = (
    Option("lookup.cache", "choice", "none", "Cache looked-up rows in each Python worker process, reused across "
           "micro-batches: none, or partial (Flink's PARTIAL: the rows of recently looked-up keys).",
           choices=("none", "partial")),
    Option("lookup.partial-cache.max-rows", "int", 10_000, "Rows the partial cache holds per worker process; the "
           "least recently used keys' rows are evicted beyond it (a key without rows counts as one).",
           minimum=1, maximum=100_000_000),
    Option("lookup.partial-cache.expire-after-write", "float", 0.0, "Seconds a cached key's rows are used for after "
           "they were read; 0 = until evicted.", minimum=0),
    Option("lookup.partial-cache.cache-missing-key", "bool", True, "Cache that a key has no rows too (its next "
           "lookups ask the store again only once it expires or is evicted)."),
)


def lookup_max_retries(retried: str) -> Option:
    """Flink's `lookup.max-retries`, one name for every store: how often a store's lookup request is sent again
    after a failure that can pass; `retried` says which failures and where to (a store's own words)."""
    return Option("lookup.max-retries", "int", 3, f"Times a lookup's request is sent again {retried} (backoff from "
                  "0.5 s, doubling, at most 8 s); then the task fails, naming the store and the table.", minimum=0,
                  maximum=100)


def lookup_retry_pause(described: str, keys: int, attempt: int, retries: int, error: BaseException) -> None:
    """Between a lookup request's failed `attempt` (0 for the first) and the next one: a warning on the
    `sluice.lookup` logger (a retry is otherwise invisible until the task fails), then the backoff of
    `lookup.max-retries`: 0.5 s, doubling, at most RETRY_DELAY_CAP. `described` is the reader's, with no secrets."""
    delay = min(0.5 * 2 ** attempt, RETRY_DELAY_CAP)
    log.warning("looking up %d key(s) in %s: attempt %d of %d failed (%s); trying again in %.1f s (lookup.max-retries)",
                keys, described, attempt + 1, retries + 1, error, delay)
    time.sleep(delay)


@dataclass(frozen=True)
class LookupCacheSettings(TypedOptions):
    """The cache options (LOOKUP_OPTIONS), typed once on the driver: `LookupCacheSettings.of(opts)`."""

    declared = LOOKUP_OPTIONS
    prefix = "lookup."

    cache: str
    partial_cache_max_rows: int
    partial_cache_expire_after_write: float
    partial_cache_cache_missing_key: bool

    @property
    def enabled(self) -> bool:
        return self.cache == "partial"


class LookupReader(ABC):
    """A store's bulk read by key for lookup joins: made on the driver by the data source's `lookup_reader()`,
    pickled to the Python workers, where each task calls `lookup` once per Arrow batch and `close` once at its end.

    `schema` is the rows' Spark schema (the key columns, named as `on` names them, and the looked-up columns), as
    the store's batch read types them; sluice derives the lookup's output schema from it once, on the driver."""

    @property
    @abstractmethod
    def schema(self) -> StructType:
        """The rows' schema: key columns and looked-up columns, typed as `spark.read.format(...)` types them."""

    @property
    @abstractmethod
    def described(self) -> str:
        """What is read, for messages: 'table public.users on postgresql://app@db:5432/shop' (no secrets)."""

    @abstractmethod
    def lookup(self, keys: pa.Table) -> pa.Table:
        """The rows matching `keys` (distinct, no nulls; its columns the key columns, typed as `schema` types them),
        read in bulk, in `schema`'s Arrow form (key columns included): several rows for a key that has several, none
        for a key the store lacks, in any order. A store that cannot answer raises (never returns no rows for it)."""

    def close(self, clean: bool) -> None:
        """The task is done with the reader (`clean`: it did not fail): release what `lookup` holds (a pooled
        connection goes back to its pool only when clean)."""

    def placement(self) -> KeyPlacement | None:
        """Where the DataFrame's rows are best looked up, asked once on the driver: None (the default) keeps the
        DataFrame's partitioning; a `KeyPlacement` makes sluice shuffle the rows by it before the lookup, so each
        task asks about keys one server holds (Cassandra's replicas, as the Spark Cassandra Connector's
        `repartitionByCassandraReplica` does)."""
        return None


class KeyPlacement(ABC):
    """A partitioning of the keys by the server that holds them, made on the driver (`LookupReader.placement`) and
    pickled to the Python workers, which call `assign` on each Arrow batch's distinct keys before the shuffle."""

    @property
    @abstractmethod
    def partitions(self) -> int:
        """How many partitions the DataFrame is shuffled into (each a task of the lookup)."""

    @abstractmethod
    def assign(self, keys: pa.Table) -> pa.Array:
        """Each key's partition, an int32 in [0, partitions) per row of `keys` (distinct, no nulls; its columns the
        key columns, typed as the reader's `schema` types them)."""


def arrow_rows(schema: StructType) -> pa.Schema:
    """The Arrow schema of a reader's rows (`LookupReader.schema`)."""
    from sluice.spark._compat import to_arrow_schema

    return to_arrow_schema(schema)
