"""What upsert.unchanged-column means to every sink that upserts: a list<string> column naming, per row, the columns
the change left unchanged and did not carry (postgres_changes' `_unchanged`, for TOASTed values an UPDATE did not
touch). Their values in the row are null and mean nothing: the store keeps the value it has.

Shared here: the option's declaration and checks, which rows name a column, and the fill of a batch's rows of one
key (a later change that left a column unchanged takes the value of the last earlier change that set it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice._errors import OptionError, RecordError
from sluice._options import Option

OPTION = "upsert.unchanged-column"


def unchanged_column_option(effect: str) -> Option:
    """The option, as a sink declares it; `effect`: what the sink does with a column a row names."""
    return Option(OPTION, "str", None,
                  "list<string> column naming, per row, the columns whose value the change left unchanged and did not "
                  f"carry (postgres_changes' _unchanged); {effect} Needs primary-key; not written.")


def check_unchanged_column(schema: pa.Schema, column: str | None, primary_key: Sequence[str]) -> None:
    """Refuse upsert.unchanged-column naming a column the DataFrame lacks or one that is not a list of strings, or
    without a primary key (the stored row is found by its key)."""
    if column is None:
        return
    if column not in schema.names:
        raise OptionError(f"{OPTION} column '{column}' is not in the DataFrame (columns: {schema.names})")
    kind = schema.field(column).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_string(kind.value_type):
        raise OptionError(f"{OPTION} column '{column}' is {kind}; it must be a list of column names (array<string>, "
                          "as postgres_changes' _unchanged)")
    if not primary_key:
        raise OptionError(f"{OPTION} needs primary-key: the stored value is kept in the row with the same key")


def marked_columns(marker: pa.Array | pa.ChunkedArray) -> list[str]:
    """The columns some row of `marker` names, sorted."""
    names = pc.unique(pc.list_flatten(marker)).drop_null().to_pylist()
    return sorted(names)


def marked_rows(marker: pa.Array | pa.ChunkedArray, column: str) -> np.ndarray:
    """A boolean mask: the rows whose `marker` names `column`."""
    if isinstance(marker, pa.ChunkedArray):
        marker = marker.combine_chunks()
    out = np.zeros(len(marker), bool)
    flat = pc.list_flatten(marker)
    if len(flat):
        parents = pc.list_parent_indices(marker).to_numpy()
        out[parents[pc.fill_null(pc.equal(flat, column), False).to_numpy(zero_copy_only=False)]] = True
    return out


def refuse_unchanged(batch: pa.RecordBatch | pa.Table, column: str, key: Sequence[str], store: str,
                     fix: str) -> None:
    """For a sink that cannot keep a stored value: a RecordError for the rows that name a column, naming the first
    row's key and columns, before any row of `batch` is written. `fix`: what the user can do instead."""
    marker = batch.column(column)
    named = pc.fill_null(pc.greater(pc.list_value_length(marker), 0), False)
    if not pc.any(named).as_py():
        return
    rows = pc.indices_nonzero(named).to_pylist()
    first = rows[0]
    keys = {k: batch.column(k)[first].as_py() for k in key if k in batch.schema.names}
    more = f", and {len(rows) - 1} more row(s)" if len(rows) > 1 else ""
    raise RecordError(f"{store} cannot keep a stored value: the row with key {keys} leaves column(s) "
                      f"{marker[first].as_py()} unchanged ({OPTION} '{column}'){more}, and writing it would null "
                      f"them. {fix} Nothing of the chunk was written.", rows=rows)


def fill_unchanged(table: pa.Table, key: Sequence[str], column: str, order: str) -> tuple[pa.Table, dict[str, str]]:
    """The last row per key of `table` (ordered by `order` within a key), its unchanged values filled from the last
    earlier row of that key that set them; for each column some row names, a boolean column `_sluice_keep_<n>` that
    is true where no row of the key set it (the store keeps its stored value). Returns the rows (in `order`, without
    `order`) and {column: its keep column}."""
    n = table.num_rows
    names = marked_columns(table.column(column))
    idx = pc.sort_indices(table, [(k, "ascending") for k in key] + [(order, "ascending")]).to_numpy()
    ordered = table.take(pa.array(idx))
    starts = np.zeros(n, bool)
    if n:
        starts[0] = True
        for k in key:
            col = ordered.column(k).combine_chunks()
            same = pc.fill_null(pc.equal(col.slice(1), col.slice(0, n - 1)), False)  # a null key: its own group
            starts[1:] |= ~same.to_numpy(zero_copy_only=False)
    group_start = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    last = np.flatnonzero(np.append(starts[1:], True)) if n else np.zeros(0, np.int64)
    out = ordered.take(pa.array(last))
    keeps: dict[str, str] = {}
    for i, name in enumerate(names):
        set_here = ~marked_rows(ordered.column(column), name)
        latest = np.maximum.accumulate(np.where(set_here, np.arange(n), -1))[last]
        known = latest >= group_start[last]
        source = np.where(known, latest, last)
        filled = ordered.column(name).take(pa.array(source))
        keep = f"_sluice_keep_{i}"
        out = out.set_column(out.schema.get_field_index(name), name, filled).append_column(keep, pa.array(~known))
        keeps[name] = keep
    resorted = pc.sort_indices(out.column(order)).to_numpy()
    return out.take(pa.array(resorted)).drop_columns([order]), keeps
