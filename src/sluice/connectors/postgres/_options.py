"""The options of format("postgres"): declared once (parsing, ranges, did-you-mean, redaction and docs follow), and
parsed once on the driver into the typed `WriteOptions` and `ReadOptions` the rest of the connector reads."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.connector import (
    ERROR_OPTIONS,
    LOOKUP_OPTIONS,
    SINK_SPEC,
    UNORDERED,
    Option,
    OptionError,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    pushdown_option,
    schema_evolution_option,
    tracking_options,
    unchanged_column_option,
)
from sluice.connectors.postgres._client import CONNECTION_OPTIONS, Connection

MiB = 1024 * 1024

WRITE_OPTIONS = (
    Option("table", "str", None, "Target table, [schema.]name (quote odd names: '\"My Table\"').", required=True),
    Option("primary-key", "list", (), "Key columns: rows are upserted (INSERT ... ON CONFLICT) by this key."),
    Option("upsert.op-column", "str", None,
           "Column whose value d, delete, D or -D deletes the row with that key (needs primary-key); not written. "
           "'truncate' (postgres_changes) deletes every row, in order with the changes around it (sink.mode="
           "global-ordered; refused in the other modes)."),
    unchanged_column_option("the upsert keeps the table's value of each column a row names (or the value the "
                            "row's last earlier change in the same batch set)."),
    schema_evolution_option("ALTER TABLE ... ADD COLUMN IF NOT EXISTS, typed as create-table maps the Spark type, "
                            "committed before any row is written, or in the commit's transaction with "
                            "sink.transactional=true.",
                            full="also what a change capture source (postgres_changes) did to its table: a column "
                            "renamed there is renamed (RENAME COLUMN, its values kept), one dropped there is dropped, "
                            "and a type widened there (or a column the DataFrame carries wider) is widened (ALTER "
                            "COLUMN ... TYPE); the sink remembers which column holds which source column in "
                            "sluice_column_sources, a table of the target's schema."),
    Option("create-table", "bool", False, "Create a missing table from the DataFrame's schema (and primary-key)."),
    Option("connections-per-task", "int", 2, "Connections (concurrent batches) per Spark task.", minimum=1,
           maximum=64),
)


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("postgres") (WRITE_OPTIONS), parsed and checked once, one field per option."""

    declared = WRITE_OPTIONS

    table: str
    primary_key: tuple[str, ...]
    upsert_op_column: str | None
    upsert_unchanged_column: str | None
    schema_evolution: str
    create_table: bool
    connections_per_task: int


def _check_modes(opts: Options) -> None:
    if opts["primary-key"] and opts["sink.mode"] == UNORDERED and opts.is_set("sink.mode"):
        raise OptionError("primary-key with sink.mode=unordered: upserts of one key could overtake each other. Use "
                          "sink.mode=partition-ordered (the default with primary-key) or global-ordered.")


WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *WRITE_OPTIONS), (_check_modes,),
    # COPY pays a fixed cost per statement: large batches (bench/stores/postgres_write_read.py) amortize it.
    sink_batch_max_size=50_000, sink_requests_max_buffered=200_000, sink_flush_buffer_size=32 * MiB,
).renamed("postgres")


READ_OPTIONS = (
    Option("table", "str", None, "Table to read, [schema.]name (or use query)."),
    Option("query", "str", None, "A SELECT to read instead of a table; it runs as a subquery."),
    Option("partition-column", "str", None,
           "Integer, date or timestamp column whose min..max range is cut into splits; default: a one-column "
           "primary key of such a type, else (tables) heap page ranges."),
    Option("num-partitions", "int", 0, "Splits to cut; 0 = about one per 250,000 rows (table statistics), "
           "at most 64.", minimum=0, maximum=10_000),
    Option("consistent-snapshot", "bool", True,
           "All splits read one exported snapshot (one consistent picture); false = each split its own."),
    pushdown_option("the WHERE clause"),
    Option("snapshot.timeout-s", "int", 600,
           "The shared snapshot is released after this many seconds without a split finishing (or when the "
           "Spark driver exits); actions on the DataFrame after that fail: load it again.", minimum=5),
)


# readStream: a tracking-column stream (docs/tracking.md), typed by sluice.connector.TrackingSettings.
STREAM_OPTIONS = tracking_options(
    "an integer (smallint, integer, bigint: an identity or serial) or timestamp column; the primary key breaks "
    "ties. Index (column, primary key) so each micro-batch is one index range scan.")


def _check_source(opts: Options) -> None:
    if bool(opts["table"]) == bool(opts["query"]):
        raise OptionError("set exactly one of 'table' and 'query' for spark.read.format('postgres')")


# errors.*: a row with a value that does not convert to its column's Spark type fails the read, or goes to a
# dead-letter target (errors.tolerance=all).
READ_SPEC = OptionSpec("postgres", (*CONNECTION_OPTIONS, *READ_OPTIONS, *STREAM_OPTIONS, *ERROR_OPTIONS),
                       (_check_source, check_error_options))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("postgres") (READ_OPTIONS), parsed and checked once, one field per option;
    `conn`: the server (its repr hides the password)."""

    declared = READ_OPTIONS
    conn_from = Connection.from_options

    table: str | None
    query: str | None
    partition_column: str | None
    num_partitions: int
    consistent_snapshot: bool
    pushdown: bool
    snapshot_timeout_s: int
    conn: Connection


# sluice.lookup(df, "postgres", ...): the table looked up by key (docs/lookup.md), and the cache's options.
LOOKUP_SPEC = OptionSpec("postgres", (
    *CONNECTION_OPTIONS,
    Option("table", "str", None, "Table (or view) to look rows up in, [schema.]name.", required=True),
    lookup_max_concurrent_requests("Statements (= ANY of a batch's keys, each on its own pooled connection of the "
                                   "worker process)"),
    lookup_max_keys_per_request("statement (= ANY($1))"),
    *LOOKUP_OPTIONS,
))


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("postgres") besides the cache's; `conn`: the server (its repr hides the
    password)."""

    declared = tuple(LOOKUP_SPEC.get(name) for name in ("table", "lookup.max-concurrent-requests",
                                                         "lookup.max-keys-per-request"))
    conn_from = Connection.from_options

    table: str
    lookup_max_concurrent_requests: int
    lookup_max_keys_per_request: int
    conn: Connection
