"""What schema.evolution means to every sink that can change its target's schema: `none` keeps today's refusal of a
DataFrame column the target lacks (naming the column and this option), `add-columns` adds such a column, typed as
the sink's own mapping of the Spark type, before the first rows that carry it are written. A column the target has
under another type is never changed: the sink's own type check still refuses it by name. `full`, where a sink offers
it, also renames and drops the target's columns as their source did, and widens a column's type.

A rename cannot be told from a drop and an add by names alone. A change capture source therefore marks each column
with where it comes from (SourceColumn, in the Spark field's metadata, which Spark carries to the sink's schema): its
table, as an id that changes when the table is created again, and the column's id in it, which a rename keeps. A sink
remembers which of its target's columns holds which source column, and so finds a column it holds under an old name.

Shared here: the option's declaration, which DataFrame columns are new to the target, and the source marks."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sluice._names import case_hint, check_dataframe_columns
from sluice._options import Option

OPTION = "schema.evolution"
NONE = "none"
ADD_COLUMNS = "add-columns"
FULL = "full"
SOURCE_COLUMNS = "sluice.source-columns"  # the Spark field metadata key of a column's SourceColumns


def schema_evolution_option(effect: str, full: str | None = None) -> Option:
    """The option, as a sink declares it; `effect`: how the sink adds a column (a sentence); `full`: what the sink's
    `full` does (a sentence), when it offers it."""
    text = (f"A DataFrame column the target lacks: {NONE} refuses the write naming it; {ADD_COLUMNS} adds it before "
            f"the first rows that carry it are written (earlier rows read as null). {effect}")
    if full is None:
        return Option(OPTION, "choice", NONE, f"{text} A column the target has under another type is refused as ever.",
                      choices=(NONE, ADD_COLUMNS))
    return Option(OPTION, "choice", NONE, f"{text} {FULL}: {full}", choices=(NONE, ADD_COLUMNS, FULL))


@dataclass(frozen=True)
class SourceColumn:
    """Where a DataFrame column comes from, as a change capture source marks it: `table`, an id of its source table
    that changes when the table is created again (PostgreSQL: schema.name and pg_class.oid); `column`, the column's
    id in that table, which a rename keeps and the table never reuses (pg_attribute.attnum); `dropped`, the ids of
    the table's columns dropped so far."""

    table: str
    column: int
    dropped: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """The column's identity as one string (what a sink remembers)."""
        return f"{self.table}#{self.column}"

    def to_json(self) -> dict[str, str | int | list[int]]:
        return {"table": self.table, "column": self.column, "dropped": list(self.dropped)}


def source_columns(metadata: dict[str, object] | None) -> tuple[SourceColumn, ...]:
    """The SourceColumns in a Spark field's `metadata` (a column of several source tables has one per table)."""
    raw: Any = (metadata or {}).get(SOURCE_COLUMNS)
    if isinstance(raw, str):
        raw = json.loads(raw)
    return tuple(SourceColumn(str(c["table"]), int(c["column"]), tuple(int(d) for d in c.get("dropped", ())))
                 for c in raw or ())


def source_metadata(columns: Iterable[SourceColumn]) -> dict[str, list[dict[str, str | int | list[int]]]]:
    """A Spark field's metadata marking it with `columns` (none: no metadata)."""
    marks = [c.to_json() for c in columns]
    return {SOURCE_COLUMNS: marks} if marks else {}


_SPARK_METADATA = b"SPARK::metadata::json"  # where Spark puts a field's metadata in the Arrow schema it hands over


def without_source_marks(schema: pa.Schema) -> pa.Schema:
    """`schema` (as Spark hands a writer its rows) without the source marks in its fields' metadata: a store that
    keeps a schema of its own (Parquet, Delta) must not keep where a change capture query's columns came from, which
    changes with the query and would make two writes' schemas differ. Other metadata is kept."""
    fields = []
    for f in schema:
        meta = dict(f.metadata or {})
        raw = meta.get(_SPARK_METADATA)
        if raw is not None and SOURCE_COLUMNS.encode() in raw:
            spark = {k: v for k, v in json.loads(raw).items() if k != SOURCE_COLUMNS}
            if spark:
                meta[_SPARK_METADATA] = json.dumps(spark).encode()
            else:
                del meta[_SPARK_METADATA]
            f = f.with_metadata(meta) if meta else f.remove_metadata()
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def new_columns(columns: Iterable[str], table_columns: Collection[str], table: str, evolution: str,
                advice: str = "Drop or rename it, or add it to the table") -> list[str]:
    """The DataFrame `columns` the target `table` (its columns `table_columns`) lacks, in order, when `evolution` is
    add-columns. With `none` the first of them is refused (OptionError naming it and this option); a column whose
    name the table has in another case only is refused in both modes (a second column differing by case is a
    slip, not a new column)."""
    columns = list(columns)
    if evolution not in (ADD_COLUMNS, FULL):
        check_dataframe_columns(columns, table_columns, table, f"{advice}, or set {OPTION}={ADD_COLUMNS} to have "
                                                               "the sink add it.")
        return []
    for name in columns:
        if name not in table_columns and case_hint(name, table_columns):
            check_dataframe_columns([name], table_columns, table, "Rename it to the table's spelling.")
    return [name for name in columns if name not in table_columns]
