"""Reading Kafka on the executors: one consumer per Spark partition, assigned to one topic partition at the range's
first offset (Consumer.assign, no consumer group), fetching with consume(num_messages) and handing Spark Arrow
batches with the columns Spark's Kafka source has.

Where a range ends: at the first record at or past its end offset, or at the partition's end (librdkafka's partition
EOF, which under read_committed is the last stable offset). The end was at most the partition's end when it was
planned, so one of the two always comes, also when the range's last offsets are transaction markers or aborted
records, which a read_committed consumer never sees.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from itertools import accumulate
from operator import is_not, itemgetter
from typing import Any, cast

import numpy as np
import pyarrow as pa

from sluice.connector import (
    DeadLetterRoute,
    DeadLetterWriter,
    OptionError,
    SluiceError,
    Split,
    SplitReader,
    from_arrow_schema,
    read_with_letters,
    to_arrow_schema,
)
from sluice.connectors.kafka._consumers import lent
from sluice.connectors.kafka._decode import BadPayloadError, SideDecoder
from sluice.connectors.kafka._enumerator import topic_partition
from sluice.connectors.kafka._options import ReadOptions
from sluice.connectors.kafka._undecodable import set_aside

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          "timestampType int")
HEADERS = "headers array<struct<key: string, value: binary>>"
# SCHEMA and HEADERS in Arrow: the columns a read with a typed key or value has besides those.
ARROW_COLUMNS = (pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
                 pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
                 pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32()),
                 pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
FETCH_RECORDS = 10_000  # records asked of the client per consume() call (one Arrow batch at most)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a fetch and its Arrow batch: each makes 10,000 Message objects and
    as many timestamp tuples, none in a cycle (reference counting frees them), and the collections their allocations
    set off scanned every live object again and again (two fifths of a reader's sampled CPU in py-spy). They must be
    freed before the collector is back on, or the first allocation after it scans them all at once."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def split_errors(messages: list[Any]) -> tuple[list[Any], list[Any]]:
    """A fetch's records and its error events (partition EOF and the like, rare; as messages, which name their
    partition): the records are the whole fetch unless an error came, found without a Python loop over the records."""
    from confluent_kafka import Message

    if not any(map(partial(is_not, None), map(Message.error, messages))):
        return messages, []
    return [m for m in messages if m.error() is None], [m for m in messages if m.error() is not None]


def spark_schema(include_headers: bool) -> str:
    return f"{SCHEMA}, {HEADERS}" if include_headers else SCHEMA


def decoders(options: ReadOptions) -> tuple[SideDecoder | None, SideDecoder | None]:
    """The key's and the value's decoders (None: raw bytes); their reader schemas were resolved on the driver."""
    payloads = options.payloads
    if payloads.raw:
        return None, None
    assert payloads.registry is not None
    return tuple(None if side.raw else SideDecoder(side, payloads.registry)  # type: ignore[return-value]
                 for side in (payloads.key, payloads.value))


def read_schema(options: ReadOptions) -> Any:
    """The read's columns: Spark's Kafka source's, with a typed key a struct, and a typed value a struct or, with
    value.fields=columns, its fields as top-level columns in the value's place."""
    if options.payloads.raw:
        return spark_schema(options.include_headers)
    key, value = decoders(options)
    fields: list[pa.Field] = []
    for field in ARROW_COLUMNS[:None if options.include_headers else -1]:
        if field.name == "key" and key is not None:
            fields.append(pa.field("key", key.arrow_type()))
        elif field.name == "value" and value is not None:
            value_type = value.arrow_type()
            if options.payloads.value.fields == "struct":
                fields.append(pa.field("value", value_type))
                continue
            clash = sorted(set(value_type.names) & (set(COLUMNS) - {"value"}))
            if clash:
                raise OptionError(f"the value's field(s) {clash} have the names of Kafka's columns: set "
                                  ".option('value.fields', 'struct') (one column value), or rename them in the "
                                  "reader schema (value.schema).")
            fields.extend(value_type)
        else:
            fields.append(field)
    return from_arrow_schema(pa.schema(fields))


