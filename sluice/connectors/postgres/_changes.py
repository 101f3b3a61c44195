"""`spark.readStream.format("postgres_changes")`: a table's committed changes, in order, from logical replication.

A sibling format rather than an option of `format("postgres")`: its options (slot, publication, snapshot, ...)
have nothing in common with a batch read's beyond the connection, and each format validates and documents
exactly its own.

How it works (the built-in `pgoutput` plugin, so any PostgreSQL >= 12 with wal_level=logical):
- **Offsets are LSNs** in Spark's checkpoint. A micro-batch (start, end] holds every transaction of the
  publication whose commit record lies in [start, end), whole: `pg_logical_slot_peek_binary_changes(slot,
  end, ...)` decodes transactions committed before `end` and never consumes them. The slot is advanced to
  a batch's start when the next batch is planned (Spark has then committed everything before it) and in
  `commit()`, so a restarted query replays exactly the batches Spark did not commit. The end of a batch is
  the server's flushed WAL position, or with `max-changes-per-trigger` the commit after the last transaction
  that fits (at least one transaction, never a part of one). When only tables outside the publication wrote
  (`quiet-advance-wal-bytes` of WAL), a batch without rows moves past their WAL, so the slot does not hold it back.
- **A batch's fetch is overlapped with its decoding** (`fetch-ranges`): the server materializes a whole peek
  before sending any of it, so a large batch is fetched as consecutive WAL ranges, each after the first from a
  temporary copy of the slot advanced to the range's start (the copy skips earlier transactions on the server;
  each range's decoder keeps only its own), the next range fetched in a thread while this one is decoded.
- **Initial snapshot without gap or overlap**: on first start the slot is created over the replication
  protocol with an exported snapshot (held open by a small process, see _snapshot.py); micro-batch 0 reads
  the tables in that snapshot, in parallel splits as `format("postgres")` does, and every later batch
  streams from the slot's consistent point, where that snapshot ends. With `max-changes-per-trigger` the
  snapshot is cut into splits of about that many rows (table statistics) and read over as many micro-batches,
  whole splits each; the splits are planned once and carried in the offsets, so a replayed batch reads the same
  ones (offsets {"lsn", "snapshot", "channel", "splits", "done"} until the last snapshot batch).
- **Rows**: the tables' columns typed as `format("postgres")` types them, then `_op` (insert, update, delete:
  values `upsert.op-column` takes; snapshot rows are inserts), `_lsn` (the commit LSN as a number),
  `_commit_time`, `_xid` (null for snapshot rows) and `_table` (schema.name).
- **A lost slot is data loss**: dropped, invalidated (max_slot_wal_keep_size) or moved past the query's
  position by someone else (checked when a batch is planned and again, on the executor, after its changes are
  fetched). failOnDataLoss=true (default) fails; false warns, re-creates the slot and goes on from its new position.
- **One query per slot** (SlotGuard): the driver holds an advisory lock named after the slot for the query's life,
  so a second query on it fails at start instead of advancing the slot past the first one's changes.

Kept in one module for now (past 400 lines): its concerns (options, publication and slot, offsets, fetch, the
reader) move into a package of their own as one step, since splitting them one by one would cross import cycles
between the reader, the snapshot holder and format("postgres")'s reader.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sluice.connector import DataLossError, EngineDataSource, Option, OptionError, Options, OptionSpec, Split
from sluice.connectors.postgres._conn import (
    CONNECTION_OPTIONS,
    Connection,
    PostgresError,
    qualified,
    quote_ident,
    quote_literal,
    split_qualified,
    sqlstate_of,
)
from sluice.connectors.postgres._pgoutput import (
    COMMIT_TIME,
    LSN,
    METADATA_COLUMNS,
    OP,
    TABLE,
    XID,
    ChangeDecoder,
    format_lsn,
    parse_lsn,
)
from sluice.connectors.postgres._snapshot import SharedSnapshot, SnapshotHolder
from sluice.connectors.postgres._snapshot_holder import holder_name
from sluice.connectors.postgres._source import (
    PostgresEnumerator,
    PostgresSplitReader,
    describe_columns,
    infer_schema,
)
from sluice.spark._compat import (
    AdmissionControlledReader,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

log = logging.getLogger("sluice.postgres")

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
    Option("snapshot", "bool", True,
           "On first start, create the slot with an exported snapshot and read the tables in it as micro-batch 0 "
           "(every row as an insert), then stream changes from exactly there. false: changes only."),
    Option("max-changes-per-trigger", "int", 0,
           "Most changes per micro-batch (whole transactions; at least one); 0 = all available. The initial "
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
)


def _check(opts: Options) -> None:
    if not opts["table"] and not opts["publication"]:
        raise OptionError("format('postgres_changes') needs option 'table' (tables to stream) or 'publication'")


CHANGES_SPEC = OptionSpec("postgres_changes", (*CONNECTION_OPTIONS, *CHANGES_OPTIONS), (_check,))

_PEEK = ("pg_logical_slot_peek_binary_changes({slot}, {upto}, {count}, 'proto_version', '1', "
         "'publication_names', {publication})")
_SESSION = ("SET DateStyle = ISO", "SET TimeZone = 'UTC'", "SET IntervalStyle = postgres",
            "SET bytea_output = hex")
DECODE_SLICE = 65_536  # messages decoded at a time
# A fetch range smaller than this is not worth a copied slot: copying and advancing one costs ~0.1 s, and the copy
# decodes (without sending) everything from the slot's restart point up to the range again.
FETCH_RANGE_MIN_WAL = 16 << 20
# Most snapshot splits per table when max-changes-per-trigger cuts the snapshot: every snapshot offset carries them.
MAX_SNAPSHOT_SPLITS = 1_000
_SLOT_BUSY = "55006"  # object_in_use: another backend is decoding the slot (a killed task's, for a moment)
_NO_FREE_SLOT = "53400"  # configuration_limit_exceeded: all max_replication_slots are in use
_LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out


@dataclass(frozen=True)
class ChangeStream:
    """What the driver resolved: the slot, the publication, the tables and their columns."""

    conn: Connection
    slot: str
    publication: str
    tables: tuple[str, ...]  # schema.name
    columns: dict[str, str]  # every table column over all tables -> PostgreSQL type
    table_columns: dict[str, tuple[tuple[str, str], ...]]
    primary_keys: dict[str, tuple[str, ...]]
    table_options: dict[str, Options]  # each table's options for format("postgres")'s snapshot reader

    def peek(self, upto: str, count: int | None, slot: str | None = None) -> str:
        return _PEEK.format(slot=quote_literal(slot or self.slot), upto=f"{quote_literal(upto)}::pg_lsn",
                            count="NULL" if count is None else int(count),
                            publication=quote_literal(quote_ident(self.publication)))


def default_slot(conn: Connection, tables: Sequence[str], publication: str | None) -> str:
    digest = hashlib.sha1(f"{conn.dbname}|{','.join(sorted(tables))}|{publication or ''}".encode()).hexdigest()
    return f"sluice_{digest[:12]}"


def resolve(opts: Options) -> ChangeStream:
    """On the driver: the publication's tables (created for `table` if needed) and their columns."""
    conn = Connection.from_options(opts)
    wanted = [".".join(split_qualified(t)) for t in opts["table"]]
    slot = opts["slot"] or default_slot(conn, wanted, opts["publication"])
    if len(slot) > 63 or not slot.replace("_", "").isalnum() or slot != slot.lower():
        raise OptionError(f"option 'slot': {slot!r} is not a valid replication slot name (lower-case letters, "
                          "digits and _, at most 63)")
    publication = opts["publication"] or slot
    with conn.connect_psycopg() as pg:
        version = _check_server(pg, conn)
        if opts["slot.failover"] and version < 170000:
            raise OptionError(f"option 'slot.failover' needs PostgreSQL 17 or later (failover slots); "
                              f"{conn.describe()} runs {version // 10000}.{version % 100}. Remove the option, or "
                              "upgrade the server")
        published = _published_tables(pg, publication)
        if published is not None:
            _warn_unpublished_operations(pg, publication)
        if published is None:
            if opts["publication"]:
                raise OptionError(f"publication '{publication}' does not exist on {conn.describe()} "
                                  "(option 'publication'); create it, or name the tables with option 'table'")
            # A missing table is named as such, not as a failed CREATE PUBLICATION.
            _describe(conn, {t: _table_opts(opts, t) for t in wanted})
            _create_publication(pg, conn, publication, wanted)
            published = wanted
        tables = wanted or published
        missing = [t for t in tables if t not in published]
        if missing:
            partitioned = [t for t in missing if pg.execute(
                "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
                (_quoted(t),)).fetchone() == (True,)]
            hint = (f"; {partitioned} are partitioned: the publication sends their partitions' changes unless "
                    f"ALTER PUBLICATION {quote_ident(publication)} SET (publish_via_partition_root = true)"
                    if partitioned else "")
            raise OptionError(f"table(s) {missing} are not in publication '{publication}' (its tables: {published}); "
                              f"ALTER PUBLICATION {quote_ident(publication)} ADD TABLE ...{hint}")
        column_lists = _sent_columns(pg, publication, tables)
    table_options = {t: _table_opts(opts, t) for t in tables}
    return ChangeStream(conn, slot, publication, tuple(tables), *_describe(conn, table_options, column_lists),
                        table_options)


