"""Job B of the two-machine test, run as its own process with its own SparkSession (another "machine")."""

import sys


def main(warehouse: str, meta: str, checkpoint: str) -> int:
    import sluice
    import sluice.tablestore

    spark = sluice.session("job-b", master="local[1]", **{"spark.sql.shuffle.partitions": "1"})
    store = {"warehouse": warehouse, "meta": meta}
    job = sluice.tablestore.register_job(spark, "B", sources=["orders"], sinks=["customer_totals"], meta=meta)
    feed = spark.readStream.format("tablestore").option("table", "orders").option("changes", "true") \
        .options(**store).load()
    query = job.watch(
        feed.selectExpr("customer", sluice.tablestore.signed_change("amount") + " AS signed")
        .groupBy("customer").agg({"signed": "sum"}).withColumnRenamed("sum(signed)", "total")
        .writeStream.format("tablestore").option("table", "customer_totals").option("primary-key", "customer")
        .options(**store).outputMode("complete").option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start())
    query.awaitTermination()
    import time

    time.sleep(0.5)  # the listener marks the job finished
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
