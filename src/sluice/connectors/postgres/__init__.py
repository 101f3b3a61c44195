"""PostgreSQL from PySpark: `format("postgres")` writes in all three sink modes and reads in consistent splits.

    import sluice
    spark = sluice.session()
    pg = {"url": "postgresql://app@db:5432/shop", "table": "public.orders"}   # password: option or PGPASSWORD
    orders = spark.createDataFrame([(1, "eu", 9.5), (2, "us", 3.0)], "id long, region string, amount double")

    sluice.write(orders, "postgres", {**pg, "create-table": "true"})                # COPY, at-least-once
    sluice.write(orders, "postgres", {**pg, "primary-key": "id"})                    # upsert, per-key order
    sluice.write(orders, "postgres", {**pg, "sink.mode": "global-ordered",           # exactly-once, ordered
                                      "sink.transactional": "true"})
    orders.write.format("postgres").options(**pg).mode("overwrite").save()          # atomic replace

    df = spark.read.format("postgres").options(**pg).load()                         # one consistent snapshot
    big = spark.read.format("postgres").option("url", pg["url"]).option("query", "SELECT * FROM orders o "
                                                                        "WHERE o.amount > 5").load()

Writes: see _sink.py for how each mode maps onto COPY, INSERT ... ON CONFLICT and the staged commit.
    changes = (spark.readStream.format("postgres_changes")                          # change capture
               .options(url=pg["url"], table="public.orders").load())                # (wal_level=logical)

Reads: see _source.py for splits, the shared snapshot and filter pushdown. Full guide: docs/postgres.md.
"""

from sluice.connectors.postgres._client import Connection, PostgresError
from sluice.connectors.postgres._datasource import PostgresDataSource
from sluice.connectors.postgres.changes import PostgresChangesDataSource

__all__ = ["Connection", "PostgresChangesDataSource", "PostgresDataSource", "PostgresError"]
