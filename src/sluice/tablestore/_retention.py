"""What a table keeps: the oldest version a consistent read may still open, and the Delta log entries (with the
change data they name) no version from there on needs (the sink's clean and `sluice table vacuum` both go by them)."""

from __future__ import annotations

import json
from typing import Any

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
    version), and the change data files beside the log that only they named. Returns their paths."""
    from pyarrow import fs as pafs

    fs = warehouse.filesystem()
    entries = {i.base_name: i for i in fs.get_file_info(pafs.FileSelector(log)) if i.type == pafs.FileType.File}
    versioned = [(int(n[:20]), n) for n in entries if n[:20].isdigit()]
    checkpoints = [v for v, n in versioned if ".checkpoint." in n and v <= keep_from]
    if not checkpoints:
        return []
    floor = max(checkpoints)
    doomed = [f"{log}/{n}" for v, n in versioned if v < floor]
    floor_entry = entries.get(f"{floor:020}.json")
    if floor_entry is not None:
        commits = {f"{log}/{n}": v < floor for v, n in versioned if n.endswith(".json")}
        doomed += _change_data_gone(fs, log.rsplit("/", 1)[0], commits, floor_entry.mtime)
    if not dry_run:
        for path in doomed:
            fs.delete_file(path)
    return doomed


def _change_data_gone(fs: Any, table: str, commits: dict[str, bool], floor_written: Any) -> list[str]:
    """The change data files (Delta's `cdc` actions, in `_change_data`) that go with the log entries: those named by
    an entry that goes (`commits`: each entry's path, True if it goes), and those no entry names that were written
    before the oldest entry kept (left by a merge that never committed, or by entries trimmed before). delta-rs's
    vacuum deletes only removed data files, so without this every merge's change data stays for good. A merge still
    running wrote its change data after every entry kept, so it is never among them."""
    from urllib.parse import unquote

    from pyarrow import fs as pafs

    files = [i for i in fs.get_file_info(pafs.FileSelector(f"{table}/_change_data", allow_not_found=True,
                                                           recursive=True)) if i.type == pafs.FileType.File]
    if not files:
        return []
    named: dict[str, bool] = {}  # each named file: whether its entry goes
    for entry, goes in commits.items():
        with fs.open_input_stream(entry) as stream:
            for line in stream.read().splitlines():
                action = json.loads(line) if b'"cdc"' in line else {}
                if "cdc" in action:
                    named[unquote(action["cdc"]["path"])] = goes
    return [i.path for i in files
            if named.get(i.path[len(table) + 1:], i.mtime < floor_written)]
