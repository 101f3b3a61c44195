"""The running Spark line and what its Python Data Source API offers; sluice's stand-ins where a line lacks one.

sluice supports pyspark 4.0 and later (the Python Data Source API arrived in 4.0). The lines differ in:
  - the Arrow stream writer, `DataSourceStreamArrowWriter` (4.1). Spark 4.0 already hands Arrow batches to any
    writer that is a `DataSourceArrowWriter`, streaming ones too, so `StreamArrowWriterBase` is that class plus
    `DataSourceStreamWriter` there: Arrow on every line, no per-row path;
  - filter pushdown into Python readers, `DataSourceReader.pushFilters` (4.1): on 4.0 Spark never calls it and
    filters the rows itself (same rows, more read);
  - admission control and Trigger.AvailableNow for Python stream readers (4.2): `latestOffset(start, limit)`,
    `getDefaultReadLimit()`, `SupportsTriggerAvailableNow`. On 4.0/4.1 `AdmissionControlledReader` gives the
    reader its start and limit itself, so per-trigger caps hold on every line (see its docstring for the one
    thing it cannot give: a multi-batch AvailableNow run);
  - Declarative Pipelines, `pyspark.pipelines` (4.1).
`capabilities()` lists them for the running line; docs/deploy.md's table is produced from what the tests ran.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

MINIMUM = (4, 0)
FIX = ("Use a Spark 4.0+ runtime (its pyspark is on the path), or pip install 'sluice[spark]' into a fresh "
       "environment.")

try:
    import pyspark
except ImportError as e:
    raise ImportError(f"sluice's Spark data sources need pyspark >= 4.0, and this Python has none. {FIX}") from e
from pyspark.sql import datasource as _ds  # noqa: E402 (after the check above)


def parse_version(text: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"not a Spark version: {text!r}")
    return int(found.group(1)), int(found.group(2))


SPARK_VERSION = parse_version(pyspark.__version__)
if SPARK_VERSION < MINIMUM:
    raise ImportError(
        f"sluice needs pyspark >= 4.0 (Spark's Python Data Source API), but this Python has pyspark "
        f"{pyspark.__version__}. {FIX}")

SPARK_LINE = f"{SPARK_VERSION[0]}.{SPARK_VERSION[1]}"

# The line that brought each capability, for the capability table and for errors that name it.
SINCE: dict[str, tuple[int, int]] = {
    "arrow stream writer": (4, 1),
    "filter pushdown": (4, 1),
    "admission control": (4, 2),
    "trigger available-now": (4, 2),
    "declarative pipelines": (4, 1),
}

HAS_ARROW_STREAM_WRITER = hasattr(_ds, "DataSourceStreamArrowWriter")
HAS_FILTER_PUSHDOWN = hasattr(_ds, "Filter")
HAS_ADMISSION_CONTROL = find_spec("pyspark.sql.streaming.datasource") is not None
HAS_PIPELINES = find_spec("pyspark.pipelines") is not None


def capabilities() -> dict[str, bool]:
    """Which of Spark's capabilities the running pyspark has natively."""
    return {
        "arrow stream writer": HAS_ARROW_STREAM_WRITER,
        "filter pushdown": HAS_FILTER_PUSHDOWN,
        "admission control": HAS_ADMISSION_CONTROL,
        "trigger available-now": HAS_ADMISSION_CONTROL,
        "declarative pipelines": HAS_PIPELINES,
    }


def since(capability: str) -> str:
    major, minor = SINCE[capability]
    return f"{major}.{minor}"


if HAS_ARROW_STREAM_WRITER:
    StreamArrowWriterBase = _ds.DataSourceStreamArrowWriter
else:
    # misc: the two bases' commit/abort differ (Spark 4.0 calls the stream writer's form); no-redef: the other branch
    class StreamArrowWriterBase(_ds.DataSourceArrowWriter, _ds.DataSourceStreamWriter):  # type: ignore[no-redef,misc]
        """Spark 4.0: its write worker gives Arrow batches to any DataSourceArrowWriter, in streaming writes too,
        and its streaming commit calls commit(messages, batchId) on whatever streamWriter() returned."""


if HAS_ADMISSION_CONTROL:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
else:
    # The same shapes as pyspark.sql.streaming.datasource (4.2), so readers are written once.
    class ReadLimit:  # type: ignore[no-redef]
        """How much one micro-batch may read."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        max_bytes: int

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Spark 4.0/4.1 never call prepareForTriggerAvailableNow on a Python reader (see AdmissionControlledReader)."""

        def prepareForTriggerAvailableNow(self) -> None:
            raise NotImplementedError

