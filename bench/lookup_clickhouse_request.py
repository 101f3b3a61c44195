"""What one ClickHouse lookup query costs by its keys, one at a time: is it the keys, the granules, or a fixed cost?

Run: `.venv/bin/python -m bench.lookup_clickhouse_request [--rows 200000] [--queries 20]`. The server is
bench/lookup_stores.py's: ClickHouse 26.9's engine (chdb-core) behind the tests' HTTP stand-in, `dim` a MergeTree
`ORDER BY id` of --rows rows. sluice's lookup query (`id IN (SELECT arrayJoin({k0:Array(Int64)}))`, the keys as a
query parameter) through sluice's client, one query at a time, after two untimed: no keys, 1 key, 1,000 keys drawn
uniformly (every granule of 8,192 rows holds some), 1,000 consecutive ids (one or two granules), 5,000 uniform keys.
Median and fastest of --queries queries each, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import numpy as np


def run(rows: int, queries: int) -> dict[str, object]:
    from sluice.connectors.clickhouse._client import Connection
    from sluice.connectors.clickhouse._options import WRITE_SPEC
    from tests.clickhouse_chdb import ChdbClickHouse

    report: dict[str, object] = {"rows": rows, "queries": queries, "cores": os.cpu_count(),
                                 "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 "load_average_start": os.getloadavg()}
    rng = np.random.default_rng(3)
    high = int(rows * 1.1)

    def keys(values: np.ndarray) -> str:
        return "[" + ",".join(str(int(k)) for k in values) + "]"

    kinds: dict[str, Callable[[], str]] = {
        "no keys": lambda: "[]",
        "1 key": lambda: keys(rng.integers(1, high + 1, 1)),
        "1,000 uniform keys": lambda: keys(rng.integers(1, high + 1, 1000)),
        "1,000 consecutive ids": lambda: keys(np.arange(start := int(rng.integers(1, rows - 1000)), start + 1000)),
        "5,000 uniform keys": lambda: keys(rng.integers(1, high + 1, 5000)),
    }
    with ChdbClickHouse() as server:
        server.sql("CREATE TABLE dim (id Int64, name String, value Int64) ENGINE = MergeTree ORDER BY id")
        server.sql(f"INSERT INTO dim SELECT number + 1, concat('name-', toString(number + 1)), (number + 1) * 7 "
                   f"FROM numbers({rows})")
        conn = Connection.from_options(WRITE_SPEC.parse({"url": server.url, "password": server.password,
                                                         "table": "dim"}))
        sql = "SELECT id, name, value FROM default.dim WHERE id IN (SELECT arrayJoin({k0:Array(Int64)}))"
        for name, make in kinds.items():
            for _ in range(2):  # untimed
                list(conn.arrow_batches(sql, param_k0=make()))
            seconds = []
            for _ in range(queries):
                params = make()
                started = time.perf_counter()
                list(conn.arrow_batches(sql, param_k0=params))
                seconds.append(time.perf_counter() - started)
            report[name] = {"median_ms": round(float(np.median(seconds)) * 1000, 1),
                            "fastest_ms": round(min(seconds) * 1000, 1)}
    report["load_average_end"] = os.getloadavg()
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(run(args.rows, args.queries), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
