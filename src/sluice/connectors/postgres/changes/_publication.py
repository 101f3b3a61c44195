"""What the driver resolves before a change stream starts: the publication (created for option 'table' if needed),
its tables and the columns their changes carry, and the stream's Spark schema."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType, TimestampType

from sluice.connector import OptionError, from_arrow_schema, source_metadata
from sluice.connectors.postgres._client import (
    Connection,
    PostgresError,
    qualified,
    quote_ident,
    quote_literal,
    split_qualified,
    sqlstate_of,
)
from sluice.connectors.postgres._options import READ_SPEC, ReadOptions
from sluice.connectors.postgres._pgmessages import MESSAGES_SCHEMA
from sluice.connectors.postgres._pgoutput import COMMIT_TIME, LSN, METADATA_COLUMNS, OP, TABLE, UNCHANGED, XID
from sluice.connectors.postgres._source import infer_schema, spark_type
from sluice.connectors.postgres.changes._columns import TableColumns, TypeIds, read_columns, source_marks
from sluice.connectors.postgres.changes._options import ChangeOptions

log = logging.getLogger("sluice.postgres")

_PEEK = ("pg_logical_slot_peek_binary_changes({slot}, {upto}, {count}, 'proto_version', '1', "
         "'publication_names', {publication}{messages})")


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
    table_options: dict[str, ReadOptions]  # each table's options for format("postgres")'s snapshot reader
    messages: tuple[str, ...] = ()  # the prefixes of the logical decoding messages streamed (messages.prefix)
    identities: tuple[TableColumns, ...] = ()  # each table's columns by attribute number (_columns.py)
    dropped: dict[str, tuple[int, ...]] = field(default_factory=dict)  # each table's dropped attribute numbers
    type_ids: dict[str, TypeIds] = field(default_factory=dict)  # each table's columns' type oids and modifiers

    def peek(self, upto: str, count: int | None, slot: str | None = None) -> str:
        return _PEEK.format(slot=quote_literal(slot or self.slot), upto=f"{quote_literal(upto)}::pg_lsn",
                            count="NULL" if count is None else int(count),
                            publication=quote_literal(quote_ident(self.publication)),
                            messages=", 'messages', 'true'" if self.messages else "")


def default_slot(conn: Connection, tables: Sequence[str], publication: str | None) -> str:
    digest = hashlib.sha1(f"{conn.dbname}|{','.join(sorted(tables))}|{publication or ''}".encode()).hexdigest()
    return f"sluice_{digest[:12]}"


def resolve(options: ChangeOptions) -> ChangeStream:
    """On the driver: the publication's tables (created for `table` if needed) and their columns."""
    conn = options.conn
    if options.messages_prefix:
        return _resolve_messages(options)
    wanted = [".".join(split_qualified(t)) for t in options.table]
    slot = _checked_slot(options.slot or default_slot(conn, wanted, options.publication))
    publication = options.publication or slot
    with conn.connect_psycopg() as pg:
        version = _check_server(pg, conn)
        if options.slot_failover and version < 170000:
            raise OptionError(f"option 'slot.failover' needs PostgreSQL 17 or later (failover slots); "
                              f"{conn.describe()} runs {version // 10000}.{version % 100}. Remove the option, or "
                              "upgrade the server")
        published = _published_tables(pg, publication)
        if published is not None:
            _warn_unpublished_operations(pg, publication)
        if published is None:
            if options.publication:
                raise OptionError(f"publication '{publication}' does not exist on {conn.describe()} "
                                  "(option 'publication'); create it, or name the tables with option 'table'")
            # A missing table is named as such, not as a failed CREATE PUBLICATION.
            _describe(conn, {t: table_opts(options, t) for t in wanted})
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
    table_options = {t: table_opts(options, t) for t in tables}
    columns, table_columns, keys = _describe(conn, table_options, column_lists)
    with conn.connect_psycopg() as pg:
        catalog = read_columns(pg, tables, {t: [c for c, _ in cols] for t, cols in table_columns.items()})
    return ChangeStream(conn, slot, publication, tuple(tables), columns, table_columns, keys, table_options,
                        identities=catalog.identities, dropped=catalog.dropped, type_ids=catalog.types)


