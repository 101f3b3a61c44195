"""Table store benchmark (seed 001): what a barrier commit costs, and how consistent-read planning scales.

Run: `.venv/bin/python bench/tablestore.py` (no Spark: it measures the driver's part).
- commit overhead: the same staged Parquet files (--files files of --rows rows) committed to a Delta table
  by sluice's barrier commit (app-transaction check, commit with metadata + app transaction, MetaService
  record) vs a plain deltalake commit of the same files (create_write_transaction), alternating, --commits
  each; also for upsert tables: sluice's merge commit vs a plain deltalake merge of the same rows;
- consistent-read planning: MetaService.consistent_version over 2, 10 and 50 tables that each completed
  --barriers barriers (SQLite file), median of 20.
"""

from __future__ import annotations

import argparse
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


def stage(root: Path, folder: str, files: int, rows: int, start: int):
    from sluice.tablestore._table import StagedFile

    out = []
    (root / folder).mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path = root / folder / f"part-{i}.parquet"
        ids = pa.array(range(start + i * rows, start + (i + 1) * rows), pa.int64())
        pq.write_table(pa.table({"id": ids, "v": pa.compute.multiply(ids, 2)}), path)
        out.append(StagedFile(str(path.relative_to(root)), path.stat().st_size, rows))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--barriers", type=int, default=200)
    args = ap.parse_args()

    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    from sluice.meta import MetaService
    from sluice.tablestore import StoreTable

    tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-ts-"))
    meta = MetaService(str(tmp / "meta.db"))
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64())])
    results: dict[str, float] = {}

    for kind, key in (("append", ()), ("upsert", ("id",))):
        ours = StoreTable(f"{kind}_sluice", str(tmp / "wh"))
        plain = StoreTable(f"{kind}_plain", str(tmp / "wh"))
        ours.create(schema, key)
        plain.create(schema, key)
        sluice_ms, plain_ms = [], []
        for n in range(args.commits):
            start = (n % 5) * args.files * args.rows  # upserts overlap earlier keys
            files = stage(ours.root, f"data/w{n}", args.files, args.rows, start)
            t = time.perf_counter()
            ours.commit(files, job="bench", barrier=1000 + n, meta=meta)
            sluice_ms.append((time.perf_counter() - t) * 1000)

            files = stage(plain.root, f"data/w{n}", args.files, args.rows, start)
            t = time.perf_counter()
            dt = DeltaTable(plain.uri)
            if key:
                source = pa.concat_tables([pq.read_table(plain.root / f.path) for f in files])
                dt.merge(source, "t.id = s.id", source_alias="s", target_alias="t") \
                    .when_matched_update_all().when_not_matched_insert_all().execute()
            else:
                now = int(time.time() * 1000)
                dt.create_write_transaction([AddAction(f.path, f.size, {}, now, True, "{}") for f in files],
                                            mode="append", schema=dt.schema())
            plain_ms.append((time.perf_counter() - t) * 1000)
        results[f"{kind}_commit_sluice_ms_median"] = statistics.median(sluice_ms)
        results[f"{kind}_commit_plain_deltalake_ms_median"] = statistics.median(plain_ms)

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
        "files_per_commit": args.files, "rows_per_file": args.rows, "commits": args.commits,
        "barriers_per_table": args.barriers, "results": {k: round(v, 2) for k, v in results.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
