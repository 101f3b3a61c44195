"""ClickHouse benchmark: sluice's append vs the store's limit vs a naive per-row insert, one run, one server.

Run: `.venv/bin/python bench/clickhouse.py` (starts a throwaway ClickHouse with LocalClickHouse).
Data: N narrow rows (id Int64, k Int32, v Float64, s String of ~16 bytes) in a cached DataFrame of 2 partitions.
- sluice: `sluice.write(df, "clickhouse", ...)` (unordered, Native-encoded INSERTs of 100,000 rows), end to end;
- limit: one Python process POSTs the same rows, pre-encoded as the same Native blocks, one INSERT after another
  (no Spark, no encoding in the timed part): what the server takes from one client; limit_rowbinary: the same
  with RowBinary blocks (and both encodings' speed in one process), which decided Native over RowBinary;
- floor: the same DataFrame into format("sluice_null") (the engine with a store that drops everything): what
  Spark's hand-over of rows to Python workers allows any Python connector on 2 cores;
- naive: a foreachPartition that sends one `INSERT ... VALUES` per row over HTTP (what a user writes without a
  connector), on --naive-rows rows (each INSERT is a part on disk; the full N would take hours).
Each figure is rows per second, the best of --rounds runs; with the CPU seconds of each component.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import uuid
from datetime import date

from _cpu import clocked

import sluice
from sluice.testing import LocalClickHouse

COLUMNS = "id Int64, k Int32, v Float64, s String"


def rowbinary_block(table, types) -> bytes:
    """The same rows in RowBinary (row-major), vectorized as far as it goes: each column is encoded as for Native,
    then its per-row pieces are scattered into their rows. Non-Nullable columns only (the benchmark's)."""
    import numpy as np
    import pyarrow.compute as pc

    from sluice.connectors.clickhouse._native import _varints, encode_column

    n = table.num_rows
    columns, widths = [], []
    for name in table.column_names:
        data = np.frombuffer(encode_column(table.column(name), types[name], name, str), dtype=np.uint8)
        if types[name].base == "String":
            lengths = pc.binary_length(table.column(name).combine_chunks()).to_numpy().astype(np.int64)
            width = _varints(lengths)[0] + lengths
        else:
            width = np.full(n, len(data) // n, dtype=np.int64)
        columns.append(data)
        widths.append(width)
    row_width = np.sum(widths, axis=0)
    row_start = np.concatenate(([0], np.cumsum(row_width)[:-1]))
    out = np.empty(int(row_width.sum()), dtype=np.uint8)
    before = np.zeros(n, dtype=np.int64)
    for data, width in zip(columns, widths, strict=True):
        source_start = np.concatenate(([0], np.cumsum(width)[:-1]))
        out[np.repeat(row_start + before - source_start, width) + np.arange(len(data))] = data
        before += width
    return out.tobytes()


def naive_rows(url: str, password: str, table: str):
    def insert(rows) -> None:
        import base64
        import urllib.error
        import urllib.request

        auth = "Basic " + base64.b64encode(f"default:{password}".encode()).decode()
        for row in rows:
            sql = f"INSERT INTO {table} VALUES ({row.id}, {row.k}, {row.v!r}, '{row.s}')"
            request = urllib.request.Request(url, data=sql.encode(), method="POST", headers={"Authorization": auth})
            try:
                urllib.request.urlopen(request).read()
            except urllib.error.HTTPError as e:
                raise RuntimeError(f"{sql}: {e.read().decode()[:500]}") from None

    return insert


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--naive-rows", type=int, default=4_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spark = sluice.session("sluice-bench-clickhouse")
    df = spark.range(0, args.rows, 1, 2).selectExpr("id", "CAST(id % 1000 AS INT) AS k",
                                                    "CAST(id AS DOUBLE) * 0.25 AS v",
                                                    "concat('name-', CAST(id AS STRING)) AS s").cache()
    df.count()
    results: dict[str, dict] = {}
    with LocalClickHouse() as ch:
        def fresh() -> str:
            name = f"b_{uuid.uuid4().hex[:8]}"
            ch.sql(f"CREATE TABLE {name} ({COLUMNS}) ENGINE = MergeTree() ORDER BY id")
            return name

        def run_sluice():
            table = fresh()
            result = clocked(lambda: sluice.write(df, "clickhouse", {"url": ch.url, "password": ch.password,
                                                                      "table": table}))
            assert ch.rows(f"SELECT count() FROM {table}") == [[str(args.rows)]]
            return result

        # The limit: the same rows as the same Native blocks (100,000 rows each), encoded before the clock starts.
        from sluice.connectors.clickhouse._client import Connection
        from sluice.connectors.clickhouse._native import ColumnType, native_block
        from sluice.connectors.clickhouse._sink import WRITE_SPEC
        from sluice.spark._compat import to_arrow_schema

        arrow = df.toArrow().cast(to_arrow_schema(df.schema))
        types = {n: ColumnType.parse(n, t) for n, t in zip(arrow.column_names, ["Int64", "Int32", "Float64",
                                                                                  "String"], strict=True)}
        blocks = [native_block(arrow.slice(i, 100_000), types, str) for i in range(0, args.rows, 100_000)]
        encode_s, _ = clocked(lambda: [native_block(arrow.slice(i, 100_000), types, str)
                                       for i in range(0, args.rows, 100_000)])
        # RowBinary, the row-major alternative: encoded the same way, inserted the same way, for the choice.
        row_blocks = [rowbinary_block(arrow.slice(i, 100_000), types) for i in range(0, args.rows, 100_000)]
        row_encode_s, _ = clocked(lambda: [rowbinary_block(arrow.slice(i, 100_000), types)
                                           for i in range(0, args.rows, 100_000)])

        def run_blocks(fmt: str, encoded: list[bytes]):
            """One process POSTing pre-encoded blocks, one INSERT after another: what the server takes."""
            table = fresh()
            conn = Connection.from_options(WRITE_SPEC.parse({"url": ch.url, "password": ch.password, "table": table}))
            result = clocked(lambda: [conn.request(f"INSERT INTO {table} FORMAT {fmt}", body=b) for b in encoded])
            assert ch.rows(f"SELECT count() FROM {table}") == [[str(args.rows)]]
            return result

        naive_df = df.limit(args.naive_rows).repartition(2).cache()
        naive_df.count()

        def run_naive():
            table = fresh()
            result = clocked(lambda: naive_df.foreachPartition(naive_rows(ch.url, ch.password, table)))
            assert ch.rows(f"SELECT count() FROM {table}") == [[str(args.naive_rows)]]
            return result

        runs: dict[str, list] = {"sluice": [], "limit": [], "limit_rowbinary": [], "floor": [], "naive": []}
        for _ in range(args.rounds):
            runs["sluice"].append(run_sluice())
            runs["limit"].append(run_blocks("Native", blocks))
            runs["limit_rowbinary"].append(run_blocks("RowBinary", row_blocks))
            runs["floor"].append(clocked(lambda: sluice.write(df, "sluice_null", {})))
            runs["naive"].append(run_naive())
        rows = {"sluice": args.rows, "limit": args.rows, "limit_rowbinary": args.rows, "floor": args.rows,
                "naive": args.naive_rows}
        for name, measured in runs.items():
            seconds, cpu = min(measured, key=lambda r: r[0])
            results[name] = {"rows": rows[name], "seconds": round(seconds, 3),
                             "rows_per_s": round(rows[name] / seconds), "cpu_s": cpu}
    spark.stop()
    sluice_rate = results["sluice"]["rows_per_s"]
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "clickhouse": "18.16 (Debian bookworm clickhouse-server)", "results": results,
        "encoding_rows_per_s_one_process": {"native": round(args.rows / encode_s),
                                            "rowbinary": round(args.rows / row_encode_s)},
        "ratios": {"sluice_vs_limit": round(sluice_rate / results["limit"]["rows_per_s"], 2),
                   "sluice_vs_floor": round(sluice_rate / results["floor"]["rows_per_s"], 2),
                   "sluice_vs_naive": round(sluice_rate / results["naive"]["rows_per_s"], 1)},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
