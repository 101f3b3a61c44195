"""Kafka from PySpark: `format("sluice_kafka")` reads with the columns of Spark's Kafka source, read_committed by
default, on sluice's split framework (a split per topic partition).

    df = (spark.read.format("sluice_kafka").option("kafka.bootstrap.servers", "broker:9092")
          .option("subscribe", "orders").load())
    stream = (spark.readStream.format("sluice_kafka").option("kafka.bootstrap.servers", "broker:9092")
              .option("subscribePattern", "orders-.*").option("max-records-per-trigger", "100000").load())

Columns: key, value (binary), topic, partition, offset, timestamp, timestampType, and headers with includeHeaders.
"""

from sluice.connectors.kafka._source_datasource import KafkaSourceDataSource

__all__ = ["KafkaSourceDataSource"]
