"""Per-file column statistics of an appended data file, as the Delta log's `stats` holds them (numRecords,
minValues, maxValues, nullCount), gathered by the task that writes the file.

With them, a reader that filters on a column skips a file whose range cannot match without opening it (the lookup
join of _lookup.py; Spark's Delta reader). Merges and compactions go through delta-rs, which writes these itself.

All columns or none: deltalake 1.6's `to_pyarrow_dataset()` turns a column without bounds in a file that has stats
into the guarantee `column >= null`, under which pyarrow drops the file from any filter on that column (rows lost
for a reader of the table through deltalake). So a file gets bounds only when every column has them: integers,
floats without NaN, booleans, dates, strings (a bound of more than 32 characters cut to a prefix: the maximum's with
U+10FFFF after it, above every string that starts so) and UTC timestamps (to the millisecond, as Delta keeps them:
the minimum rounded down, the maximum up); otherwise its row count alone, as before.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

CUT = 32  # characters a string bound keeps (Delta's default)
_MS = datetime.timedelta(milliseconds=1)


def _covered(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_date32(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or (pa.types.is_timestamp(kind) and kind.tz in ("UTC", "+00:00", "Etc/UTC")))


def _bound(value: Any, high: bool) -> Any:
    """A column's bound as the Delta log's JSON keeps it."""
    if isinstance(value, str) and len(value) > CUT:
        return value[:CUT] + "\U0010ffff" if high else value[:CUT]
    if isinstance(value, datetime.datetime):
        cut = value.replace(microsecond=value.microsecond // 1000 * 1000)
        if high and cut != value:
            cut += _MS
        return cut.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{cut.microsecond // 1000:03d}Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


class FileStats:
    """The running min, max and null count of every column of the batches written to one file."""

    def __init__(self) -> None:
        self.rows = 0
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}
        self.nulls: dict[str, int] = {}
        self.complete = True  # every column bounded so far

    def add(self, data: pa.Table) -> None:
        self.rows += data.num_rows
        if not self.complete:
            return
        for field in data.schema:
            column = data.column(field.name)
            if not _covered(field.type) or (pa.types.is_floating(field.type) and pc.any(pc.is_nan(column)).as_py()):
                self.complete = False
                return
            self.nulls[field.name] = self.nulls.get(field.name, 0) + column.null_count
            bounds = pc.min_max(column).as_py()
            if bounds["min"] is None:
                continue  # no value in this batch
            seen_low, seen_high = self.low.get(field.name), self.high.get(field.name)
            self.low[field.name] = bounds["min"] if seen_low is None else min(seen_low, bounds["min"])
            self.high[field.name] = bounds["max"] if seen_high is None else max(seen_high, bounds["max"])

    def json(self) -> str:
        """The Delta `stats` of the file: every column's bounds, or the row count alone."""
        if not self.complete or set(self.low) != set(self.nulls):  # a column of nulls only has no bounds either
            return json.dumps({"numRecords": self.rows})
        return json.dumps({"numRecords": self.rows,
                           "minValues": {n: _bound(v, high=False) for n, v in self.low.items()},
                           "maxValues": {n: _bound(v, high=True) for n, v in self.high.items()},
                           "nullCount": self.nulls})
