"""What the driver learns about the target table once: columns and types, engine, sorting key, version column."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.connector import OptionError
from sluice.connectors.clickhouse._client import Connection, quote_literal
from sluice.connectors.clickhouse._native import ColumnType

# Engines whose rows of one sorting key collapse to the last version (upsert tables).
REPLACING = "ReplacingMergeTree"


@dataclass(frozen=True)
class TableInfo:
    types: dict[str, str]  # every column's ClickHouse type as spelled, in table order
    defaults: frozenset[str]  # columns with a DEFAULT / MATERIALIZED / ALIAS expression
    engine: str
    sorting_key: tuple[str, ...]
    version_column: str | None  # ReplacingMergeTree(ver)

    @property
    def replacing(self) -> bool:
        return self.engine == REPLACING

    def column_types(self, columns: list[str]) -> dict[str, ColumnType]:
        """The types of `columns`, refusing those sluice cannot handle (the error names column and type)."""
        return {name: ColumnType.parse(name, self.types[name]) for name in columns}


def describe(conn: Connection) -> TableInfo:
    """One look at system.tables and system.columns (ClickHouse 18.16 lists a table's columns in table order)."""
    db, table = quote_literal(conn.database), quote_literal(conn.table)
    found = conn.rows(f"SELECT engine, engine_full, sorting_key FROM system.tables WHERE database = {db} AND "
                      f"name = {table}")
    if not found:
        near = conn.rows(f"SELECT name FROM system.tables WHERE database = {db} AND lower(name) = lower({table})")
        hint = f" (there is '{near[0][0]}': names are case-sensitive)" if near else ""
        raise OptionError(f"table {conn.database}.{conn.table} does not exist on {conn.url}{hint}; create it first "
                          "(sluice does not guess a ClickHouse engine and sorting key for you).")
    engine, engine_full, sorting = found[0]
    rows = conn.rows(f"SELECT name, type, default_kind FROM system.columns WHERE database = {db} AND table = {table}")
    version = None
    if engine == REPLACING:
        match = re.search(r"ReplacingMergeTree\((\w+)\)", engine_full)
        version = match.group(1) if match else None
    return TableInfo({name: spelled for name, spelled, _ in rows}, frozenset(name for name, _, kind in rows if kind),
                     engine, tuple(c.strip() for c in sorting.split(",") if c.strip()), version)
