"""Which column is which across a restart: each streamed table's columns by attribute number, as the query that
wrote an offset saw them (ChangeOffset.columns), against the restarted query's.

A query's schema is fixed when it starts, so a RENAME COLUMN stops it and the restarted query reads the new name.
The micro-batch it replays still holds changes sent under the old name (pgoutput's Relation messages name columns,
not their attribute numbers). PostgreSQL keeps a column's attribute number through a rename (pg_attribute.attnum),
and never reuses one in the same table (pg_class.oid), so the offsets carry both and the names are matched exactly,
not guessed from positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sluice.connector import SourceColumn


@dataclass(frozen=True)
class TableColumns:
    """One table's streamed columns: (attribute number, name) each, in attribute order."""

    table: str  # schema.name
    relid: int  # pg_class.oid: a table dropped and created again under the name is another table
    columns: tuple[tuple[int, str], ...]

    def to_json(self) -> list[Any]:
        return [self.table, self.relid, [list(c) for c in self.columns]]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> TableColumns:
        table, relid, columns = raw
        return cls(str(table), int(relid), tuple((int(n), str(name)) for n, name in columns))


TypeIds = dict[str, tuple[int, int]]  # column -> (pg_attribute.atttypid, atttypmod), as pgoutput's Relation sends


@dataclass(frozen=True)
class Catalog:
    """What the driver reads of each streamed table's columns when the query starts."""

    identities: tuple[TableColumns, ...]
    dropped: dict[str, tuple[int, ...]]  # the attribute numbers of each table's dropped columns
    types: dict[str, TypeIds]  # each table's columns' types: a Relation message with others is an ALTER TYPE


def read_columns(pg: Any, tables: Iterable[str], streamed: dict[str, Sequence[str]]) -> Catalog:
    """The attribute numbers and types of each table's `streamed` columns, and its dropped attribute numbers, off
    the catalog (`pg`: a psycopg connection)."""
    out, dropped, types = [], {}, {}
    for table in tables:
        rows = column_rows(pg, table)
        wanted = set(streamed[table])
        out.append(TableColumns(table, rows[0][0] if rows else 0,
                                tuple((n, col) for _, n, col, gone, *_ in rows if col in wanted and not gone)))
        dropped[table] = tuple(n for _, n, _, gone, *_ in rows if gone)
        types[table] = {col: (oid, mod) for _, _, col, gone, oid, mod in rows if col in wanted and not gone}
    return Catalog(tuple(out), dropped, types)


def column_rows(pg: Any, table: str) -> list[tuple[int, int, str, bool, int, int]]:
    """(table oid, attnum, name, dropped, type oid, typmod) of each of `table`'s columns, in attribute order."""
    schema, name = table.split(".", 1)
    return pg.execute("SELECT c.oid::bigint, a.attnum::int, a.attname::text, a.attisdropped, a.atttypid::bigint, "
                      "a.atttypmod FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON "
                      "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 ORDER BY "
                      "a.attnum", (schema, name)).fetchall()


def source_marks(identities: Iterable[TableColumns], dropped: dict[str, tuple[int, ...]]
                 ) -> dict[str, list[SourceColumn]]:
    """Per column name, where it comes from in each streamed table that has it (the Spark schema's marks, which
    schema.evolution=full reads in the sinks)."""
    marks: dict[str, list[SourceColumn]] = {}
    for t in identities:
        for n, name in t.columns:
            marks.setdefault(name, []).append(SourceColumn(f"{t.table}:{t.relid}", n, dropped.get(t.table, ())))
    return marks


@dataclass(frozen=True)
class Renamed:
    """One table's renames since an offset: `before`, its columns as that offset's query streamed them; `to`, each
    renamed column's new name."""

    before: tuple[str, ...]
    to: dict[str, str]

    def under_new_names(self, columns: list[str]) -> list[str]:
        """A Relation message's columns with renamed ones under their new names. A message naming exactly the
        columns of `before`, in order, is from before the renames (a swap of two names included); any other is
        from after one of them, and a column keeps its name where its new name is in the message already."""
        if tuple(columns) == self.before:
            return [self.to.get(c, c) for c in columns]
        return [self.to[c] if c in self.to and self.to[c] not in columns else c for c in columns]


def renamed(before: Iterable[TableColumns] | None, now: Iterable[TableColumns]) -> dict[str, Renamed]:
    """Per table, the columns renamed between `before` (an offset's; None when the offset predates them) and `now`:
    the same table (relid) and attribute number under another name."""
    if before is None:
        return {}
    old = {t.table: t for t in before}
    out: dict[str, Renamed] = {}
    for table in now:
        was = old.get(table.table)
        if was is None or was.relid != table.relid:
            continue
        names = dict(was.columns)
        moves = {names[n]: name for n, name in table.columns if n in names and names[n] != name}
        if moves:
            out[table.table] = Renamed(tuple(name for _, name in was.columns), moves)
    return out
