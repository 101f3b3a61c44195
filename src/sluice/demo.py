"""`make demo`: an order changelog from Spark into split S2 streams, read back and materialized.

1. Starts sluice's local S2 server (durable, data under .sluice/demo/s2) on a free loopback port.
2. A Spark job generates an order changelog: every order is inserted, some are updated, some deleted.
3. The changelog is written with format("s2_upsert") into one stream per region (orders/{region}),
   partition-ordered by order id, so each order's changes arrive in order.
4. The streams are read back with spark.read.format("s2") (record counts) and format("s2_upsert"), which
   materializes them: the latest row per key wins, deletes remove the key. The result is checked against
   what the generator meant to produce.
5. Two-hop streaming ETL over the table store (FLIP-276): job A streams the S2 changelog into the Delta
   table `orders` (upserts, one barrier per micro-batch); job B streams the change feed of `orders` into
   `region_totals` (an aggregation committed with A's barriers). A consistent read of both tables at one
   barrier shows the same money in both; the MetaService prints the lineage.
6. The first hop from an operational database: orders change in PostgreSQL (a throwaway server with
   wal_level=logical), format("postgres_changes") streams the committed changes into S2 as s2_upsert records,
   a second query streams them on into the table store, and the table read at the end equals the database.

The page of `sluice ui` (the pipeline's jobs, tables, lineage, lag and every write's live metrics) is up for the
whole demo at the address it prints first; `make demo DEMO_ARGS=--stay` keeps it up after the demo until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TypedDict

DATA = Path(".sluice/demo")
BASIN = "sluice-demo"
ORDERS = 60_000


class Store(TypedDict):
    """The table store's options, typed so they pass as read_consistent's keywords too."""

    warehouse: str
    meta: str


def generate(spark):
    """One row per change; all changes of an order sit together in input order (insert, update, delete)."""
    return spark.sql(f"""
        SELECT order_id, region, change.status AS status, change.amount AS amount, change.op AS op
        FROM (
          SELECT id AS order_id, element_at(array('eu', 'us', 'apac'), CAST(id % 3 AS INT) + 1) AS region,
                 filter(array(
                   named_struct('status', 'new', 'amount', CAST(id % 97 AS DOUBLE), 'op', 'u'),
                   IF(id % 4 = 0, named_struct('status', 'paid', 'amount', CAST(id % 97 AS DOUBLE) + 0.5, 'op', 'u'),
                      NULL),
                   IF(id % 10 = 0, named_struct('status', 'cancelled', 'amount', CAST(NULL AS DOUBLE), 'op', 'd'),
                      NULL)
                 ), c -> c IS NOT NULL) AS changes
          FROM range({ORDERS})
        ) LATERAL VIEW explode(changes) AS change
    """)


def two_hop_etl(spark, conn: dict) -> bool:
    import sluice.tablestore
    from sluice.meta import MetaService

    store = Store(warehouse=str(DATA / "warehouse"), meta=str(DATA / "meta.db"))
    meta = MetaService(store["meta"])
    print("5. Two-hop streaming ETL over the table store, with barriers and a consistent read:")
    job_a = sluice.tablestore.register_job(spark, "ingest-orders", sources=[], sinks=["orders"], meta=store["meta"])
    changes = (spark.readStream.format("s2_upsert").options(**conn).option("s2.discovery-prefix", "orders/")
               .option("primary-key", "order_id").option("max-records-per-trigger", 40_000)
               .schema("order_id long, region string, status string, amount double, _op string").load())
    query = job_a.watch(changes.writeStream.format("tablestore").option("table", "orders")
                        .option("primary-key", "order_id").option("upsert.op-column", "_op").options(**store)
                        .option("checkpointLocation", str(DATA / "ck-a")).trigger(availableNow=True).start())
    query.awaitTermination()
    print(f"   job A: S2 changelog -> orders, {len(meta.barriers('orders'))} barriers "
          f"(one per micro-batch of at most 40,000 changes)")
    job_b = sluice.tablestore.register_job(spark, "region-totals", sources=["orders"], sinks=["region_totals"],
                                           meta=store["meta"])
    feed = spark.readStream.format("tablestore").option("table", "orders").option("changes", "true") \
        .options(**store).load()
    query = job_b.watch(
        feed.selectExpr("region", sluice.tablestore.signed_change("amount") + " AS signed")
        .groupBy("region").agg({"signed": "sum"}).withColumnRenamed("sum(signed)", "total")
        .writeStream.format("tablestore").option("table", "region_totals").option("primary-key", "region")
        .options(**store).outputMode("complete").option("checkpointLocation", str(DATA / "ck-b"))
        .trigger(availableNow=True).start())
    query.awaitTermination()
    print(f"   job B: orders change feed -> region_totals, committed with barriers "
          f"{[b for b, _ in meta.barriers('region_totals')][-3:]} (last 3)")
    barrier, frames = sluice.tablestore.read_consistent(spark, ["orders", "region_totals"], **store)
    orders = frames["orders"].selectExpr("round(sum(amount), 1)").first()[0]
    totals = frames["region_totals"].selectExpr("round(sum(total), 1)").first()[0]
    same = orders == totals
    print(f"   consistent read at barrier {barrier}: sum(orders.amount) = {orders:,}, "
          f"sum(region_totals.total) = {totals:,} {'OK' if same else 'MISMATCH'}")
    for job in meta.jobs():
        print(f"   lineage: {', '.join(job.sources) or 'S2 streams'} -> [{job.name}] -> {', '.join(job.sinks)} "
              f"({job.status})")
    return same


def first_hop(spark, conn: dict) -> bool:
    import psycopg

    import sluice
    from sluice.testing import LocalPostgres

    print("6. The first hop: PostgreSQL changes -> S2 (s2_upsert) -> the table store:")
    store = Store(warehouse=str(DATA / "warehouse"), meta=str(DATA / "meta.db"))
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on"}) as pg:
        with psycopg.connect(pg.url, autocommit=True) as db:
            db.execute("CREATE TABLE shop_orders (order_id bigint PRIMARY KEY, region text, status text, "
                       "amount double precision)")
            db.execute("INSERT INTO shop_orders SELECT g, (array['eu','us','apac'])[g % 3 + 1], 'new', g % 97 "
                       "FROM generate_series(1, 5000) g")
        to_s2 = {**conn, "s2.stream": "pg-orders", "s2.create-streams": "true", "primary-key": "order_id",
                 "upsert.op-column": "_op", "sink.mode": "partition-ordered"}

        def changes_to_s2() -> int:
            changes = (spark.readStream.format("postgres_changes").options(url=pg.url, table="shop_orders").load()
                       # no large values in this table, and S2 keeps no rows to keep them in: no _unchanged
                       .drop("_lsn", "_commit_time", "_xid", "_table", "_unchanged"))
            query = (sluice.partitioned(changes, "s2_upsert", to_s2).writeStream.format("s2_upsert").options(**to_s2)
                     .option("checkpointLocation", str(DATA / "ck-pg")).trigger(availableNow=True).start())
            query.awaitTermination()
            return sum(p["numInputRows"] for p in query.recentProgress)

        snapshot = changes_to_s2()
        print(f"   the table's snapshot ({snapshot:,} rows) went to S2 stream pg-orders as micro-batch 0")
        with psycopg.connect(pg.url, autocommit=True) as db:
            for i in range(20):  # 20 transactions: payments, cancellations, new orders
                with db.transaction():
                    db.execute("UPDATE shop_orders SET status = 'paid', amount = amount + 0.5 "
                               "WHERE order_id %% 20 = %s AND status = 'new'", (i,))
                    db.execute("DELETE FROM shop_orders WHERE order_id %% 200 = %s", (i * 7 % 200,))
                    db.execute("INSERT INTO shop_orders VALUES (%s, 'eu', 'new', 10)", (10_000 + i,))
            source = db.execute("SELECT order_id, region, status, amount FROM shop_orders ORDER BY 1").fetchall()
        streamed = changes_to_s2()
        print(f"   20 transactions later, the same query (restarted from its checkpoint) sent {streamed:,} changes")
        into_store = (spark.readStream.format("s2_upsert").options(**conn).option("s2.streams", "pg-orders")
                      .option("primary-key", "order_id")
                      .schema("order_id long, region string, status string, amount double, _op string").load())
        query = (into_store.writeStream.format("tablestore").option("table", "shop_orders")
                 .option("primary-key", "order_id").option("upsert.op-column", "_op").options(**store)
                 .option("checkpointLocation", str(DATA / "ck-pg-store")).trigger(availableNow=True).start())
        query.awaitTermination()
    _, frames = sluice.tablestore.read_consistent(spark, ["shop_orders"], **store)
    table = [tuple(r) for r in frames["shop_orders"].select("order_id", "region", "status", "amount")
             .orderBy("order_id").collect()]
    same = table == source
    print(f"   PostgreSQL: {len(source):,} orders, {sum(r[3] for r in source):,.1f} in total; the table store's "
          f"consistent read: {len(table):,} orders, {sum(r[3] for r in table):,.1f}; row for row "
          f"{'the same: OK' if same else 'DIFFERENT: MISMATCH'}")
    return same


def main() -> int:
    import sluice
    from sluice.s2local import LocalS2
    from sluice.ui import serve_ui

    started = time.monotonic()
    stay = "--stay" in sys.argv[1:]
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    print("sluice demo: an order changelog from Spark into S2 streams, and back; then from PostgreSQL.\n")
    # The page over the two-hop pipeline's MetaService and every write's live metrics, up for the whole demo.
    with serve_ui(str(DATA / "meta.db")) as page, LocalS2(data_dir=DATA / "s2") as server:
        print(f"Watch it run: {page.url}/ (live metrics for Prometheus: {page.url}/metrics)\n")
        print(f"1. Local S2 server on {server.url} (durable, data in {DATA / 's2'}).")
        spark = sluice.session("sluice-demo", **{"spark.sql.shuffle.partitions": "4"})
        changelog = generate(spark).cache()
        changes = changelog.count()
        deletes = changelog.where("op = 'd'").count()
        print(f"2. Generated {changes:,} changes for {ORDERS:,} orders: every order inserted, every 4th paid "
              f"(an update), every 10th cancelled ({deletes:,} deletes).")
        options = {
            "s2.basin": BASIN, "s2.stream": "orders/{region}", "s2.create-basin": "true",
            "s2.create-streams": "true", "s2.endpoints.account": server.url, "s2.endpoints.basin": server.url,
            "s2.auth-token": "demo", "primary-key": "order_id", "upsert.op-column": "op",
            "sink.mode": "partition-ordered",
        }
        sluice.write(changelog, "s2_upsert", options)
        summary = sluice.last_write_summary("s2_upsert")
        if summary is None:  # sluice.write above records one, committed or failed
            raise RuntimeError("the s2_upsert write left no summary")
        print(f"3. Wrote the changelog with format('s2_upsert') into orders/eu, orders/us and orders/apac, "
              f"partition-ordered by order_id ({summary['tasks']} Spark tasks, {summary['batches']} requests, "
              f"up to {summary['peak_inflight']} in flight).")
        print(f"   Sink statistics: {json.dumps(summary)}")
        streams = [f"orders/{r}" for r in ("eu", "us", "apac")]
        conn = {k: options[k] for k in ("s2.basin", "s2.endpoints.account", "s2.endpoints.basin", "s2.auth-token")}
        records = {r.stream: r["count"] for r in spark.read.format("s2").options(**conn)
                   .option("s2.discovery-prefix", "orders/").load().groupBy("stream").count().collect()}
        expected = {r: changelog.where(f"region = '{r}'").select("order_id").distinct().count()
                    - changelog.where(f"region = '{r}' AND op = 'd'").count() for r in ("eu", "us", "apac")}
        print("4. Read the streams back with spark.read.format('s2') and materialized them with "
              "format('s2_upsert')\n   (latest change per order wins, deletes remove the order):")
        ok = True
        for name in streams:
            state = (spark.read.format("s2_upsert").options(**conn).option("s2.streams", name)
                     .option("primary-key", "order_id").schema("order_id long, region string, status string, "
                                                                "amount double").load())
            live = state.count()
            paid = state.where("status = 'paid'").count()
            want = expected[name.split("/")[1]]
            ok &= live == want
            print(f"   {name:12s} {records[name]:7,} records -> {live:6,} live orders ({paid:,} paid); expected "
                  f"{want:,} {'OK' if live == want else 'MISMATCH'}")
        ok &= two_hop_etl(spark, conn)
        ok &= first_hop(spark, conn)
        spark.stop()
        if stay:
            print(f"\nThe page stays up at {page.url}/ until Ctrl-C.")
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    total = sum(records.values())
    print(f"\n{changes:,} changes became {total:,} records: within each Arrow batch the sink sends only the last "
          "change per order\n(as flink-connector-s2 does per request), which never reorders one order's changes.")
    print(f"Done in {time.monotonic() - started:.0f} s.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
