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

from sluice.connector import (
    DELETE_OPS_SQL,
    TRUNCATE_OP,
    OptionError,
    SluiceError,
    fill_unchanged,
    marked_columns,
    new_columns,
)
from sluice.meta import MetaService
from sluice.tablestore._commit import CHECKPOINT_INTERVAL, COMPACT_TARGET_BYTES, DEFAULT_UPKEEP, BarrierCommit, Upkeep
from sluice.tablestore._evolve import adds_columns, append_adding_columns, nullable_added, staged_rows
from sluice.tablestore._retention import oldest_needed_version, trim_log
from sluice.tablestore._storage import Warehouse

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
DATA = "data"


class TableStoreError(SluiceError):
    """A table-store request failed; the message names the table."""


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise OptionError(f"table name {name!r}: use letters, digits and '_' (at most 128, not starting with a digit)")
    return name


# How long a checkpoint carries the removal of a file (Delta's default is a week: a table compacted every few minutes
# would open tens of thousands of them). Vacuum deletes only removals the table still carries, in whole hours: the
# sink's clean at every compaction gets them within this window, a `vacuum` run less often than this may not.
TOMBSTONE_RETENTION = "interval 2 hours"
# Attempts at the next version when other commits keep taking it (each attempt re-reads the log first).
COMMIT_ATTEMPTS = 20


