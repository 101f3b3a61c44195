"""What the driver checks once per write, before any task starts: the columns, the client settings, the brokers (one
metadata request: reachable, the topics that exist) and the largest record the target accepts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from sluice.connector import OptionError, SinkError
from sluice.connectors.kafka._client import ClientSettings, client_certificate_refused
from sluice.connectors.kafka._options import WriteOptions
from sluice.connectors.kafka._txn import connection_settings, describe

COLUMNS = ("key", "value", "headers", "topic", "partition", "timestamp")
HEADERS_TYPE = "array<struct<key:string,value:binary>>"


@dataclass(frozen=True)
class RecordColumns:
    """Which of Spark's Kafka sink columns the DataFrame has (value always)."""

    key: bool
    headers: bool
    topic: bool
    partition: bool
    timestamp: bool


def check_columns(schema: T.StructType, topic_option: str | None, key_typed: bool = False,
                  value_typed: bool = False) -> RecordColumns:
    """Spark's Kafka sink's columns and types; anything else is refused, naming the column. A typed side (key.format,
    value.format) is a struct column; a typed value whose `value` column is no struct is every other column, the
    `timestamp` column included (_schemas.py): the record columns are then those the payload encoder makes."""
    fields = {f.name.lower(): f for f in schema.fields}
    value_fields = value_typed and not isinstance(getattr(fields.get("value"), "dataType", None), T.StructType)
    if value_fields:
        fields = {n: f for n, f in fields.items() if n in ("key", "topic", "partition", "headers")}
    extra = [f.name for f in schema.fields if f.name.lower() not in COLUMNS]
    if extra and not value_fields:
        raise OptionError(
            f"format 'sluice_kafka' writes the columns {', '.join(COLUMNS)} (value required); the DataFrame also has "
            f"{extra}, which would be dropped. Select the record's columns, e.g. "
            "df.selectExpr('CAST(id AS STRING) AS key', 'to_json(struct(*)) AS value').")
    if "value" not in fields and not value_fields:
        raise OptionError(
            f"format 'sluice_kafka' needs a 'value' column (string or binary); the DataFrame has "
            f"{schema.fieldNames()}. E.g. df.selectExpr('to_json(struct(*)) AS value').")
    binary = (T.StringType, T.BinaryType)
    for name in ("key", "value"):
        field = fields.get(name)
        if {"key": key_typed, "value": value_typed}[name]:
            if field is not None and not isinstance(field.dataType, T.StructType):
                raise OptionError(f"column '{name}' is {field.dataType.simpleString()}; with {name}.format it must "
                                  f"be a struct of the fields to encode, e.g. struct(id, name) AS {name}.")
            continue
        if field is not None and not isinstance(field.dataType, binary):
            raise OptionError(
                f"column '{name}' is {field.dataType.simpleString()}; Kafka's {name} must be string or binary. "
                f"Convert it, e.g. CAST({name} AS STRING).")
    checks = {"topic": (T.StringType,), "partition": (T.IntegerType, T.ShortType, T.ByteType),
              "timestamp": (T.TimestampType,)}
    for name, types in checks.items():
        field = fields.get(name)
        if field is not None and not isinstance(field.dataType, types):
            wanted = {"topic": "string", "partition": "int", "timestamp": "timestamp"}[name]
            raise OptionError(f"column '{name}' is {field.dataType.simpleString()}; it must be {wanted}. "
                              f"Convert it, e.g. CAST({name} AS {wanted.upper()}).")
    headers = fields.get("headers")
    if headers is not None and headers.dataType.simpleString() != HEADERS_TYPE:
        raise OptionError(f"column 'headers' is {headers.dataType.simpleString()}; it must be {HEADERS_TYPE} "
                          "(Spark's Kafka sink's headers), e.g. array(struct(lit('h') AS key, CAST(v AS BINARY) AS "
                          "value)).")
    if topic_option is None and "topic" not in fields:
        raise OptionError("format 'sluice_kafka' needs a topic: set .option('topic', 'name'), or give each row one "
                          "in a string column 'topic'.")
    return RecordColumns(*(n in fields for n in ("key", "headers", "topic", "partition", "timestamp")))


@dataclass(frozen=True)
class Cluster:
    """What one metadata request and one config request told the driver: the topics that exist and the largest
    record (bytes) the target topic (or, for a topic column, the broker's default) accepts."""

    topics: frozenset[str]
    record_limit: int


