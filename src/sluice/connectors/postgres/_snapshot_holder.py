"""The snapshot holder process (see _snapshot.py): export a snapshot, print its id, hold it while splits finish.

A standalone script on purpose: it imports only psycopg, so it starts in a fraction of a second.
Usage: python _snapshot_holder.py CHANNEL IDLE_TIMEOUT_S WATCH_PID [SLOT]   (libpq URI in SLUICE_PG_URI)

With SLOT, the snapshot is the one a new logical replication slot exports as it is created (pgoutput): the
table state exactly at the slot's consistent point, where its changes begin. It stays valid while the
replication connection that created the slot stays open and idle. Prints `snapshot ID LSN`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not imported at run time: psycopg is imported where it is used
    import psycopg


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


def holder_name(slot: str, snapshot: str, channel: str) -> str:
    """The application_name of a slot's snapshot holder: sluice/<slot hash>/<snapshot id>/<channel suffix>."""
    import hashlib

    return f"sluice/{hashlib.sha1(slot.encode()).hexdigest()[:8]}/{snapshot}/{channel.rsplit('_', 1)[-1]}"


def _create_slot(holder: psycopg.Connection[Any], slot: str, failover: bool) -> str:
    """CREATE_REPLICATION_SLOT over the replication protocol (simple query; names are quoted by the caller).
    FAILOVER: PostgreSQL 17+ (the driver refuses the option on older servers)."""
    options = "SNAPSHOT 'export', FAILOVER" if failover else "SNAPSHOT 'export'"
    result = holder.pgconn.exec_(f"CREATE_REPLICATION_SLOT {slot} LOGICAL pgoutput ({options})".encode())
    if result.status != 2:  # PGRES_TUPLES_OK
        raise RuntimeError((result.error_message or b"CREATE_REPLICATION_SLOT failed").decode(errors="replace"))
    lsn, snapshot = result.get_value(0, 1), result.get_value(0, 2)
    if lsn is None or snapshot is None:  # both are set when a slot is created with SNAPSHOT 'export'
        raise RuntimeError("CREATE_REPLICATION_SLOT returned no consistent point or no snapshot")
    return f"{snapshot.decode()} {lsn.decode()}"


def _serve(channel: str, idle_timeout_s: float, watch_pid: int, slot: str | None, failover: bool) -> int:
    import psycopg

    uri = os.environ.pop("SLUICE_PG_URI")
    # autocommit=True: psycopg would otherwise open its own transaction before our BEGIN. A parameter given as None
    # is left out of the connection string.
    with psycopg.connect(uri, autocommit=True, replication="database" if slot else None) as holder, \
            psycopg.connect(uri, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        if slot:
            exported = _create_slot(holder, slot, failover)
            # Findable by a restarted query that has to replay micro-batch 0 (see changes/_slot.py, holder_of); not on
            # the replication connection: any command there would end the exported snapshot.
            listener.execute("SELECT set_config('application_name', %s, false)",
                             (holder_name(slot, exported.split(" ")[0], channel),))
        else:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            exported = holder.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        print(f"snapshot {exported}", flush=True)
        idle_until = time.monotonic() + idle_timeout_s
        while time.monotonic() < idle_until and _alive(watch_pid):
            for _ in listener.notifies(timeout=2.0, stop_after=1):
                idle_until = time.monotonic() + idle_timeout_s  # a split finished: others may follow
        if not slot:
            holder.execute("ROLLBACK")
    return 0


if __name__ == "__main__":
    slot_args = sys.argv[4:6]
    sys.exit(_serve(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), slot_args[0] if slot_args else None,
                    slot_args[1:] == ["failover"]))
