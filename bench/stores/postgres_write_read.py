"""PostgreSQL benchmark: sluice vs Spark's JDBC source/sink vs one Python process, one run, one server.

Run: `.venv/bin/python -m bench.stores.postgres_write_read` (starts a throwaway PostgreSQL with LocalPostgres; needs
Debian's libpostgresql-jdbc-java for /usr/share/java/postgresql.jar: `apt-get install -y libpostgresql-jdbc-java`).
Data: N rows of (id bigint, name text, value bigint) in a cached DataFrame of 2 partitions (local[2]).
- append: sluice format("postgres") unordered vs Spark JDBC (batchsize 10000, reWriteBatchedInserts=true);
- upsert (fewer rows, the baseline is slow): sluice partition-ordered with primary-key vs a foreachPartition
  doing psycopg executemany of INSERT ... ON CONFLICT DO UPDATE (pages of 10,000 rows);
- read: sluice (consistent snapshot, split by id) vs Spark JDBC with partitionColumn=id, same partition count,
  both written to Spark's noop sink;
- one Python process, no Spark: psycopg COPY of pre-encoded CSV, ADBC ingest of an Arrow table, ADBC read;
- floors of Spark's Python Data Source API on the same data, no database: the sluice engine with no store
  (format("sluice_null")) for writes, and a Python source yielding the rows as ready-made Arrow batches for
  reads. No Python connector can be faster than these.
Each Spark figure is the best of --rounds runs, alternating the contenders; with it, the CPU seconds each
component (Spark JVM, Python workers, PostgreSQL) used in that run (bench/cpu.py), because on 2 cores a
write is bounded by the CPU all of them need together.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from datetime import date

from bench.cpu import clocked

JAR = "/usr/share/java/postgresql.jar"


def best_rounds(contenders: dict, rounds: int) -> dict[str, list[tuple[float, dict[str, float]]]]:
    """Every round runs each contender once, in turn: (seconds, CPU by component) of every run."""
    runs: dict[str, list] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            runs[name].append(run())
    return runs


def floor_source(rows: int, partitions: int):
    """A Python data source yielding the benchmark's rows, built in Arrow with vectorized kernels (no database)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition):
            import numpy as np
            import pyarrow as pa
            import pyarrow.compute as pc

            per = rows // partitions
            ids = pa.array(np.arange(partition.value * per, (partition.value + 1) * per, dtype=np.int64))
            names = pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), "")  # vectorized: ~20 ms
            batch = pa.RecordBatch.from_arrays([ids, names, pc.multiply(ids, 7)], names=["id", "name", "value"])
            for start in range(0, per, 65536):
                yield batch.slice(start, 65536)

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_floor"

        def schema(self):
            return "id long, name string, value long"

        def reader(self, schema):
            return FloorReader()

    return FloorSource