def validate_client(config: dict[str, Any]) -> None:
    """librdkafka checks names and values when a client is made: a producer on the driver, closed unused."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({**config, "log_level": 0}).close()
    except KafkaException as e:
        message = describe(e)
        raise OptionError(f"the Kafka client refuses the kafka.* settings: {message}. Options prefixed kafka. are "
                          "librdkafka's settings (its CONFIGURATION.md), not the Java client's.") from None


def probe(write: WriteOptions, topics: list[str]) -> Cluster:
    """The brokers reachable within timeout-ms, `topics` existing (auto-creation is not relied on), and the limit."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    client, timeout_s = write.client, write.timeout_ms / 1000.0
    errors: list[Any] = []
    settings: dict[str, Any] = {**connection_settings(client), "error_cb": errors.append, "log_level": 0}
    admin = AdminClient(settings)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as e:
        admin.poll(0.5)  # serves error_cb: what librdkafka saw on the way (refused, authentication, TLS)
        raise unreachable(client, write.timeout_ms, e, errors) from None
    existing = frozenset(t for t, m in metadata.topics.items() if m.error is None)
    missing = [t for t in topics if t not in existing]
    if missing:
        raise OptionError(
            f"topic(s) {missing} do not exist on {client.bootstrap_servers}; the sink does not create topics. "
            "Create them first (kafka-topics.sh --create, or AdminClient.create_topics).")
    resource = (ConfigResource("TOPIC", write.topic) if write.topic
                else ConfigResource("BROKER", str(next(iter(metadata.brokers)))))
    wanted = "max.message.bytes" if write.topic else "message.max.bytes"
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        limit = int(configs[wanted].value)
    except Exception as e:  # no DescribeConfigs right: Kafka's default, and the broker still refuses larger ones
        limit = 1_048_588
        import logging

        logging.getLogger("sluice.kafka").info("kafka: %s unknown (%s); assuming Kafka's default %d", wanted,
                                               client.scrub(describe(e)), limit)
    return Cluster(existing, limit)


def partition_count(write: WriteOptions, topic: str) -> int:
    """How many partitions `topic` has now, asked of the brokers within timeout-ms."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    client, timeout_s = write.client, write.timeout_ms / 1000.0
    errors: list[Any] = []
    settings: dict[str, Any] = {**connection_settings(client), "error_cb": errors.append, "log_level": 0}
    admin = AdminClient(settings)
    try:
        metadata = admin.list_topics(topic, timeout=timeout_s)
    except KafkaException as e:
        admin.poll(0.5)
        raise unreachable(client, write.timeout_ms, e, errors) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise OptionError(f"topic {topic!r} does not exist on {client.bootstrap_servers}; the sink does not create "
                          "topics. Create it first (kafka-topics.sh --create, or AdminClient.create_topics).")
    return len(found.partitions)


def unreachable(client: ClientSettings, timeout_ms: int, error: Any, seen: list[Any]) -> SinkError:
    """No metadata within the timeout: name the servers and what librdkafka saw (refused, authentication, TLS)."""
    reasons = sorted({client.scrub(describe(e)) for e in seen})[:3]
    seen_text = f" librdkafka reported: {'; '.join(reasons)}." if reasons else ""
    if any(e.code() == _authentication() for e in seen):
        seen_text += (" Authentication failed: check kafka.sasl.mechanism, kafka.sasl.username and "
                      "kafka.sasl.password (the password is not shown).")
    refused = client_certificate_refused(" ".join(describe(e) for e in seen))  # a transport error, not _SSL
    if refused:
        seen_text += f" TLS failed: {refused}."
    elif any(e.code() == _ssl() for e in seen):
        seen_text += " TLS failed: check that kafka.ssl.ca.pem holds the CA that signed the brokers' certificates."
    return SinkError(
        f"kafka: no broker of kafka.bootstrap.servers={client.bootstrap_servers} answered within {timeout_ms} ms "
        f"(timeout-ms): {client.scrub(describe(error))}.{seen_text} Check the addresses, that the brokers run, and "
        "kafka.security.protocol / kafka.sasl.* for the listener.", store="kafka", target=client.bootstrap_servers)


def _ssl() -> int:
    from confluent_kafka import KafkaError

    return KafkaError._SSL


def _authentication() -> int:
    from confluent_kafka import KafkaError

    return KafkaError._AUTHENTICATION
