"""The snapshot holder process (see _snapshot.py): export a snapshot, print its id, hold it while splits finish.

A standalone script on purpose: it imports only psycopg, so it starts in a fraction of a second.
Usage: python _snapshot_holder.py CHANNEL IDLE_TIMEOUT_S WATCH_PID   (libpq URI in SLUICE_PG_URI)
"""

from __future__ import annotations

import os
import sys
import time


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _serve(channel: str, idle_timeout_s: float, watch_pid: int) -> int:
    import psycopg

    uri = os.environ.pop("SLUICE_PG_URI")
    # autocommit=True: psycopg would otherwise open its own transaction before our BEGIN
    with psycopg.connect(uri, autocommit=True) as holder, psycopg.connect(uri, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        snapshot = holder.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        print(f"snapshot {snapshot}", flush=True)
        idle_until = time.monotonic() + idle_timeout_s
        while time.monotonic() < idle_until and _alive(watch_pid):
            for _ in listener.notifies(timeout=2.0, stop_after=1):
                idle_until = time.monotonic() + idle_timeout_s  # a split finished: others may follow
        holder.execute("ROLLBACK")
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
