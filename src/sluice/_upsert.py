"""What primary-key and upsert.op-column mean to every sink that upserts (s2, postgres, tablestore)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import OptionError, SluiceError

# Values of upsert.op-column that delete the row's key, as flink-connector-s2's upsert sink reads them.
DELETE_OPS = ("d", "delete", "D", "-D")
DELETE_OPS_SQL = "(" + ", ".join(f"'{op}'" for op in DELETE_OPS) + ")"  # an IN list for PostgreSQL and Spark SQL
# The value of upsert.op-column that empties the whole target (format("postgres_changes") emits it for a TRUNCATE);
# its other columns are null. Sinks that apply it: postgres, tablestore; every other upserting sink refuses it.
TRUNCATE_OP = "truncate"
# Op values whose row carries no values to write (its key alone, or nothing): NOT NULL and CHECKs do not apply.
VALUELESS_OPS_SQL = "(" + ", ".join(f"'{op}'" for op in (*DELETE_OPS, TRUNCATE_OP)) + ")"


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


def refuse_truncate(op: pa.Array, op_column: str, sink: str) -> None:
    """Fail, naming the value and the column, when `op` (an upsert.op-column) holds TRUNCATE_OP: `sink` cannot empty
    its target in order with the rows around it. Called on each chunk before any of its rows is buffered."""
    if pc.any(pc.equal(op.cast(pa.string()), TRUNCATE_OP)).as_py():
        raise TruncateRefusedError(
            f"upsert.op-column '{op_column}' has the value '{TRUNCATE_OP}' (a TRUNCATE from format('postgres_changes'))"
            f", which the {sink} sink cannot apply: it would have to empty its target in order with the rows around "
            f"it. Stream into format('postgres') or format('tablestore'), which apply it; or filter such rows out "
            f"(.where(\"{op_column} <> '{TRUNCATE_OP}'\")) and empty the target yourself; or read with "
            "option truncate=fail to stop the source at a TRUNCATE")


class TruncateRefusedError(SluiceError):
    """A sink that cannot apply upsert.op-column's TRUNCATE_OP met one (refuse_truncate)."""
