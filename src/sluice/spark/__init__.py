"""Spark glue: Data Source base classes, session helper, registration, one-call writes."""

# _compat first: a missing or too old pyspark fails there, saying what to do.
from sluice.spark import _compat  # noqa: F401
from sluice.spark._datasource import SluiceDataSource
from sluice.spark._registry import FORMATS, register
from sluice.spark._session import python_worker_env, session
from sluice.spark._sink import SinkDataSource
from sluice.spark._source import SourceDataSource
from sluice.spark._write import partitioned, write
from sluice.spark._writers import EngineArrowWriter, EngineStreamArrowWriter, SluiceCommitMessage

__all__ = [
    "FORMATS",
    "EngineArrowWriter",
    "EngineStreamArrowWriter",
    "SinkDataSource",
    "SluiceCommitMessage",
    "SluiceDataSource",
    "SourceDataSource",
    "partitioned",
    "python_worker_env",
    "register",
    "session",
    "write",
]
