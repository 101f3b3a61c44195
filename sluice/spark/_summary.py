"""Write statistics on the driver: one log line per write or micro-batch, the last summary kept on disk.

Spark runs a data source's commit() in a Python worker process, not in the user's interpreter, so the
last summary is handed over through a small JSON file (SLUICE_STATS_DIR, default a per-user temp dir).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("sluice.summary")


def stats_dir() -> Path:
    configured = os.environ.get("SLUICE_STATS_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"sluice-stats-{os.getuid()}"


def save_summary(format_name: str, summary: dict[str, Any]) -> None:
    folder = stats_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"format": format_name, **summary}, sort_keys=True)
    for name in (f"{format_name}.json", "last.json"):
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(data)
        os.replace(tmp, folder / name)  # atomic: a reader never sees half a file


def read_last_summary(format_name: str | None = None) -> dict[str, Any] | None:
    path = stats_dir() / (f"{format_name}.json" if format_name else "last.json")
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def log_summary(line: str) -> None:
    if not logging.getLogger().handlers and not log.handlers:
        # The commit runs in a bare Spark Python worker: give the one line a place to go (stderr).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    log.info(line)
