"""What the driver learns about the server and the target table once: version, columns and types, engine, sorting
key, ReplacingMergeTree's version and is_deleted columns, and whether inserts are deduplicated."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.connector import OptionError, case_hint
from sluice.connectors.clickhouse._client import Connection, quote_literal
from sluice.connectors.clickhouse._types import CHType, column_type

# The oldest ClickHouse sluice talks to: 23.3, the oldest LTS release of those users run (ClickHouse supports a
# release for a year, an LTS for two). Everything sluice relies on is older than it: ArrowStream in and out,
# insert_deduplication_token (22.2), ReplacingMergeTree(ver, is_deleted) (23.2).
MINIMUM_VERSION = (23, 3)

# ReplicatedMergeTree and ClickHouse Cloud's SharedMergeTree families deduplicate inserted blocks by default.
_DEDUPLICATING_PREFIXES = ("Replicated", "Shared")
_WINDOW = re.compile(r"\bnon_replicated_deduplication_window\s*=\s*(\d+)")


@dataclass(frozen=True)
class TableInfo:
    spelled: dict[str, str]  # every column's ClickHouse type as spelled, in table order
    defaults: frozenset[str]  # columns with a DEFAULT / MATERIALIZED / ALIAS expression
    engine: str
    sorting_key: tuple[str, ...]
    version_column: str | None  # ReplacingMergeTree(ver)
    is_deleted_column: str | None  # ReplacingMergeTree(ver, is_deleted)
    deduplicates: bool  # inserts with the same insert_deduplication_token are applied once
    server_version: str

    @property
    def replacing(self) -> bool:
        return self.engine.endswith("ReplacingMergeTree")

    def column_types(self, columns: list[str]) -> dict[str, CHType]:
        """The types of `columns`, refusing those sluice cannot handle (the error names column and type)."""
        return {name: column_type(name, self.spelled[name]) for name in columns}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:4])


def _engine_columns(engine: str, engine_full: str) -> list[str]:
    """The column arguments of `engine(...)` in engine_full: ReplacingMergeTree(ver, is_deleted), without the
    quoted ZooKeeper path and replica name of the Replicated variants."""
    match = re.search(re.escape(engine) + r"\(([^)]*)\)", engine_full)
    if match is None:
        return []
    args = [a.strip() for a in match.group(1).split(",") if a.strip()]
    return [a.strip("`") for a in args if not a.startswith("'")]


def describe(conn: Connection) -> TableInfo:
    """One look at the server's version, system.tables and system.columns."""
    version = conn.rows("SELECT version()")[0][0]
    if _version(version)[:2] < MINIMUM_VERSION:
        raise OptionError(
            f"ClickHouse {version} at {conn.url} is older than {'.'.join(map(str, MINIMUM_VERSION))}, the oldest "
            "version sluice supports (it inserts and reads Arrow, deduplicates retried inserts with "
            "insert_deduplication_token and deletes through ReplacingMergeTree(ver, is_deleted)). Upgrade the "
            "server: every release before it is out of ClickHouse's support.")
    db, table = quote_literal(conn.database), quote_literal(conn.table)
    found = conn.rows(f"SELECT engine, engine_full, sorting_key FROM system.tables WHERE database = {db} AND "
                      f"name = {table}")
    if not found:
        near = conn.rows(f"SELECT name FROM system.tables WHERE database = {db} AND lower(name) = lower({table})")
        hint = case_hint(conn.table, [name for name, in near], f"database {conn.database}")
        raise OptionError(f"table {conn.database}.{conn.table} does not exist on {conn.url}{hint}; create it first "
                          "(sluice does not guess a ClickHouse engine and sorting key for you).")
    engine, engine_full, sorting = found[0]
    rows = conn.rows(f"SELECT name, type, default_kind FROM system.columns WHERE database = {db} AND table = {table} "
                     "ORDER BY position")
    version_column = is_deleted = None
    if engine.endswith("ReplacingMergeTree"):
        args = _engine_columns(engine, engine_full)
        version_column = args[0] if args else None
        is_deleted = args[1] if len(args) > 1 else None
    return TableInfo({name: spelled for name, spelled, _ in rows}, frozenset(name for name, _, kind in rows if kind),
                     engine, tuple(c.strip() for c in sorting.split(",") if c.strip()), version_column, is_deleted,
                     _deduplicates(conn, engine, engine_full), version)


def _deduplicates(conn: Connection, engine: str, engine_full: str) -> bool:
    if engine.startswith(_DEDUPLICATING_PREFIXES):
        return True
    if not engine.endswith("MergeTree"):
        return False
    window = _WINDOW.search(engine_full)
    if window is None:  # the server's default for MergeTree tables (0 unless its config says otherwise)
        found = conn.rows("SELECT value FROM system.merge_tree_settings WHERE name = "
                          "'non_replicated_deduplication_window'")
        return bool(found) and int(found[0][0]) > 0
    return int(window.group(1)) > 0
