"""Keeps one exported snapshot alive while a parallel read runs, so every split sees the same table state.

`pg_export_snapshot()` names a snapshot that other sessions can adopt (SET TRANSACTION SNAPSHOT) only while
the exporting transaction stays open. Spark plans a read in a short-lived Python worker and re-runs the
planned splits for every action on the DataFrame, so the exporting transaction lives in a small detached
process: it exports the snapshot, prints its id, and holds it until `snapshot.timeout-s` pass without a
split finishing (each reader sends `pg_notify(channel, split id)` when done), or the Spark driver (the JVM
that started the planner) exits. An action that starts after that fails with a clear error that says to load
the DataFrame again. Holding a snapshot delays VACUUM of rows deleted meanwhile, hence the idle timeout.

The holder is `_snapshot_holder.py`, started as a plain script (it imports only psycopg, so it is up in a
fraction of a second); the libpq URI reaches it in the SLUICE_PG_URI environment variable, never on the
command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from sluice.connectors.postgres._client import Connection, PostgresError


@dataclass(frozen=True)
class SharedSnapshot:
    snapshot_id: str
    channel: str
    lsn: str | None = None  # the slot's consistent point, when the snapshot came with a new replication slot


class SnapshotHolder:
    """Driver side: start the holder process and get the snapshot id (with `slot`: from creating that slot)."""

    def __init__(self, conn_info: Connection, timeout_s: int, slot: str | None = None, failover: bool = False) -> None:
        self.channel = "sluice_snap_" + uuid.uuid4().hex[:16]
        env = {**os.environ, "SLUICE_PG_URI": conn_info.uri()}
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_snapshot_holder.py")), self.channel, str(timeout_s),
             str(_driver_pid()), *([slot, "failover" if failover else "plain"] if slot else [])],  # slot: [a-z0-9_]
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            start_new_session=True,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode().strip()
        if not line.startswith("snapshot "):
            err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
            self._proc.wait()
            raise PostgresError(f"could not export a snapshot from {conn_info.describe()}: "
                                f"{conn_info.scrub(RuntimeError(err or line))}")
        parts = line.split(" ")
        self.shared = SharedSnapshot(parts[1], self.channel, parts[2] if len(parts) > 2 else None)

    def release_pipes(self) -> None:
        """Planning is done: the holder runs on by itself."""
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()

    def cancel(self) -> None:
        self._proc.kill()
        self._proc.wait()


def _driver_pid() -> int:
    """The nearest ancestor that is a JVM (Spark's driver), or 0 when there is none to watch."""
    pid = os.getpid()
    for _ in range(6):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"java" in f.read().split(b"\0")[0]:
                    return pid
        except (OSError, ValueError, IndexError):
            return 0
        if pid <= 1:
            return 0
    return 0
