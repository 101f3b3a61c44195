"""The streaming query of tests/tablestore/test_tracking_hop.py: a PostgreSQL table streamed by its tracking column
`id` into the table-store table `events`. Run as a module it is a driver process of its own (its own SparkSession,
as on another machine): `processing-time` runs until the process is killed; `available-now` ends once it has read
the rows there were when it started. The server's URL comes in the environment (TRACKING_HOP_PG_URL), not on the
command line."""

import os
import sys


def start_query(spark, url: str, source: str, warehouse: str, meta: str, checkpoint: str, window_ms: str,
                trigger: str):
    writer = (spark.readStream.format("postgres").option("url", url).option("table", source)
              .option("tracking.column", "id").option("tracking.lag-window-ms", window_ms).load()
              .writeStream.format("tablestore").option("table", "events").option("warehouse", warehouse)
              .option("meta", meta).option("checkpointLocation", checkpoint))
    if trigger == "available-now":
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="300 milliseconds").start()


def main(source: str, warehouse: str, meta: str, checkpoint: str, window_ms: str, trigger: str) -> int:
    import sluice

    spark = sluice.session("tracking-hop", master="local[1]", **{"spark.sql.shuffle.partitions": "1"})
    query = start_query(spark, os.environ["TRACKING_HOP_PG_URL"], source, warehouse, meta, checkpoint, window_ms,
                        trigger)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
