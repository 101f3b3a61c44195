"""Spark glue: Data Source base classes, session helper, registration, one-call writes."""

# _compat first: a missing or too old pyspark fails there, saying what to do.
from sluice.spark import _compat  # noqa: F401
from sluice.spark._datasource import (
    EngineArrowWriter,
    EngineDataSource,
    EngineStreamArrowWriter,
    SluiceCommitMessage,
)
from sluice.spark._registry import FORMATS, register
from sluice.spark._session import python_worker_env, session
from sluice.spark._write import partitioned, write

__all__ = [
    "FORMATS",
    "EngineArrowWriter",
    "EngineDataSource",
    "EngineStreamArrowWriter",
    "SluiceCommitMessage",
    "partitioned",
    "python_worker_env",
    "register",
    "session",
    "write",
]
