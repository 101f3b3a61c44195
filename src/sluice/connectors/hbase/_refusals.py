"""The rows a batch's refused puts and deletes came from, for the dead-letter target (Store.refused_rows): decoded
back from the entries themselves (the row key into its columns, each cell into its column, as a read does), so the
hot path keeps no row for them. Only the gateway's refusals need it: rows the encoder refuses go aside as they
were (RecordError with rows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from sluice.connectors.hbase._cells import decoder
from sluice.connectors.hbase._client import thrift

if TYPE_CHECKING:
    from sluice.connectors.hbase._sink import RowPlan


def entry_rows(entries: Sequence[Any], plan: RowPlan, schema: pa.Schema) -> pa.Table:
    """One row of `schema` per entry: a put's key columns and cells (its timestamp in write.timestamp-column);
    a delete's key columns, with upsert.op-column 'd' when it deletes the row. A row written as a put and a delete
    of its null cells (write.null-cells=delete) is two entries, each refused on its own."""
    from thriftpy2.protocol import TCyBinaryProtocolFactory
    from thriftpy2.utils import deserialize

    module = thrift()
    decode_key = plan.key.decoder(schema)
    columns = {(cell.family, cell.qualifier): column for column, cell in plan.catalog.cells}
    decoders = {column: decoder(schema.field(column).type, column) for column, _ in plan.catalog.cells}
    rows: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, bytes):  # a put as Thrift bytes (_wire.py)
            entry = deserialize(module.TPut(), entry, TCyBinaryProtocolFactory())
        row: dict[str, Any] = {name: array[0].as_py() for name, array in
                               zip(plan.key.columns, decode_key([bytes(entry.row)]), strict=True)}
        if isinstance(entry, module.TPut):
            for value in entry.columnValues or ():
                column = columns.get((bytes(value.family), bytes(value.qualifier)))
                if column is not None:
                    row[column] = decoders[column](bytes(value.value))
        elif plan.op_column is not None and not entry.columns:
            row[plan.op_column] = "d"
        if plan.timestamp == "column" and plan.timestamp_column is not None and entry.timestamp is not None:
            dtype = schema.field(plan.timestamp_column).type
            stamp = pa.scalar(entry.timestamp, pa.int64())
            row[plan.timestamp_column] = (stamp.cast(pa.timestamp("ms")).cast(dtype) if pa.types.is_timestamp(dtype)
                                          else stamp.cast(dtype)).as_py()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)
