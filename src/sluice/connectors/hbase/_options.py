"""The options of format("hbase"), declared once and typed once on the driver: the Thrift2 gateway and table
(_client.py's), the columns' cells (_catalog.py's), the puts' timestamps and durability, how region scans are
split and fetched."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sluice.connector import (
    ERROR_OPTIONS,
    PARTITION_ORDERED,
    SINK_SPEC,
    Option,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    lookup_max_retries,
    pushdown_option,
    tracking_options,
)
from sluice.connector import LOOKUP_OPTIONS as SDK_LOOKUP_OPTIONS
from sluice.connectors.hbase._catalog import CATALOG_OPTIONS
from sluice.connectors.hbase._client import CONNECTION_OPTIONS

DURABILITY = {"default": 0, "skip-wal": 1, "async-wal": 2, "sync-wal": 3, "fsync-wal": 4}  # TDurability

WRITE_OPTIONS = (
    Option("write.timestamp", "choice", "client",
           "Where cell timestamps (ms) come from: client (the executor's clock when the row is encoded; a later "
           "change of the same key in a task one step later) or micro-batch (streaming: the batch id and the "
           "row's position, so a replayed batch never overwrites a later one's cells; not wall-clock times). "
           "docs/hbase.md.", choices=("client", "micro-batch")),
    Option("write.replay-guard", "bool", True,
           "Streaming: keep the last micro-batch committed per query in write.replay-guard-table, and write nothing "
           "for an older one replayed (a restart from an older checkpoint copy), so a replay never brings back a "
           "row a later micro-batch deleted, however long ago (a delete marker lasts until a major compaction). "
           "docs/hbase.md."),
    Option("write.replay-guard-table", "str", "sluice_replay_guard",
           "The table of write.replay-guard's markers (namespace:name; created at the first commit if missing): a "
           "row per query and target table."),
    Option("write.timestamp-column", "str", None,
           "Column holding each row's cell timestamp (long milliseconds since the epoch, or a timestamp). Not "
           "written."),
    Option("write.null-cells", "choice", "skip",
           "A null value: skip writes no cell (a stored one stays); delete deletes the stored cell (every version "
           "at or below the row's timestamp), so the row holds what the DataFrame row holds.",
           choices=("skip", "delete")),
    Option("upsert.op-column", "str", None,
           "Column whose value d, delete, D or -D deletes the row (every cell at or below the row's timestamp). "
           "Not written."),
    Option("write.durability", "choice", "default", "The puts' and deletes' write-ahead-log durability (HBase's "
           "Durability); default: the table's.", choices=tuple(DURABILITY)),
    Option("write.max-cell-bytes", "int", 10_485_760,
           "Largest cell value sent: a larger one fails the write naming its row key and column, before it is "
           "sent (the server's hbase.server.keyvalue.maxsize, 10 MiB by default).", minimum=1),
)


WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *CATALOG_OPTIONS, *WRITE_OPTIONS),
    sink_mode=PARTITION_ORDERED, sink_batch_max_size=1000, sink_flush_buffer_size=4 << 20,
    sink_requests_max_inflight=16,
).renamed("hbase")


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("hbase") (WRITE_OPTIONS), parsed and checked once, one field per option."""

    declared = WRITE_OPTIONS

    write_timestamp: str
    write_replay_guard: bool
    write_replay_guard_table: str
    write_timestamp_column: str | None
    write_null_cells: str
    upsert_op_column: str | None
    write_durability: str
    write_max_cell_bytes: int


READ_OPTIONS = (
    Option("read.splits-per-region", "int", 1, "Splits (Spark partitions) per region: its key range cut into "
           "this many equal byte ranges.", minimum=1, maximum=1024),
    Option("read.rows-per-fetch", "int", 1000, "Rows per scanner call (and the scan's caching).", minimum=1,
           maximum=1_000_000),
    Option("read.time-range", "list", (), "min,max: only cells with min <= timestamp < max (milliseconds), e.g. "
           "'0,1767225600000' to read the table as of a moment."),
    Option("read.versions", "int", 1, "Versions of each row to read, newest first: above 1, a row per cell "
           "timestamp holding the cells written at it (needs read.timestamp-column; the families must keep that "
           "many versions).", minimum=1, maximum=10_000),
    Option("read.timestamp-column", "str", None, "A column of the read's schema (long: milliseconds, or "
           "timestamp) that gets the row's cell timestamp: its newest cell's, or the version's."),
    pushdown_option("the scans' key range (filters on the row key's first column)"),
)


