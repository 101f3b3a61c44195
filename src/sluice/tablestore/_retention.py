"""What a table keeps: the oldest version a consistent read may still open, and the Delta log entries no version
from there on needs (the sink's clean and `sluice table vacuum` both go by them)."""

from __future__ import annotations

from sluice.meta import MetaService
from sluice.tablestore._storage import Warehouse


def oldest_needed_version(name: str, meta: MetaService) -> int | None:
    """The table's version at the consistent barrier of every table linked to it through jobs (upstream and
    downstream): any consistent read that includes this table reads that version or a newer one. None before the
    tables have a barrier in common (then any version may still be needed)."""
    from sluice.meta import NoConsistentVersionError

    linked = {name} | meta.upstream([name]) | meta.downstream([name])
    try:
        return meta.consistent_version(sorted(linked)).versions[name]
    except NoConsistentVersionError:
        return None


def trim_log(warehouse: Warehouse, log: str, keep_from: int, *, dry_run: bool = False) -> list[str]:
    """Delete the entries of the Delta log in folder `log` that no version from `keep_from` on needs: those before
    the newest checkpoint at or below `keep_from` (that checkpoint and the entries after it open every such
    version). Returns their paths."""
    from pyarrow import fs as pafs

    fs = warehouse.filesystem()
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(log)) if i.type == pafs.FileType.File]
    versioned = [(int(n[:20]), n) for n in names if n[:20].isdigit()]
    checkpoints = [v for v, n in versioned if ".checkpoint." in n and v <= keep_from]
    if not checkpoints:
        return []
    floor = max(checkpoints)
    doomed = [f"{log}/{n}" for v, n in versioned if v < floor]
    if not dry_run:
        for path in doomed:
            fs.delete_file(path)
    return doomed
