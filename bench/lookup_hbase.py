"""Lookup joins against HBase: rows read per micro-batch and seconds, and whether `lookup.repartition-by-region` pays.

Run: `.venv/bin/python -m bench.lookup --store hbase [--rows 200000] [--regions 8] [--keys 1000] [--keys-high 10000]
[--batches 5] [--region-servers 3]`: each measure at --keys keys per micro-batch, then at --keys-high (0: not).
The server: one standalone HBase 2.6 (`sluice.testing.LocalHBase`, full JIT, 1 GiB heap; its Thrift2 gateway 256 MiB),
with --region-servers region servers in its JVM (default 1), the table's regions dealt over them by the master (the
run stops if they are not on all of them). The table `dim` (row key id long, cells name string and value long in
family d), pre-split into --regions regions of equal id ranges, --rows rows written by `sluice.write`. Key batches as
bench/lookup.py's: uniform over 1 .. 1.1 x rows (one in eleven missing).
- streaming, Spark local[2], a file stream of the key batches (one file, one micro-batch each, Trigger.AvailableNow,
  the noop sink): the lookup on the stream's own partitioning (one file, one task), and for each partitions-per-server
  count p (one server: 2, the cores, and --regions, a task per region; several: 1, a task per server, and a server's
  share of the regions, rounded up) after `repartition(p x servers)` (round robin: the shuffle alone) and with
  lookup.repartition-by-region into as many tasks, each twice in turn, the faster kept. Rows read are counted by
  sluice's tasks on its metrics collector (`sluice_lookup_numRecordsLoaded_total`).
- region servers per task: for each lookup above, on one batch of --keys-high keys (a DataFrame), how many region
  servers each task's getMultiples went to (the servers of its keys' regions: a getMultiple per region).
- one process: `RegionPlacement.assign` (encode the keys, place them among the region start keys, in Arrow) on
  --keys-high distinct keys against 10, 100 and 1,000 regions: seconds a batch.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.lookup_cassandra import keys_of, settled


def split_keys(rows: int, regions: int) -> list[bytes]:
    """Start keys of `regions` regions of equal id ranges over 1 .. 1.1 x rows (ids: sign-flipped big-endian longs)."""
    high = int(rows * 1.1)
    return [(1 << 63 | (high * i // regions)).to_bytes(8, "big") for i in range(1, regions)]


def contenders(options: dict[str, str], regions: int, servers: int) -> dict[str, Any]:
    """The lookups compared, each a function of the key stream: on the stream's own partitioning, and for each
    partitions-per-server count (one server: 2, as many tasks as cores, and --regions, a task per region; several:
    1, a task per server, and as many as a server's regions) after `repartition(tasks)` (round robin: the shuffle
    alone) and with lookup.repartition-by-region into as many tasks."""
    import sluice

    out: dict[str, Any] = {"sluice.lookup (the stream's partitioning)": lambda s: sluice.lookup(s, "hbase", options,
                                                                                                 on="id")}
    per_server = {2, regions} if servers == 1 else {1, -(-regions // servers)}
    for each in sorted(per_server):
        tasks = each * servers
        by_region = {**options, "lookup.repartition-by-region": "true", "lookup.partitions-per-server": str(each)}
        out[f"sluice.lookup after repartition({tasks})"] = \
            lambda s, n=tasks: sluice.lookup(s.repartition(n), "hbase", options, on="id")
        out[f"sluice.lookup, lookup.repartition-by-region, partitions-per-server {each}"] = \
            lambda s, o=by_region: sluice.lookup(s, "hbase", o, on="id")
    return out


def streaming(spark: Any, lookups: dict[str, Any], batches: list[np.ndarray], folder: Path,
              metrics: str) -> dict[str, dict[str, float]]:
    folder.mkdir()
    files = folder / "keys"
    files.mkdir()
    for i, keys in enumerate(batches):
        (files / f"{i:05d}.json").write_text("\n".join(json.dumps({"id": int(k)}) for k in keys))
    out: dict[str, dict[str, float]] = {}
    for run in range(2):  # each twice, in turn, the faster kept (the first query also starts the Python workers)
        for name, enrich in lookups.items():
            stream = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(files))
            counted = "sluice_lookup_numRecordsLoaded_total"
            before = settled(metrics, counted, "hbase")
            started = time.perf_counter()
            query = enrich(stream).writeStream.format("noop").trigger(availableNow=True) \
                .option("checkpointLocation", str(folder / (re.sub(r"\W+", "_", name) + f"-{run}"))).start()
            query.awaitTermination()
            seconds = time.perf_counter() - started
            micro_batches = len([p for p in query.recentProgress if p["numInputRows"]])
            read = settled(metrics, counted, "hbase") - before
            figures = {"micro_batches": micro_batches, "rows_read_per_micro_batch": read / max(1, micro_batches),
                       "seconds_per_micro_batch": seconds / max(1, micro_batches)}
            print(json.dumps({name: figures, "run": run}), file=sys.stderr, flush=True)
            if name not in out or figures["seconds_per_micro_batch"] < out[name]["seconds_per_micro_batch"]:
                out[name] = figures
    return out


def servers_per_task(spark: Any, lookups: dict[str, Any], keys: np.ndarray, conn: Any) -> dict[str, list[int]]:
    """For each lookup, on one batch of keys (a DataFrame, not a stream): how many region servers each task's
    getMultiples went to, sorted. A task sends a getMultiple per region of its keys (the table's regions, read
    through the gateway as the lookup reads them), so its servers are those of its keys' regions."""
    from pyspark.sql.functions import spark_partition_id

    from sluice.connectors.hbase._client import regions as read_regions
    from sluice.connectors.hbase._keys import KeyCodec
    from sluice.connectors.hbase._regions import RegionMap

    region_map = RegionMap.of(read_regions(conn, "default:dim"))
    codec = KeyCodec(("id",), ("int64",))
    frame = spark.createDataFrame([(int(k),) for k in keys], "id long").coalesce(1)
    out = {}
    for name, enrich in lookups.items():
        rows = enrich(frame).select("id", spark_partition_id().alias("task")).collect()
        batch = pa.RecordBatch.from_arrays([pa.array([r.id for r in rows], pa.int64())], names=["id"])
        server = np.asarray(region_map.server_of)[region_map.region_of(codec.encoded(batch))]
        tasks: dict[int, set[int]] = {}
        for row, s in zip(rows, server.tolist(), strict=True):
            tasks.setdefault(row.task, set()).add(s)
        out[name] = sorted(len(s) for s in tasks.values())
    return out


