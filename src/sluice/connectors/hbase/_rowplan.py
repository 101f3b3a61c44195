"""How a DataFrame row becomes an HBase put or delete, decided on the driver (the sink encodes by it; the refused
rows are decoded back by it, _refusals.py)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.connectors.hbase._catalog import Catalog
from sluice.connectors.hbase._keys import KeyCodec


@dataclass(frozen=True)
class RowPlan:
    """How a DataFrame row becomes a put or a delete, decided on the driver."""

    catalog: Catalog
    key: KeyCodec
    region_starts: tuple[bytes, ...]  # every region's start key but the first's (b""), in order
    op_column: str | None
    timestamp: str  # client | micro-batch | column
    timestamp_column: str | None
    delete_nulls: bool
    durability: int
    max_cell_bytes: int
