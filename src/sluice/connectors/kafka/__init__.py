"""Kafka from PySpark: `format("sluice_kafka")` writes with Spark's Kafka sink's columns in three delivery modes, the
last exactly-once through Kafka transactions (Spark's own `kafka` sink is at-least-once only), and reads with the
columns of Spark's Kafka source, read_committed by default, a split per topic partition.

    import sluice
    spark = sluice.session()
    kafka = {"kafka.bootstrap.servers": "broker:9092", "topic": "orders"}
    df = spark.range(1000).selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")

    df.write.format("sluice_kafka").options(**kafka).mode("append").save()               # at-least-once
    sluice.write(df, "sluice_kafka", {**kafka, "sink.mode": "partition-ordered"})         # each key in order
    df.write.format("sluice_kafka").options(**kafka).option("sink.mode", "global-ordered") \\
        .option("sink.transactional", "true").mode("append").save()                       # exactly-once

    read = (spark.read.format("sluice_kafka").option("kafka.bootstrap.servers", "broker:9092")
            .option("subscribe", "orders").load())
    stream = (spark.readStream.format("sluice_kafka").option("kafka.bootstrap.servers", "broker:9092")
              .option("subscribePattern", "orders-.*").option("max-records-per-trigger", "100000").load())

Written columns: value (string/binary, required), key, headers (array<struct<key:string,value:binary>>), topic (when
no topic option), partition, timestamp. Read columns: key, value (binary), topic, partition, offset, timestamp,
timestampType, and headers with includeHeaders. `kafka.*` options are librdkafka settings. Why the name is not
`kafka`, what each mode guarantees and how exactly-once works: docs/kafka.md.
"""

from sluice.connectors.kafka._datasource import KafkaDataSource
from sluice.connectors.kafka._store import DeliveryError
from sluice.connectors.kafka._txn import MARKER_GROUP_PREFIX, FencedError, default_transactional_prefix

__all__ = ["MARKER_GROUP_PREFIX", "DeliveryError", "FencedError", "KafkaDataSource", "default_transactional_prefix"]
