"""schema.evolution=full in the postgres sink: the target follows its source's renames, drops and widened types.

A change capture source marks each DataFrame column with where it comes from (sluice.connector.SourceColumn: its
table and the column's id there, which a rename keeps). The sink remembers, in a table of its own in the target's
schema (`sluice_column_sources`: target table, column, source column), which target column holds which source
column. With that:
- a DataFrame column the target lacks whose source column the target holds under another name is that column
  renamed: `ALTER TABLE ... RENAME COLUMN`, so its rows keep their values;
- a target column whose source column the source lists as dropped, and which the DataFrame lacks, is dropped;
- a column the DataFrame carries in a wider type than the target's (smallint < integer < bigint, real < double
  precision, numeric with more digits on either side of the point) is widened: `ALTER COLUMN ... TYPE`;
- any other column the target lacks is added, as add-columns does.
A column the sink never wrote under full has no memory: its rename is seen as a new column (add-columns'
behaviour). Every statement is idempotent (a replayed micro-batch, a second writer), and they run where add-columns'
do: before any row of the write, or in the commit's transaction when staged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql.types import DataType, StructField

from sluice.connector import source_columns
from sluice.connectors.postgres._client import qualified, quote_ident, quote_literal

MEMORY_TABLE = "sluice_column_sources"

_INTEGERS = ("smallint", "integer", "bigint")
_FLOATS = ("real", "double precision")
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")


def widens(target: str, wanted: str) -> bool:
    """Whether PostgreSQL type `wanted` holds every value of `target` and more (format_type spellings)."""
    for ladder in (_INTEGERS, _FLOATS):
        if target in ladder and wanted in ladder:
            return ladder.index(wanted) > ladder.index(target)
    old, new = _NUMERIC.fullmatch(target), _NUMERIC.fullmatch(wanted)
    if old and new:
        (p, s), (p2, s2) = (int(g) for g in old.groups()), (int(g) for g in new.groups())
        return (p2, s2) != (p, s) and p2 - s2 >= p - s and s2 >= s
    return False


def _widenable(target: str) -> bool:
    """Whether `widens` knows `target`'s type (other columns are left to the sink's own type check)."""
    return target in _INTEGERS or target in _FLOATS or _NUMERIC.fullmatch(target) is not None


def remembered(cur: Any, schema: str, table: str) -> dict[str, str]:
    """Which source column (SourceColumn.key) each column of the target holds, as the sink last recorded it."""
    memory = qualified(schema, MEMORY_TABLE)
    cur.execute("SELECT to_regclass($1)::oid::bigint", parameters=(memory,))
    if cur.fetchone()[0] is None:
        return {}
    cur.execute(f"SELECT column_name, source FROM {memory} WHERE target = $1", parameters=(table,))
    return dict(cur.fetchall())


def full_statements(cur: Any, schema: str, table: str, target: dict[str, str], fields: Sequence[StructField],
                    add_sql: Callable[[StructField], str], pg_type: Callable[[str, DataType], str]) -> tuple[str, ...]:
    """The statements that bring table `schema.table` (its columns and types, `target`) to the DataFrame's `fields`
    under schema.evolution=full, and record what each column holds; `add_sql(field)`: add-columns' statement for a
    new column; `pg_type`: create-table's type of a Spark type. Empty when nothing changes."""
    rel = qualified(schema, table)
    memory = remembered(cur, schema, table)
    held = {source: column for column, source in memory.items() if column in target}
    wanted = {f.name: f for f in fields}
    marks = {f.name: source_columns(f.metadata) for f in fields}
    out: list[str] = []
    renamed: dict[str, str] = {}
    for name, f in wanted.items():
        if name in target:
            continue
        old = next((held[m.key] for m in marks[name] if m.key in held and held[m.key] not in wanted), None)
        if old is not None and old not in renamed:
            renamed[old] = name
            out.append(_rename_sql(rel, old, name))
        else:
            out.append(add_sql(f))
    gone = {f"{m.table}#{d}" for ms in marks.values() for m in ms for d in m.dropped}
    dropped = [column for column, source in memory.items()
               if source in gone and column in target and column not in wanted and column not in renamed]
    out += [f"ALTER TABLE {rel} DROP COLUMN IF EXISTS {quote_ident(c)}" for c in dropped]
    for name, f in wanted.items():
        have = target.get(name) or target.get(next((o for o, n in renamed.items() if n == name), ""))
        if have is not None and _widenable(have) and widens(have, wider := pg_type(name, f.dataType)):
            out.append(f"ALTER TABLE {rel} ALTER COLUMN {quote_ident(name)} TYPE {wider}")
    record = {name: marks[name][0].key for name in wanted if len(marks[name]) == 1}
    # Written only when it changes: a column whose mark an expression took away keeps what was recorded.
    if any(memory.get(c) != s for c, s in record.items()) or dropped or renamed:
        out += _record_sql(schema, table, record, [*dropped, *renamed])
    return tuple(out)


def _rename_sql(rel: str, old: str, new: str) -> str:
    """RENAME COLUMN when the table still has `old` and not yet `new` (a replayed write finds it done)."""
    def has(name: str) -> str:
        return (f"EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = {quote_literal(rel)}::regclass AND attname = "
                f"{quote_literal(name)} AND NOT attisdropped)")
    return (f"DO $sluice$ BEGIN IF {has(old)} AND NOT {has(new)} THEN ALTER TABLE {rel} RENAME COLUMN "
            f"{quote_ident(old)} TO {quote_ident(new)}; END IF; END $sluice$")


def _record_sql(schema: str, table: str, record: dict[str, str], forget: Sequence[str]) -> list[str]:
    memory = qualified(schema, MEMORY_TABLE)
    out = [f"CREATE TABLE IF NOT EXISTS {memory} (target text, column_name text, source text NOT NULL, "
           "PRIMARY KEY (target, column_name))"]
    if forget:
        names = ", ".join(quote_literal(c) for c in forget)
        out.append(f"DELETE FROM {memory} WHERE target = {quote_literal(table)} AND column_name IN ({names})")
    if record:
        rows = ", ".join(f"({quote_literal(table)}, {quote_literal(c)}, {quote_literal(s)})" for c, s in record.items())
        out.append(f"INSERT INTO {memory} VALUES {rows} ON CONFLICT (target, column_name) DO UPDATE SET source = "
                   "EXCLUDED.source")
    return out