def _resolve_messages(options: ChangeOptions) -> ChangeStream:
    """A stream of logical decoding messages: pgoutput needs a publication, which here has no tables (their changes
    would be decoded and sent only to be dropped)."""
    conn = options.conn
    slot = _checked_slot(options.slot or default_slot(conn, [f"messages:{p}" for p in options.messages_prefix],
                                                      options.publication))
    publication = options.publication or slot
    with conn.connect_psycopg() as pg:
        version = _check_server(pg, conn)
        if version < 140000:
            raise OptionError(f"option 'messages.prefix' needs PostgreSQL 14 or later (pgoutput sends logical "
                              f"decoding messages from 14 on); {conn.describe()} runs {version // 10000}. Remove "
                              "the option, or upgrade the server")
        published = _published_tables(pg, publication)
        if published:
            raise OptionError(f"publication '{publication}' (option 'publication') has tables {published}: a stream "
                              "of messages (messages.prefix) reads a publication without tables, since their changes "
                              "would be decoded and sent only to be dropped. Name one without tables "
                              f"(CREATE PUBLICATION name), or leave 'publication' out")
        if published is None:
            if options.publication:
                raise OptionError(f"publication '{publication}' does not exist on {conn.describe()} "
                                  "(option 'publication'); create it without tables, or leave the option out")
            try:
                pg.execute(f"CREATE PUBLICATION {quote_ident(publication)}")
            except Exception as e:
                raise PostgresError(f"could not create publication '{publication}' (no tables: pgoutput needs one "
                                    f"to send messages) on {conn.describe()}: {conn.scrub(e)}; create it yourself "
                                    "and pass option 'publication'", sqlstate_of(e)) from None
    return ChangeStream(conn, slot, publication, (), {}, {}, {}, {}, tuple(options.messages_prefix))


def _checked_slot(slot: str) -> str:
    if len(slot) > 63 or not slot.replace("_", "").isalnum() or slot != slot.lower():
        raise OptionError(f"option 'slot': {slot!r} is not a valid replication slot name (lower-case letters, "
                          "digits and _, at most 63)")
    return slot


def _describe(conn: Connection, table_options: dict[str, ReadOptions],
              column_lists: dict[str, list[str]] | None = None) -> tuple[dict[str, str], dict, dict]:
    """(column -> PostgreSQL type over all tables, each table's columns, each table's primary key). A table whose
    changes carry only some columns (`column_lists`, sent_columns) has those only, and the snapshot reads the same."""
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


def table_opts(options: ChangeOptions, table: str, partitions: int | None = None) -> ReadOptions:
    """The options of a batch read of one table in the snapshot (format("postgres")'s reader takes them)."""
    raw = {**options.connection, "table": _quoted(table),
           "num-partitions": str(options.num_partitions if partitions is None else partitions),
           "snapshot.timeout-s": str(options.snapshot_timeout_s)}
    return ReadOptions.of(READ_SPEC.parse(raw))


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
    flags = pg.execute("SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
                       (publication,)).fetchone()
    left_out = [op for op, published in zip(("insert", "update", "delete", "truncate"), flags, strict=True)
                if not published]
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
    if stream.messages:
        return from_arrow_schema(MESSAGES_SCHEMA)
    # Each column marked with its source (_columns.source_marks): schema.evolution=full in the sinks reads it.
    marks = source_marks(stream.identities, stream.dropped)
    fields = [StructField(name, spark_type(pg_type)[0], True, source_metadata(marks.get(name, ())))
              for name, pg_type in stream.columns.items()]
    return StructType([*fields, StructField(OP, StringType(), False), StructField(LSN, LongType(), False),
                       StructField(COMMIT_TIME, TimestampType(), True), StructField(XID, LongType(), True),
                       StructField(TABLE, StringType(), False), StructField(UNCHANGED, ArrayType(StringType()), True)])

