"""The checks of a tracking column every store makes the same (docs/tracking.md): the column and the tie-breaker
columns exist, the column's type is one a position can hold (the store says which: its type mapping), the
tie-breaker is not the column itself, and tracking.start is a value of the column's kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from sluice._errors import OptionError
from sluice._names import require_name
from sluice.source._tracking import parse_value
from sluice.source._tracking_options import TrackingSettings

T = TypeVar("T")


def tracking_column_kind(settings: TrackingSettings, types: Mapping[str, T], kind_of: Callable[[T], str | None], *,
                  source: str, works: str, tie_breaker: Sequence[str] = (), noun: str = "column",
                  advice: str = "", where: str | None = "the table") -> str:
    """The kind of the tracking column ("int" or "timestamp", `parse_value`'s kinds), from `types` (each column's
    type in the store) and the store's mapping `kind_of` (None: a type a stream cannot range over; it may also
    raise its own refusal). Refuses, naming it: a tracking or tie-breaker column `source` lacks (with the case
    hint saying what `where` has, then `advice`), a tracking column of another type (saying what `works`), a
    tie-breaker that names the tracking column, and a tracking.start that is not a value of the kind. `noun`: what
    the store calls a column (an index has fields)."""
    column = settings.column
    for name, option in [(column, "tracking.column"), *((c, "tracking.tie-breaker") for c in tie_breaker)]:
        require_name(name, types, option, source, noun, advice if option == "tracking.column" else "", where)
    kind = kind_of(types[column])
    if kind is None:
        raise OptionError(f"tracking.column '{column}' has type {types[column]}; a tracking {noun} must be {works}")
    if column in tie_breaker:
        raise OptionError(f"tracking.tie-breaker names the tracking {noun} '{column}' itself; name other {noun}s (a "
                          "key that tells records of one tracking value apart), or none")
    if settings.start not in ("beginning", "now"):
        parse_value(kind, settings.start, "tracking.start")
    return kind
