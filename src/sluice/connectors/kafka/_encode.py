"""Encoding the key and the value on the executors, in bulk, before a batch's rows are buffered: each typed side's
columns as one struct array, encoded by the format under the writer schema the driver resolved, framed with its
schema id (Confluent's wire format). A row that does not fit refuses the whole Arrow batch, naming the column and the
row's key, before any of its records is sent; under sink.transactional the task then fails and its transaction is
aborted, so nothing of the task becomes visible. A null `value` struct is a tombstone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from sluice.connector import OptionError, PayloadError, RecordError, RegisteredSchema, frame_payloads
from sluice.connectors.kafka._fit import conform_struct
from sluice.connectors.kafka._format_options import RECORD_COLUMNS, PayloadSide, payload_format
from sluice.connectors.kafka._schemas import SideColumns
from sluice.connectors.kafka._store import show_key


class RowRefusedError(RecordError, OptionError):
    """A row whose key or value does not fit its writer schema (`rows`: its position in the Arrow batch); nothing of
    its Arrow batch was sent. With errors.tolerance=all the row goes to the dead-letter target and the rest of the
    batch is encoded again."""


@dataclass(frozen=True)
class SideEncoder:
    side: PayloadSide
    columns: SideColumns

    @property
    def writer(self) -> RegisteredSchema:
        assert self.side.schema is not None, "the writer schema is resolved on the driver"
        return self.side.schema

    @cached_property
    def arrow_type(self) -> pa.StructType:
        return payload_format(self.side.format).reader_type(self.writer)

    def rows(self, batch: pa.RecordBatch) -> pa.StructArray:
        if self.columns.struct_column is not None:
            column = batch.column(self.columns.struct_column)
        else:
            column = pa.StructArray.from_arrays([batch.column(n) for n in self.columns.columns],
                                                names=list(self.columns.columns))
        return conform_struct(column, self.arrow_type)

    def encode(self, batch: pa.RecordBatch, name_row: Callable[[int], str]) -> pa.Array:
        """The side's framed payloads of `batch`'s rows (null for a null struct: a tombstone)."""
        rows = self.rows(batch)
        present: np.ndarray | None = None
        if rows.null_count:
            present = np.flatnonzero(rows.is_valid().to_numpy(zero_copy_only=False))
            rows = rows.take(pa.array(present))
        try:
            bodies = payload_format(self.side.format).encode(rows, self.writer)
        except PayloadError as error:
            row = int(present[error.index]) if present is not None else error.index
            column = error.column or "?"
            if self.columns.struct_column is not None and error.column:
                column = f"{self.columns.struct_column}.{error.column}"
            raise RowRefusedError(
                f"kafka: the row with key {name_row(row)} does not fit the {self.side.side}'s writer schema (subject "
                f"{self.writer.subject}, id {self.writer.schema_id}) in column '{column}': {error.reason}. Nothing of "
                "its Arrow batch was sent. Fix or filter the row, write with a schema that takes it, or set "
                "errors.tolerance=all and errors.deadletter.format to send such rows aside.", rows=[row]) from None
        framed = frame_payloads(bodies, self.writer.schema_id)
        if present is None:
            return framed
        index = np.zeros(batch.num_rows, np.int64)
        index[present] = np.arange(len(present))
        mask = np.ones(batch.num_rows, bool)
        mask[present] = False
        return framed.take(pa.array(index, mask=mask))


@dataclass(frozen=True)
class PayloadEncoder:
    """A batch of the DataFrame's rows -> a batch of Kafka's record columns (key and value binary, framed)."""

    key: SideEncoder | None
    value: SideEncoder | None
    value_struct: bool  # the value is the struct column `value` (else the value's fields are columns)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        names = batch.schema.names
        keys = batch.column("key") if "key" in names else None

        def name_row(row: int) -> str:
            return "null" if keys is None else show_key(keys[row].as_py())

        out: dict[str, pa.Array] = {}
        if self.key is not None:
            out["key"] = self.key.encode(batch, name_row)
        elif keys is not None:
            out["key"] = keys
        out["value"] = self.value.encode(batch, name_row) if self.value is not None else batch.column("value")
        kept = RECORD_COLUMNS + (("timestamp",) if self.value_struct or self.value is None else ())
        for name in names:
            if name in kept and name not in out:
                out[name] = batch.column(name)
        return pa.RecordBatch.from_pydict(out)
