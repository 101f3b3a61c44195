"""Delta tables by name in a warehouse folder, and the one place that commits to them.

A commit carries its barrier twice: as custom metadata (`sluice.barrier`, shown by `history()`) and as a Delta
app transaction (app id = the writing job, version = the barrier). delta-rs does not enforce app transactions,
so `commit` checks `transaction_version(job) >= barrier` itself and skips a replayed barrier. After a commit,
the MetaService records (table, barrier, Delta version).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sluice.connector import DELETE_OPS_SQL, OptionError, SluiceError
from sluice.meta import MetaService
from sluice.tablestore._storage import Warehouse

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DATA = "data"


class TableStoreError(SluiceError):
    """A table-store request failed; the message names the table."""


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise OptionError(f"table name {name!r}: use letters, digits and '_' (at most 128, not starting with a digit)")
    return name


# Versions between Delta checkpoints (Delta's own default): opening a table reads the newest checkpoint and at most
# this many log entries after it.
CHECKPOINT_INTERVAL = 100
# Compaction: files below this size are small; they are rewritten into files of about this size.
COMPACT_TARGET_BYTES = 128 * 1024 * 1024
COMPACT_MIN_FILES = 50


def small_files(dt: Any, target_bytes: int) -> int:
    """How many of the table's current data files are smaller than `target_bytes`."""
    import pyarrow.compute as pc

    sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
    return int(pc.sum(pc.less(sizes, target_bytes)).as_py() or 0)


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file a task wrote, relative to the table root, not yet in the Delta log."""

    path: str
    size: int
    rows: int


@dataclass(frozen=True)
class Commit:
    table: str
    barrier: int
    version: int
    replayed: bool


class StoreTable:
    """One named table: where it lives, its schema and primary key, and commits to it."""

    def __init__(self, name: str, warehouse: str | Warehouse | None = None) -> None:
        self.name = check_name(name)
        self.warehouse = Warehouse.resolve(warehouse)
        self.uri = self.warehouse.table_uri(name)

    def __repr__(self) -> str:
        return f"StoreTable({self.name!r}, {self.warehouse.root!r})"

    @property
    def root(self) -> Path:
        """The table's folder, for a local warehouse."""
        if not self.warehouse.is_local:
            raise TableStoreError(f"table '{self.name}' is in {self.warehouse.root}, not in a local folder")
        return Path(self.uri)

    def file_path(self, relative: str) -> str:
        """A file of this table (a path relative to its root) as the warehouse's filesystem names it."""
        return self.warehouse.path(f"{self.uri}/{relative}")

    def exists(self) -> bool:
        from deltalake import DeltaTable

        if self.warehouse.is_local:
            return (self.root / "_delta_log").is_dir()
        return DeltaTable.is_deltatable(self.uri, storage_options=self.warehouse.storage_options())

    def delta(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable

        if not self.exists():
            raise TableStoreError(f"table '{self.name}' does not exist in {self.warehouse.root}; write to it first "
                                  "(it is created from the DataFrame's schema)")
        storage = self.warehouse.storage_options()
        if version is None:
            return DeltaTable(self.uri, storage_options=storage)
        try:
            return DeltaTable(self.uri, version=version, storage_options=storage)
        except Exception:
            latest = DeltaTable(self.uri, storage_options=storage).version()
            if version > latest:  # deltalake's own error here is a kernel message that names neither
                raise TableStoreError(f"table '{self.name}' has no version {version}: its latest is {latest}") \
                    from None
            raise

    def primary_key(self, dt: Any = None) -> tuple[str, ...]:
        # Kept in the table's description: this delta-kernel refuses custom configuration keys.
        try:
            about = json.loads((dt or self.delta()).metadata().description or "{}")
        except ValueError:
            return ()
        return tuple(about.get("sluice", {}).get("primary_key", ()))

    def create(self, schema: pa.Schema, primary_key: tuple[str, ...]) -> None:
        from deltalake import write_deltalake

        if self.warehouse.is_local:
            self.root.mkdir(parents=True, exist_ok=True)
        about = json.dumps({"sluice": {"primary_key": list(primary_key)}})
        write_deltalake(self.uri, schema.empty_table(), mode="append", name=self.name, description=about,
                        configuration={"delta.enableChangeDataFeed": "true"},
                        storage_options=self.warehouse.storage_options())

    def check_schema(self, schema: pa.Schema) -> None:
        have = pa.schema(self.delta().schema().to_arrow())
        names = {f.name: f for f in have}
        for f in schema:
            if f.name not in names:
                raise OptionError(f"column '{f.name}' is not in table '{self.name}' (columns: {list(names)})")
            if not _same_type(names[f.name].type, f.type):
                raise OptionError(f"column '{f.name}' is {f.type} in the DataFrame but {names[f.name].type} in table "
                                  f"'{self.name}'; cast it first")

    def staging_prefix(self, write_id: str, epoch: int | None) -> str:
        """Where tasks write Parquet files for one write or micro-batch, relative to the table (files join the table
        on commit)."""
        return f"{DATA}/{write_id if epoch is None else f'{write_id}-e{epoch}'}"

    def commit(self, files: list[StagedFile], *, job: str, barrier: int, meta: MetaService, job_id: str | None = None,
               op_column: str | None = None, checkpoint_interval: int = CHECKPOINT_INTERVAL,
               compact_min_files: int = 0, compact_target_bytes: int = COMPACT_TARGET_BYTES) -> Commit:
        """Make `files` visible in one Delta version for `barrier` (append, or merge by the primary key); every
        `checkpoint_interval` versions, a Delta checkpoint, so opening the table reads a checkpoint and the log after
        it instead of the whole log; once the table has `compact_min_files` files smaller than
        `compact_target_bytes` (0: never), a compaction right after the barrier's version (see `compact`)."""
        from deltalake import CommitProperties, PostCommitHookProperties, Transaction
        from deltalake.transaction import AddAction

        dt = self.delta()
        done = dt.transaction_version(job)
        if done is not None and done >= barrier:
            self._drop(files)
            version = meta.barrier_version(self.name, barrier)
            if version is None:  # the commit landed but the driver died before recording it: record it now
                version = next((h["version"] for h in dt.history() if h.get("sluice.barrier") == str(barrier)),
                               dt.version())
                meta.complete_barrier(self.name, barrier, version, job_id)
            return Commit(self.name, barrier, version, replayed=True)
        props = CommitProperties(custom_metadata={"sluice.barrier": str(barrier), "sluice.job": job},
                                 app_transactions=[Transaction(app_id=job, version=barrier)])
        hooks = PostCommitHookProperties(create_checkpoint=False)  # checkpoints on our interval, below
        key = self.primary_key(dt)
        if not key:
            now = int(time.time() * 1000)
            actions = [AddAction(f.path, f.size, {}, now, True, f'{{"numRecords": {f.rows}}}') for f in files if f.rows]
            dt.create_write_transaction(actions, mode="append", schema=dt.schema(), commit_properties=props,
                                        post_commithook_properties=hooks)
        else:
            self._merge(dt, files, key, op_column, props, hooks)
            self._drop(files)
        dt.update_incremental()  # a write transaction does not advance the handle by itself
        version = dt.version()
        if version % checkpoint_interval == 0:
            dt.create_checkpoint()
        meta.complete_barrier(self.name, barrier, version, job_id)
        # By the table's single writer, between two of its commits: a compaction never races one of them.
        if compact_min_files and small_files(dt, compact_target_bytes) >= compact_min_files:
            self.compact(compact_target_bytes, dt)
        return Commit(self.name, barrier, version, replayed=False)

    def compact(self, target_bytes: int = COMPACT_TARGET_BYTES, dt: Any = None) -> dict[str, Any]:
        """Rewrite the table's small files into files of about `target_bytes`, as one data-neutral Delta version.

        Delta's optimize marks its adds and removes dataChange=false: reads at a barrier (pinned to the barrier's
        version) are untouched, the change feed between two barrier versions has no rows from it, and a replayed
        barrier still finds its app transaction. The version belongs to no barrier (sluice.compaction in its
        metadata). Deltalake's metrics are returned (numFilesAdded, numFilesRemoved, ...).
        """
        from deltalake import CommitProperties, PostCommitHookProperties

        dt = dt or self.delta()
        return dt.optimize.compact(target_size=target_bytes,
                                   commit_properties=CommitProperties(custom_metadata={"sluice.compaction": "true"}),
                                   post_commithook_properties=PostCommitHookProperties(create_checkpoint=False))

    def _merge(self, dt: Any, files: list[StagedFile], key: tuple[str, ...], op_column: str | None,
               props: Any, hooks: Any) -> None:
        import pyarrow.parquet as pq

        fs = self.warehouse.filesystem()
        tables = [pq.read_table(self.file_path(f.path), filesystem=fs) for f in files if f.rows]
        if not tables:  # nothing changed; the barrier still completes with an empty commit
            dt.create_write_transaction([], mode="append", schema=dt.schema(), commit_properties=props,
                                        post_commithook_properties=hooks)
            return
        source = pa.concat_tables(tables)
        # Last change per key wins: row order within the staged files is task order, then row order.
        import pyarrow.compute as pc

        source = source.append_column("_sluice_row", pa.array(range(source.num_rows), pa.int64()))
        last = source.group_by(list(key)).aggregate([("_sluice_row", "max")])
        rows = pc.sort_indices(last.column("_sluice_row_max"))
        source = source.take(pc.take(last.column("_sluice_row_max"), rows)).drop_columns(["_sluice_row"])
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
        merge = dt.merge(source, on, source_alias="s", target_alias="t", commit_properties=props,
                         post_commithook_properties=hooks)
        if op_column:
            deleted = f"s.`{op_column}` IN {DELETE_OPS_SQL}"
            cols = {c: f"s.`{c}`" for c in source.column_names if c != op_column}
            merge = (merge.when_matched_delete(deleted).when_matched_update(cols, f"NOT ({deleted})")
                     .when_not_matched_insert(cols, f"NOT ({deleted})"))
        else:
            merge = merge.when_matched_update_all().when_not_matched_insert_all()
        merge.execute()

    def _drop(self, files: list[StagedFile]) -> None:
        """Delete files no commit references (a replay's, or the staged input of a merge)."""
        self.delete_files([f.path for f in files])

    def delete_files(self, relative: list[str]) -> None:
        fs = self.warehouse.filesystem()
        for path in relative:
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(self.file_path(path))
        if self.warehouse.is_local:  # object stores have no folders to leave behind
            for folder in {(self.root / path).parent for path in relative}:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    norm = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary(), pa.string_view(): pa.string()}
    a, b = norm.get(a, a), norm.get(b, b)
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return (a.tz is None) == (b.tz is None)
    if (pa.types.is_list(a) and pa.types.is_list(b)) or (pa.types.is_large_list(a) and pa.types.is_large_list(b)):
        return _same_type(a.value_type, b.value_type)
    return a == b


