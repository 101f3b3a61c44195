"""What bench/engine_throughput.py and bench/floors/flink_async_sink.py share: the rows, and the bare Arrow writer (a
Python Data Source whose tasks only count the rows Spark hands them: the floor of any Python sink)."""

from __future__ import annotations

# 100 bytes, as bench/floors/java/FlinkFloor.java makes them
BODY = "concat(lpad(cast(id AS string), 20, '0'), repeat('x', 80)) AS body"


def rows_frame(spark, rows: int, with_id: bool = False):
    """`rows` rows of one 100-byte string column in 2 partitions, cached and counted (made before any timing);
    `with_id`: a bigint `id` column before it."""
    df = spark.range(0, rows, 1, 2).selectExpr(*(["id"] if with_id else []), BODY).cache()
    df.count()
    return df


def register_bare_writer(spark) -> str:
    """Registers format("bench_count") on `spark` and returns its name."""
    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    class CountingWriter(DataSourceArrowWriter):
        def write(self, iterator):
            n = 0
            for batch in iterator:
                n += batch.num_rows
            return WriterCommitMessage()

    class CountingSource(DataSource):
        @classmethod
        def name(cls):
            return "bench_count"

        def writer(self, schema, overwrite):
            return CountingWriter()

    spark.dataSource.register(CountingSource)
    return "bench_count"
