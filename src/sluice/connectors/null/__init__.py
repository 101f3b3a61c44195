"""`format("sluice_null")`: runs the whole sink engine against a store that accepts and drops every batch.

Measures what sluice itself costs (encoding, buffering, batching, commit) with no store in the way:

    import sluice
    spark = sluice.session()
    df = spark.range(1_000_000).selectExpr("repeat('x', 100) AS body")
    sluice.write(df, "sluice_null", {"sink.mode": "unordered"})
    print(sluice.last_write_summary("sluice_null"))

Entries are the values of the `body` column (or the only string/binary column); any other DataFrame
is accepted too, with one entry per row sized by the batch's average row size.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.types import StructType

from sluice.connector import (
    Batch,
    Encoded,
    Encoder,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    Store,
    TaskWriter,
    WriteContext,
    WritePlan,
    binary_column,
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


def _row_encoder(batch: pa.RecordBatch) -> Encoded:
    size = max(1, batch.nbytes // max(1, batch.num_rows))
    return Encoded(range(batch.num_rows), [size] * batch.num_rows)


def _column_encoder(column: str) -> Encoder:
    def encode(batch: pa.RecordBatch) -> Encoded:
        return Encoded(*binary_column(batch, column))

    return encode


@dataclass(frozen=True)
class NullWritePlan(WritePlan):
    body_column: str | None = None  # entries are this column's values; None: one entry per row

    def open_task(self, context: WriteContext) -> TaskWriter:
        encode = _row_encoder if self.body_column is None else _column_encoder(self.body_column)
        return TaskWriter(encode, NullStore())


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
