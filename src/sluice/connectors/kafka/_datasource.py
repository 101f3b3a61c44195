"""`format("sluice_kafka")`: the Spark data source, writes and reads. Options in _options.py (client settings in
_client.py); writes: driver checks in _checks.py, the plan and committer in _sink.py, the producer in _store.py,
exactly-once in _txn.py; reads: the split enumerator in _source.py (partitions found by _discovery.py), the split
reader in _reader.py."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

from pyspark.sql.types import StructType

from sluice.connector import (
    PARTITION_ORDERED,
    OptionError,
    Options,
    SinkConfig,
    SinkDataSource,
    SourceDataSource,
    SplitBatchReader,
    SplitStreamReader,
)
from sluice.connectors.kafka._checks import check_columns, partition_count, probe, validate_client
from sluice.connectors.kafka._discovery import PartitionList, TopicDiscovery, TopicList, TopicPattern
from sluice.connectors.kafka._encode import PayloadEncoder, SideEncoder
from sluice.connectors.kafka._enumerator import KafkaEnumerator
from sluice.connectors.kafka._options import FORMAT_NAME, READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions
from sluice.connectors.kafka._partitioner import with_partition_column
from sluice.connectors.kafka._reader import KafkaSplitReader, read_schema
from sluice.connectors.kafka._schemas import resolve_reads, resolve_writes
from sluice.connectors.kafka._sink import KafkaWritePlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def check_consumer_settings(options: ReadOptions) -> None:
    """librdkafka checks the consumer's settings when one is made (no broker is asked): on the driver, so that a
    misspelt `kafka.*` setting fails the query before any task starts."""
    from confluent_kafka import Consumer, KafkaException

    try:
        Consumer(options.consumer_config()).close()
    except KafkaException as error:
        raise OptionError(options.client.scrub(f"a kafka.* setting was refused by the Kafka client: "
                                               f"{error.args[0].str()}")) from None


def check_same_reader_schema(planned: StructType, resolved: StructType) -> None:
    """schema() and reader() resolve the reader schema in separate calls: a subject whose latest version changed in
    between would hand the tasks columns of another type than Spark planned."""
    now = {f.name: f.dataType.simpleString() for f in resolved.fields}  # types, not nullability
    changed = [f.name for f in planned.fields if f.name in now and now[f.name] != f.dataType.simpleString()]
    if changed:
        raise OptionError(f"the reader schema changed while the read was planned (column(s) {changed}): a new version "
                          "of the subject was registered meanwhile. Run the query again, or pin the version with "
                          "value.schema-version (key.schema-version).")


def discovery_of(options: ReadOptions) -> TopicDiscovery:
    if options.assigned:
        return PartitionList(options.assigned)
    if options.subscribe_pattern:
        return TopicPattern(options.subscribe_pattern)
    return TopicList(options.subscribe)


class KafkaDataSource(SinkDataSource, SourceDataSource):
    """`format("sluice_kafka")`: see the package docstring for usage."""

    format_name = FORMAT_NAME
    write_spec = WRITE_SPEC
    read_spec = READ_SPEC
    # The exactly-once marker check (_txn.py); the tests' negative controls subclass this with False.
    check_marker: ClassVar[bool] = True
    refused_writes = ("A record over the topic's max.message.bytes (found before it is sent, or refused by the broker "
                      "alone in its record batch), and with key.format/value.format a row that does not fit the "
                      "writer schema.")
    refused_reads = ("With a schema-registry key.format/value.format, a record whose key or value does not decode: "
                     "not in Confluent's wire format, a schema id the registry does not have, or a body that does "
                     "not decode under its writer schema.")

    # writes

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        return ("key",)  # partition-ordered keeps each Kafka key's order unless sink.partition-key says otherwise

    def partitioning(self, opts: Options, schema: StructType) -> tuple[str, ...] | None:
        if opts["transaction.by-partition"]:
            return ("partition",)  # with_layout_columns made it from the key when the DataFrame had none
        return super().partitioning(opts, schema)

    def with_layout_columns(self, opts: Options, df: DataFrame) -> DataFrame:
        """transaction.by-partition without a `partition` column: the key's partition, as Kafka's partitioner picks
        it (_partitioner.py), set as the column, so each task's rows go to the partitions it was given."""
        if not opts["transaction.by-partition"] or "partition" in df.columns:
            return df
        write = WriteOptions.of(opts)
        if "key" not in df.columns or not write.payloads.key.raw:
            raise OptionError("transaction.by-partition lays rows out by their Kafka partition: give the DataFrame a "
                              "'partition' column, or a 'key' column written as its bytes (not key.format), from "
                              "which the partition is computed as Kafka's partitioner does.")
        if write.topic is None:
            raise OptionError("transaction.by-partition needs the topic option (the partition count is the topic's)")
        return with_partition_column(df, partition_count(write, write.topic))

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        if (opts["sink.mode"] == PARTITION_ORDERED and not opts["sink.partition-key"]
                and "key" not in schema.fieldNames()):
            raise OptionError("sink.mode=partition-ordered keeps each key's records in order, but the DataFrame has no "
                              "'key' column; add one, or name the ordering columns in sink.partition-key.")
        return super().sink_config(opts, schema)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> KafkaWritePlan:
        self.refuse_overwrite(overwrite)
        write = WriteOptions.of(opts)
        columns = check_columns(schema, write.topic, not write.payloads.key.raw, not write.payloads.value.raw)
        marker_topic = write.topic
        if config.transactional and marker_topic is None:
            raise OptionError("sink.transactional=true with a topic column: set .option('topic', ...) too (it then "
                              "overrides the column), or write each topic in a write of its own; the task's commit "
                              "marker needs one topic known before the write.")
        if config.transactional:
            check_dead_letter_transactions(opts, write.transactional_id_prefix)
        plan = KafkaWritePlan(self.format_name, opts, schema, config, write, columns, 0, frozenset(), marker_topic,
                              self.check_marker)
        trial = plan.producer_config()
        if config.transactional:  # librdkafka checks the transactional settings together (no broker is asked)
            trial["transactional.id"] = "sluice-settings-check"
        validate_client(trial)
        cluster = probe(write, [write.topic] if write.topic else [])
        payloads = None
        if not write.payloads.raw:  # after the brokers' checks: a typo in the topic registers nothing
            resolved, made_of = resolve_writes(write.payloads, schema, write.topic)
            write = replace(write, payloads=resolved)
            key, value = (SideEncoder(side, made_of[side.side]) if not side.raw else None
                          for side in (resolved.key, resolved.value))
            payloads = PayloadEncoder(key, value, value is None or value.columns.struct_column is not None)
        return KafkaWritePlan(self.format_name, opts, schema, config, write, columns, cluster.record_limit,
                              cluster.topics, marker_topic, self.check_marker, payloads)

    # reads

    def _options_resolved(self) -> ReadOptions:
        """The read's options, with the reader schemas of typed sides resolved (once per driver call: schema() and
        reader() are separate calls, each asking the registry once)."""
        options = ReadOptions.of(self.read_options())
        if options.payloads.raw:
            return options
        topics = options.subscribe or tuple(options.assigned or ())
        return replace(options, payloads=resolve_reads(options.payloads, topics[0] if len(topics) == 1 else None))

    def schema(self) -> StructType | str:
        return read_schema(self._options_resolved())

    def _read_parts(self, schema: StructType, batch: bool) -> tuple[KafkaEnumerator, KafkaSplitReader, ReadOptions]:
        options = self._options_resolved()
        if not options.payloads.raw:
            check_same_reader_schema(schema, read_schema(options))
        check_consumer_settings(options)
        # errors.tolerance=all: where the records the read cannot decode go, planned here on the driver
        reader = KafkaSplitReader(options, schema, self.dead_letters(self.read_options(), streaming=not batch),
                                  f"read-{uuid.uuid4().hex}", streaming=not batch)
        return KafkaEnumerator(options, discovery_of(options), batch), reader, options

    def reader(self, schema: StructType) -> SplitBatchReader:
        enumerator, reader, options = self._read_parts(schema, batch=True)
        return SplitBatchReader(enumerator, reader, options.max_records_per_partition or None,
                                reads=self.read_observer(event_time="timestamp"), per_task=options.records_per_task)

    def streamReader(self, schema: StructType) -> SplitStreamReader:
        if any(k.lower() == "endingoffsets" for k in self.options):
            raise OptionError("endingOffsets is for batch reads (spark.read); a stream reads on as records come")
        enumerator, reader, options = self._read_parts(schema, batch=False)
        return SplitStreamReader(enumerator, reader, options.max_records_per_partition or None,
                                 options.max_records_per_trigger, None,
                                 source=(self.format_name, enumerator.discovery.describe()),
                                 reads=self.read_observer(event_time="timestamp"),
                                 per_task=options.records_per_task)


def check_dead_letter_transactions(opts: Options, prefix: str | None) -> None:
    """A transactional Kafka write whose dead letters go to a transactional Kafka topic: the two producers of a task
    need transactional ids of their own, else the dead letters' producer fences the write's (librdkafka's
    init_transactions) and the task fails."""
    if opts["errors.tolerance"] != "all" or opts["errors.deadletter.format"] != FORMAT_NAME:
        return
    target = {k.lower(): v for k, v in dict(opts["errors.deadletter.*"]).items()}
    if str(target.get("sink.transactional", "false")).lower() != "true":
        return
    if target.get("transactional-id-prefix") == prefix:
        raise OptionError(
            "sink.transactional=true with a transactional sluice_kafka dead-letter target: the two need transactional "
            f"ids of their own, and both use the prefix {prefix or 'sluice-<write id>'}. Set "
            "errors.deadletter.transactional-id-prefix to another prefix (e.g. '<this write's prefix>-dead-letters').")
