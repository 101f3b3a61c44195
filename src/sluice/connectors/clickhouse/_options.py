"""The options of format("clickhouse"), declared once and typed once on the driver: the server and table
(_client.py's), how inserts are made (deduplication tokens, async inserts, deletes), how reads are split."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.connector import (
    ERROR_OPTIONS,
    LOOKUP_OPTIONS,
    SINK_SPEC,
    Option,
    OptionSpec,
    TypedOptions,
    check_error_options,
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    lookup_max_retries,
    schema_evolution_option,
    tracking_options,
    unchanged_column_option,
)
from sluice.connectors.clickhouse._client import CONNECTION_OPTIONS, Connection

MiB = 1024 * 1024

WRITE_OPTIONS = (
    Option("connections-per-task", "int", 2, "Concurrent INSERTs per Spark task.", minimum=1, maximum=32),
    Option("insert.deduplicate", "bool", False,
           "Exactly-once for retried tasks and replayed micro-batches through insert_deduplication_token: batches "
           "are cut at fixed row positions and each carries a token ClickHouse applies once. The table must "
           "deduplicate inserts (Replicated*/Shared* engines, or non_replicated_deduplication_window > 0)."),
    Option("insert.async", "bool", False,
           "ClickHouse's asynchronous inserts (async_insert=1, wait_for_async_insert=1): the server gathers many "
           "small inserts into one part, and acknowledges each once it is written. For many small batches."),
    Option("upsert.op-column", "str", None,
           "Column whose value d, delete, D or -D deletes the row's key; a ReplacingMergeTree(ver, is_deleted) "
           "table only. Not written."),
    schema_evolution_option("ALTER TABLE ... ADD COLUMN IF NOT EXISTS, Nullable where the Spark field is (ClickHouse "
                            "has no transaction: the column is added before any row of the write is sent)."),
    unchanged_column_option("a ClickHouse row replaces the whole row (ReplacingMergeTree), so a row that names a "
                            "column is refused, naming its key, before anything of its chunk is written."),
)


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("clickhouse") (WRITE_OPTIONS), parsed and checked once, one field per option."""

    declared = WRITE_OPTIONS

    connections_per_task: int
    insert_deduplicate: bool
    insert_async: bool
    upsert_op_column: str | None
    upsert_unchanged_column: str | None
    schema_evolution: str


# ClickHouse wants few, large inserts (each one is a part on disk that merges later): large batches by default.
WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *WRITE_OPTIONS),
    sink_batch_max_size=100_000, sink_requests_max_buffered=400_000, sink_flush_buffer_size=64 * MiB,
).renamed("clickhouse")


FINAL_OPTION = Option("final", "bool", None, "Read with FINAL (one row per key of a ReplacingMergeTree table); "
                      "default: true for ReplacingMergeTree tables, false otherwise.")

READ_OPTIONS = (
    Option("partitions", "int", 4, "Splits (Spark partitions) of a read, by ranges of the sorting key's first "
           "column; 1 when that column is not an integer, Date or DateTime.", minimum=1, maximum=10_000),
    FINAL_OPTION,
)


# readStream: a tracking-column stream (docs/tracking.md), typed by sluice.connector.TrackingSettings.
STREAM_OPTIONS = (
    *tracking_options("an integer or DateTime/DateTime64 column of the table whose values grow as rows are inserted "
                      "(e.g. DEFAULT now64(6)): ClickHouse keeps no commit order of its own."),
    Option("tracking.tie-breaker", "list", (),
           "readStream: columns that tell rows of one tracking value apart, so max-records-per-trigger can cut "
           "between them; none: a micro-batch takes every row of a tracking value."),
)

# errors.*: a row with a value that does not convert to the type the read's schema gives its column goes to the
# read's dead-letter target (errors.tolerance=all).
READ_SPEC = OptionSpec("clickhouse", (*CONNECTION_OPTIONS, *READ_OPTIONS, *STREAM_OPTIONS, *ERROR_OPTIONS),
                       (check_error_options,))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("clickhouse") (READ_OPTIONS), parsed and checked once, one field per option;
    `conn`: the server and table."""

    declared = READ_OPTIONS
    conn_from = Connection.from_options

    partitions: int
    final: bool | None
    conn: Connection


# sluice.lookup(df, "clickhouse", ...): the table looked up by key (docs/lookup.md), and the cache's options.
LOOKUP_SPEC = OptionSpec("clickhouse", (
    *CONNECTION_OPTIONS,
    FINAL_OPTION,
    lookup_max_retries("when the server cannot be reached or answers that it is overloaded"),
    lookup_max_concurrent_requests("Queries (IN on a batch's keys, over the worker process's pooled HTTP "
                                   "connections)"),
    lookup_max_keys_per_request("query (IN on the key)"),
    *LOOKUP_OPTIONS,
))


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("clickhouse") besides the cache's; `conn`: the server and table."""

    declared = (FINAL_OPTION, *(LOOKUP_SPEC.get(name) for name in ("lookup.max-retries",
                "lookup.max-concurrent-requests", "lookup.max-keys-per-request")))
    conn_from = Connection.from_options

    final: bool | None
    lookup_max_retries: int
    lookup_max_concurrent_requests: int
    lookup_max_keys_per_request: int
    conn: Connection