# readStream: rows found by their cell timestamps (_tracking.py, docs/hbase.md), typed by TrackingSettings. A range is
# read in one task per region already; cutting it further costs a keys-only scan of it on the driver: off by default.
STREAM_OPTIONS = tuple(
    replace(o, default=0, meaning="readStream: a micro-batch's range is read by one task per region, each cut into "
            "tasks of about this many rows (found by a keys-only scan of the range on the driver); 0: one task per "
            "region.") if o.name == "tracking.rows-per-task" else o
    for o in tracking_options("on HBase, the read schema's column (long: milliseconds, or timestamp) that gets each "
                              "row's newest cell timestamp, the tracking value (docs/hbase.md)"))
BATCH_ONLY = ("read.splits-per-region", "read.time-range", "read.versions", "read.timestamp-column", "pushdown")

# errors.*: rows whose key or cells do not decode go to a dead-letter target (errors.tolerance=all).
READ_SPEC = OptionSpec("hbase", (*CONNECTION_OPTIONS, *CATALOG_OPTIONS, *READ_OPTIONS, *STREAM_OPTIONS,
                                 *ERROR_OPTIONS), (check_error_options,))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("hbase") (READ_OPTIONS), parsed and checked once, one field per option; `rowkey`:
    the row key's columns (CATALOG_OPTIONS), which the timestamp column may not be."""

    declared = READ_OPTIONS

    read_splits_per_region: int
    read_rows_per_fetch: int
    read_time_range: tuple[str, ...]
    read_versions: int
    read_timestamp_column: str | None
    pushdown: bool
    rowkey: tuple[str, ...]

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"rowkey": opts["rowkey"]}


# sluice.lookup(df, "hbase", ...): rows by row key (docs/lookup.md), the cache's options too. HBase cells are bytes,
# so the columns' types come from `schema`, as a batch read's come from .schema(...).
LOOKUP_OPTIONS = (
    Option("schema", "str", None, "The row key's columns and the looked-up columns with their Spark types, as "
           ".schema(...) gives a batch read (Spark DDL), e.g. 'region string, id long, amount double, note string'; "
           "the catalog options (rowkey, family, columns) place them.", required=True),
    lookup_max_retries("after a failure that passes (no answer from the Thrift2 gateway, a region moving or busy, "
                       "a region server restarting): the request's getMultiple"),
    lookup_max_concurrent_requests("getMultiple calls (one per region holding a batch's keys, each on a Thrift2 "
                                   "connection of its own to the gateway)"),
    lookup_max_keys_per_request("getMultiple (a region's keys beyond it go in several)"),
    Option("lookup.repartition-by-region", "bool", False, "Shuffle the DataFrame by the region that holds each row "
           "key (the table's region boundaries, read once on the driver) before the lookup, so each task's "
           "getMultiple asks one region server, as lookup.repartition-by-replica does for Cassandra. Costs a "
           "shuffle."),
    Option("lookup.partitions-per-server", "int", 10, "With lookup.repartition-by-region: partitions (tasks) per "
           "region server holding regions of the table; a server's regions are dealt to them in key order, one "
           "region each when it has no more regions than this.", minimum=1, maximum=10_000),
)
LOOKUP_SPEC = OptionSpec("hbase", (*CONNECTION_OPTIONS, *CATALOG_OPTIONS, *LOOKUP_OPTIONS, *SDK_LOOKUP_OPTIONS))


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("hbase") besides the cache's and the catalog's (Catalog.from_options)."""

    declared = LOOKUP_OPTIONS

    schema: str
    lookup_max_retries: int
    lookup_max_concurrent_requests: int
    lookup_max_keys_per_request: int
    lookup_repartition_by_region: bool
    lookup_partitions_per_server: int
