"""Write statistics on the driver: one log line per write or micro-batch, the last summary kept on disk.

Spark runs a data source's commit() and abort() in a Python worker process on the driver's machine, not
in the user's interpreter, so the last summary is handed over through a small JSON file (SLUICE_STATS_DIR,
default a per-user temp dir). A Spark Connect client is another machine: it asks the driver for the file
through `format("sluice_summary")`, whose read plan is made on the driver.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from sluice._driver import console_handler, stats_dir
from sluice._errors import OptionError

log = logging.getLogger("sluice.summary")


def save_summary(format_name: str, summary: dict[str, Any]) -> None:
    folder = stats_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"format": format_name, **summary}, sort_keys=True)
    for name in (f"{format_name}.json", "last.json"):
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(data)
        os.replace(tmp, folder / name)  # atomic: a reader never sees half a file


def read_summary_file(format_name: str | None = None) -> dict[str, Any] | None:
    path = stats_dir() / (f"{format_name}.json" if format_name else "last.json")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _active_connect_session() -> Any:
    """The Spark Connect session of this process, if the user made one (never imports the Connect client)."""
    module = sys.modules.get("pyspark.sql.connect.session")
    return module.SparkSession.getActiveSession() if module is not None else None


def read_last_summary(format_name: str | None = None, spark: Any = None) -> dict[str, Any] | None:
    """From this machine's file, or through `spark` (default: the active Spark Connect session, if any)."""
    spark = spark or _active_connect_session()
    if spark is None:
        return read_summary_file(format_name)
    reader = spark.read.format("sluice_summary")
    if format_name:
        reader = reader.option("format", format_name)
    rows = reader.load().collect()
    return json.loads(rows[0]["summary"]) if rows and rows[0]["summary"] else None


def log_summary(line: str) -> None:
    console_handler(log)
    log.info(line)


class SummaryReader(DataSourceReader):
    def __init__(self, format_name: str | None) -> None:
        self.format_name = format_name

    def partitions(self) -> list[InputPartition]:
        # Planned on the driver's machine, where commit()/abort() saved the file.
        return [InputPartition(json.dumps(read_summary_file(self.format_name)))]

    def read(self, partition: InputPartition) -> Iterator[tuple[str | None, str | None]]:
        yield (self.format_name, None if partition.value == "null" else partition.value)


class SummaryDataSource(DataSource):
    """`spark.read.format("sluice_summary")[.option("format", name)]`: the driver's last write summary."""

    @classmethod
    def name(cls) -> str:
        return "sluice_summary"

    def schema(self) -> str:
        return "format STRING, summary STRING"

    def reader(self, schema: Any) -> SummaryReader:
        unknown = sorted(set(self.options) - {"format"})
        if unknown:
            raise OptionError(f"format 'sluice_summary' takes only the option 'format'; got {unknown}")
        return SummaryReader(self.options.get("format"))
