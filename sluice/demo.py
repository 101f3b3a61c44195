"""`make demo`: an order changelog from Spark into split S2 streams, read back and materialized.

1. Starts sluice's local S2 server (durable, data under .sluice/demo/s2) on a free loopback port.
2. A Spark job generates an order changelog: every order is inserted, some are updated, some deleted.
3. The changelog is written with format("s2_upsert") into one stream per region (orders/{region}),
   partition-ordered by order id, so each order's changes arrive in order.
4. The streams are read back with spark.read.format("s2") (record counts) and format("s2_upsert"), which
   materializes them: the latest row per key wins, deletes remove the key. The result is checked against
   what the generator meant to produce.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

DATA = Path(".sluice/demo")
BASIN = "sluice-demo"
ORDERS = 60_000


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


def main() -> int:
    import sluice
    from sluice.s2local import LocalS2

    started = time.monotonic()
    shutil.rmtree(DATA, ignore_errors=True)
    print("sluice demo: an order changelog from Spark into S2 streams, and back.\n")
    with LocalS2(data_dir=DATA / "s2") as server:
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
        spark.stop()
    total = sum(records.values())
    print(f"\n{changes:,} changes became {total:,} records: within each Arrow batch the sink sends only the last "
          "change per order\n(as flink-connector-s2 does per request), which never reorders one order's changes.")
    print(f"Done in {time.monotonic() - started:.0f} s.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
