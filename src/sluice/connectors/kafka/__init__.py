"""Kafka from PySpark: `format("sluice_kafka")` writes with Spark's Kafka sink's columns in three delivery modes, the
last exactly-once through Kafka transactions (Spark's own `kafka` sink is at-least-once only).

    import sluice
    spark = sluice.session()
    kafka = {"kafka.bootstrap.servers": "broker:9092", "topic": "orders"}
    df = spark.range(1000).selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")

    df.write.format("sluice_kafka").options(**kafka).mode("append").save()               # at-least-once
    sluice.write(df, "sluice_kafka", {**kafka, "sink.mode": "partition-ordered"})         # each key in order
    df.write.format("sluice_kafka").options(**kafka).option("sink.mode", "global-ordered") \\
        .option("sink.transactional", "true").mode("append").save()                       # exactly-once

Columns: value (string/binary, required), key, headers (array<struct<key:string,value:binary>>), topic (when no topic
option), partition, timestamp. `kafka.*` options are librdkafka settings. Why the name is not `kafka`, what each
mode guarantees and how exactly-once works: docs/kafka.md.
"""

from sluice.connectors.kafka._datasource import KafkaDataSource
from sluice.connectors.kafka._store import DeliveryError
from sluice.connectors.kafka._txn import FencedError

__all__ = ["DeliveryError", "FencedError", "KafkaDataSource"]
