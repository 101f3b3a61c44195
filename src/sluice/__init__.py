"""sluice: connectors for PySpark with control over parallelism, batching, ordering and delivery.

    import sluice
    spark = sluice.session()            # or any SparkSession: installed formats need no registration
    sluice.write(df, "sluice_null", {"sink.mode": "partition-ordered", "sink.partition-key": "id"})
    print(sluice.last_write_summary())

Importing `sluice` (or `sluice.engine`) does not import pyspark; the Spark helpers import it on use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sluice._errors import (
    ConflictError,
    DataLossError,
    OptionError,
    RecordError,
    RecordTooLargeError,
    RefusedRecords,
    RestartNeededError,
    RetryableError,
    SinkError,
    SluiceError,
    ThrottledError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__version__ = "0.1.0"


def register(spark: SparkSession) -> list[str]:
    """Register every sluice format with `spark`; returns the format names.

    Not needed for the built-in formats where sluice is installed: Spark finds them by itself (docs/deploy.md).
    """
    from sluice.spark._registry import register as _register

    return _register(spark)


def session(app_name: str = "sluice", master: str | None = None, **conf: str) -> SparkSession:
    """A SparkSession for sluice jobs. Local masters (the default, local[2,4]): workers use this interpreter, the
    driver listens on loopback, quiet logs. Other masters: the cluster's own settings (docs/deploy.md)."""
    from sluice.spark._session import session as _session

    return _session(app_name, master, **conf)


def write(df: DataFrame, format: str, options: Mapping[str, object] | None = None, mode: str = "append",
          num_partitions: int | None = None) -> None:
    """Batch-write `df`; in partition-ordered mode, rows are first repartitioned by the partition key."""
    from sluice.sink._dataframe_write import write as _write

    _write(df, format, options or {}, mode, num_partitions)


def partitioned(df: DataFrame, format: str, options: Mapping[str, object] | None = None,
                num_partitions: int | None = None) -> DataFrame:
    """`df` laid out for the sink's guarantee, as `write` lays it out (partition-ordered mode: repartitioned by the
    partition key; Kafka's transaction.by-partition: by the Kafka partition); use before writeStream."""
    from sluice.sink._dataframe_write import partitioned as _partitioned

    return _partitioned(df, format, options or {}, num_partitions)


def lookup(df: DataFrame, format: str, options: Mapping[str, object] | None = None, *, on: str | Sequence[str],
           how: str = "left", columns: Sequence[str] | None = None) -> DataFrame:
    """`df` (batch or streaming) with the columns of the rows a store holds for each row's key `on` (Flink's lookup
    join): per Arrow batch, distinct keys read in bulk, optionally cached (lookup.cache), joined back in Arrow. `how`:
    "left" (no match: nulls) or "inner" (no match: no row); `columns`: the store's columns to add (default: all but
    the keys). Options are the format's lookup options (docs/lookup.md), all checked before any work."""
    from sluice.source._lookup_dataframe import lookup as _lookup

    return _lookup(df, format, options or {}, on, how, columns)


def run(start_query: Callable[[], StreamingQuery], *, max_restarts: int = 10) -> StreamingQuery:
    """Run a streaming query to its end, starting it again (`start_query()`: it builds the streaming DataFrame and
    starts the query on its checkpoint) whenever it stops on sluice's "restart needed" error (RestartNeededError,
    e.g. a column added to a table postgres_changes captures), at most `max_restarts` times; any other error is
    raised. Returns the last query (docs/postgres.md, schema changes)."""
    from sluice.spark._run import run as _run

    return _run(start_query, max_restarts=max_restarts)


def last_write_summary(format: str | None = None, spark: SparkSession | None = None) -> dict[str, Any] | None:
    """The statistics summary of the last write (or micro-batch), committed or failed (`status`).

    Kept on the driver's machine; a Spark Connect client (the active Connect session, or `spark`) asks the
    driver for it.
    """
    from sluice.spark._summary import read_last_summary

    return read_last_summary(format, spark)


__all__ = [
    "ConflictError",
    "DataLossError",
    "OptionError",
    "RecordError",
    "RecordTooLargeError",
    "RefusedRecords",
    "RestartNeededError",
    "RetryableError",
    "SinkError",
    "SluiceError",
    "ThrottledError",
    "__version__",
    "last_write_summary",
    "lookup",
    "partitioned",
    "register",
    "run",
    "session",
    "write",
]
