"""Each contender of the Avro benchmark, on one broker and one registry: the source's decode (Spark's from_avro over
Spark's Kafka source, confluent-kafka's DeserializingConsumer, the sluice source) and the sink's encode and write
(Spark's to_avro into Spark's Kafka sink, the sluice sink). Each returns its seconds and checks what it did."""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.kafka_formats.data import FIELDS, SCHEMA_JSON, check_avro_sample, confluent_header, sample_of

# Every decoded field hashed into one figure: no field can be pruned away or left undecoded, and two readers of the
# same topic that decode the same values to the same Spark types get the same figure.
CHECKSUM = ("count(*) AS n", f"bit_xor(xxhash64({', '.join(FIELDS)})) AS h")


def sluice_options(registry_url: str, fmt: str = "avro-confluent") -> dict[str, str]:
    """The sluice_kafka options of a value in Confluent's wire format, the registry at `registry_url` (the value's
    fields are top-level columns, the source's default)."""
    return {"value.format": fmt, "schema-registry.url": registry_url}


# The producer settings of both sinks, each given them as kafka.* options: their clients' defaults differ (Spark's Kafka
# sink, Java's kafka-clients 3.9: linger.ms 0, batch.size 16384; the sluice sink, librdkafka: linger.ms 5, batch.size
# up to the topic's max.message.bytes), and Java's small batches cost the broker about twice the CPU per record.
PRODUCER = {"kafka.linger.ms": "5", "kafka.batch.size": "1000000", "kafka.compression.type": "none",
            "kafka.acks": "all"}


# The columns the Protobuf sink writes: its schema derived from the DataFrame has the decimal as a string and the date
# as days, and the sink takes columns of those types only (it does not cast a decimal or a date itself).
PROTOBUF_COLUMNS = tuple({"amount": "CAST(amount AS STRING) AS amount",
                          "ship_date": "unix_date(ship_date) AS ship_date"}.get(f, f) for f in FIELDS)


def comparable(columns: dict[str, str]) -> list[str]:
    """The checksum's fields as the Avro readers give them, from a Protobuf read's columns (name: simpleString type):
    Protobuf has no decimal nor date, so a schema derived from the DataFrame has them as a string and days."""
    converted = {"amount": "CAST(amount AS DECIMAL(12, 2))", "ship_date": "date_from_unix_date(ship_date)"}
    return [converted[f] if f in converted and columns[f] in ("string", "int") else f for f in FIELDS]


