"""`format("sluice_null")`: runs the whole sink engine against a store that accepts and drops every batch.

Measures what sluice itself costs (encoding, buffering, batching, commit) with no store in the way:

    import sluice
    spark = sluice.session()
    df = spark.range(1_000_000).selectExpr("repeat('x', 100) AS body")
    sluice.write(df, "sluice_null", {"sink.mode": "unordered"})
    print(sluice.last_write_summary("sluice_null"))

Entries are the task's row numbers, as the stores that keep rows in Arrow make them (ArrowRows: postgres, kafka,
clickhouse, tablestore), sized by the `body` column's values (or the only string/binary column's) in bytes; any other
DataFrame is accepted too, each row sized by the batch's average row size. No Python object is made per row: what it
measures is the engine and the glue around it. A store whose client takes Python objects makes them in its encoder
(`binary_column`: about 50 ns a row), which is its cost, not the engine's (bench/stores/s2_sink.py measures one against
its SDK).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StructType

from sluice.connector import (
    Batch,
    BatchRun,
    Encoded,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    Store,
    TaskWriter,
    WriteContext,
    WritePlan,
    binary_running_sums,
    body_column_name,
    completed_future,
)


class NullStore(Store):
    name = "sluice_null"

    @property
    def target(self) -> str:
        return "nowhere"

    def submit(self, batch: Batch) -> Future[None]:
        return completed_future()

    def submit_run(self, run: BatchRun) -> Future[None]:
        return completed_future()


class _RowNumbers:
    """Encoder: a task's rows as running row numbers (a range), sized by a column's values or the batch's average."""

    def __init__(self, column: str | None) -> None:
        self.column = column
        self.next = 0

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        n = batch.num_rows
        start, self.next = self.next, self.next + n
        if self.column is None:
            return Encoded(range(start, start + n), np.full(n, max(1, batch.nbytes // max(1, n)), dtype=np.int64))
        return Encoded(range(start, start + n), None, running=binary_running_sums(batch, self.column))


@dataclass(frozen=True)
class NullWritePlan(WritePlan):
    body_column: str | None = None  # entries are this column's values; None: one entry per row

    def open_task(self, context: WriteContext) -> TaskWriter:
        return TaskWriter(_RowNumbers(self.body_column), NullStore())


class NullDataSource(SinkDataSource):
    format_name = "sluice_null"
    writes_any_type = True

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> WritePlan:
        self.refuse_overwrite(overwrite)
        try:
            column = body_column_name(schema.fieldNames(), [f.dataType.typeName() for f in schema.fields])
        except OptionError:
            column = None
        return NullWritePlan(self.format_name, opts, schema, config, column)


__all__ = ["NullDataSource", "NullStore"]
