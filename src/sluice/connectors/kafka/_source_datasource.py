"""`format("sluice_kafka")`'s reads: the Spark data source of the Kafka split source (the sink's data source is the
same format's other half: the two are one class once merged)."""

from __future__ import annotations

from pyspark.sql.types import StructType

from sluice.connector import OptionError, Options, SourceDataSource, SplitBatchReader, SplitStreamReader
from sluice.connectors.kafka._discovery import PartitionList, TopicDiscovery, TopicList, TopicPattern
from sluice.connectors.kafka._read_options import FORMAT_NAME, READ_SPEC, ReadOptions, parse_read_options
from sluice.connectors.kafka._reader import KafkaSplitReader, spark_schema
from sluice.connectors.kafka._source import KafkaEnumerator


def check_consumer_settings(options: ReadOptions) -> None:
    """librdkafka checks the consumer's settings when one is made (no broker is asked): on the driver, so that a
    misspelt `kafka.*` setting fails the query before any task starts."""
    from confluent_kafka import Consumer, KafkaException

    try:
        Consumer(options.consumer_config()).close()
    except KafkaException as error:
        raise OptionError(options.client.scrub(f"a kafka.* setting was refused by the Kafka client: "
                                               f"{error.args[0].str()}")) from None


def discovery_of(options: ReadOptions) -> TopicDiscovery:
    if options.assigned:
        return PartitionList(options.assigned)
    if options.subscribe_pattern:
        return TopicPattern(options.subscribe_pattern)
    return TopicList(options.subscribe)


class KafkaSourceDataSource(SourceDataSource):
    """spark.read / spark.readStream .format("sluice_kafka"): the columns of Spark's Kafka source, read_committed."""

    format_name = FORMAT_NAME
    read_spec = READ_SPEC

    def read_options(self) -> Options:
        return parse_read_options(self.options)

    def schema(self) -> str:
        return spark_schema(ReadOptions.of(self.read_options()).include_headers)

    def _parts(self, schema: StructType, batch: bool) -> tuple[KafkaEnumerator, KafkaSplitReader, ReadOptions]:
        options = ReadOptions.of(self.read_options())
        check_consumer_settings(options)
        return KafkaEnumerator(options, discovery_of(options), batch), KafkaSplitReader(options, schema), options

    def reader(self, schema: StructType) -> SplitBatchReader:
        enumerator, reader, options = self._parts(schema, batch=True)
        return SplitBatchReader(enumerator, reader, options.max_records_per_partition or None,
                                reads=self.read_observer(event_time="timestamp"))

    def streamReader(self, schema: StructType) -> SplitStreamReader:
        if any(k.lower() == "endingoffsets" for k in self.options):
            raise OptionError("endingOffsets is for batch reads (spark.read); a stream reads on as records come")
        enumerator, reader, options = self._parts(schema, batch=False)
        return SplitStreamReader(enumerator, reader, options.max_records_per_partition or None,
                                 options.max_records_per_trigger, None,
                                 source=(self.format_name, enumerator.discovery.describe()),
                                 reads=self.read_observer(event_time="timestamp"))
