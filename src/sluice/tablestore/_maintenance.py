"""Maintenance of a table as a command runs it (`sluice table compact|vacuum`, `sluice.tablestore.compact`): a
short job holding the table's writer role, and the progress of a long compaction in the console."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sluice.meta import MetaService
from sluice.metrics import ProgressLines
from sluice.tablestore._commit import COMPACT_TARGET_BYTES
from sluice.tablestore._storage import Warehouse
from sluice.tablestore._table import StoreTable

AFTER_S = 5.0  # a compaction that ends sooner prints nothing
EVERY_S = 5.0


def vacuum(name: str, *, warehouse: str | Warehouse | None = None, meta: MetaService | None = None,
           dry_run: bool = False) -> list[str]:
    """Delete data files and log entries no longer needed, but never one a consistent read may still ask for.

    The oldest version to keep is this table's version at the consistent barrier of every table linked to it
    through jobs (upstream and downstream): any consistent read that includes this table reads at that barrier
    or a newer one. Delta's vacuum works by age, in whole hours, so the retention is the age of that version
    rounded up (keeping more, never less); log entries go up to the newest checkpoint at or below that version,
    with the change data they name (trim_log). Returns the files deleted (or that would be, with dry_run).
    """
    return StoreTable(name, warehouse).clean(meta or MetaService(), dry_run=dry_run)


def compact(name: str, *, warehouse: str | Warehouse | None = None, meta: MetaService | None = None,
            target_bytes: int = COMPACT_TARGET_BYTES) -> dict[str, Any]:
    """Compact a table now (see StoreTable.compact), as a short job holding the table's writer role; one that runs
    over 5 s prints how much it has rewritten every 5 s (logger sluice.progress).

    It never races a commit: while the table's writer runs (a registered job, or a streaming query within its
    writer-lease) this refuses with WriterConflictError; that writer compacts by itself (option auto-compact).
    """
    meta = meta or MetaService()
    table = StoreTable(name, warehouse)
    dt = table.delta()  # a missing table fails here, before any job is registered
    job = meta.register_job("compaction", sources=[], sinks=[name])
    try:
        with CompactionProgress(table, dt, target_bytes):
            return table.compact(target_bytes, dt)
    finally:
        meta.finish_job(job.job_id)


class CompactionProgress(ProgressLines):
    """Delta's optimize is one call that reports nothing until it ends; what it has written so far is in the
    table's folder: new data files, listed every few seconds, against the bytes of the small files it rewrites."""

    def __init__(self, table: StoreTable, dt: Any, target_bytes: int) -> None:
        import pyarrow.compute as pc

        super().__init__(AFTER_S, EVERY_S)
        sizes = pa.table(dt.get_add_actions(flatten=True)).column("size_bytes")
        small = pc.less(sizes, target_bytes)
        self.files = int(pc.sum(small).as_py() or 0)
        self.total = int(pc.sum(pc.filter(sizes, small)).as_py() or 0)
        self.table = table
        self._before: set[str] = set()

    def _data_files(self) -> dict[str, int]:
        from pyarrow import fs as pafs

        selector = pafs.FileSelector(self.table.file_path(""), recursive=True, allow_not_found=True)
        return {i.path: i.size for i in self.table.warehouse.filesystem().get_file_info(selector)
                if i.type == pafs.FileType.File and i.path.endswith(".parquet") and "/_delta_log/" not in i.path}

    def _line(self, took: float) -> str:
        written = sum(size for path, size in self._data_files().items() if path not in self._before)
        share = f" ({100 * written / self.total:.0f}%)" if self.total else ""
        return (f"compacting {self.table.name}: {_size(written)} of about {_size(self.total)} rewritten{share} from "
                f"{self.files} small files, {took:.0f} s")

    def __enter__(self) -> CompactionProgress:
        self._before = set(self._data_files())  # before the compaction writes its first file
        super().__enter__()
        return self


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:,.1f} {unit}"