if HAS_FILTER_PUSHDOWN:
    Filter: Any = _ds.Filter
else:
    class Filter:  # type: ignore[no-redef]
        """Spark 4.0 has no filter pushdown into Python readers: pushFilters is never called."""


log = logging.getLogger("sluice.spark")


class AdmissionControlledReader(_ds.DataSourceStreamReader):
    """A stream reader written once against Spark 4.2's admission control, run on every line.

    Subclasses implement `latest_offset(start, limit)`. On 4.2+ Spark calls `latestOffset(start, limit)` with the
    end of the last micro-batch and the reader's default limit (or all-available under Trigger.AvailableNow,
    after `prepareForTriggerAvailableNow`). On 4.0/4.1 Spark calls `latestOffset()` with nothing, so the reader
    keeps the start itself: the end of the last offset it returned, or, after a restart, the offset Spark
    announces with `partitions(latest, latest)` (its AcceptsLatestSeenOffset), else the initial offset; the limit
    is the reader's default, so per-trigger caps hold. What 4.0/4.1 cannot give: Trigger.AvailableNow there asks
    the reader once and runs one micro-batch (Spark's AvailableNowDataStreamWrapper), so a capped reader would
    stop after one cap; it logs that once when a cap leaves data behind. Readers that can stop at a target add
    `SupportsTriggerAvailableNow` themselves.
    """

    _start_seen: dict[str, Any] | None = None
    _cap_checked: bool = False
    cap_options: tuple[str, ...] = ()  # the options that cap a micro-batch, named in the 4.0/4.1 warning

    def latest_offset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise NotImplementedError

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is not None:  # Spark 4.2+
            return self.latest_offset(start, limit if limit is not None else self.getDefaultReadLimit())
        begin = self._start_seen if self._start_seen is not None else self.initialOffset()
        default = self.getDefaultReadLimit()
        end = self.latest_offset(begin, default)
        if not self._cap_checked and not isinstance(default, ReadAllAvailable):
            # Once per query run: the first call is the only one under AvailableNow.
            self._cap_checked = True
            if self.latest_offset(begin, ReadAllAvailable()) != end:
                log.warning(
                    "Spark %s has no admission control for Python stream readers: sluice caps each micro-batch "
                    "itself (%s). Under Trigger.AvailableNow, Spark %s runs one micro-batch only, so such a run "
                    "reads one cap's worth; Spark %s+ runs AvailableNow to the end in capped micro-batches.",
                    SPARK_LINE, ", ".join(self.cap_options) or "its per-trigger limit", SPARK_LINE,
                    since("trigger available-now"))
        self._start_seen = end
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[_ds.InputPartition]:
        self._start_seen = end  # read by the 4.0/4.1 path of latestOffset only
        if start == end:  # Spark's notice of the latest offset it has seen (restart): nothing to read
            return []
        return self.plan_partitions(start, end)

    def plan_partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[_ds.InputPartition]:
        raise NotImplementedError


def require(capability: str, option: str, instead: str) -> None:
    """Refuse `option` where the running Spark lacks `capability` (an option is honoured or refused, never ignored)."""
    if capabilities()[capability]:
        return
    from sluice._errors import OptionError

    raise OptionError(
        f"option '{option}' needs {capability} into Python data sources, which Spark {since(capability)} added; "
        f"this Spark is {pyspark.__version__}. {instead} or run on Spark {since(capability)} or later.")


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """Spark's schema in Arrow, timestamps in UTC (the keyword changed in Spark 4.2: timestamp_utc -> timezone)."""
    from pyspark.sql.pandas.types import to_arrow_schema as convert

    if SPARK_VERSION >= (4, 2):
        return convert(schema, timezone="UTC")
    return convert(schema, timestamp_utc=True)  # type: ignore[call-arg]  # Spark < 4.2's keyword


def from_arrow_schema(schema: pa.Schema) -> StructType:
    """An Arrow schema in Spark's types; a timestamp without a time zone is TIMESTAMP_NTZ on every line (Spark 4.2
    made that the default; 4.0/4.1 read it as a local-time TIMESTAMP)."""
    from pyspark.sql.pandas.types import from_arrow_schema as convert

    return convert(schema, prefer_timestamp_ntz=True)