def placement_cost(keys: int) -> dict[str, float]:
    """Seconds of one `assign` over `keys` distinct long keys, the best of 5, at 10, 100 and 1,000 regions."""
    from sluice.connectors.hbase._client import Region
    from sluice.connectors.hbase._keys import KeyCodec
    from sluice.connectors.hbase._regions import RegionMap, RegionPlacement

    rng = np.random.default_rng(7)
    table = pa.table({"id": pa.array(rng.choice(1 << 40, keys, replace=False).astype(np.int64))})
    codec = KeyCodec(("id",), ("int64",))
    out = {}
    for regions in (10, 100, 1000):
        starts = [b"", *split_keys(1 << 40, regions)]
        placement = RegionPlacement(RegionMap.of([Region(s, b"", f"rs{i % 3}:16020") for i, s in enumerate(starts)]),
                                    codec, 10)
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            placement.assign(table)
            best = min(best, time.perf_counter() - started)
        out[f"{regions}_regions_seconds"] = best
    return out


def run(rows: int, regions: int, keys: list[int], batches: int, region_servers: int = 1) -> dict[str, object]:
    import sluice
    import sluice.metrics
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.connectors.hbase._client import regions as regions_of
    from sluice.testing import LocalHBase

    rng = np.random.default_rng(7)
    report: dict[str, object] = {"store": "hbase", "region_servers": region_servers, "regions": regions, "rows": rows,
                                 "keys_per_batch": keys, "batches": batches,
                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
                                 "load_average_start": os.getloadavg()}
    report["placement_one_process"] = placement_cost(max(keys))
    t = thrift()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        server = stack.enter_context(LocalHBase(full_jit=True, heap="1g", gateway_heap="256m",
                                                  region_servers=region_servers))
        report["server_start_seconds"] = server.start_seconds
        conn = Connection((server.host,), server.port, 60.0)
        conn.call("createTable", t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=b"dim"),
                                                    columns=[t.TColumnFamilyDescriptor(name=b"d")]),
                  split_keys(rows, regions))
        options = {"host": server.host, "port": str(server.port), "table": "default:dim", "rowkey": "id",
                   "family": "d", "schema": "id long, name string, value long"}
        spark = sluice.session("bench-lookup-hbase", master="local[2]", **{"spark.sql.shuffle.partitions": "2"})
        stack.callback(spark.stop)
        started = time.perf_counter()
        sluice.write(spark.range(1, rows + 1, 1, 2).selectExpr("id", "concat('name-', id) AS name", "id * 7 AS value"),
                     "hbase", {k: v for k, v in options.items() if k != "schema"})
        report["load_seconds"] = time.perf_counter() - started
        located = {r.server for r in regions_of(conn, "default:dim")}
        report["servers_holding_regions"] = len(located)
        if len(located) != region_servers:
            raise RuntimeError(f"the table's {regions} regions are on {len(located)} region servers, not "
                               f"{region_servers}: the comparison needs them spread over all")
        lookups = contenders(options, regions, region_servers)
        report["region_servers_per_task"] = servers_per_task(spark, lookups, keys_of(np.random.default_rng(11), rows,
                                                                                    max(keys), 1)[0], conn)
        print(json.dumps({"region_servers_per_task": report["region_servers_per_task"]}), file=sys.stderr, flush=True)
        collector = stack.enter_context(sluice.metrics.serve())
        metrics = f"http://127.0.0.1:{collector.port}/metrics"
        for size in keys:
            report[f"{size}_keys_per_micro_batch"] = streaming(spark, lookups,
                                                               keys_of(rng, rows, size, batches),
                                                               Path(tmp) / str(size), metrics)
    report["load_average_end"] = os.getloadavg()
    return report