class Contest:
    """The server, the Spark session with the rows (appended and read: `df`; upserted: `up`), and the best round of
    each contender so far (its seconds, its CPU, every round's seconds)."""

    def __init__(self, pg, spark, rows: int, upsert_rows: int, partitions: int, rounds: int) -> None:
        self.url, self.spark, self.n, self.m = pg.url, spark, rows, upsert_rows
        self.partitions, self.rounds = partitions, rounds
        self.jdbc_url = f"jdbc:postgresql://127.0.0.1:{pg.port}/{pg.dbname}"
        self.jdbc = {"url": self.jdbc_url, "user": pg.user, "password": pg.password, "driver": "org.postgresql.Driver"}
        for t in ("w_sluice", "w_jdbc", "w_copy", "w_adbc"):
            self.sql(f"CREATE TABLE {t} (id bigint, name text, value bigint)")
        for t in ("u_sluice", "u_naive"):
            self.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, name text, value bigint)")
        self.df = spark.range(0, rows, 1, 2).selectExpr("id", "concat('name-', id) AS name", "id * 7 AS value").cache()
        self.df.count()
        self.up = spark.range(0, upsert_rows, 1, 2).selectExpr("id", "concat('name-', id) AS name",
                                                               "id * 7 AS value").repartition(2, "id").cache()
        self.up.count()
        self.results: dict[str, float] = {}
        self.cpu: dict[str, dict[str, float]] = {}
        self.every_round: dict[str, list[float]] = {}

    def sql(self, q: str) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute(q)

    def keep(self, contenders: dict) -> None:
        for name, results_of_rounds in best_rounds(contenders, self.rounds).items():
            self.results[f"{name}_s"], self.cpu[name] = min(results_of_rounds, key=lambda r: r[0])
            self.every_round[name] = [round(seconds, 2) for seconds, _ in results_of_rounds]

    def append(self) -> None:
        df, url, jdbc, jdbc_url, sql = self.df, self.url, self.jdbc, self.jdbc_url, self.sql

        def sluice_append():
            sql("TRUNCATE w_sluice")
            return clocked(lambda: df.write.format("postgres").option("url", url).option("table", "w_sluice")
                           .mode("append").save())

        def jdbc_append():
            sql("TRUNCATE w_jdbc")
            return clocked(lambda: df.write.format("jdbc").options(**jdbc)
                           .option("url", jdbc_url + "?reWriteBatchedInserts=true").option("dbtable", "w_jdbc")
                           .option("batchsize", 10000).mode("append").save())

        def null_append():
            return clocked(lambda: df.write.format("sluice_null").mode("append").save())

        self.keep({"append_sluice": sluice_append, "append_jdbc": jdbc_append,
                   "append_floor_python_sink": null_append})

    def upsert(self) -> None:
        import psycopg

        up, url, m, sql = self.up, self.url, self.m, self.sql

        def sluice_upsert():
            sql("TRUNCATE u_sluice")
            sql(f"INSERT INTO u_sluice SELECT g, 'old', 0 FROM generate_series(0, {m - 1}, 2) g")
            return clocked(lambda: up.write.format("postgres").option("url", url).option("table", "u_sluice")
                           .option("primary-key", "id").mode("append").save())

        def naive_upsert():
            sql("TRUNCATE u_naive")
            sql(f"INSERT INTO u_naive SELECT g, 'old', 0 FROM generate_series(0, {m - 1}, 2) g")

            def write_partition(rows, url=url):
                import psycopg as pg3

                stmt = ("INSERT INTO u_naive (id, name, value) VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE "
                        "SET name = EXCLUDED.name, value = EXCLUDED.value")
                with pg3.connect(url) as conn, conn.cursor() as cur:
                    page = []
                    for row in rows:
                        page.append((row.id, row.name, row.value))
                        if len(page) == 10_000:
                            cur.executemany(stmt, page)
                            page = []
                    if page:
                        cur.executemany(stmt, page)

            return clocked(lambda: up.foreachPartition(write_partition))

        self.keep({"upsert_sluice": sluice_upsert, "upsert_naive": naive_upsert})
        with psycopg.connect(url) as c:
            a = c.execute("SELECT count(*), sum(value) FROM u_sluice").fetchone()
            b = c.execute("SELECT count(*), sum(value) FROM u_naive").fetchone()
        assert a == b == (m, sum(i * 7 for i in range(m))), (a, b)

    def read(self) -> None:
        """Of w_sluice: n rows."""
        spark, url, jdbc, n, partitions = self.spark, self.url, self.jdbc, self.n, self.partitions
        self.sql("ALTER TABLE w_sluice ADD PRIMARY KEY (id)")
        self.sql("ANALYZE w_sluice")
        spark.dataSource.register(floor_source(n, partitions))

        def sluice_read():
            return clocked(lambda: spark.read.format("postgres").option("url", url).option("table", "w_sluice")
                           .option("num-partitions", partitions).load().write.format("noop")
                           .mode("overwrite").save())

        def jdbc_read():
            return clocked(lambda: spark.read.format("jdbc").options(**jdbc).option("dbtable", "w_sluice")
                           .option("partitionColumn", "id").option("lowerBound", 0).option("upperBound", n)
                           .option("numPartitions", partitions).option("fetchsize", 10000).load()
                           .write.format("noop").mode("overwrite").save())

        def floor_read():
            return clocked(lambda: spark.read.format("bench_floor").load().write.format("noop").mode("overwrite")
                           .save())

        self.keep({"read_sluice": sluice_read, "read_jdbc": jdbc_read, "read_floor_python_source": floor_read})


