"""Vectorized helpers that turn Arrow record batches into engine entries (no per-row dicts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import OptionError


def binary_column(batch: pa.RecordBatch, name: str) -> tuple[list[bytes], list[int]]:
    """Entries = the values of one string/binary column as bytes; sizes = their byte lengths."""
    column = batch.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary() if pa.types.is_string(column.type) else pa.large_binary())
    if column.null_count:
        raise OptionError(
            f"column '{name}' has {column.null_count} null value(s) in this batch; a record body cannot be null. "
            "Filter them out or fill them (e.g. F.coalesce(col, F.lit(''))) before writing."
        )
    sizes = pc.binary_length(column).to_numpy(zero_copy_only=False).tolist()
    return column.to_pylist(), sizes


def body_column_name(schema_names: Sequence[str], types: Sequence[Any]) -> str:
    """The column a raw body comes from: the only string/binary column, or the one named `body`."""
    if "body" in schema_names:
        return "body"
    candidates = [n for n, t in zip(schema_names, types, strict=True) if t in ("string", "binary")]
    if len(candidates) == 1 and len(schema_names) == 1:
        return candidates[0]
    raise OptionError(
        f"raw bodies come from a single string/binary column or a column named 'body'; the DataFrame has "
        f"columns {list(schema_names)}. Select one column or rename it to 'body'."
    )


def partition_buckets(batch: pa.RecordBatch, columns: Sequence[str], parallelism: int) -> list[int]:
    """Bucket of every row: hash of the partition-key columns modulo `parallelism` (vectorized)."""
    import pandas as pd

    missing = [c for c in columns if c not in batch.schema.names]
    if missing:
        raise OptionError(
            f"sink.partition-key column(s) {missing} are not in the DataFrame (columns: {batch.schema.names})."
        )
    frame = pa.Table.from_batches([batch.select(list(columns))]).to_pandas()
    hashes = pd.util.hash_pandas_object(frame, index=False).to_numpy()
    return (hashes % parallelism).tolist()
