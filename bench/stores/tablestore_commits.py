"""Table store benchmark (FLIP-276): what a barrier commit costs, how a long-running table ages, and how
consistent-read planning scales.

Run: `.venv/bin/python -m bench.stores.tablestore_commits [--store local|s3] [--compaction on|off|both]
[--compact-min-files N]` (no Spark: it measures
the driver's part; `s3` starts moto's standalone S3-compatible server on loopback and puts the tables in its bucket).
- commit overhead: the same staged Parquet files (--files files of --rows rows) committed to a Delta table
  by sluice's barrier commit (app-transaction check, commit with metadata + app transaction, MetaService
  record) vs a plain deltalake commit of the same files (create_write_transaction), alternating, --commits
  each; also for upsert tables: sluice's merge commit vs a plain deltalake merge of the same rows;
- a day of micro-batches: --day micro-batches (2 staged files of 50 rows each, as 2 tasks would write) committed
  through the sink's committer (TableStoreCommitter: writer claim, barrier, commit, checkpoint, compaction), with
  auto-compaction on and off; at 10, 1,000 and 2,000 micro-batches: the median commit time of the last 10, the time
  to open the table and to read it fully (open + every row), each measured after each of the last 10 micro-batches
  (a whole checkpoint interval), median;
- consistent-read planning: MetaService.consistent_version over 2, 10 and 50 tables that each completed
  --barriers barriers (SQLite file), median of 20.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def stage(table, folder: str, files: int, rows: int, start: int):
    """Parquet files written where the sink's tasks would write them (local folder or bucket)."""
    from sluice.tablestore._table import StagedFile

    out = []
    fs = table.warehouse.filesystem()
    for i in range(files):
        relative = f"{folder}/part-{i}.parquet"
        path = table.file_path(relative)
        if table.warehouse.is_local:
            fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        ids = pa.array(range(start + i * rows, start + (i + 1) * rows), pa.int64())
        with fs.open_output_stream(path) as sink:
            pq.write_table(pa.table({"id": ids, "v": pa.compute.multiply(ids, 2)}), sink)
            size = sink.tell()
        out.append(StagedFile(relative, size, rows))
    return out


