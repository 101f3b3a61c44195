"""PostgreSQL benchmark: sluice vs Spark's JDBC source/sink vs one Python process, one run, one server.

Run: `.venv/bin/python bench/postgres.py` (starts a throwaway PostgreSQL with LocalPostgres; needs Debian's
libpostgresql-jdbc-java for /usr/share/java/postgresql.jar: `apt-get install -y libpostgresql-jdbc-java`).
Data: N rows of (id bigint, name text, value bigint) in a cached DataFrame of 2 partitions (local[2]).
- append: sluice format("postgres") unordered vs Spark JDBC (batchsize 10000, reWriteBatchedInserts=true);
- upsert (fewer rows, the baseline is slow): sluice partition-ordered with primary-key vs a foreachPartition
  doing psycopg executemany of INSERT ... ON CONFLICT DO UPDATE (pages of 10,000 rows);
- read: sluice (consistent snapshot, split by id) vs Spark JDBC with partitionColumn=id, same partition count,
  both written to Spark's noop sink;
- one Python process, no Spark: psycopg COPY of pre-encoded CSV, ADBC ingest of an Arrow table, ADBC read.
Each Spark figure is the best of --rounds runs, alternating the contenders.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import time
from datetime import date

JAR = "/usr/share/java/postgresql.jar"


def best(fn, rounds: int) -> float:
    return min(fn() for _ in range(rounds))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--upsert-rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4, help="read partitions for both readers")
    ap.add_argument("--rounds", type=int, default=3, help="the first round also warms up Spark's Python workers")
    args = ap.parse_args()
    if not os.path.exists(JAR):
        raise SystemExit(f"{JAR} is missing: apt-get install -y libpostgresql-jdbc-java")

    import adbc_driver_postgresql.dbapi as adbc
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    import sluice
    from sluice.testing import LocalPostgres

    n, m = args.rows, args.upsert_rows
    with LocalPostgres() as pg:
        url = pg.url
        jdbc_url = f"jdbc:postgresql://127.0.0.1:{pg.port}/{pg.dbname}"
        jdbc = {"url": jdbc_url, "user": pg.user, "password": pg.password, "driver": "org.postgresql.Driver"}

        def sql(q: str) -> None:
            with psycopg.connect(url, autocommit=True) as c:
                c.execute(q)

        for t in ("w_sluice", "w_jdbc", "w_copy", "w_adbc"):
            sql(f"CREATE TABLE {t} (id bigint, name text, value bigint)")
        for t in ("u_sluice", "u_naive"):
            sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, name text, value bigint)")

        spark = sluice.session("bench-postgres", master="local[2]",
                               **{"spark.jars": JAR, "spark.sql.shuffle.partitions": "2"})
        df = spark.range(0, n, 1, 2).selectExpr("id", "concat('name-', id) AS name", "id * 7 AS value").cache()
        df.count()
        up = spark.range(0, m, 1, 2).selectExpr("id", "concat('name-', id) AS name", "id * 7 AS value") \
            .repartition(2, "id").cache()
        up.count()
        results: dict[str, float] = {}

        # ---------------------------------------------------------------- append
        def sluice_append() -> float:
            sql("TRUNCATE w_sluice")
            t = time.perf_counter()
            df.write.format("postgres").option("url", url).option("table", "w_sluice").mode("append").save()
            return time.perf_counter() - t

        def jdbc_append() -> float:
            sql("TRUNCATE w_jdbc")
            t = time.perf_counter()
            (df.write.format("jdbc").options(**jdbc).option("url", jdbc_url + "?reWriteBatchedInserts=true")
             .option("dbtable", "w_jdbc").option("batchsize", 10000).mode("append").save())
            return time.perf_counter() - t

        results["append_sluice_s"], results["append_jdbc_s"] = (
            min(x) for x in zip(*[(sluice_append(), jdbc_append()) for _ in range(args.rounds)], strict=True))

        # ---------------------------------------------------------------- upsert
        def sluice_upsert() -> float:
            sql("TRUNCATE u_sluice")
            sql(f"INSERT INTO u_sluice SELECT g, 'old', 0 FROM generate_series(0, {m - 1}, 2) g")
            t = time.perf_counter()
            up.write.format("postgres").option("url", url).option("table", "u_sluice") \
                .option("primary-key", "id").mode("append").save()
            return time.perf_counter() - t

        def naive_upsert() -> float:
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

            t = time.perf_counter()
            up.foreachPartition(write_partition)
            return time.perf_counter() - t

        results["upsert_sluice_s"], results["upsert_naive_s"] = (
            min(x) for x in zip(*[(sluice_upsert(), naive_upsert()) for _ in range(args.rounds)], strict=True))
        with psycopg.connect(url) as c:
            a = c.execute("SELECT count(*), sum(value) FROM u_sluice").fetchone()
            b = c.execute("SELECT count(*), sum(value) FROM u_naive").fetchone()
        assert a == b == (m, sum(i * 7 for i in range(m))), (a, b)

        # ---------------------------------------------------------------- read (of w_sluice: n rows)
        sql("ALTER TABLE w_sluice ADD PRIMARY KEY (id)")
        sql("ANALYZE w_sluice")

        def sluice_read() -> float:
            t = time.perf_counter()
            r = spark.read.format("postgres").option("url", url).option("table", "w_sluice") \
                .option("num-partitions", args.partitions).load()
            r.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t

        def jdbc_read() -> float:
            t = time.perf_counter()
            r = (spark.read.format("jdbc").options(**jdbc).option("dbtable", "w_sluice")
                 .option("partitionColumn", "id").option("lowerBound", 0).option("upperBound", n)
                 .option("numPartitions", args.partitions).option("fetchsize", 10000).load())
            r.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t

        results["read_sluice_s"], results["read_jdbc_s"] = (
            min(x) for x in zip(*[(sluice_read(), jdbc_read()) for _ in range(args.rounds)], strict=True))
        spark.stop()

        # ---------------------------------------------------------------- one Python process
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

    rate = {k.removesuffix("_s"): round((m if k.startswith("upsert") else n) / v) for k, v in results.items()}
    report = {
        "date": date.today().isoformat(), "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "rows": n, "upsert_rows": m, "read_partitions": args.partitions, "rounds": args.rounds,
        "seconds": {k: round(v, 3) for k, v in results.items()}, "rows_per_s": rate,
        "ratios": {
            "append_sluice_vs_jdbc": round(results["append_jdbc_s"] / results["append_sluice_s"], 2),
            "upsert_sluice_vs_foreachPartition_executemany": round(results["upsert_naive_s"]
                                                                   / results["upsert_sluice_s"], 2),
            "read_sluice_vs_jdbc": round(results["read_jdbc_s"] / results["read_sluice_s"], 2),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