def vacuum(name: str, *, warehouse: str | Warehouse | None = None, meta: MetaService | None = None,
           dry_run: bool = False) -> list[str]:
    """Delete data files no longer needed, but never one a consistent read may still ask for.

    The oldest version to keep is this table's version at the consistent barrier of every table linked to it
    through jobs (upstream and downstream): any consistent read that includes this table reads at that barrier
    or a newer one. Delta's vacuum works by age, in whole hours, so the retention is the age of that version
    rounded down (keeping more, never less). Returns the files deleted (or that would be, with dry_run).
    """
    from sluice.meta import NoConsistentVersionError

    meta = meta or MetaService()
    table = StoreTable(name, warehouse)
    dt = table.delta()
    linked = {name} | meta.upstream([name]) | meta.downstream([name])
    try:
        keep_from = meta.consistent_version(sorted(linked)).versions[name]
    except NoConsistentVersionError:
        return []  # no barrier in common yet: any version may still be needed
    stamps = {h["version"]: h["timestamp"] for h in dt.history() if "version" in h and "timestamp" in h}
    committed_ms = stamps.get(keep_from)
    if committed_ms is None:
        return []
    # Files removed after that version are still needed by it: keep every removal younger than its commit
    # (hours rounded up). When it is the latest version, nothing removed is needed any more.
    age_ms = time.time() * 1000 - committed_ms
    hours = 0 if keep_from >= dt.version() else int(-(-age_ms // 3_600_000))
    return list(dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=dry_run))


def compact(name: str, *, warehouse: str | Warehouse | None = None, meta: MetaService | None = None,
            target_bytes: int = COMPACT_TARGET_BYTES) -> dict[str, Any]:
    """Compact a table now (see StoreTable.compact), as a short job holding the table's writer role.

    It never races a commit: while the table's writer runs (a registered job, or a streaming query within its
    writer-lease) this refuses with WriterConflictError; that writer compacts by itself (option auto-compact).
    """
    meta = meta or MetaService()
    table = StoreTable(name, warehouse)
    table.delta()  # a missing table fails here, before any job is registered
    job = meta.register_job("compaction", sources=[], sinks=[name])
    try:
        return table.compact(target_bytes)
    finally:
        meta.finish_job(job.job_id)
