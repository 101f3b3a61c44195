"""What primary-key and upsert.op-column mean to every sink that upserts (s2, postgres, tablestore)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import OptionError

# Values of upsert.op-column that delete the row's key, as flink-connector-s2's upsert sink reads them.
DELETE_OPS = ("d", "delete", "D", "-D")
DELETE_OPS_SQL = "(" + ", ".join(f"'{op}'" for op in DELETE_OPS) + ")"  # an IN list for PostgreSQL and Spark SQL


def delete_mask(op: pa.Array) -> pa.BooleanArray:
    """Which rows an upsert.op-column of strings marks as deletes (a null op is not a delete)."""
    return pc.fill_null(pc.is_in(op, pa.array(DELETE_OPS)), False)


def first_null(column: pa.Array) -> int:
    """The position of the first null in `column` (which has one): the row an error about it names."""
    position: int = column.is_null().index(True).as_py()
    return position


def check_key_columns(names: Sequence[str], primary_key: Sequence[str], op_column: str | None) -> None:
    """Fail naming the option when a primary-key or upsert.op-column column is not in the DataFrame."""
    for option, columns in (("primary-key", primary_key), ("upsert.op-column", [op_column] if op_column else [])):
        missing = [c for c in columns if c not in names]
        if missing:
            raise OptionError(f"{option} column(s) {missing} are not in the DataFrame (columns: {list(names)})")
