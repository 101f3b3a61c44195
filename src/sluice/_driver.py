"""What the processes of the driver's machine share without Spark: the folder they hand files over in (Spark runs a
data source's commit() and planning in Python workers, not in the user's interpreter) and a console for the INFO
lines users see without configuring logging. Below both sluice.spark and sluice.metrics, which use them."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path


def stats_dir() -> Path:
    configured = os.environ.get("SLUICE_STATS_DIR")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"sluice-stats-{os.getuid()}"


def console_handler(logger: logging.Logger) -> None:
    """Where logging is not configured (a bare Spark Python worker, a plain script), give `logger`'s INFO lines a
    place to go: stderr."""
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
