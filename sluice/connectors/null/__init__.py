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
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from sluice._errors import OptionError
from sluice._options import Options
from sluice.engine import Batch, Store, WriteContext, completed_future
from sluice.spark._datasource import Encoder, EngineDataSource
from sluice.spark._encoding import binary_column, body_column_name


class NullStore(Store):
    name = "sluice_null"

    @property
    def target(self) -> str:
        return "nowhere"

    def submit(self, batch: Batch) -> Future[None]:
        return completed_future()


def _row_encoder(batch: pa.RecordBatch) -> tuple[list[Any], list[int]]:
    size = max(1, batch.nbytes // max(1, batch.num_rows))
    return list(range(batch.num_rows)), [size] * batch.num_rows


class NullDataSource(EngineDataSource):
    format_name = "sluice_null"
    writes_any_type = True

    def make_encoder(self, opts: Options, schema: StructType, context: WriteContext) -> Encoder:
        try:
            column = body_column_name(schema.fieldNames(), [f.dataType.typeName() for f in schema.fields])
        except OptionError:
            return _row_encoder
        return lambda batch: binary_column(batch, column)

    def make_store(self, opts: Options, schema: StructType, context: WriteContext) -> Store:
        return NullStore()


__all__ = ["NullDataSource", "NullStore"]