def _hooks() -> Any:
    """Post-commit work sluice does itself: checkpoints on its interval (commit), log retention by what consistent
    reads need (trim_log; delta-rs's own cleanup lists the whole log after every commit and knows nothing of them)."""
    from deltalake import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


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
    stats: str | None = None  # the Delta log's per-file stats (_stats.py); None: the row count alone


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
        from deltalake.exceptions import TableNotFoundError

        storage = self.warehouse.storage_options()
        missing = TableStoreError(f"table '{self.name}' does not exist in {self.warehouse.root}; write to it first "
                                  "(it is created from the DataFrame's schema)")
        try:  # opened directly: on an object store, asking first whether it exists is one more round trip
            return DeltaTable(self.uri, version=version, storage_options=storage)
        except TableNotFoundError:
            if version is None:
                raise missing from None
        except Exception:
            if version is None:
                raise
        try:  # deltalake's errors for a version it cannot open are kernel messages that name neither
            latest = DeltaTable(self.uri, storage_options=storage).version()
        except TableNotFoundError:
            raise missing from None
        if version > latest:
            raise TableStoreError(f"table '{self.name}' has no version {version}: its latest is {latest}")
        raise TableStoreError(f"table '{self.name}' has no version {version} any more: vacuum trimmed its log to the "
                              f"versions a consistent read may still need (latest {latest})")

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
                        configuration={"delta.enableChangeDataFeed": "true",
                                       "delta.deletedFileRetentionDuration": TOMBSTONE_RETENTION},
                        storage_options=self.warehouse.storage_options())

    def drop_if_unwritten(self) -> bool:
        """Remove the table when it holds nothing but its creation (version 0): a write that created it and failed
        before its first commit leaves nothing behind. True when removed."""
        if not self.exists() or self.delta().version() != 0:
            return False
        self.warehouse.filesystem().delete_dir(self.warehouse.path(self.uri))
        return True

    def check_schema(self, schema: pa.Schema, evolution: str) -> None:
        """Refuse a DataFrame column the table has under another type, and one it lacks unless `evolution`
        (schema.evolution) is add-columns: then the commit adds it (`commit`'s add_columns)."""
        have = pa.schema(self.delta().schema().to_arrow())
        names = {f.name: f for f in have}
        added = new_columns(schema.names, names, f"'{self.name}'", evolution, "Drop or rename it")
        for f in schema:
            if f.name in added:
                continue
            if not _same_type(names[f.name].type, f.type):
                raise OptionError(f"column '{f.name}' is {f.type} in the DataFrame but {names[f.name].type} in table "
                                  f"'{self.name}'; cast it first")

    def staging_prefix(self, write_id: str, epoch: int | None) -> str:
        """Where tasks write Parquet files for one write or micro-batch, relative to the table (files join the table
        on commit)."""
        return f"{DATA}/{write_id if epoch is None else f'{write_id}-e{epoch}'}"

    def commit(self, files: list[StagedFile], by: BarrierCommit, meta: MetaService, *, op_column: str | None = None,
               unchanged_column: str | None = None, upkeep: Upkeep = DEFAULT_UPKEEP,
               add_columns: bool = False) -> Commit:
        """Make `files` visible in one Delta version for `by.barrier` (append, or merge by the primary key), then
        the table's `upkeep`: a Delta checkpoint on its interval, so opening the table reads a checkpoint and the log
        after it instead of the whole log; once enough small files pile up, a compaction right after the barrier's
        version (see `compact`), then `clean`; a `clean` every `log_retention` versions too (see Upkeep).
        `add_columns` (schema.evolution=add-columns): columns of `files` the table lacks join its schema in that
        same version."""
        from deltalake.exceptions import CommitFailedError

        barrier, interval, min_files = by.barrier, upkeep.checkpoint_interval, upkeep.compact_min_files
        dt = self.delta()
        for _ in range(COMMIT_ATTEMPTS):
            done = dt.transaction_version(by.job)
            if done is not None and done >= barrier:
                return self._replayed(dt, files, by, meta)
            try:
                version = self._commit_once(dt, files, by, op_column, unchanged_column, add_columns)
                break
            except CommitFailedError:  # another commit took the next version first: commit on top of it
                dt.update_incremental()
        else:
            raise TableStoreError(f"table '{self.name}': barrier {barrier} lost the race for the next version "
                                  f"{COMMIT_ATTEMPTS} times; another process keeps committing to it outside sluice")
        # A merge leaves the handle at the new version, an append at the one it read. Re-reading the log (a LIST on
        # object storage) only when a checkpoint or a compaction needs the new version; the small-file count of an
        # append is the one before it plus its own small files.
        current = int(dt.version()) == version
        small = 0
        if min_files:
            small = small_files(dt, upkeep.compact_target_bytes)
            if not current:
                small += sum(1 for f in files if f.rows and f.size < upkeep.compact_target_bytes)
        cleans = version % upkeep.log_retention == 0
        if not current and (version % interval == 0 or small >= min_files > 0 or cleans):
            dt.update_incremental()
        if version % interval == 0:
            dt.create_checkpoint()
        meta.complete_barrier(self.name, barrier, version, by.job_id)
        # By the table's single writer, between two of its commits: a compaction never races one of them. Files and
        # log entries are cleaned at the same pace (kept: log_retention versions and all a consistent read may open).
        if min_files and small >= min_files:
            self.compact(upkeep.compact_target_bytes, dt, interval)
            self.clean(meta, keep_last=upkeep.log_retention, dt=dt, checkpoint_interval=interval)
        elif cleans:
            # A table that never compacts (upserts rewrite the files they touch, so few are small) is cleaned every
            # log_retention versions all the same, or its removed files and log entries grow without bound (76 MB an
            # hour in bench.soak's steady hour).
            self.clean(meta, keep_last=upkeep.log_retention, dt=dt, checkpoint_interval=interval)
        elif version % interval == 0:  # its barriers are forgotten more often: they are rows in every read's path
            self.forget_barriers(meta, version - upkeep.log_retention)
        return Commit(self.name, barrier, version, replayed=False)

    def forget_barriers(self, meta: MetaService, below_version: int) -> int:
        """Drop the MetaService's rows of barriers completed before `below_version` that no consistent read can use
        (older than the oldest version one may open), so they do not grow with every commit. Returns the rows."""
        keep_from = oldest_needed_version(self.name, meta)
        if keep_from is None:
            return 0  # no barrier in common yet: any of them may still be needed
        return meta.prune_barriers(self.name, min(keep_from, below_version))

    def checkpoint_if_crossed(self, dt: Any, before: int, interval: int = CHECKPOINT_INTERVAL) -> None:
        """A checkpoint at `dt`'s version if versions since `before` reached a multiple of `interval`. Compactions
        and vacuums take versions too (as in Delta, every commit counts), so each calls this after itself: were a
        multiple taken by one of them left without its checkpoint, opening the table would replay up to twice the
        interval's log entries."""
        if int(dt.version()) // interval > before // interval:
            dt.create_checkpoint()

    def clean(self, meta: MetaService, *, keep_last: int = 0, dry_run: bool = False, dt: Any = None,
              checkpoint_interval: int = CHECKPOINT_INTERVAL) -> list[str]:
        """Delete the data files and log entries that no version from `keep_from` on needs (see `vacuum`);
        `keep_from` is the oldest version a consistent read may open, or `keep_last` versions back if older."""
        keep_from = oldest_needed_version(self.name, meta)
        if keep_from is None:
            return []  # no barrier in common yet: any version may still be needed
        dt = dt or self.delta()
        latest = int(dt.version())
        keep_from = max(0, min(keep_from, latest - keep_last))
        if keep_from >= latest:
            hours = 0  # nothing removed is needed any more
        else:  # files removed after that version are still needed by it: keep every removal younger than its commit
            committed = next((h["timestamp"] for h in dt.history(latest - keep_from + 1)
                              if h.get("version") == keep_from), None)
            if committed is None:
                return []
            hours = int(-(-(time.time() * 1000 - committed) // 3_600_000))  # whole hours, rounded up
        deleted = list(dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=dry_run,
                                 post_commithook_properties=_hooks()))
        self.checkpoint_if_crossed(dt, latest, checkpoint_interval)  # the vacuum's own versions, when it deleted
        if not dry_run:  # barriers of versions no consistent read can open any more: their rows go with the files
            meta.prune_barriers(self.name, keep_from)
        return deleted + trim_log(self.warehouse, self.file_path("_delta_log"), keep_from, dry_run=dry_run)

    def _commit_once(self, dt: Any, files: list[StagedFile], by: BarrierCommit, op_column: str | None,
                     unchanged_column: str | None = None, add_columns: bool = False) -> int:
        """One attempt at the version after `dt`'s; returns that version. No silent retry at a later version (so
        the version is known without reading the log again): a lost race raises CommitFailedError."""
        from deltalake import CommitProperties, Transaction
        from deltalake.transaction import AddAction

        props = CommitProperties(custom_metadata={"sluice.barrier": str(by.barrier), "sluice.job": by.job},
                                 app_transactions=[Transaction(app_id=by.job, version=by.barrier)],
                                 max_commit_retries=0)
        hooks = _hooks()
        key = self.primary_key(dt)
        rows = [self.file_path(f.path) for f in files if f.rows]
        evolves = add_columns and adds_columns(dt, self.warehouse.filesystem(), rows[0] if rows else None)
        if key:
            # a merge advances the handle itself
            self._merge(dt, files, key, op_column, props, hooks, unchanged_column, evolves)
            self._drop(files)
            return int(dt.version())
        if evolves:  # the schema change and the rows in one version (_evolve.py)
            append_adding_columns(dt, staged_rows(self.warehouse.filesystem(), rows), props, hooks)
            self._drop(files)
            return int(dt.version())
        now = int(time.time() * 1000)
        actions = [AddAction(f.path, f.size, {}, now, True, f.stats or f'{{"numRecords": {f.rows}}}')
                   for f in files if f.rows]
        read = int(dt.version())
        dt.create_write_transaction(actions, mode="append", schema=dt.schema(), commit_properties=props,
                                    post_commithook_properties=hooks)
        return read + 1

    def _replayed(self, dt: Any, files: list[StagedFile], by: BarrierCommit, meta: MetaService) -> Commit:
        self._drop(files)
        version = meta.barrier_version(self.name, by.barrier)
        if version is None:  # the commit landed but the driver died before recording it: record it now
            version = next((h["version"] for h in dt.history() if h.get("sluice.barrier") == str(by.barrier)),
                           dt.version())
            meta.complete_barrier(self.name, by.barrier, version, by.job_id)
        return Commit(self.name, by.barrier, version, replayed=True)

    def compact(self, target_bytes: int = COMPACT_TARGET_BYTES, dt: Any = None,
                checkpoint_interval: int = CHECKPOINT_INTERVAL) -> dict[str, Any]:
        """Rewrite the table's small files into files of about `target_bytes`, as one data-neutral Delta version.

        Delta's optimize marks its adds and removes dataChange=false: reads at a barrier (pinned to the barrier's
        version) are untouched, the change feed between two barrier versions has no rows from it, and a replayed
        barrier still finds its app transaction. The version belongs to no barrier (sluice.compaction in its
        metadata). Deltalake's metrics are returned (numFilesAdded, numFilesRemoved, ...).
        """
        from deltalake import CommitProperties

        dt = dt or self.delta()
        before = int(dt.version())
        metrics = dt.optimize.compact(target_size=target_bytes,
                                      commit_properties=CommitProperties(custom_metadata={"sluice.compaction": "true"}),
                                      post_commithook_properties=_hooks())
        self.checkpoint_if_crossed(dt, before, checkpoint_interval)
        return metrics

    def _merge(self, dt: Any, files: list[StagedFile], key: tuple[str, ...], op_column: str | None,
               props: Any, hooks: Any, unchanged_column: str | None = None, evolves: bool = False) -> None:
        source = staged_rows(self.warehouse.filesystem(), [self.file_path(f.path) for f in files if f.rows])
        if source is None:  # nothing changed; the barrier still completes with an empty commit
            dt.create_write_transaction([], mode="append", schema=dt.schema(), commit_properties=props,
                                        post_commithook_properties=hooks)
            return
        if evolves:
            source = nullable_added(source, dt)
        # Last change per key wins: row order within the staged files is task order, then row order.
        import pyarrow.compute as pc

        # A truncate empties the table in this same version: only the changes after the last one are applied, and
        # every other row of the table is deleted (when_not_matched_by_source_delete).
        truncated = op_column is not None and pc.any(pc.equal(source.column(op_column), TRUNCATE_OP)).as_py()
        if truncated:
            marks = pc.indices_nonzero(pc.fill_null(pc.equal(source.column(op_column), TRUNCATE_OP), False))
            source = source.slice(pc.max(marks).as_py() + 1)
            if not source.num_rows:
                dt.delete(commit_properties=props, post_commithook_properties=hooks)
                return

        source = source.append_column("_sluice_row", pa.array(range(source.num_rows), pa.int64()))
        keeps: dict[str, str] = {}
        if unchanged_column and marked_columns(source.column(unchanged_column)):
            # A row that left a column unchanged: the key's last earlier row that set it, else the table's value.
            source, keeps = fill_unchanged(source, key, unchanged_column, "_sluice_row")
        else:
            last = source.group_by(list(key)).aggregate([("_sluice_row", "max")])
            rows = pc.sort_indices(last.column("_sluice_row_max"))
            source = source.take(pc.take(last.column("_sluice_row_max"), rows)).drop_columns(["_sluice_row"])
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in key)
        merge = dt.merge(source, on, source_alias="s", target_alias="t", merge_schema=evolves,
                         commit_properties=props, post_commithook_properties=hooks)
        if op_column or unchanged_column:
            special = {op_column, unchanged_column, *keeps.values()}
            cols = {c: f"s.`{c}`" for c in source.column_names if c not in special}
            kept = {c: f"CASE WHEN s.`{keep}` THEN t.`{c}` ELSE s.`{c}` END" for c, keep in keeps.items()}
            deleted = f"s.`{op_column}` IN {DELETE_OPS_SQL}" if op_column else "false"
            merge = (merge.when_matched_delete(deleted).when_matched_update(cols | kept, f"NOT ({deleted})")
                     .when_not_matched_insert(cols, f"NOT ({deleted})"))
            if truncated:
                merge = merge.when_not_matched_by_source_delete()
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
