"""Per-file column statistics of an appended data file, as the Delta log's `stats` holds them (numRecords,
minValues, maxValues, nullCount), gathered by the task that writes the file.

With them, a reader that filters on a column skips a file whose range cannot match without opening it: deltalake's
pyarrow dataset turns each file's stats into a guarantee pyarrow prunes by (the lookup join of _lookup.py, Spark's
Delta reader). Merges and compactions go through delta-rs, which writes these itself. Kept to the types whose Delta
stats form is exact and cheap: integers, dates, and strings up to MAX_STRING characters (a longer bound is left
out: a column without stats is simply never pruned).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MAX_STRING = 64


def _eligible(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_date32(kind) or pa.types.is_string(kind) or \
        pa.types.is_large_string(kind)


class FileStats:
    """The running min, max and null count of each eligible column of the batches written to one file."""

    def __init__(self) -> None:
        self.rows = 0
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}
        self.unbounded: set[str] = set()  # a column with a bound too long to keep

    def add(self, data: pa.Table) -> None:
        self.rows += data.num_rows
        for field in data.schema:
            if not _eligible(field.type):
                continue
            column = data.column(field.name)
            self.nulls[field.name] = self.nulls.get(field.name, 0) + column.null_count
            bounds = pc.min_max(column).as_py()
            low, high = bounds["min"], bounds["max"]
            if low is None:
                continue
            if isinstance(low, str) and max(len(low), len(high)) > MAX_STRING:
                self.unbounded.add(field.name)
            seen_low, seen_high = self.low.get(field.name), self.high.get(field.name)
            self.low[field.name] = low if seen_low is None else min(seen_low, low)
            self.high[field.name] = high if seen_high is None else max(seen_high, high)

    def json(self) -> str:
        """The Delta `stats` of the file."""
        def form(value: Any) -> Any:
            return value.isoformat() if isinstance(value, datetime.date) else value

        bounded = [n for n in self.low if n not in self.unbounded]
        return json.dumps({"numRecords": self.rows, "minValues": {n: form(self.low[n]) for n in bounded},
                           "maxValues": {n: form(self.high[n]) for n in bounded}, "nullCount": self.nulls})
