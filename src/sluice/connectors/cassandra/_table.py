"""What the driver learns about the target table once per write or read: columns and their CQL types, the
partition key and clustering columns, from the driver's schema metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.connector import OptionError, case_hint
from sluice.connectors.cassandra._client import Connection, forget_session
from sluice.connectors.cassandra._types import CQLType, parse


@dataclass(frozen=True)
class TableInfo:
    columns: dict[str, CQLType]  # every column in table order
    partition_key: tuple[str, ...]
    clustering: tuple[str, ...]
    replication: str  # for messages: the keyspace's replication strategy
    indexes: dict[str, str] = field(default_factory=dict)  # indexed column -> index class (sai, a class name)

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self.partition_key + self.clustering

    def key_description(self) -> str:
        clustering = f", clustering columns {list(self.clustering)}" if self.clustering else ""
        return f"partition key {list(self.partition_key)}{clustering}"


def _refreshed(conn: Connection) -> Any:
    cluster = conn.session().cluster
    metadata = cluster.metadata
    if conn.keyspace in metadata.keyspaces:
        cluster.refresh_table_metadata(conn.keyspace, conn.table)
    if conn.keyspace not in metadata.keyspaces or conn.table not in metadata.keyspaces[conn.keyspace].tables:
        cluster.refresh_schema_metadata()
    return metadata


def _found(what: str, name: str, where: str, known: dict[str, Any]) -> Any:
    """The keyspace or table `name` of `known`; refuses a missing one, with the case hint and what there is."""
    if name not in known:
        names = sorted(known)
        raise OptionError(f"{what} '{name}' does not exist {where}{case_hint(name, names, None)}; {what}s: {names}. "
                          f"Create it (CREATE {what.upper()} ...) or fix the option {what}.")
    return known[name]


def describe(conn: Connection) -> TableInfo:
    """The table as the cluster knows it now: the process's driver session is shared and long-lived, so its
    schema metadata is refreshed first (it may predate the table, or a column added since)."""
    from cassandra import DriverException

    try:
        metadata = _refreshed(conn)
    except DriverException:  # the cached session lost its control connection (a restarted node): connect anew
        forget_session(conn)
        metadata = _refreshed(conn)
    keyspace = _found("keyspace", conn.keyspace, f"at {conn.display}", metadata.keyspaces)
    table = _found("table", conn.table, f"in keyspace '{conn.keyspace}'", keyspace.tables)

    def user_type(name: str) -> list[tuple[str, str]] | None:
        name = name.strip('"')
        if name not in keyspace.user_types:  # made after this process's session learned the keyspace
            conn.session().cluster.refresh_user_type_metadata(conn.keyspace, name)
        found = metadata.keyspaces[conn.keyspace].user_types.get(name)
        return None if found is None else list(zip(found.field_names, found.field_types, strict=True))

    columns = {name: parse(column.cql_type, user_type) for name, column in table.columns.items()}
    return TableInfo(columns, tuple(c.name for c in table.partition_key), tuple(c.name for c in table.clustering_key),
                     str(keyspace.replication_strategy.export_for_schema()), _indexes(table))


def _indexes(table: Any) -> dict[str, str]:
    """The table's indexes on whole columns, by column: a custom index's class (`sai` as CREATE INDEX ... USING
    'sai' keeps it), `legacy` for Cassandra's original secondary index."""
    out: dict[str, str] = {}
    for index in table.indexes.values():
        target = index.index_options.get("target", "").strip('"')
        if target and "(" not in target:  # keys(m), values(m), entries(m), full(f): not the column's values
            found = index.index_options.get("class_name", "legacy")
            if out.get(target) is None or is_sai_class(found):
                out[target] = found
    return out


def is_sai_class(index_class: str) -> bool:
    """Whether an index's class (its CREATE INDEX ... USING, as the schema keeps it) is a storage-attached index."""
    return index_class.lower() in ("sai", "storageattachedindex") or index_class.endswith(".StorageAttachedIndex")
