"""Names a user gave that the store does not have: the refusal names the option, the place and what is there, and
says when only the case differs (stores compare names exactly; Spark's column names are case-insensitive by
default, so `Name` for `name` is the usual slip)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from sluice._errors import OptionError


def case_hint(name: str, known: Iterable[str], where: str | None = "the table") -> str:
    """" (the table has 'Name': names are case-sensitive)" when `known` holds `name` in another case only, else "".
    `where` None: " (did you mean 'Name'? names are case-sensitive)"."""
    same = [k for k in known if k.lower() == name.lower() and k != name]
    if not same:
        return ""
    if where is None:
        return f" (did you mean '{same[0]}'? names are case-sensitive)"
    return f" ({where} has '{same[0]}': names are case-sensitive)"


def require_name(name: str, known: Collection[str], option: str, of: str, noun: str = "column",
                 advice: str = "", where: str | None = None) -> None:
    """Refuses `name` when `known` lacks it: "tracking.column 'x' is not a column of table t (did you mean 'X'?
    names are case-sensitive); its columns: [...]" (the hint's `where` as `case_hint`'s), then `advice` (a
    sentence) if given."""
    if name not in known:
        raise OptionError(f"{option} '{name}' is not a {noun} of {of}{case_hint(name, known, where)}; its {noun}s: "
                          f"{list(known)}{'. ' + advice if advice else ''}")


def check_dataframe_columns(columns: Iterable[str], table_columns: Collection[str], table: str,
                            advice: str = "Drop or rename it.") -> None:
    """Refuses the first DataFrame column that `table` (its columns `table_columns`) lacks, with the case hint and
    the table's columns, then `advice`."""
    for name in columns:
        if name not in table_columns:
            raise OptionError(f"column '{name}' of the DataFrame is not in table {table}"
                              f"{case_hint(name, table_columns)}; table columns: {list(table_columns)}. {advice}")


def check_option_columns(columns: Mapping[str, str | Sequence[str] | None], names: Sequence[str]) -> None:
    """Refuses the first option naming a column the DataFrame (its columns `names`) lacks, with the case hint.
    `columns`: option -> the column it names, the columns (a list option), or None (not set)."""
    for option, given in columns.items():
        for column in [given] if isinstance(given, str) else given or ():
            if column not in names:
                raise OptionError(f"{option} '{column}' is not a DataFrame column"
                                  f"{case_hint(column, names, 'the DataFrame')} (columns: {list(names)}).")
