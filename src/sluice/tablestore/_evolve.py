"""schema.evolution=add-columns in the table store: the staged files of a commit carry a column the table lacks, and
the Delta schema change goes in the version of those rows. A merge does it itself (`merge_schema`); an append,
whose other commits only add the tasks' files to the log, writes that commit's rows again through deltalake with
`schema_mode="merge"` (the add actions of a write transaction cannot change the schema)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def staged_rows(fs: Any, paths: list[str]) -> pa.Table | None:
    """The rows of the staged Parquet files at `paths` (the filesystem's paths), in order; None when there are none."""
    import pyarrow.parquet as pq

    tables = [pq.read_table(path, filesystem=fs) for path in paths]
    return pa.concat_tables(tables) if tables else None


def adds_columns(dt: Any, fs: Any, path: str | None) -> bool:
    """Whether the staged file at `path` (a commit's files share the write's schema) has a column `dt` lacks."""
    import pyarrow.parquet as pq

    if path is None:
        return False
    have = set(pa.schema(dt.schema().to_arrow()).names)
    return any(name not in have for name in pq.read_schema(path, filesystem=fs).names)


def nullable_added(table: pa.Table, dt: Any) -> pa.Table:
    """`table` with the columns `dt` lacks made nullable: the table's earlier rows have no value for them."""
    have = set(pa.schema(dt.schema().to_arrow()).names)
    return table.cast(pa.schema([f.with_nullable(True) if f.name not in have else f for f in table.schema]))


def append_adding_columns(dt: Any, rows: pa.Table, props: Any, hooks: Any) -> None:
    """`rows` appended to `dt` with the columns it lacks, in one version (`props`' app transaction included)."""
    from deltalake import write_deltalake

    write_deltalake(dt, nullable_added(rows, dt), mode="append", schema_mode="merge", commit_properties=props,
                    post_commithook_properties=hooks)
