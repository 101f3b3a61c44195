"""The options of format("postgres_changes") (besides the connection's), declared once, and the typed form the
rest of change capture reads them in (ChangeOptions, made once per query)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.connector import ERROR_OPTIONS, Option, OptionError, Options, OptionSpec, TypedOptions, check_error_options
from sluice.connectors.postgres._client import CONNECTION_OPTIONS, Connection

CHANGES_OPTIONS = (
    Option("table", "list", (), "Tables whose changes to stream, [schema.]name, comma-separated; or use "
           "publication."),
    Option("publication", "str", None,
           "An existing publication whose tables to stream. Default: sluice creates publication <slot> for the "
           "tables in 'table' (which needs ownership of them)."),
    Option("slot", "str", None,
           "The logical replication slot (pgoutput), created if missing. Default: sluice_<12 hex digits of the "
           "database and tables>. Two queries over the same tables need different slots: a second query on a slot in "
           "use fails at start."),
    Option("slot.failover", "bool", False,
           "Create the slot as a failover slot (PostgreSQL 17+): a physical standby with sync_replication_slots = on "
           "keeps a synchronized copy, so after a failover the stream goes on from the promoted standby (point 'url' "
           "at it; docs/postgres.md). Applies when sluice creates the slot; refused on servers before 17."),
    Option("slot.log-restart-point", "bool", True,
           "PostgreSQL 16+: when planning a micro-batch, log a running-transactions record "
           "(pg_log_standby_snapshot()), so the slot's restart_lsn follows the query and each batch's decoding "
           "starts near its position, not up to 15 s of WAL back (the server logs one that often). Needs EXECUTE on "
           "the function (superusers by default); without it, a warning and the server's own records."),
    Option("messages.prefix", "list", (),
           "Stream logical decoding messages (pg_logical_emit_message; PostgreSQL 14+) instead of table changes: "
           "those whose prefix is one of these, comma-separated, compared exactly (the server sends every message; "
           "sluice keeps these). Columns prefix, content, transactional, message_lsn, _lsn, _commit_time, _xid; a "
           "transactional message comes when its transaction commits, in commit order, never when it rolls back. "
           "Not with 'table'; 'publication', if given, must have no tables (default: sluice creates publication "
           "<slot> without tables). snapshot and fetch-ranges do not apply."),
    Option("snapshot", "bool", True,
           "On first start, create the slot with an exported snapshot and read the tables in it as micro-batch 0 "
           "(every row as an insert), then stream changes from exactly there. false: changes only."),
    Option("snapshot.new-tables", "choice", "incremental",
           "A table the publication has that the checkpoint's offsets did not stream yet (added to the capture "
           "between runs): incremental = its existing rows are read in primary-key chunks of snapshot.chunk-size, "
           "one chunk per micro-batch while the changes keep streaming, as _op = 'read' rows; none = only its "
           "changes from now on.", choices=("incremental", "none")),
    Option("snapshot.chunk-size", "int", 50_000,
           "Rows per chunk of a snapshot on demand (snapshot.new-tables, signal.table): a micro-batch reads at most "
           "one chunk besides its changes.", minimum=1, maximum=10_000_000),
    Option("signal.table", "str", None,
           "A table sluice reads requests from while the stream runs (Debezium's signal table: columns id, type, "
           "data, as text or jsonb): type 'execute-snapshot' with data {\"data-collections\": [\"schema.table\", "
           "...], \"additional-conditions\": [{\"data-collection\": \"schema.table\", \"filter\": \"SQL "
           "condition\"}]} reads those tables again in chunks, as snapshot.new-tables does; 'stop-snapshot' "
           "stops it. A row is taken once and deleted when its micro-batch is committed (the query's role needs "
           "SELECT and DELETE on the table). Whoever may insert into it has the query's role run their filter: "
           "grant INSERT to trusted roles only."),
    Option("truncate", "choice", "emit",
           "A TRUNCATE of a streamed table: emit = one row per table it emptied (those a CASCADE reached included), "
           "in commit order among the changes: _op = 'truncate', _table, _lsn, _commit_time and _xid set, the "
           "table's columns null; the postgres and tablestore sinks empty their target there, other upserting sinks "
           "refuse it by name. fail = the query fails at it (reload the table to go on).",
           choices=("emit", "fail")),
    Option("max-changes-per-trigger", "int", 0,
           "Most changes (with messages.prefix: messages) per micro-batch (whole transactions; at least one); 0 = "
           "all available. The initial "
           "snapshot is read in splits of about this many rows, as many micro-batches.", minimum=0),
    Option("failOnDataLoss", "bool", True,
           "Fail when the slot is missing, invalidated or moved past the query's position (false: warn, "
           "re-create the slot and skip what is gone)."),
    Option("quiet-advance-wal-bytes", "int", 16 << 20,
           "When no table of the publication changed but other tables wrote this much WAL since the query's "
           "position, the query moves past it in a micro-batch without rows, so the slot lets the server recycle "
           "that WAL (a quiet table on a busy database would hold it back without end). 0 = at every trigger.",
           minimum=0),
    Option("retained-wal-warn-bytes", "int", 1 << 30,
           "Warn when the slot holds back more WAL than this on the server.", minimum=0),
    Option("num-partitions", "int", 0, "Splits per table for the snapshot; 0 = about one per 250,000 rows.",
           minimum=0, maximum=10_000),
    Option("snapshot.timeout-s", "int", 600,
           "The exported snapshot is released this long after the last snapshot split finished.", minimum=5),
    Option("fetch-ranges", "int", 2,
           "A micro-batch's changes are fetched as up to this many consecutive WAL ranges of at least 16 MiB each: "
           "the server decodes the next range, from a temporary copy of the slot, while sluice decodes and Spark "
           "writes the one before. 1 = one fetch per micro-batch. A copy takes a replication slot "
           "(max_replication_slots) while it is read; with none free the range is fetched from the slot itself "
           "(slower, with a warning).", minimum=1, maximum=16),
    Option("job", "str", None,
           "The MetaService job this query belongs to (its job_id): the driver records the slot as that job's when "
           "the query starts and about every 30 s while it runs, so `sluice doctor` names the slot's owner and "
           "`--fix` drops the slot only once that job has stopped."),
    Option("meta", "str", None, "With 'job': the MetaService's database (SQLite path or postgresql:// URL, read by the "
           "driver only); default $SLUICE_META, else .sluice/meta.db.", secret=True),
)


def _check(opts: Options) -> None:
    if opts["messages.prefix"]:
        if opts["table"]:
            raise OptionError("options 'messages.prefix' and 'table' together: a query streams either logical "
                              "decoding messages or table changes (their rows share no columns); stream the table's "
                              "changes with a query of its own")
        if opts["signal.table"]:
            raise OptionError("option 'signal.table' does not apply with 'messages.prefix': a stream of messages "
                              "reads no table to snapshot; remove one of them")
        if any(not prefix for prefix in opts["messages.prefix"]):
            raise OptionError("option 'messages.prefix': an empty prefix; list the prefixes to stream, "
                              "comma-separated, as pg_logical_emit_message was given them")
    elif not opts["table"] and not opts["publication"]:
        raise OptionError("format('postgres_changes') needs option 'table' (tables to stream), 'publication' or "
                          "'messages.prefix' (logical decoding messages to stream)")
    if opts.is_set("meta") and not opts["job"]:
        raise OptionError("option 'meta' only applies with option 'job' (the MetaService job that owns the slot); "
                          "set .option('job', <job_id>) or remove 'meta'")


# errors.*: a change with a value that does not convert to its column's Spark type fails the read, or goes to a
# dead-letter target (errors.tolerance=all) and the stream goes on.
CHANGES_SPEC = OptionSpec("postgres_changes", (*CONNECTION_OPTIONS, *CHANGES_OPTIONS, *ERROR_OPTIONS),
                          (_check, check_error_options))


@dataclass(frozen=True)
class ChangeOptions(TypedOptions):
    """The options of one change-capture query, parsed and checked (CHANGES_SPEC), one field per option of
    CHANGES_OPTIONS; `conn`: the database; `connection`: the connection options the user set, for the snapshot's
    format("postgres") reads (never shown: a password may be among them)."""

    declared = CHANGES_OPTIONS
    conn_from = Connection.from_options

    table: tuple[str, ...]
    publication: str | None
    slot: str | None
    slot_failover: bool
    slot_log_restart_point: bool
    messages_prefix: tuple[str, ...]
    snapshot: bool
    snapshot_new_tables: str
    snapshot_chunk_size: int
    signal_table: str | None
    truncate: str
    max_changes_per_trigger: int
    fail_on_data_loss: bool
    quiet_advance_wal_bytes: int
    retained_wal_warn_bytes: int
    num_partitions: int
    snapshot_timeout_s: int
    fetch_ranges: int
    job: str | None
    meta: str | None
    conn: Connection
    connection: Mapping[str, str] = field(repr=False)

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        connection = {o.name: str(opts[o.name]) for o in CONNECTION_OPTIONS if opts.is_set(o.name)}
        return {"connection": connection}
