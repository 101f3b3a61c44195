"""The options of a tracking-column stream (_tracking.py), declared once for every store that has one, and their
typed form; the refusals of options that belong to the other kind of read."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice._errors import OptionError
from sluice._options import Option, Options


def tracking_options(column: str) -> tuple[Option, ...]:
    """The options of a tracking-column stream, declared once for every store that has one (`column`: what the
    store's tracking.column may be). A connector puts them among its read options."""
    return (
        Option("tracking.column", "str", None, f"readStream: the column whose growing values find new rows; {column}"),
        Option("tracking.lag-window-ms", "int", 5000,
               "readStream: a stream reads no further than the greatest tracking value the store showed this long "
               "ago, so a row committed up to this late after a greater one is still read (exactly once). Longer "
               "than the store's longest writing transaction; rows stream this much later.", minimum=0),
        Option("tracking.start", "str", "beginning",
               "readStream, first start: beginning, now (rows with greater values than the greatest now), or a "
               "value (rows with tracking values >= it: an integer or an ISO 8601 timestamp, UTC if no zone)."),
        Option("max-records-per-trigger", "int", None, "readStream: most rows per micro-batch (whole groups of "
               "one tracking value and tie-breaker are never cut, so a micro-batch may hold more).", minimum=1),
        Option("tracking.rows-per-task", "int", 250_000, "readStream: a micro-batch's range is read by tasks of "
               "about this many rows, cut at rows' positions when it is planned (one query each); 0: one task.",
               minimum=0),
    )


TRACKING_NAMES = ("tracking.column", "tracking.lag-window-ms", "tracking.start", "max-records-per-trigger",
                  "tracking.rows-per-task")


@dataclass(frozen=True)
class TrackingSettings:
    """The shared options of a tracking-column stream (`tracking_options`), typed."""

    column: str
    lag_window_ms: int
    start: str  # beginning | now | a value
    max_records: int | None
    rows_per_task: int = 0  # 0: a micro-batch's range is one task

    @classmethod
    def of(cls, opts: Options, format_name: str) -> TrackingSettings:
        """The settings of a readStream; refuses one without tracking.column."""
        if not opts["tracking.column"]:
            raise OptionError(f"readStream from '{format_name}' needs option 'tracking.column': a column whose "
                              "values grow as rows are added (an increasing id, or a timestamp set when the row is "
                              "written); see docs/tracking.md")
        start = opts["tracking.start"].strip()
        return cls(opts["tracking.column"], opts["tracking.lag-window-ms"],
                   start.lower() if start.lower() in ("beginning", "now") else start, opts["max-records-per-trigger"],
                   opts["tracking.rows-per-task"])


def refuse_batch_options_in_stream(opts: Options, format_name: str, names: Sequence[str]) -> None:
    """A readStream refuses the options of a batch read's splits (`names`), which it has no use for."""
    given = [name for name in names if opts.is_set(name)]
    if given:
        raise OptionError(f"option(s) {given} apply to spark.read.format('{format_name}') (batch) only; a readStream "
                          "reads each micro-batch's range in one query. Remove them.")


def refuse_tracking_in_batch(opts: Options, format_name: str) -> None:
    """A batch read refuses the options of a stream (an option is honoured or refused, never ignored)."""
    given = [name for name in TRACKING_NAMES if opts.is_set(name)]
    if given:
        raise OptionError(f"option(s) {given} apply to spark.readStream.format('{format_name}') only; a batch read "
                          "reads every row. Remove them, or use readStream.")
