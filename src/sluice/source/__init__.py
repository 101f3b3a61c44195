"""Split sources (FLIP-27): a driver-side SplitEnumerator and executor-side SplitReaders, mapped onto Spark."""

from sluice.source._datasource import SourceDataSource
from sluice.source._framework import (
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitGroup,
    SplitPartition,
    SplitReader,
    SplitStreamReader,
    cut,
    pack,
    tasks,
)
from sluice.source._offset import SplitOffset, check_offset_version

__all__ = [
    "SourceDataSource",
    "Split",
    "SplitBatchReader",
    "SplitEnumerator",
    "SplitGroup",
    "SplitOffset",
    "SplitPartition",
    "SplitReader",
    "SplitStreamReader",
    "check_offset_version",
    "cut",
    "pack",
    "tasks",
]