class AvroBench:
    def __init__(self, spark: Any, kafka: Any, registry_url: str, df: Any, rows: int) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.spark, self.kafka, self.url, self.df, self.n = spark, kafka, registry_url, df, rows
        self.sample = sample_of(df)
        self.registry = SchemaRegistryClient({"url": registry_url})
        self.source_topic = ""
        self.protobuf_topic = ""
        self.checksums: dict[str, int] = {}

    def register(self, topic: str) -> int:
        """Registers the schema under `topic`'s value subject (TopicNameStrategy): its id."""
        from confluent_kafka.schema_registry import Schema

        return self.registry.register_schema(f"{topic}-value", Schema(SCHEMA_JSON, "AVRO"))

    def topic(self) -> str:
        name = f"formats-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(name, partitions=2)
        return name

    def _read(self, fmt: str, options: dict[str, str], topic: str = "") -> Any:
        return (self.spark.read.format(fmt)
                .options(**{"kafka.bootstrap.servers": self.kafka.bootstrap_servers,
                            "subscribe": topic or self.source_topic,
                            "startingOffsets": "earliest", "endingOffsets": "latest", **options}).load())

    def _check(self, name: str, row: Any) -> None:
        if row.n != self.n:
            raise SystemExit(f"{name} decoded {row.n} records, not {self.n}")
        self.checksums[name] = row.h

    # ------------------------------------------------------------------ sources
    def spark_from_avro(self) -> float:
        """Spark's own path: its Kafka source, the header cut off by hand, from_avro with the schema's text."""
        from pyspark.sql.avro.functions import from_avro
        from pyspark.sql.functions import expr

        started = time.perf_counter()
        decoded = self._read("kafka", {}).select(
            from_avro(expr("substring(value, 6)"), SCHEMA_JSON).alias("r")).select("r.*")
        row = decoded.selectExpr(*CHECKSUM).collect()[0]
        seconds = time.perf_counter() - started
        self._check("spark from_avro", row)
        return seconds

    def sluice_source(self) -> float:
        started = time.perf_counter()
        row = self._read("sluice_kafka", sluice_options(self.url)).selectExpr(*CHECKSUM).collect()[0]
        seconds = time.perf_counter() - started
        self._check("sluice source", row)
        return seconds

    def sluice_source_protobuf(self) -> float:
        """The sluice source on the Protobuf topic (written by the sluice sink, the schema derived from the
        DataFrame); the checksum over the fields converted back to the Avro readers' types where Protobuf lacks one."""
        started = time.perf_counter()
        df = self._read("sluice_kafka", sluice_options(self.url, "protobuf-confluent"), self.protobuf_topic)
        fields = comparable({f.name: f.dataType.simpleString() for f in df.schema.fields})
        row = df.selectExpr("count(*) AS n", f"bit_xor(xxhash64({', '.join(fields)})) AS h").collect()[0]
        seconds = time.perf_counter() - started
        self._check("sluice source (protobuf)", row)
        return seconds

    def deserializing_consumer(self) -> float:
        """confluent-kafka's DeserializingConsumer with its AvroDeserializer (the writer schema from the registry by
        the header's id, fastavro per record into a dict), one process for both partitions; the seconds after the
        consumer was made. Every record's dict is complete (fastavro decodes every field)."""
        from confluent_kafka import OFFSET_BEGINNING, DeserializingConsumer, TopicPartition
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        deserializer = AvroDeserializer(SchemaRegistryClient({"url": self.url}))  # a cold cache, as a new process's
        consumer = DeserializingConsumer({
            "bootstrap.servers": self.kafka.bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "value.deserializer": deserializer})
        started = time.perf_counter()
        try:
            consumer.assign([TopicPartition(self.source_topic, p, OFFSET_BEGINNING) for p in (0, 1)])
            records = ids = 0
            poll = consumer.poll
            while records < self.n:
                message = poll(5.0)
                if message is None:
                    raise SystemExit(f"the DeserializingConsumer got nothing for 5 s after {records} records")
                if message.error() is not None:
                    raise SystemExit(f"the DeserializingConsumer failed: {message.error()}")
                ids += message.value()["id"]
                records += 1
        finally:
            consumer.close()
        seconds = time.perf_counter() - started
        if ids != self.n * (self.n - 1) // 2:
            raise SystemExit(f"the DeserializingConsumer's ids sum to {ids}, not {self.n * (self.n - 1) // 2}")
        return seconds

    # ------------------------------------------------------------------ sinks
    def _verify(self, topic: str, schema_id: int | None, what: str) -> None:
        from sluice.testing import read_committed

        records = read_committed(self.kafka.client_config(), topic, timeout=300)
        if len(records) != self.n:
            raise SystemExit(f"{what}: a read_committed consumer reads {len(records)} records, not {self.n}")
        if schema_id is None:  # the sink registered the schema itself: the id its header names
            schema_id = int.from_bytes((records[0].value or b"")[1:5], "big")
        text = self.registry.get_schema(schema_id).schema_str
        if text is None:
            raise SystemExit(f"{what}: the registry has no text for schema id {schema_id}")
        check_avro_sample(records, text, schema_id, self.sample, what)

    def spark_to_avro(self) -> float:
        """Spark's own path: to_avro of every field under the schema's text, Confluent's header prepended with
        concat(lit(...)), Spark's Kafka sink (the schema registered beforehand, untimed: Spark has no registry)."""
        from pyspark.sql.avro.functions import to_avro
        from pyspark.sql.functions import concat, lit, struct

        topic = self.topic()
        schema_id = self.register(topic)
        started = time.perf_counter()
        (self.df.select("key", concat(lit(confluent_header(schema_id)), to_avro(struct(*FIELDS), SCHEMA_JSON))
                        .alias("value"))
         .write.format("kafka").option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
         .options(**PRODUCER).option("topic", topic).save())
        seconds = time.perf_counter() - started
        self._verify(topic, schema_id, "Spark to_avro + kafka sink")
        return seconds

    def sluice_sink(self) -> float:
        """The sluice sink encoding the same columns under the same schema text (value.schema; it registers it
        itself, under the topic's subject), every column but key being the value's."""
        topic = self.topic()
        seconds = self._sluice_write(topic, {"value.schema": SCHEMA_JSON, **sluice_options(self.url)})
        self._verify(topic, None, "sluice sink")
        return seconds

    def sluice_sink_protobuf(self) -> float:
        """The sluice sink encoding the same columns as Protobuf under a schema it derives from the DataFrame and
        registers; what it wrote is checked by the Protobuf source's read (its count and checksum)."""
        from sluice.testing import count_committed

        topic = self.topic()
        seconds = self._sluice_write(topic, sluice_options(self.url, "protobuf-confluent"), PROTOBUF_COLUMNS)
        got = count_committed(self.kafka.client_config(), topic, timeout=300)
        if got != self.n:
            raise SystemExit(f"sluice sink (protobuf): a read_committed consumer counts {got} records, not {self.n}")
        self.protobuf_topic = self.protobuf_topic or topic
        return seconds

    def _sluice_write(self, topic: str, options: dict[str, str], columns: tuple[str, ...] = tuple(FIELDS)) -> float:
        started = time.perf_counter()
        (self.df.selectExpr("key", *columns).write.format("sluice_kafka")
         .options(**{"kafka.bootstrap.servers": self.kafka.bootstrap_servers, "topic": topic,
                     "sink.mode": "unordered", **PRODUCER, **options}).mode("append").save())
        return time.perf_counter() - started

    def produce_source(self) -> None:
        from bench.kafka_formats.data import produce_avro

        self.source_topic = self.topic()
        schema_id = self.register(self.source_topic)
        produce_avro(self.df, self.kafka.client_config(), self.source_topic, schema_id)
