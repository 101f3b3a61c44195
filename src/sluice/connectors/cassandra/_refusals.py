"""What Cassandra refuses per record: the values an encoder finds unfit before anything is sent, and the server's
InvalidRequest messages that name what a statement holds (the same statement fails again, the others of its batch
would not). With errors.tolerance=all such rows go aside (docs/reliability.md, "When a record is refused"); with
none they fail the write, as they always did."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sluice.connector import RecordError
from sluice.connectors.cassandra._types import CQLType, python_values

# InvalidRequest messages of Cassandra's own checks of a statement's values (ModificationStatement, Attributes,
# the partition key's validation, guardrails). Anything else an InvalidRequest says (an unknown column, a table
# dropped, a type the prepared statement no longer has, a batch over batch_size_fail_threshold) is the whole
# write's problem and stays a failure of the write.
RECORD_MESSAGES = (
    "Key may not be empty",  # an empty partition key (an empty string or blob, the key's only column)
    "Key length of",  # a key component over 65,535 bytes
    "Invalid null value",  # a null in a primary key column (the encoder refuses those before sending)
    "Invalid empty value",
    "A TTL must be greater or equal to 0",  # write.ttl-column's value
    "ttl is too large",
    "Rejected an oversized mutation",  # a mutation over max_mutation_size (half of commitlog_segment_size)
    "Guardrail",  # a value over a guardrail (column_value_size, collection_size, items_per_collection, ...)
)
ADVICE = "Fix such rows, or set errors.tolerance=all and errors.deadletter.format to send them aside."


def refuses_record(error: BaseException) -> bool:
    """Whether a driver error refuses a statement for what it holds (the class and message of Cassandra's checks)."""
    from cassandra import InvalidRequest

    return isinstance(error, InvalidRequest) and any(text in str(error) for text in RECORD_MESSAGES)


def row_key(batch: pa.RecordBatch, keys: Sequence[str], row: int) -> str:
    values = {k: batch.column(k)[row].as_py() for k in keys if k in batch.schema.names}
    return f"the row with primary key {values}"


def check_rows(batch: pa.RecordBatch, primary_key: Sequence[str], timestamp_column: str | None, table: str,
               first_row: int) -> None:
    """RecordError with the rows of the first primary key column found null (Cassandra has no null keys), else of
    a null write.timestamp-column (every row needs its write timestamp). One problem at a time, so each dead letter
    has its own reason: the engine encodes the other rows again."""
    for name in primary_key:
        column = batch.column(name)
        if column.null_count:
            rows = np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False))).tolist()
            others = [k for k in primary_key if k != name]
            raise RecordError(f"primary key column '{name}' is null in row {first_row + rows[0]} of this task "
                              f"({row_key(batch, others, rows[0]) if others else 'no other key columns'}) writing "
                              f"into {table}: Cassandra has no null keys{_more(rows)}. Filter such rows out or fill "
                              f"them in. {ADVICE}", rows=rows)
    if timestamp_column is not None and batch.column(timestamp_column).null_count:
        column = batch.column(timestamp_column)
        rows = np.flatnonzero(np.asarray(column.is_null().to_numpy(zero_copy_only=False))).tolist()
        raise RecordError(f"write.timestamp-column '{timestamp_column}' is null for "
                          f"{row_key(batch, primary_key, rows[0])}{_more(rows)}; every row needs a timestamp. "
                          f"{ADVICE}", rows=rows)


def _more(rows: Sequence[int]) -> str:
    return f" ({len(rows) - 1} more such row(s) in this batch)" if len(rows) > 1 else ""


def column_values(batch: pa.RecordBatch, column: str, kind: CQLType, primary_key: Sequence[str],
                  table: str) -> list[Any]:
    """The column's values as the driver binds them; RecordError with every row whose value cannot be one (a string
    that is no UUID for a uuid column), found value by value only once the whole column failed."""
    try:
        return python_values(batch.column(column), kind)
    except (TypeError, ValueError, OverflowError):
        pass
    bad: list[int] = []
    reason = ""
    for row in range(batch.num_rows):
        try:
            python_values(batch.column(column).slice(row, 1), kind)
        except (TypeError, ValueError, OverflowError) as e:
            reason = reason or (f"{row_key(batch, primary_key, row)}: column '{column}' ({kind}) cannot take its "
                                f"value: {e}")
            bad.append(row)
    raise RecordError(f"{reason} ({len(bad)} such row(s) in this batch) writing into {table}. {ADVICE}", rows=bad)


def bind_refusal(batch: pa.RecordBatch, primary_key: Sequence[str], table: str, failures: dict[int, BaseException]
                 ) -> RecordError:
    """Rows the driver could not serialize (a value out of its CQL type's range): the first, and those that failed
    the same way (each dead letter has its own reason: the engine encodes the other rows again)."""
    row = min(failures)
    reason = str(failures[row])
    rows = sorted(r for r, e in failures.items() if str(e) == reason)
    return RecordError(f"{row_key(batch, primary_key, row)} cannot be written into {table}: {reason}{_more(rows)}. "
                       f"{ADVICE}", rows=rows)
