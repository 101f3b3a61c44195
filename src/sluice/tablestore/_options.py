"""The table store's options: one declaration each, for writes and reads, parsed once on the driver into the typed
`WriteOptions` and `ReadOptions` the rest of the format reads.

The warehouse and storage.* options are no field: `Warehouse.resolve` reads them at the parse boundary (where the
table is opened), and the `Warehouse` it returns travels inside the `StoreTable`, its credentials out of every repr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.connector import (
    ERROR_OPTIONS,
    Option,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
    schema_evolution_option,
    unchanged_column_option,
)
from sluice.connector import LOOKUP_OPTIONS as SDK_LOOKUP_OPTIONS
from sluice.tablestore._commit import Upkeep

TABLE = Option("table", "str", None, "Table name (letters, digits, '_').", required=True)
META = Option("meta", "str", None, "MetaService database (SQLite path or postgresql:// URL); default $SLUICE_META, "
              "else .sluice/meta.db.", secret=True)
WAREHOUSE = (
    Option("warehouse", "str", None, "Where the tables live: a folder (local or shared), file:///folder or "
           "s3://bucket/prefix; default $SLUICE_WAREHOUSE, else .sluice/warehouse."),
    Option("storage.endpoint", "str", None, "s3:// warehouses: the S3 endpoint URL (an S3-compatible server); "
           "default $AWS_ENDPOINT_URL, else AWS S3."),
    Option("storage.region", "str", None, "s3:// warehouses: the bucket's region; default $AWS_REGION, else the "
           "bucket's own for data files and us-east-1 for the Delta log (set it for a bucket elsewhere)."),
    Option("storage.access-key-id", "str", None, "s3:// warehouses: access key id; default $AWS_ACCESS_KEY_ID, else "
           "the machine's default AWS credentials."),
    Option("storage.secret-access-key", "str", None, "s3:// warehouses: secret access key; default "
           "$AWS_SECRET_ACCESS_KEY.", secret=True),
    Option("storage.session-token", "str", None, "s3:// warehouses: session token of temporary credentials; "
           "default $AWS_SESSION_TOKEN.", secret=True),
    Option("storage.allow-http", "bool", None, "s3:// warehouses: allow a plain http:// endpoint; default true "
           "when storage.endpoint is http://."),
)
COMMON = (TABLE, *WAREHOUSE, META)
WRITE_OPTIONS = (
    Option("primary-key", "list", (), "Key columns: writes are upserts (merge) by this key; set when the table is "
           "created."),
    Option("upsert.op-column", "str", None, "Column whose value d, delete, D or -D deletes the key (not stored); "
           "'truncate' (postgres_changes) deletes every row, in the same Delta version as the changes after it."),
    unchanged_column_option("the merge keeps the table's value of each column a row names (the row's last earlier "
                            "change in the same commit that set it, if any)."),
    schema_evolution_option("The Delta schema change is in the same version as the first rows that carry it (the "
                            "commit of their write or micro-batch)."),
    Option("job", "str", "batch", "Name of the writing job in commits (app transaction id) for batch writes; "
           "streaming writes use the query id."),
    Option("writer-lease", "int", 600, "Seconds a streaming query that did not register_job stays the table's "
           "only writer after its last commit (a registered job is the writer until it ends); another writer is "
           "refused until then.", minimum=0),
    Option("checkpoint-interval", "int", 10, "A Delta checkpoint every this many versions, so opening the table "
           "reads a checkpoint and at most this many log entries, not the whole log.", minimum=1),
    Option("auto-compact", "bool", True, "Compact the table from the sink: after a commit that leaves "
           "compact-min-files small files, they are rewritten into few large ones (a data-neutral version)."),
    Option("compact-min-files", "int", 20, "Files smaller than compact-target-bytes that trigger a compaction "
           "(each is a request when the table is read from object storage).", minimum=2),
    Option("compact-target-bytes", "int", 128 * 1024 * 1024, "Size of the files a compaction writes; smaller files "
           "count as small.", minimum=1024),
    Option("log-retention-versions", "int", 100, "When the sink compacts, and every this many versions, it cleans "
           "the table (removed files by Delta's vacuum, the Delta log trimmed): it keeps the last this many versions "
           "(version and barrier reads of them work) and every version a consistent read may open. Every "
           "checkpoint-interval versions, the MetaService forgets the barriers of older versions (but those a "
           "consistent read may open).", minimum=1),
    Option("write-id", "str", None, "Batch writes: an id of your choosing for this write; re-running it with the "
           "same id (after a failure, or when unsure it committed) commits it once: it keeps its barrier, and a "
           "commit that landed is not repeated."),
)
READ_OPTIONS = (
    Option("version", "int", None, "Read this Delta version.", minimum=0),
    Option("barrier", "int", None, "Read the version that completed this barrier.", minimum=0),
    Option("consistent-with", "list", (),
           "Other tables: read this one at the newest barrier it and they all completed."),
    Option("aligned-with", "list", (), "Streaming: the job's other table-store inputs; every micro-batch "
           "advances all of them to the same barrier (set it on each of those sources too)."),
    Option("max-partition-bytes", "int", 128 * 1024 * 1024, "Batch reads: data files are grouped into Spark "
           "partitions of about this many bytes (a larger file is a partition alone).", minimum=1),
    Option("changes", "bool", False, "Add the change columns _change_type and _commit_version (Delta's change "
           "data feed); needed to stream an upsert table."),
)
# The sink's engine settings are fixed (SINK_CONFIG), but what a refused row does is the user's: errors.*.
WRITE_SPEC = OptionSpec("tablestore", (*COMMON, *WRITE_OPTIONS, *ERROR_OPTIONS), (check_error_options,))
READ_SPEC = OptionSpec("tablestore", (*COMMON, *READ_OPTIONS))
# sluice.lookup(df, "tablestore", ...): rows by key from one version (docs/lookup.md), the cache's options too.
LOOKUP_VERSION = Option("lookup.version", "int", None, "Look rows up in this Delta version of the table; default: "
                        "the version of its latest completed barrier, as each task finds it when it starts.",
                        minimum=0)
LOOKUP_SPEC = OptionSpec("tablestore", (*COMMON, LOOKUP_VERSION, *SDK_LOOKUP_OPTIONS))


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("tablestore") (TABLE, META, WRITE_OPTIONS), one field per option; `job_named`:
    whether the user set `job` (a streaming query that did not writes as an implicit job named after itself)."""

    declared = (TABLE, META, *WRITE_OPTIONS)

    table: str
    meta: str | None = field(repr=False)  # a postgresql:// URL may carry a password
    primary_key: tuple[str, ...]
    upsert_op_column: str | None
    upsert_unchanged_column: str | None
    schema_evolution: str
    job: str
    writer_lease: int
    checkpoint_interval: int
    auto_compact: bool
    compact_min_files: int
    compact_target_bytes: int
    log_retention_versions: int
    write_id: str | None
    job_named: bool

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"job_named": opts.is_set("job")}

    def upkeep(self) -> Upkeep:
        """The sink's maintenance of the table after each commit (auto-compact=false: no compaction)."""
        return Upkeep(self.checkpoint_interval, self.compact_min_files if self.auto_compact else 0,
                      self.compact_target_bytes, self.log_retention_versions)


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("tablestore") (TABLE, META, READ_OPTIONS), one field per option."""

    declared = (TABLE, META, *READ_OPTIONS)

    table: str
    meta: str | None = field(repr=False)  # a postgresql:// URL may carry a password
    version: int | None
    barrier: int | None
    consistent_with: tuple[str, ...]
    aligned_with: tuple[str, ...]
    max_partition_bytes: int
    changes: bool


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("tablestore") besides the cache's and the warehouse's."""

    declared = (TABLE, META, LOOKUP_VERSION)

    table: str
    meta: str | None = field(repr=False)  # a postgresql:// URL may carry a password
    lookup_version: int | None