def _describe(conn: Connection, table_options: dict[str, Options],
              column_lists: dict[str, list[str]] | None = None) -> tuple[dict[str, str], dict, dict]:
    """(column -> PostgreSQL type over all tables, each table's columns, each table's primary key). A table whose
    changes carry only some columns (`column_lists`, _sent_columns) has those only, and the snapshot reads the same."""
    columns: dict[str, str] = {}
    table_columns, keys = {}, {}
    for table, read_opts in table_options.items():
        _, cols, pk = infer_schema(conn, read_opts)
        listed = (column_lists or {}).get(table)
        if listed is not None:
            cols = [(name, pg_type) for name, pg_type in cols if name in listed]
        table_columns[table] = tuple(cols)
        keys[table] = tuple(pk)
        for name, pg_type in cols:
            if name in METADATA_COLUMNS:
                raise OptionError(f"column '{name}' of {table} has the name of a metadata column the change stream "
                                  f"adds ({', '.join(METADATA_COLUMNS)}); rename it or read a view without it")
            if columns.setdefault(name, pg_type) != pg_type:
                raise OptionError(f"column '{name}' is {columns[name]} in one table and {pg_type} in {table}; "
                                  "stream those tables with separate queries")
    return columns, table_columns, keys


def _conn_options(opts: Options) -> dict[str, Any]:
    return {o.name: opts[o.name] for o in CONNECTION_OPTIONS if opts.is_set(o.name)}


def _table_opts(opts: Options, table: str, partitions: int | None = None) -> Options:
    """The options of a batch read of one table in the snapshot (format("postgres")'s reader takes them)."""
    from sluice.connectors.postgres._source import READ_SPEC

    raw = {k: str(v) for k, v in _conn_options(opts).items()}
    raw.update({"table": _quoted(table),
                "num-partitions": str(opts["num-partitions"] if partitions is None else partitions),
                "snapshot.timeout-s": str(opts["snapshot.timeout-s"])})
    return READ_SPEC.parse(raw)


def _quoted(table: str) -> str:
    """A table as resolve() names it (schema.name, exact) quoted for SQL."""
    return qualified(*table.split(".", 1))


def _check_server(pg: Any, conn: Connection) -> int:
    """Refuse a server change capture cannot use; its server_version_num."""
    level, version = pg.execute("SELECT current_setting('wal_level'), current_setting('server_version_num')::int"
                                ).fetchone()
    if version < 120000:
        raise PostgresError(f"{conn.describe()} runs PostgreSQL {version // 10000}; change capture needs >= 12")
    if level != "logical":
        raise PostgresError(f"{conn.describe()} has wal_level={level}; change capture needs wal_level=logical "
                            "(ALTER SYSTEM SET wal_level = logical, then restart the server; managed services "
                            "call it logical replication / logical decoding)")
    return version


def _published_tables(pg: Any, publication: str) -> list[str] | None:
    if pg.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
        return None
    rows = pg.execute("SELECT schemaname::text || '.' || tablename::text FROM pg_publication_tables "
                      "WHERE pubname = %s ORDER BY 1", (publication,)).fetchall()
    return [r[0] for r in rows]


