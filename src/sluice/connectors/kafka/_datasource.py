"""`format("sluice_kafka")`: the Spark data source; options in _options.py, driver checks in _checks.py, writes in
_sink.py (the plan and committer), _store.py (the producer) and _txn.py (exactly-once)."""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.types import StructType

from sluice.connector import PARTITION_ORDERED, OptionError, Options, SinkConfig, SinkDataSource
from sluice.connectors.kafka._checks import check_columns, probe, validate_client
from sluice.connectors.kafka._options import PASSTHROUGH, WRITE_SPEC, WriteOptions, client_settings
from sluice.connectors.kafka._sink import KafkaWritePlan


class KafkaDataSource(SinkDataSource):
    """`format("sluice_kafka")`: see the package docstring for usage."""

    format_name = "sluice_kafka"
    write_spec = WRITE_SPEC
    # The exactly-once marker check (_txn.py); the tests' negative controls subclass this with False.
    check_marker: ClassVar[bool] = True

    def parsed(self) -> Options:
        spec = self.option_spec()
        rest, client = client_settings(self.options, {o.name.lower() for o in spec.options})
        return spec.parse(rest).with_values(**{PASSTHROUGH.replace(".", "_"): client})

    def primary_key(self, opts: Options) -> tuple[str, ...]:
        return ("key",)  # partition-ordered keeps each Kafka key's order unless sink.partition-key says otherwise

    def sink_config(self, opts: Options, schema: StructType) -> SinkConfig:
        if (opts["sink.mode"] == PARTITION_ORDERED and not opts["sink.partition-key"]
                and "key" not in schema.fieldNames()):
            raise OptionError("sink.mode=partition-ordered keeps each key's records in order, but the DataFrame has no "
                              "'key' column; add one, or name the ordering columns in sink.partition-key.")
        return super().sink_config(opts, schema)

    def plan_write(self, opts: Options, schema: StructType, config: SinkConfig, overwrite: bool) -> KafkaWritePlan:
        self.refuse_overwrite(overwrite)
        write = WriteOptions.of(opts)
        columns = check_columns(schema, write.topic)
        marker_topic = write.topic
        if config.transactional and marker_topic is None:
            raise OptionError("sink.transactional=true with a topic column: set .option('topic', ...) too (it then "
                              "overrides the column), or write each topic in a write of its own; the task's commit "
                              "marker needs one topic known before the write.")
        plan = KafkaWritePlan(self.format_name, opts, schema, config, write, columns, 0, frozenset(), marker_topic,
                              self.check_marker)
        trial = plan.producer_config()
        if config.transactional:  # librdkafka checks the transactional settings together (no broker is asked)
            trial["transactional.id"] = "sluice-settings-check"
        validate_client(trial)
        cluster = probe(write, [write.topic] if write.topic else [])
        return KafkaWritePlan(self.format_name, opts, schema, config, write, columns, cluster.record_limit,
                              cluster.topics, marker_topic, self.check_marker)
