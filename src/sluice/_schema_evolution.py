"""What schema.evolution means to every sink that can change its target's schema: `none` keeps today's refusal of a
DataFrame column the target lacks (naming the column and this option), `add-columns` adds such a column, typed as
the sink's own mapping of the Spark type, before the first rows that carry it are written. A column the target has
under another type is never changed: the sink's own type check still refuses it by name.

Shared here: the option's declaration and which DataFrame columns are new to the target."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sluice._names import case_hint, check_dataframe_columns
from sluice._options import Option

OPTION = "schema.evolution"
NONE = "none"
ADD_COLUMNS = "add-columns"


def schema_evolution_option(effect: str) -> Option:
    """The option, as a sink declares it; `effect`: how the sink adds a column (a sentence)."""
    return Option(OPTION, "choice", NONE,
                  f"A DataFrame column the target lacks: {NONE} refuses the write naming it; {ADD_COLUMNS} adds it "
                  f"before the first rows that carry it are written (earlier rows read as null). {effect} A column "
                  "the target has under another type is refused as ever.", choices=(NONE, ADD_COLUMNS))


def new_columns(columns: Iterable[str], table_columns: Collection[str], table: str, evolution: str,
                advice: str = "Drop or rename it, or add it to the table") -> list[str]:
    """The DataFrame `columns` the target `table` (its columns `table_columns`) lacks, in order, when `evolution` is
    add-columns. With `none` the first of them is refused (OptionError naming it and this option); a column whose
    name the table has in another case only is refused in both modes (a second column differing by case is a
    slip, not a new column)."""
    columns = list(columns)
    if evolution != ADD_COLUMNS:
        check_dataframe_columns(columns, table_columns, table, f"{advice}, or set {OPTION}={ADD_COLUMNS} to have "
                                                               "the sink add it.")
        return []
    for name in columns:
        if name not in table_columns and case_hint(name, table_columns):
            check_dataframe_columns([name], table_columns, table, "Rename it to the table's spelling.")
    return [name for name in columns if name not in table_columns]
