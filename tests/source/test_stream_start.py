"""An error raised when a stream starts reaches the user as sluice's, not as Spark's `UnboundLocalError`: Spark's
streaming source runner masks an exception of `streamReader()` (sluice/source/_stream_start.py). Run on every Spark
line (`lines`): the runner's code is each line's own."""

import pytest
from pyspark.errors import StreamingQueryException

from sluice.connectors.kafka._datasource import KafkaDataSource

pytestmark = [pytest.mark.spark, pytest.mark.lines]


def start_failure(spark, reader) -> str:
    """The text of the exception a user meets starting `reader`'s stream (its load, start or first batch)."""
    with pytest.raises(StreamingQueryException) as failed:
        query = reader.load().writeStream.format("noop").start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    return str(failed.value)


def kafka_stream(spark, name="sluice_kafka"):
    return (spark.readStream.format(name).option("kafka.bootstrap.servers", "127.0.0.1:9")
            .option("subscribe", "t").option("endingOffsets", "latest"))


def test_a_stream_start_error_is_sluices_own_on_every_line(spark, capability):
    kafka = start_failure(spark, kafka_stream(spark))
    assert "OptionError: endingOffsets is for batch reads" in kafka and "UnboundLocalError" not in kafka
    postgres = start_failure(spark, spark.readStream.format("postgres").schema("id long")
                             .option("url", "postgresql://u@127.0.0.1:9/db").option("table", "t"))
    assert "OptionError" in postgres and "tracking.column" in postgres and "UnboundLocalError" not in postgres
    capability("stream start errors whole", "yes")


def test_without_the_wrapper_spark_masks_the_error(spark):
    """The negative control: the same source with its own, unwrapped streamReader() (assigned after the class is
    made, so SourceDataSource does not wrap it) ends in Spark's UnboundLocalError."""

    class UnwrappedKafka(KafkaDataSource):  # defined here: pickled by value to Spark's Python worker
        @classmethod
        def name(cls) -> str:
            return "sluice_kafka_unwrapped"

    UnwrappedKafka.streamReader = KafkaDataSource.streamReader.__wrapped__
    spark.dataSource.register(UnwrappedKafka)
    masked = start_failure(spark, kafka_stream(spark, "sluice_kafka_unwrapped"))
    assert "UnboundLocalError" in masked