def _warn_unpublished_operations(pg: Any, publication: str) -> None:
    """A publication may leave operations out (publish = 'insert', ...): the stream then never carries them."""
    flags = pg.execute("SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    left_out = [op for op, published in zip(("insert", "update", "delete"), flags, strict=True) if not published]
    if left_out:
        log.warning("publication %s does not publish %s: the stream carries no such changes, and what it feeds "
                    "will not see them (ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate') "
                    "if that is not meant)", publication, ", ".join(left_out), quote_ident(publication))


def _sent_columns(pg: Any, publication: str, tables: Sequence[str]) -> dict[str, list[str]]:
    """The tables whose changes carry only some of their columns, with those: a publication's column list
    (PostgreSQL 15+), and never generated columns unless the publication publishes them (PostgreSQL 18+)."""
    version = pg.execute("SELECT current_setting('server_version_num')::int").fetchone()[0]
    generated_sent = pg.execute(  # publish_generated_columns = stored (PostgreSQL 18+; absent before)
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_publication'::regclass "
        "AND attname = 'pubgencols')").fetchone()[0] and pg.execute(
        "SELECT pubgencols::text IN ('s', 'true') FROM pg_publication WHERE pubname = %s", (publication,)).fetchone()[0]
    listed: dict[str, list[str]] = {}
    if version >= 150000:
        listed = dict(pg.execute("SELECT schemaname::text || '.' || tablename::text, attnames::text[] "
                                 "FROM pg_publication_tables WHERE pubname = %s", (publication,)).fetchall())
    out = {}
    for table in tables:
        columns = pg.execute("SELECT attname::text, attgenerated <> '' FROM pg_attribute WHERE attrelid = "
                             "to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                             (_quoted(table),)).fetchall()
        names = listed.get(table)
        sent = [name for name, generated in columns
                if (generated_sent or not generated) and (names is None or name in names)]
        if len(sent) < len(columns):
            out[table] = sent
    return out


def _create_publication(pg: Any, conn: Connection, publication: str, tables: list[str]) -> None:
    _check_replica_identity(pg, tables)
    rels = ", ".join(_quoted(t) for t in tables)
    # A partitioned table's changes then come under its own name, not its partitions' (PostgreSQL 13+).
    via_root = " WITH (publish_via_partition_root = true)" if pg.info.server_version >= 130000 else ""
    try:
        pg.execute(f"CREATE PUBLICATION {quote_ident(publication)} FOR TABLE {rels}{via_root}")
    except Exception as e:
        raise PostgresError(f"could not create publication '{publication}' for {tables} on {conn.describe()}: "
                            f"{conn.scrub(e)}; create it yourself and pass option 'publication'",
                            sqlstate_of(e)) from None


def _check_replica_identity(pg: Any, tables: list[str]) -> None:
    """A published table without a replica identity (no primary key under REPLICA IDENTITY DEFAULT, or NOTHING)
    makes every UPDATE and DELETE on it fail in the database: refuse to publish one."""
    for table in tables:
        rel = _quoted(table)
        # the table itself, or for a partitioned one its partitions (whose replica identities count)
        bare = [row[0] for row in pg.execute(
            "WITH rels AS (SELECT relid FROM pg_partition_tree(to_regclass(%s)) UNION SELECT to_regclass(%s)) "
            "SELECT c.oid::regclass::text FROM rels JOIN pg_class c ON c.oid = rels.relid WHERE c.relkind = 'r' "
            "AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS (SELECT 1 FROM pg_index i "
            "WHERE i.indrelid = c.oid AND i.indisprimary)))", (rel, rel)).fetchall()]
        if bare:
            raise OptionError(
                f"table {table} has no replica identity ({', '.join(bare)}: no primary key, or REPLICA IDENTITY "
                "NOTHING): once published, every UPDATE and DELETE on it would fail in the database. Give it a "
                f"primary key, or run ALTER TABLE {rel} REPLICA IDENTITY FULL (or USING INDEX a unique index), then "
                "start again (option 'table')")


def spark_schema(stream: ChangeStream) -> StructType:
    from sluice.connectors.postgres._source import spark_type

    fields = [StructField(name, spark_type(pg_type)[0], True) for name, pg_type in stream.columns.items()]
    return StructType([*fields, StructField(OP, StringType(), False), StructField(LSN, LongType(), False),
                       StructField(COMMIT_TIME, TimestampType(), True), StructField(XID, LongType(), True),
                       StructField(TABLE, StringType(), False)])


# ------------------------------------------------------------------------------------------------ slot state
@dataclass(frozen=True)
class SlotState:
    confirmed: int
    restart: int
    wal_status: str | None
    retained_bytes: int
    invalidation_reason: str | None = None  # PostgreSQL 17+ says why a slot was invalidated

    @property
    def invalidated(self) -> bool:
        return self.wal_status == "lost" or self.invalidation_reason is not None

    def why_invalidated(self) -> str:
        return INVALIDATION_REASONS.get(self.invalidation_reason or "wal_removed",
                                        f"the server invalidated it ({self.invalidation_reason})")


# pg_replication_slots.invalidation_reason (PostgreSQL 17; idle_timeout since 18) in words; before 17 a lost slot
# has wal_status 'lost' only, which then always means removed WAL.
INVALIDATION_REASONS = {
    "wal_removed": "the server removed WAL it still needed (max_slot_wal_keep_size)",
    "idle_timeout": "it was unused for longer than the server's idle_replication_slot_timeout",
    "rows_removed": "rows it needed were vacuumed away (on a standby: hot_standby_feedback off)",
    "wal_level_insufficient": "the server's wal_level was lowered below logical",
}


def slot_state(pg: Any, slot: str) -> SlotState | None:
    # to_jsonb(s): invalidation_reason exists from PostgreSQL 17 on; older servers give null.
    row = pg.execute("SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, "
                     "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                     "to_jsonb(s) ->> 'invalidation_reason' FROM pg_replication_slots s "
                     "WHERE slot_name = %s AND database = current_database()", (slot,)).fetchone()
    if row is None:
        return None
    return SlotState(parse_lsn(row[0]) if row[0] else 0, parse_lsn(row[1]) if row[1] else 0, row[2], row[3] or 0,
                     row[4])


def holder_of(pg: Any, slot: str) -> tuple[str, str] | None:
    """(snapshot id, notify channel) of the running process that holds `slot`'s exported snapshot, if any."""
    prefix = holder_name(slot, "", "").rsplit("/", 2)[0] + "/"
    row = pg.execute("SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, %s) "
                     "LIMIT 1", (prefix,)).fetchone()
    if row is None:
        return None
    _, _, snapshot, suffix = row[0].split("/")
    return snapshot, f"sluice_snap_{suffix}"


SLOT_GUARD_WAIT_S = 15  # a query restarted at once may find its last run's session still closing


def guard_name(slot: str) -> str:
    """The application_name of the session holding `slot` for a running query (visible in pg_stat_activity)."""
    return f"sluice slot guard {slot}"[:63]


def slot_holder(pg: Any, slot: str) -> str | None:
    """Which running query holds `slot` (its guard session), if any is visible to this user."""
    row = pg.execute("SELECT pid, host(client_addr), backend_start FROM pg_stat_activity "
                     "WHERE application_name = %s AND pid <> pg_backend_pid() LIMIT 1", (guard_name(slot),)).fetchone()
    if row is None:
        return None
    pid, addr, since = row
    return f"server process {pid}, client {addr or 'local socket'}, since {since:%Y-%m-%d %H:%M:%S %Z}"


class SlotGuard:
    """One query per slot. Two queries on one slot (the default slot name is the same for the same tables) would each
    advance it past the other's position, and the other's changes would be gone. The driver holds an advisory lock
    named after the slot, on a session of its own, for the query's life; a second query waits SLOT_GUARD_WAIT_S for it
    and then fails at start, before either loses anything. The server drops the lock with the session: stop(), the
    driver's process exiting, or (its machine gone) the session's TCP keepalives, within about a minute."""

    def __init__(self, conn: Connection, slot: str) -> None:
        self.conn, self.slot = conn, slot
        self.key = int.from_bytes(hashlib.blake2b(f"sluice slot {slot}".encode(), digest_size=8).digest(), "big",
                                  signed=True)
        self.name = guard_name(slot)
        self._pg: Any = None

    def hold(self) -> Any:
        """Take the lock, or make sure this session still has it (a session the server closed is taken again).
        Returns the session, which the driver also plans micro-batches on: Spark asks for the latest offset every
        few milliseconds while nothing comes, and a connection each time would be that many logins."""
        import psycopg

        if self._pg is not None:
            try:
                self._pg.execute("SELECT 1")
                return self._pg
            except psycopg.Error:
                log.warning("the session holding slot %s for this query was closed; taking it again", self.slot)
                self.release()
        pg = self.conn.connect_psycopg()
        try:
            pg.execute("SELECT set_config('application_name', %s, false)", (self.name,))
            for setting, value in (("tcp_keepalives_idle", "30"), ("tcp_keepalives_interval", "10"),
                                   ("tcp_keepalives_count", "3"), ("lock_timeout", f"{SLOT_GUARD_WAIT_S}s")):
                pg.execute("SELECT set_config(%s, %s, false)", (setting, value))
            if pg.info.server_version >= 140000:  # managed services may end idle sessions
                pg.execute("SELECT set_config('idle_session_timeout', '0', false)")
            self._lock(pg)
            for statement in _SESSION:
                pg.execute(statement)
        except Exception as e:
            holder = self._holder(pg) if sqlstate_of(e) == _LOCK_NOT_AVAILABLE else None
            pg.close()
            if holder is None:
                raise PostgresError(f"locking slot '{self.slot}' for this query on {self.conn.describe()} failed: "
                                    f"{self.conn.scrub(e)}", sqlstate_of(e)) from None
            raise OptionError(
                f"option 'slot': replication slot '{self.slot}' is in use by another query ({holder}; waited "
                f"{SLOT_GUARD_WAIT_S} s). Two queries on one slot would each advance it past the other's changes. "
                "Give each query its own slot (.option('slot', ...)); if that query is gone, its session ends within "
                "about a minute") from None
        self._pg = pg
        return pg

    def _lock(self, pg: Any) -> None:
        pg.execute("SELECT pg_advisory_lock(%s)", (self.key,))  # waits lock_timeout for a holder to let go

    def _holder(self, pg: Any) -> str:
        import psycopg

        try:
            holder = slot_holder(pg, self.slot)
        except psycopg.Error:
            holder = None
        return holder or "its session is not visible to this user"

    def release(self) -> None:
        import psycopg

        if self._pg is not None:
            pg, self._pg = self._pg, None
            try:
                # Let go before closing: a session's end is noticed by the server a moment later, and a query
                # restarted at once (or `sluice postgres slots`) should find the slot free.
                pg.execute("SELECT pg_advisory_unlock_all(), set_config('application_name', '', false)")
                pg.close()
            except (OSError, psycopg.Error) as e:  # the server drops the lock with the session either way
                log.debug("closing the session holding slot %s: %s", self.slot, e)
                pg.close()


def _busy_retry(action: Any, what: str, conn: Connection, deadline_s: float = 30.0) -> Any:
    """Run `action`; while the slot is in use by another backend (a task being killed), wait and retry."""
    until = time.monotonic() + deadline_s
    delay = 0.1
    while True:
        try:
            return action()
        except Exception as e:
            if sqlstate_of(e) != _SLOT_BUSY or time.monotonic() > until:
                raise PostgresError(f"{what} on {conn.describe()} failed: {conn.scrub(e)}", sqlstate_of(e)) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def wal_ranges(start: int, end: int, most: int) -> list[tuple[int, int]]:
    """[start, end) cut into at most `most` consecutive ranges of equal WAL bytes, none under FETCH_RANGE_MIN_WAL."""
    count = max(1, min(most, (end - start) // FETCH_RANGE_MIN_WAL))
    cuts = [start + (end - start) * i // count for i in range(count)] + [end]
    return list(itertools.pairwise(cuts))


def _close_fetched(done: Future[RangeFetch]) -> None:
    if not done.cancelled() and done.exception() is None:
        done.result().close()


class RangeFetch:
    """One fetch range's peek, executed: its first record batch in hand, the rest still streaming from the server on
    the ADBC session, which closing ends."""

    def __init__(self, conn: Any, cur: Any, batches: Any, first: pa.RecordBatch | None) -> None:
        self._conn, self._cur, self._batches, self._first = conn, cur, batches, first

    def arrays(self) -> Iterator[pa.Array]:
        """The messages (`data` bytea), batch by batch."""
        if self._first is not None:
            yield self._first.column(0)
            self._first = None
        for batch in self._batches:
            yield batch.column(0)

    def close(self) -> None:
        self._cur.close()
        self._conn.close()

    def __enter__(self) -> RangeFetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------ partitions
@dataclass
class SnapshotPartition(InputPartition):
    table: str
    split: Split
    lsn: int

    def __init__(self, table: str, split: Split, lsn: int) -> None:
        super().__init__(f"snapshot:{table}:{split.split_id}")
        self.table, self.split, self.lsn = table, split, lsn


@dataclass
class ChangesPartition(InputPartition):
    start: int
    end: int

    def __init__(self, start: int, end: int) -> None:
        super().__init__(f"changes:{format_lsn(start)}-{format_lsn(end)}")
        self.start, self.end = start, end


class ChangeStreamReader(AdmissionControlledReader, SupportsTriggerAvailableNow):
    """Driver and executor side of the change stream (see the module docstring)."""

    cap_options = ("max-changes-per-trigger",)

    def __init__(self, stream: ChangeStream, opts: Options, schema: StructType) -> None:
        from sluice.spark._compat import to_arrow_schema

        self.stream = stream
        self.opts = opts
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema)
        self._holder: SnapshotHolder | None = None
        self._target: int | None = None  # AvailableNow: never read past this
        self._reported: dict[str, Any] | None = None
        self._initial: dict | None = None
        self._guard = SlotGuard(stream.conn, stream.slot)  # held from the first offset on, released by stop()
        self._log_restart_points = opts["slot.log-restart-point"]  # off when the server cannot
        self._nothing_before: int | None = None  # the WAL position up to which the last peek found no change

    # ------------------------------------------------------------------ driver
    def initialOffset(self) -> dict:
        """Where micro-batch 0 starts. Spark asks again when it replays micro-batch 0 (same run or a restart), so
        an existing slot whose snapshot is still held gives the same answer."""
        self._guard.hold()
        if self._initial is None:
            self._initial = self._first_offset()
        return self._initial

    def _first_offset(self) -> dict:
        s = self.stream
        with s.conn.connect_psycopg() as pg:
            state = slot_state(pg, s.slot)
            if state is not None:
                if not self.opts["snapshot"]:
                    return {"lsn": format_lsn(state.confirmed)}
                held = holder_of(pg, s.slot)
                if held is None:
                    raise OptionError(
                        f"replication slot '{s.slot}' exists already and holds no snapshot: a first start with "
                        "snapshot=true needs a new slot (its exported snapshot is where the changes begin), and a "
                        "query that stopped before micro-batch 0 committed cannot replay it any more. Drop the slot "
                        f"(sluice postgres drop-slot {s.slot} --url ...) and the checkpoint, or set snapshot=false "
                        f"to stream from the slot's position {format_lsn(state.confirmed)}")
                return {"lsn": format_lsn(state.confirmed), "snapshot": held[0], "channel": held[1]}
            if not self.opts["snapshot"]:
                return {"lsn": self._create_slot(pg)}
        holder = SnapshotHolder(s.conn, self.opts["snapshot.timeout-s"], slot=s.slot,
                                failover=self.opts["slot.failover"])
        holder.release_pipes()
        self._holder = holder
        shared = holder.shared
        return {"lsn": shared.lsn, "snapshot": shared.snapshot_id, "channel": shared.channel}

    def _create_slot(self, pg: Any) -> str:
        try:
            # (name, plugin, temporary, two-phase, failover): the fifth argument exists from PostgreSQL 17 on.
            failover = ", false, false, true" if self.opts["slot.failover"] else ""
            lsn = pg.execute(f"SELECT lsn::text FROM pg_create_logical_replication_slot(%s, 'pgoutput'{failover})",
                             (self.stream.slot,)).fetchone()[0]
        except Exception as e:
            raise PostgresError(f"could not create replication slot '{self.stream.slot}' on "
                                f"{self.stream.conn.describe()}: {self.stream.conn.scrub(e)}", sqlstate_of(e)) from None
        log.info("created replication slot %s at %s", self.stream.slot, lsn)
        return lsn

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts["max-changes-per-trigger"]
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self.stream.conn.connect_psycopg() as pg:
            self._target = parse_lsn(pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])

    def latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        pg = self._guard.hold()
        if "snapshot" in start:  # the snapshot alone, then changes from its LSN
            return self._snapshot_end(start, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        begin = parse_lsn(start["lsn"])
        s = self.stream
        begin = self._advance(pg, begin)  # Spark committed every batch before `start`: the slot may move
        flush = parse_lsn(pg.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
        upto = flush if self._target is None else min(flush, self._target)
        if upto <= begin or upto == self._nothing_before:  # no WAL since the last look found no change
            return self._same_or(start, {"lsn": format_lsn(begin)})
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = self._cut(pg, begin, upto, budget)
        if end == begin:
            self._nothing_before = upto  # Spark polls every few ms: peek again only once the WAL moved
        elif self._log_restart_points:  # a batch with changes (never an idle poll: the record is WAL too)
            self._log_restart_point(pg)
        quiet = end == begin and upto - begin >= self.opts["quiet-advance-wal-bytes"]
        if quiet:  # the peek saw no transaction of the publication before `upto`: nothing to read up to there
            log.info("slot %s: no change of the publication's tables in %d bytes of WAL; moving on to %s", s.slot,
                     upto - begin, format_lsn(upto))
            end = upto
        if self._reported is not None:
            self._reported["lsn"] = format_lsn(end)
        return {"lsn": format_lsn(end), "quiet": True} if quiet else self._same_or(start, {"lsn": format_lsn(end)})

    def _log_restart_point(self, pg: Any) -> None:
        """Log a running-transactions record: where the slot can restart decoding. Every peek decodes from the slot's
        restart_lsn, which moves only past such records; the server logs one every 15 s, so without this a batch
        re-decoded up to 15 s of WAL before reaching its own (measured: docs/postgres.md, freshness)."""
        import psycopg

        if pg.info.server_version < 160000:  # pg_log_standby_snapshot() is PostgreSQL 16's
            self._log_restart_points = False
            return
        try:
            lsn = pg.execute("SELECT pg_log_standby_snapshot()::text").fetchone()[0]
        except psycopg.errors.InsufficientPrivilege:
            self._log_restart_points = False
            log.warning("slot %s: this role may not run pg_log_standby_snapshot(), so each micro-batch decodes from "
                        "the last running-transactions record the server logged (up to 15 s of WAL back). GRANT "
                        "EXECUTE ON FUNCTION pg_log_standby_snapshot() TO the role, or set "
                        "slot.log-restart-point=false to silence this.", self.stream.slot)
            return
        if self._reported is not None:
            self._reported["restart_point"] = lsn

    @staticmethod
    def _same_or(start: dict, end: dict) -> dict:
        """`start` itself when nothing moved: Spark runs a micro-batch for any offset that differs, marks included."""
        return start if end["lsn"] == start["lsn"] else end

    def _snapshot_end(self, start: dict, budget: int | None) -> dict:
        """Where a snapshot micro-batch ends: after the whole snapshot, or with a budget after the splits (planned
        once, then carried in the offsets) whose estimated rows fit it, at least one."""
        after = {"lsn": start["lsn"]}
        if budget is None:
            return after
        splits = start.get("splits")
        if splits is None:
            splits = self._plan_snapshot(start, budget)
        done = start.get("done", 0)
        taken, rows = done, 0
        while taken < len(splits) and (taken == done or rows + splits[taken][2] <= budget):
            rows += splits[taken][2]
            taken += 1
        if taken == len(splits):
            return after
        return {**after, "snapshot": start["snapshot"], "channel": start["channel"], "splits": splits,
                "done": taken}

    def _plan_snapshot(self, start: dict, budget: int) -> list[list]:
        """[table, where, estimated rows] of every split of the snapshot, about `budget` rows each."""
        shared = SharedSnapshot(start["snapshot"], start["channel"], start["lsn"])
        out: list[list] = []
        with self.stream.conn.connect_psycopg() as pg:
            for table in self.stream.tables:
                schema, name = table.split(".", 1)  # exact names, as resolve() joined them
                (rows,) = pg.execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n "
                                     "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                                     (schema, name)).fetchone()
                if not rows:  # never analyzed (or empty): count, once
                    (rows,) = pg.execute(f"SELECT count(*) FROM {qualified(schema, name)}").fetchone()
                wanted = self.opts["num-partitions"] or min(MAX_SNAPSHOT_SPLITS, max(1, -(-rows // budget)))
                splits = self._discover(table, _table_opts(self.opts, table, wanted), shared)
                out += [[table, split.info["where"], rows // len(splits)] for split in splits]
        return out

    def _discover(self, table: str, read_opts: Options, shared: SharedSnapshot) -> list[Split]:
        """The snapshot splits of one table, cut as format("postgres")'s reader cuts them."""
        enumerator = PostgresEnumerator(self.stream.conn, read_opts, list(self.stream.table_columns[table]),
                                        list(self.stream.primary_keys[table]))
        try:
            return enumerator.discover_in(shared)
        except PostgresError as e:
            raise self._snapshot_gone(e) from None

    def _advance(self, pg: Any, begin: int) -> int:
        """Check the slot (data loss), move it to `begin`, report retained WAL; returns where reading begins."""
        s = self.stream
        state = slot_state(pg, s.slot)
        lost = None
        if state is None:
            lost = f"replication slot '{s.slot}' does not exist any more"
        elif state.invalidated:
            lost = f"replication slot '{s.slot}' was invalidated: {state.why_invalidated()}"
        elif state.confirmed > begin:
            lost = (f"replication slot '{s.slot}' is at {format_lsn(state.confirmed)}, past this query's position "
                    f"{format_lsn(begin)} (another consumer used it)")
        if lost:
            what = f"{lost}: the changes from {format_lsn(begin)} on cannot be read"
            if self.opts["failOnDataLoss"]:
                raise DataLossError(f"{what}. Set .option('failOnDataLoss', 'false') to go on from the slot's "
                                    "position (re-created if needed), or start over: drop the slot and the checkpoint "
                                    "and start with snapshot=true")
            log.warning("%s; going on from the slot's position (failOnDataLoss=false)", what)
            if state is None or state.invalidated:
                if state is not None:
                    pg.execute("SELECT pg_drop_replication_slot(%s)", (s.slot,))
                return parse_lsn(self._create_slot(pg))
            return state.confirmed
        assert state is not None
        if state.confirmed < begin:
            _busy_retry(lambda: pg.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                           (s.slot, format_lsn(begin))), f"advancing slot '{s.slot}'", s.conn)
        self._reported = {"lsn": format_lsn(begin), "slot": s.slot, "retained_wal_bytes": state.retained_bytes,
                          "wal_status": state.wal_status}
        log.info("slot %s: position %s, %d bytes of WAL retained (%s)", s.slot, format_lsn(begin),
                 state.retained_bytes, state.wal_status)
        if state.retained_bytes > self.opts["retained-wal-warn-bytes"]:
            log.warning("replication slot %s holds back %d bytes of WAL on %s (more than retained-wal-warn-bytes=%d); "
                        "the query is behind, or stopped for long", s.slot, state.retained_bytes, s.conn.describe(),
                        self.opts["retained-wal-warn-bytes"])
        return begin

    def _cut(self, pg: Any, begin: int, upto: int, budget: int | None) -> int:
        """Where the next batch ends: `upto`, or after the last whole transaction within `budget` changes; `begin`
        when no transaction of the publication committed in between (no empty micro-batches)."""
        # A budget counts changes; the peek counts messages (a BEGIN and a COMMIT around each transaction's changes).
        # Without one, the first transaction tells whether there is anything new: only its BEGIN comes back.
        count = 1 if budget is None else 2 * budget + 16
        only_begins = " WHERE get_byte(data, 0) = 66" if budget is None else ""
        rows = _busy_retry(lambda: pg.execute(
            "SELECT get_byte(data, 0), CASE WHEN get_byte(data, 0) = 66 THEN substring(data FROM 2 FOR 8) END "
            f"FROM {self.stream.peek(format_lsn(upto), count)}{only_begins}").fetchall(),
            f"peeking slot '{self.stream.slot}'", self.stream.conn)
        txns: list[list[int]] = []  # [commit LSN, changes] of each transaction from `begin` on
        for kind, final in rows:
            if kind == 66:  # B
                commit = int.from_bytes(final, "big")
                if commit >= begin:
                    txns.append([commit, 0])
            elif kind in (73, 85, 68, 84) and txns:  # I U D T
                txns[-1][1] += 1
        if not txns:
            return begin
        if budget is None:
            return upto
        taken = total = 0
        for _, changes in txns:
            if taken and total + changes > budget:
                break
            taken += 1
            total += changes
        if taken == len(txns) and len(rows) < count:
            return upto  # the peek saw everything before `upto`, and it all fits
        return txns[taken - 1][0] + 1

    def reportLatestOffset(self) -> dict | None:
        return self._reported

    def plan_partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        if "snapshot" in start and ("splits" in start or "splits" in end):  # planned splits, some of them
            planned = start.get("splits") or end["splits"]
            first, stop_at = start.get("done", 0), end.get("done", len(planned))
            info = {"snapshot": start["snapshot"], "channel": start["channel"]}
            return [SnapshotPartition(table, Split(f"split-{i}", {**info, "where": where}), begin)
                    for i, (table, where, _) in enumerate(planned[first:stop_at], first)]
        if "snapshot" in start:
            shared = SharedSnapshot(start["snapshot"], start["channel"], start["lsn"])
            return [SnapshotPartition(table, split, begin) for table in self.stream.tables
                    for split in self._discover(table, self.stream.table_options[table], shared)]
        if end.get("quiet"):  # latestOffset saw no transaction of the publication in between
            return []
        return [ChangesPartition(begin, stop)] if stop > begin else []

    def _snapshot_gone(self, error: Exception) -> PostgresError:
        return PostgresError(
            f"the initial snapshot of slot '{self.stream.slot}' is gone ({error}); it lives only until micro-batch 0 "
            "is committed (or snapshot.timeout-s after its last split), and the query stopped before that. Start over: "
            f"drop the slot (sluice postgres drop-slot {self.stream.slot} --url ...) and the checkpoint")

    def commit(self, end: dict) -> None:
        if self._holder is not None and "snapshot" not in end:
            self._holder.cancel()  # micro-batch 0 is committed: the snapshot is not needed any more
            self._holder = None
        s = self.stream
        pg = self._guard.hold()
        state = slot_state(pg, s.slot)
        if state is not None and state.confirmed < parse_lsn(end["lsn"]):
            _busy_retry(lambda: pg.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                                           (s.slot, end["lsn"])), f"advancing slot '{s.slot}'", s.conn)

    def stop(self) -> None:
        if self._holder is not None:
            self._holder.release_pipes()
        self._guard.release()

    # ------------------------------------------------------------------ executors
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotPartition):
            yield from self._read_snapshot(partition)
        else:
            assert isinstance(partition, ChangesPartition)
            yield from self._read_changes(partition)

    def _read_snapshot(self, part: SnapshotPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.types import StructType as ST

        cols = self.stream.table_columns[part.table]
        table_schema = ST([self.schema[name] for name, _ in cols])
        reader = PostgresSplitReader(self.stream.conn, self.stream.table_options[part.table], list(cols), table_schema)
        try:
            for batch in reader.read(part.split, 0, 1):
                n = batch.num_rows
                by_name = {name: batch.column(name) for name, _ in cols}
                by_name |= {OP: pa.array(["insert"] * n, pa.string()), LSN: pa.array([part.lsn] * n, pa.int64()),
                            COMMIT_TIME: pa.nulls(n, pa.timestamp("us", tz="UTC")), XID: pa.nulls(n, pa.int64()),
                            TABLE: pa.array([part.table] * n, pa.string())}
                yield pa.RecordBatch.from_arrays(
                    [by_name[f.name] if f.name in by_name else pa.nulls(n, f.type) for f in self.arrow_schema],
                    schema=self.arrow_schema)
        except PostgresError as e:
            if "shared snapshot" in str(e):
                raise self._snapshot_gone(e) from None
            raise

    def _read_changes(self, part: ChangesPartition) -> Iterator[pa.RecordBatch]:
        """The batch's changes, range by range (wal_ranges), each range's fetch running while the one before it is
        decoded and written. A range holds the transactions whose commit record starts in it: its decoder keeps only
        those, and its slot copy, advanced to the range's start, skips the ones before on the server."""
        s = self.stream
        ranges = wal_ranges(part.start, part.end, self.opts["fetch-ranges"])
        table_columns = {t: [c for c, _ in s.table_columns[t]] for t in s.tables}
        whole_publication = None if self.opts["table"] else s.publication
        pool = ThreadPoolExecutor(1, thread_name_prefix="sluice-fetch")
        ahead: Future[RangeFetch] | None = None
        try:
            for i, (low, high) in enumerate(ranges):
                fetch = ahead.result() if ahead is not None else self._fetch(low, high, copy=False)
                ahead = pool.submit(self._fetch, *ranges[i + 1], copy=True) if i + 1 < len(ranges) else None
                decoder = ChangeDecoder(self.arrow_schema, s.columns, low, high, table_columns, self._gone_columns,
                                        whole_publication, s.primary_keys)
                with fetch:
                    for messages in fetch.arrays():
                        # Slices let Spark convert and write one while the next is decoded.
                        for first in range(0, len(messages), DECODE_SLICE):
                            yield from decoder.feed(messages.slice(first, DECODE_SLICE))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            if ahead is not None:  # the query stopped reading: close the next range's session when it is open
                ahead.add_done_callback(_close_fetched)

    def _fetch(self, low: int, high: int, *, copy: bool) -> RangeFetch:
        """The pgoutput messages of the transactions committed before `high`, streaming in record batches (a large
        transaction never sits in memory whole); with `copy`, from a temporary copy of the slot advanced to `low`
        (dropped with the session), so the server sends only [low, high). Returns once the first batch is in, that
        is once the server finished the peek."""
        s = self.stream
        conn = s.conn.connect()
        cur = conn.cursor()
        try:
            for statement in _SESSION:
                cur.execute(statement)
            slot = self._copy_slot(cur, low) if copy else s.slot
            _busy_retry(lambda: cur.execute(f"SELECT data FROM {s.peek(format_lsn(high), None, slot)}"),
                        f"reading changes of slot '{slot}'", s.conn)
            batches = iter(cur.fetch_record_batch())
            first = next(batches, None)
            if slot == s.slot:
                # Checked after the peek (it computes its whole result before the first row), which starts at the
                # slot's position: moved past `low` by then, the peek missed the changes in between; moved later,
                # it had them all. The ADBC session is busy streaming: ask on another.
                with s.conn.connect_psycopg() as pg:
                    self._check_position(pg.cursor(), s.slot, low)
            return RangeFetch(conn, cur, batches, first)
        except BaseException:
            cur.close()
            conn.close()
            raise

    def _gone_columns(self, table: str, names: list[str]) -> list[str]:
        """Which of `names` `table` no longer has (asked only when a change carries a column the schema lacks)."""
        with self.stream.conn.connect_psycopg() as pg:
            present = {name for name, _ in describe_columns(pg.cursor(), self.stream.table_options[table])}
        return [c for c in names if c not in present]

    def _copy_slot(self, cur: Any, low: int) -> str:
        """A temporary copy of the slot, at `low`; the slot itself when the server has no slot free for it."""
        s = self.stream
        copy = f"sluice_tmp_{uuid.uuid4().hex[:16]}"
        try:
            # ADBC reads a function's record result as a nested row it cannot convert: select a constant.
            cur.execute(f"SELECT 1 FROM pg_copy_logical_replication_slot({quote_literal(s.slot)}, "
                        f"{quote_literal(copy)}, true)")
            cur.fetchall()
        except Exception as e:
            if sqlstate_of(e) != _NO_FREE_SLOT:
                raise PostgresError(f"copying slot '{s.slot}' on {s.conn.describe()} failed: {s.conn.scrub(e)}; "
                                    "set fetch-ranges=1 to read each micro-batch in one fetch, without copies",
                                    sqlstate_of(e)) from None
            log.warning("no replication slot free for a copy of slot %s on %s (max_replication_slots): the server "
                        "decodes this micro-batch from its start again for the range from %s; raise "
                        "max_replication_slots or set fetch-ranges=1", s.slot, s.conn.describe(), format_lsn(low))
            return s.slot
        if self._check_position(cur, copy, low):  # the copy starts where the slot was: before `low`, as it should
            cur.execute(f"SELECT 1 FROM pg_replication_slot_advance({quote_literal(copy)}, "
                        f"{quote_literal(format_lsn(low))}::pg_lsn)")
            cur.fetchall()
        return copy

    def _check_position(self, cur: Any, slot: str, low: int) -> bool:
        """Whether `slot` is still at or before `low` (else data loss: someone else moved the query's slot while a
        micro-batch was read; the planning checked it before)."""
        cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                    f"WHERE slot_name = {quote_literal(slot)}")
        rows = cur.fetchall()
        at = parse_lsn(rows[0][0]) if rows and rows[0][0] else None
        if at is not None and at <= low:
            return True
        where = "does not exist any more" if at is None else f"is at {format_lsn(at)}"
        what = (f"replication slot '{self.stream.slot}' {where}, past the start {format_lsn(low)} of the changes this "
                "micro-batch reads (another consumer moved it while the batch was read): the changes in between are "
                "gone for this query")
        if self.opts["failOnDataLoss"]:
            raise DataLossError(f"{what}. Give each query its own slot; set .option('failOnDataLoss', 'false') to go "
                                "on without them")
        log.warning("%s; going on without them (failOnDataLoss=false)", what)
        return False


class PostgresChangesDataSource(EngineDataSource):
    """`spark.readStream.format("postgres_changes")`: see the module docstring; docs/postgres.md."""

    format_name = "postgres_changes"
    read_spec = CHANGES_SPEC
    read_only = True

    def _plan(self, schema: StructType, overwrite: bool, streaming: bool) -> Any:
        raise OptionError("format 'postgres_changes' is read-only (spark.readStream); write with format('postgres')")

    def schema(self) -> StructType:
        return spark_schema(resolve(CHANGES_SPEC.parse(self.options)))

    def reader(self, schema: StructType) -> Any:
        raise OptionError("format 'postgres_changes' is a stream (spark.readStream); for a batch read of the tables "
                          "use format('postgres')")

    def streamReader(self, schema: StructType) -> ChangeStreamReader:
        opts = CHANGES_SPEC.parse(self.options)
        return ChangeStreamReader(resolve(opts), opts, schema)


# ------------------------------------------------------------------------------------------------ operations
@dataclass(frozen=True)
class SlotInfo:
    name: str
    database: str
    active: bool
    confirmed: str | None
    retained_bytes: int
    wal_status: str | None
    query: str | None = None  # the running query holding it (slot_holder), if any


def list_slots(conn: Connection, prefix: str = "sluice_") -> list[SlotInfo]:
    """The logical replication slots whose names start with `prefix` (sluice's default names), with retained WAL."""
    with conn.connect_psycopg() as pg:
        rows = pg.execute("SELECT slot_name::text, database::text, active, confirmed_flush_lsn::text, "
                          "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint, wal_status "
                          "FROM pg_replication_slots WHERE slot_type = 'logical' AND NOT temporary "
                          "AND starts_with(slot_name, %s) "
                          "ORDER BY 1", (prefix,)).fetchall()
        return [SlotInfo(*row, query=slot_holder(pg, row[0])) for row in rows]


def drop_slot(conn: Connection, slot: str, *, publication: bool = True, force: bool = False) -> None:
    """Drop a slot (the server keeps WAL for it until then) and the publication sluice created under its name; a
    slot a running query holds only with `force`."""
    with conn.connect_psycopg() as pg:
        if pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is None:
            raise OptionError(f"there is no replication slot '{slot}' on {conn.describe()} (sluice postgres slots "
                              "lists them)")
        holder = slot_holder(pg, slot)
        if holder is not None and not force:
            raise OptionError(f"replication slot '{slot}' is in use by a running query ({holder}): dropping it is "
                              "data loss for that query. Stop the query first, or force it (--force)")
        _busy_retry(lambda: pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,)), f"dropping slot '{slot}'",
                    conn)
        if publication:
            pg.execute(f"DROP PUBLICATION IF EXISTS {quote_ident(slot)}")
