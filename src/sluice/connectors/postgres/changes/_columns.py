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


def read_columns(pg: Any, tables: Iterable[str], streamed: dict[str, Sequence[str]]
                 ) -> tuple[tuple[TableColumns, ...], dict[str, tuple[int, ...]]]:
    """The attribute numbers of each table's `streamed` columns, and of its dropped ones, off the catalog (`pg`: a
    psycopg connection)."""
    out, dropped = [], {}
    for table in tables:
        schema, name = table.split(".", 1)
        rows = pg.execute("SELECT c.oid::bigint, a.attnum::int, a.attname::text, a.attisdropped FROM pg_attribute a "
                          "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
                          "n.nspname = %s AND c.relname = %s AND a.attnum > 0 ORDER BY a.attnum",
                          (schema, name)).fetchall()
        wanted = set(streamed[table])
        out.append(TableColumns(table, int(rows[0][0]) if rows else 0,
                                tuple((n, col) for _, n, col, gone in rows if col in wanted and not gone)))
        dropped[table] = tuple(n for _, n, _, gone in rows if gone)
    return tuple(out), dropped


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
