"""Spark glue: the Data Source core every format shares, the running Spark line's capabilities, the session helper,
registration of the formats and the write summary. The sink framework is `sluice.sink`, the source framework
`sluice.source`; both stand on this package, never the other way round."""

# _compat first: a missing or too old pyspark fails there, saying what to do.
from sluice.spark import _compat  # noqa: F401
from sluice.spark._datasource import SluiceDataSource
from sluice.spark._registry import FORMATS, register
from sluice.spark._session import python_worker_env, session

__all__ = [
    "FORMATS",
    "SluiceDataSource",
    "python_worker_env",
    "register",
    "session",
]