def one_python_process(url: str, n: int) -> dict[str, float]:
    """No Spark: psycopg COPY of pre-encoded CSV, ADBC ingest of an Arrow table, ADBC read of w_sluice (seconds)."""
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    results = {}
    table = pa.table({"id": pa.array(range(n), pa.int64()),
                      "name": pa.array([f"name-{i}" for i in range(n)]),
                      "value": pa.array([i * 7 for i in range(n)], pa.int64())})
    buf = io.BytesIO()
    pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False))
    csv_bytes = buf.getvalue()
    t = time.perf_counter()
    with psycopg.connect(url) as c, c.cursor().copy("COPY w_copy FROM STDIN (FORMAT csv)") as copy:
        for i in range(0, len(csv_bytes), 1 << 20):
            copy.write(csv_bytes[i:i + (1 << 20)])
    results["python_psycopg_copy_s"] = time.perf_counter() - t
    with adbc.connect(url) as c:
        t = time.perf_counter()
        c.cursor().adbc_ingest("w_adbc", table, mode="append")
        c.commit()
        results["python_adbc_ingest_s"] = time.perf_counter() - t
        t = time.perf_counter()
        cur = c.cursor()
        cur.execute("SELECT * FROM w_sluice")
        got = cur.fetch_arrow_table().num_rows
        results["python_adbc_read_s"] = time.perf_counter() - t
        assert got == n
    return results


def report(contest: Contest, args: argparse.Namespace) -> dict:
    results, n, m = contest.results, args.rows, args.upsert_rows
    rate = {k.removesuffix("_s"): round((m if k.startswith("upsert") else n) / v) for k, v in results.items()}
    return {
        "date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "rows": n, "upsert_rows": m, "read_partitions": args.partitions, "rounds": args.rounds,
        "seconds": {k: round(v, 3) for k, v in results.items()}, "rows_per_s": rate,
        "seconds_every_round": contest.every_round,
        "cpu_seconds_of_best_run": contest.cpu,
        "ratios": {
            "append_sluice_vs_jdbc": round(results["append_jdbc_s"] / results["append_sluice_s"], 2),
            "upsert_sluice_vs_foreachPartition_executemany": round(results["upsert_naive_s"]
                                                                   / results["upsert_sluice_s"], 2),
            "read_sluice_vs_jdbc": round(results["read_jdbc_s"] / results["read_sluice_s"], 2),
            "append_floor_vs_jdbc": round(results["append_jdbc_s"] / results["append_floor_python_sink_s"], 2),
            "read_floor_vs_jdbc": round(results["read_jdbc_s"] / results["read_floor_python_source_s"], 2),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--upsert-rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4, help="read partitions for both readers")
    ap.add_argument("--rounds", type=int, default=3, help="the first round also warms up Spark's Python workers")
    args = ap.parse_args()
    if not os.path.exists(JAR):
        raise SystemExit(f"{JAR} is missing: make check-pgjdbc (apt-get install -y libpostgresql-jdbc-java)")

    import sluice
    from sluice.testing import LocalPostgres

    with LocalPostgres() as pg:
        spark = sluice.session("bench-postgres", master="local[2]",
                               **{"spark.jars": JAR, "spark.sql.shuffle.partitions": "2"})
        contest = Contest(pg, spark, args.rows, args.upsert_rows, args.partitions, args.rounds)
        contest.append()
        contest.upsert()
        contest.read()
        spark.stop()
        contest.results.update(one_python_process(pg.url, args.rows))
    print(json.dumps(report(contest, args), indent=2))


if __name__ == "__main__":
    main()
