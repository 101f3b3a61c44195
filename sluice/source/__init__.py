"""Split sources (FLIP-27): a driver-side SplitEnumerator and executor-side SplitReaders, mapped onto Spark."""

from sluice.source._framework import (
    Split,
    SplitBatchReader,
    SplitEnumerator,
    SplitPartition,
    SplitReader,
    SplitStreamReader,
    cut,
)

__all__ = ["Split", "SplitBatchReader", "SplitEnumerator", "SplitPartition", "SplitReader", "SplitStreamReader",
           "cut"]