def headers_array(headers: list[list[tuple[str, bytes | None]] | None], arrow_type: pa.DataType) -> pa.Array:
    """list<struct<key, value>> from flat arrays and offsets."""
    offsets = pa.array([0, *accumulate(len(h) if h else 0 for h in headers)], pa.int32())
    flat = [pair for h in headers if h for pair in h]
    item = arrow_type.value_type
    values = pa.StructArray.from_arrays([pa.array([k for k, _ in flat], pa.string()),
                                         pa.array([v for _, v in flat], pa.binary())], fields=list(item))
    return pa.ListArray.from_arrays(offsets, values, type=arrow_type)


class KafkaSplitReader(SplitReader):
    """Reads offsets [start, end) of one topic partition; yields Arrow batches of the query's schema."""

    def __init__(self, options: ReadOptions, schema: Any, dead_letters: DeadLetterRoute | None = None,
                 read_id: str = "", streaming: bool = False) -> None:
        """`dead_letters`: where records that do not decode go (errors.tolerance=all, _undecodable.py), named after
        the streaming query, else `read_id`."""
        self.dead_letters, self.read_id, self.streaming = dead_letters, read_id, streaming
        self.key_decoder, self.value_decoder = decoders(options)
        # value.fields=columns: the value's fields are columns of their own, decoded together
        self.value_fields: tuple[str, ...] = ()
        if self.value_decoder is not None and options.payloads.value.fields == "columns":
            self.value_fields = tuple(self.value_decoder.arrow_type().names)
        allowed = (*COLUMNS, *self.value_fields)
        unknown = [n for n in schema.fieldNames() if n not in allowed]
        if unknown:
            raise OptionError(f"column(s) {unknown} are not Kafka record columns ({', '.join(COLUMNS)}); parse the "
                              "value after loading, e.g. from_json(CAST(value AS STRING), schema)")
        self.config = options.consumer_config()
        self.scrub = options.client.scrub
        self.options = options
        self.timeout = options.timeout_ms / 1000
        self.arrow_schema = to_arrow_schema(schema)

    def read(self, split: Split, start: int, end: int) -> Iterator[pa.RecordBatch]:
        topic, partition = topic_partition(split.split_id)
        return read_with_letters(self.dead_letters, self.read_id, self.streaming,
                                 f"topic {topic} partition {partition}",
                                 partial(self._read, split.split_id, topic, partition, start, end))

    def _read(self, sid: str, topic: str, partition: int, start: int, end: int,
              letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import TopicPartition

        with lent(self.config) as consumer:  # a warm consumer of this worker's, given back when the range is read
            consumer.assign([TopicPartition(topic, partition, start)])
            yield from self._range(consumer, sid, topic, partition, start, end, letters)

    def _range(self, consumer: Any, sid: str, topic: str, partition: int, start: int, end: int,
               letters: DeadLetterWriter | None) -> Iterator[pa.RecordBatch]:
        position = start
        progressed = time.monotonic()
        while position < end:
            with gc_paused():
                batch, next_position, finished = self._fetch(consumer, sid, topic, partition, position, start, end,
                                                             letters)
            if batch is not None:
                yield batch
            if next_position > position:  # also when every record of a fetch went aside
                position = next_position
                progressed = time.monotonic()
            if finished:
                return
            if time.monotonic() - progressed > self.timeout:
                raise SluiceError(self.scrub(
                    f"reading {sid} (offsets {start}..{end - 1}) made no progress at offset {position} "
                    f"for timeout-ms={int(self.timeout * 1000)}: are the brokers at "
                    f"{self.config['bootstrap.servers']} up? Raise timeout-ms to wait longer."))

    def _fetch(self, consumer: Any, sid: str, topic: str, partition: int, position: int, start: int,
               end: int, letters: DeadLetterWriter | None = None) -> tuple[pa.RecordBatch | None, int, bool]:
        """One consume() and its records up to `end` as an Arrow batch (None: none came), the position after them,
        and whether the range is finished. The fetch's Message objects are freed when it returns."""
        from confluent_kafka import Message

        # Never more than the range holds: consume() returns once it has as many as asked, else only at its timeout,
        # which a micro-batch's last fetch would otherwise always wait out.
        messages = consumer.consume(min(FETCH_RECORDS, end - position), timeout=min(1.0, self.timeout))
        records, events = split_errors(messages)
        finished = False
        for event in events:
            if event.topic() in (None, topic) and event.partition() in (None, -1, partition):
                finished |= self._handle(event.error(), sid, position, start, end)
        if records and (records[0].partition() != partition or records[-1].partition() != partition
                        or records[0].topic() != topic):
            # A pooled consumer's earlier assignment (_consumers.py): librdkafka drops its fetches; never read them.
            records = [m for m in records if m.partition() == partition and m.topic() == topic]
        if not records:
            return None, position, finished
        offsets = np.fromiter(map(Message.offset, records), np.int64, len(records))
        if offsets[0] < position:  # fetched for an earlier range of this partition (a pooled consumer's)
            keep = int(np.searchsorted(offsets, position))
            records, offsets = records[keep:], offsets[keep:]
            if not records:
                return None, position, finished
        if offsets[-1] >= end:  # offsets increase: cut without testing each one
            cut = int(np.searchsorted(offsets, end))
            records, offsets, finished = records[:cut], offsets[:cut], True
            if not records:
                return None, position, finished
        after = int(offsets[-1]) + 1
        while True:
            try:
                return self._to_arrow(topic, partition, records, offsets), after, finished
            except BadPayloadError as error:
                if letters is None or not error.positions:
                    raise
                records, offsets = set_aside(letters, error, records, offsets)
                if not records:
                    return None, after, finished

    def _handle(self, error: Any, sid: str, position: int, start: int, end: int) -> bool:
        """An error event of the consumer: True when it ends the range (the partition's end)."""
        from confluent_kafka import KafkaError

        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            return True
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            self.options.data_lost(f"offsets of {sid} from {position} were deleted before they were read (range "
                                   f"{start}..{end - 1})", "skip them")
            return True
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION):
            self.options.data_lost(f"{sid} was deleted while it was read (offsets {position}..{end - 1} not read)",
                                   "go on without it")
            return True
        if error.fatal() or not error.retriable():
            raise SluiceError(self.scrub(f"reading {sid} at offset {position}: {error.str()} ({error.name()})"))
        return False  # librdkafka retries transient errors itself

    def _to_arrow(self, topic: str, partition: int, records: list[Any], offsets: np.ndarray) -> pa.RecordBatch:
        from confluent_kafka import Message

        n = len(records)
        names = self.arrow_schema.names
        columns: dict[str, pa.Array] = {}
        # map() over Message's methods, into lists or numpy arrays: the loops over a fetch's records run in C, one
        # call per record and field.
        if "key" in names:
            columns["key"] = pa.array(list(map(Message.key, records)), pa.binary())
            if self.key_decoder is not None:
                columns["key"] = self.key_decoder.decode(columns["key"], topic, partition, offsets)
        if self.value_decoder is None:
            if "value" in names:
                columns["value"] = pa.array(list(map(Message.value, records)), pa.binary())
        elif "value" in names or any(name in names for name in self.value_fields):
            values = pa.array(list(map(Message.value, records)), pa.binary())
            decoded = self.value_decoder.decode(values, topic, partition, offsets)
            if self.value_fields:  # flatten(): a tombstone's null reaches every field
                columns.update(zip(self.value_fields, decoded.flatten(), strict=True))
            else:
                columns["value"] = decoded
        if "topic" in names:
            columns["topic"] = pa.repeat(pa.scalar(topic, pa.string()), n)
        if "partition" in names:
            columns["partition"] = pa.repeat(pa.scalar(partition, pa.int32()), n)
        if "offset" in names:
            columns["offset"] = pa.array(offsets, pa.int64())
        if "timestamp" in names or "timestampType" in names:
            stamps = list(map(Message.timestamp, records))  # (type, ms)
            ms = np.fromiter(map(itemgetter(1), stamps), np.int64, n)
            columns["timestamp"] = pa.array(ms * 1000, pa.timestamp("us", tz="UTC"))
            # librdkafka's types are Kafka's TimestampType ids + 1 (0: none, 1: create time, 2: log append time).
            columns["timestampType"] = pa.array(np.fromiter(map(itemgetter(0), stamps), np.int32, n) - 1)
        if "headers" in names:
            # A consumed record's headers are (key, bytes or None) pairs: the stub's other forms are for producing.
            headers = cast("list[list[tuple[str, bytes | None]] | None]", list(map(Message.headers, records)))
            columns["headers"] = headers_array(headers, self.arrow_schema.field("headers").type)
        return pa.RecordBatch.from_arrays([columns[name].cast(self.arrow_schema.field(name).type) for name in names],
                                          schema=self.arrow_schema)