def median_ms(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def day(warehouse, meta_url: str, batches: int, compact: bool, storage: dict[str, str],
        compact_min_files: int = 20) -> dict[str, float]:
    """--day micro-batches through the sink's committer; figures at 10, 1,000 and 2,000 micro-batches."""
    from deltalake import DeltaTable

    from sluice.connector import WriteContext
    from sluice.tablestore import StoreTable
    from sluice.tablestore._options import WRITE_SPEC, WriteOptions
    from sluice.tablestore._sink import TableStoreCommitter

    name = f"day_{'compacted' if compact else 'uncompacted'}"
    table = StoreTable(name, warehouse)
    table.create(pa.schema([("id", pa.int64()), ("v", pa.int64())]), ())
    write = WriteOptions.of(WRITE_SPEC.parse({"table": name, "warehouse": warehouse.root, "meta": meta_url,
                                              "auto-compact": str(compact).lower(),
                                              "compact-min-files": str(compact_min_files), **storage}))
    committer = TableStoreCommitter(table, write, created=False)
    query = f"bench-{name}"
    options = warehouse.storage_options()
    commit_ms: list[float] = []
    open_ms: list[float] = []
    read_ms: list[float] = []
    out: dict[str, float] = {}
    points = {n for n in (10, 1000, 2000) if n <= batches} | {batches}
    for n in range(1, batches + 1):
        files = stage(table, table.staging_prefix(query, n), 2, 50, n * 100)
        t = time.perf_counter()
        committer.commit([dataclasses.asdict(f) for f in files], WriteContext(write_id=query, epoch=n))
        commit_ms.append((time.perf_counter() - t) * 1000)
        # Open and read after each of the 10 micro-batches up to a point: a whole checkpoint interval, so the figure
        # does not depend on how far the point happens to be from the newest checkpoint (0 to 9 log entries).
        if any(0 <= point - n < 10 for point in points):
            open_ms.append(median_ms(lambda: DeltaTable(table.uri, storage_options=options), repeat=1))
            read_ms.append(median_ms(lambda: DeltaTable(table.uri, storage_options=options).to_pyarrow_table(),
                                     repeat=1))
        if n in points:
            out[f"{n}_version"] = DeltaTable(table.uri, storage_options=options).version()
            out[f"{n}_commit_ms"] = statistics.median(commit_ms[-10:])
            out[f"{n}_open_ms"] = statistics.median(open_ms[-10:])
            out[f"{n}_full_read_ms"] = statistics.median(read_ms[-10:])
            out[f"{n}_files"] = len(DeltaTable(table.uri, storage_options=options).file_uris())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--barriers", type=int, default=200)
    ap.add_argument("--day", type=int, default=2000, help="micro-batches of the day (0: skip)")
    ap.add_argument("--store", choices=("local", "s3"), default="local")
    ap.add_argument("--compaction", choices=("on", "off", "both"), default="both", help="day runs to make")
    ap.add_argument("--compact-min-files", type=int, default=20, help="the sink option of the day runs")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        run(args, stack)


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from sluice.meta import MetaService
    from sluice.tablestore import StoreTable, Warehouse
    from sluice.tablestore._commit import BarrierCommit

    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-ts-"))
    meta = MetaService(str(tmp / "meta.db"))
    storage: dict[str, str] = {}
    if args.store == "s3":
        from sluice.testing import LocalS3

        s3 = stack.enter_context(LocalS3())
        storage = s3.storage
        warehouse = Warehouse.resolve(s3.uri("bench"), storage)
    else:
        warehouse = Warehouse.resolve(str(tmp / "wh"))
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    results: dict[str, float] = {}

    for kind, key in (("append", ()), ("upsert", ("id",))):
        ours = StoreTable(f"{kind}_sluice", warehouse)
        plain = StoreTable(f"{kind}_plain", warehouse)
        ours.create(schema, key)
        plain.create(schema, key)
        sluice_ms, plain_ms = [], []
        for n in range(args.commits):
            start = (n % 5) * args.files * args.rows  # upserts overlap earlier keys
            files = stage(ours, f"data/w{n}", args.files, args.rows, start)
            t = time.perf_counter()
            ours.commit(files, BarrierCommit("bench", 1000 + n), meta)
            sluice_ms.append((time.perf_counter() - t) * 1000)

            files = stage(plain, f"data/w{n}", args.files, args.rows, start)
            t = time.perf_counter()
            dt = DeltaTable(plain.uri, storage_options=warehouse.storage_options())
            if key:
                fs = warehouse.filesystem()
                source = pa.concat_tables([pq.read_table(plain.file_path(f.path), filesystem=fs) for f in files])
                dt.merge(source, "t.id = s.id", source_alias="s", target_alias="t") \
                    .when_matched_update_all().when_not_matched_insert_all().execute()
            else:
                now = int(time.time() * 1000)
                dt.create_write_transaction([AddAction(f.path, f.size, {}, now, True, "{}") for f in files],
                                            mode="append", schema=dt.schema())
            plain_ms.append((time.perf_counter() - t) * 1000)
        results[f"{kind}_commit_sluice_ms_median"] = statistics.median(sluice_ms)
        results[f"{kind}_commit_plain_deltalake_ms_median"] = statistics.median(plain_ms)
        results[f"{kind}_commit_ratio"] = statistics.median(sluice_ms) / statistics.median(plain_ms)

    if args.day:
        for compact in {"on": (True,), "off": (False,), "both": (True, False)}[args.compaction]:
            for key, value in day(warehouse, str(tmp / "meta.db"), args.day, compact, storage,
                                  args.compact_min_files).items():
                results[f"day_{'compaction_on' if compact else 'compaction_off'}_{key}"] = value

    for count in (2, 10, 50):
        names = [f"t{count}_{i}" for i in range(count)]
        for barrier in range(1, args.barriers + 1):
            for i, name in enumerate(names):
                if barrier < args.barriers or i == 0:  # the newest barrier is not everywhere yet
                    meta.complete_barrier(name, barrier, barrier)
        times = []
        for _ in range(20):
            t = time.perf_counter()
            found = meta.consistent_version(names)
            times.append((time.perf_counter() - t) * 1000)
        assert found.barrier == args.barriers - 1
        results[f"consistent_version_{count}_tables_ms_median"] = statistics.median(times)

    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "store": args.store if args.store == "local" else "s3 (moto's standalone server on loopback)",
        "files_per_commit": args.files, "rows_per_file": args.rows, "commits": args.commits,
        "compact_min_files": args.compact_min_files,
        "barriers_per_table": args.barriers, "results": {k: round(v, 2) for k, v in results.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
