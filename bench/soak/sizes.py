"""What the soak reads of its processes and folders: command lines and parents from /proc, resident and
proportional memory, and the bytes a folder, a warehouse (by kind) or a broker's data take."""

from __future__ import annotations

from pathlib import Path


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def rss_bytes(pids: list[int]) -> int:
    return field_bytes(pids, "status", "VmRSS:")


def pss_bytes(pids: list[int]) -> int:
    """Proportional set size: Spark's Python workers are forked from one daemon and share its pages, which a sum of
    their RSS counts once per worker (26 processes summed to 4.5 GB)."""
    return field_bytes(pids, "smaps_rollup", "Pss:")


def field_bytes(pids: list[int], file: str, field: str) -> int:
    """The sum over `pids` of a field in kB of /proc/<pid>/<file>; a process gone in between counts 0."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
                if line.startswith(field):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def warehouse_bytes(path: Path) -> dict[str, int]:
    """The warehouse, and what it holds by kind: each table's log (`_delta_log`), its change data (`_change_data`:
    each merge's, kept as long as the log entry naming it), its live files (the current version's add actions) and
    the rest (files removed by a merge and not yet vacuumed). The live files are read before the folder is walked: a
    file live then is still on disk (a vacuum deletes only files removed over an hour ago), so the rest never reads
    negative while the tables are written."""
    from deltalake import DeltaTable

    kinds = ("warehouse_bytes", "warehouse_log_bytes", "warehouse_change_bytes", "warehouse_live_bytes",
             "warehouse_removed_bytes")
    if not path.exists():
        return dict.fromkeys(kinds, 0)
    live = sum(sum(DeltaTable(str(log.parent)).get_add_actions(flatten=True).column("size_bytes").to_pylist())
               for log in path.rglob("_delta_log"))
    sizes = [(f.stat().st_size, f.parts) for f in path.rglob("*") if f.is_file()]
    log = sum(size for size, parts in sizes if "_delta_log" in parts)
    change = sum(size for size, parts in sizes if "_change_data" in parts)
    total = sum(size for size, _ in sizes)
    return dict(zip(kinds, (total, log, change, live, total - log - change - live), strict=True))


def disk_bytes(path: Path) -> int:
    """The disk a folder's files take: Kafka preallocates each segment's index files (10 MB, sparse), so their
    sizes say little."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0
