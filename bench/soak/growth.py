"""What must stay bounded through a soak, sampled every minute: the memory of the driver's processes (each Python
process by role), of the S2 server and the broker, the checkpoints', S2's, the warehouse's and the broker's bytes, the
MetaService's rows, and with --stores each design store's memory and disk."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.soak.sizes import cmdline, command, disk_bytes, folder_bytes, parent, pss_bytes, rss_bytes, warehouse_bytes
from bench.soak.stores import stores_growth

if TYPE_CHECKING:
    from bench.soak.faults import Driver


def python_memory(driver: Driver) -> dict[int, tuple[str, int, int]]:
    """Each Python process of the driver's tree: its role (the driver, Spark's worker daemon, a worker the daemon
    forked, a runner Spark started on its own), its proportional set size and its RSS, so that a growth of their sum
    is traced to the processes that grew (a PSS also grows when a process sharing its pages exits; its RSS does
    not)."""
    tree = driver.tree()
    memory = {}
    for pid in tree:
        if command(pid) == "java":
            continue
        if pid == tree[0]:
            role = "driver"
        elif "pyspark.daemon" in cmdline(pid):
            role = "worker" if "pyspark.daemon" in cmdline(parent(pid) or 0) else "daemon"
        elif " -m pyspark." in cmdline(pid):
            role = "runner"  # a worker Spark starts on its own, not forked: a streaming source's runner
        else:
            role = command(pid)
        memory[pid] = (role, pss_bytes([pid]), rss_bytes([pid]))
    return memory


def growth(env: dict, work: Path) -> dict[str, float]:
    """What must stay bounded, now."""
    import psycopg

    driver: Driver = env["driver"]
    kafka = env["kafka"]
    with psycopg.connect(env["admin_url"].rsplit("/", 1)[0] + "/meta", autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        meta_rows = sum(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
    tree = driver.tree()
    jvm = [pid for pid in tree if command(pid) == "java"]
    python = [pid for pid in tree if pid not in jvm]
    return {"driver_rss_bytes": rss_bytes(tree), "driver_jvm_rss_bytes": rss_bytes(jvm),
            "driver_processes": len(tree), "python_processes": len(python),
            "python_pss_bytes": pss_bytes(python),
            "python_largest_rss_bytes": max((rss_bytes([pid]) for pid in python), default=0),
            "s2_server_rss_bytes": rss_bytes([env["s2"].process.pid] if env["s2"].process else []),
            "checkpoint_bytes": folder_bytes(work / "checkpoints"), "s2_data_bytes": folder_bytes(work / "s2"),
            "s2_stored_bytes": s2_stored_bytes(env["s2"]), **warehouse_bytes(work / "warehouse"),
            "kafka_broker_rss_bytes": rss_bytes([kafka.pid] if kafka.pid else []),
            "kafka_data_bytes": disk_bytes(kafka.folder / "data") if kafka.folder else 0, "meta_rows": meta_rows,
            **stores_growth(env.get("stores"))}


def s2_stored_bytes(s2: Any) -> int:
    """The stream's `storage` metric (S2's stream_metrics): the metered bytes it holds now. Its folder on disk
    (s2_data_bytes) also counts SQLite's write-ahead log and pages freed by trimming, which it reuses."""
    import asyncio

    import s2_sdk

    async def ask() -> int:
        async with s2_sdk.S2(s2.access_token, endpoints=s2.endpoints) as client:
            metrics = await client.stream_metrics("sluice-soak", "bank", set=s2_sdk.StreamMetricSet.STORAGE)
            points = [point for gauge in metrics for point in getattr(gauge, "values", [])]
            return int(max(points)[1]) if points else 0  # the newest point

    return asyncio.run(ask())
