"""Spark finds `format("sluice_summary")` here: it imports every top-level pyspark_* module."""

from sluice.spark._summary import SummaryDataSource as DefaultSource

__all__ = ["DefaultSource"]
