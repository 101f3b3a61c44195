"""Reading Kafka on the executors: one consumer per read task, assigned the topic partitions of its ranges at their
first offsets (Consumer.assign, no consumer group; a task reads one range, or `pack`'s group of small ones at once),
fetching with consume(num_messages) and handing Spark Arrow batches with the columns Spark's Kafka source has.

Where a range ends: at the first record at or past its end offset, or at the partition's end (librdkafka's partition
EOF, which under read_committed is the last stable offset). The end was at most the partition's end when it was
planned, so one of the two always comes, also when the range's last offsets are transaction markers or aborted
records, which a read_committed consumer never sees.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass
class _Range:
    """A range being read: the split, its topic partition, offsets [start, end) and the position reached."""

    sid: str
    topic: str
    partition: int
    start: int
    end: int
    position: int = -1

    def __post_init__(self) -> None:
        self.position = self.start


def by_partition(records: list[Any]) -> Iterator[tuple[tuple[str, int], list[Any]]]:
    """A fetch's records by topic partition, each partition's in their fetched order. A fetch of one partition is
    its own run, without a copy."""
    from confluent_kafka import Message

    if not records:
        return
    topics = sorted(cast("set[str]", set(map(Message.topic, records))))
    keys = np.fromiter(map(Message.partition, records), np.int64, len(records))
    if len(topics) > 1:
        index: dict[str | None, int] = {topic: i for i, topic in enumerate(topics)}
        keys += np.fromiter(map(index.__getitem__, map(Message.topic, records)), np.int64, len(records)) << 32
    if (keys == keys[0]).all():
        yield (records[0].topic(), records[0].partition()), records
        return
    order = np.argsort(keys, kind="stable")  # each partition's records stay in their order
    ordered = itemgetter(*order.tolist())(records)
    bounds = np.flatnonzero(np.diff(keys[order])) + 1
    for lo, hi in zip((0, *bounds.tolist()), (*bounds.tolist(), len(records)), strict=True):
        yield (ordered[lo].topic(), ordered[lo].partition()), list(ordered[lo:hi])


class KafkaSplitReader(SplitReader):
    """Reads offsets [start, end) of topic partitions; yields Arrow batches of the query's schema."""

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
        return (batch for _, batch in self.read_many([(split, start, end)]))

    def read_many(self, ranges: Sequence[tuple[Split, int, int]]) -> Iterator[tuple[str, pa.RecordBatch]]:
        """A task's ranges read at once: one consumer assigned all their partitions, so librdkafka fetches them
        together (a fetch request per broker covers every partition it leads) instead of one after another."""
        wanted = [_Range(split.split_id, *topic_partition(split.split_id), start, end)
                  for split, start, end in ranges if end > start]
        if not wanted:
            return iter(())
        topics = sorted({r.topic for r in wanted})
        partitions = ", ".join(str(r.partition) for r in wanted[:10]) + (", ..." if len(wanted) > 10 else "")
        target = f"topic{'s' if len(topics) > 1 else ''} {', '.join(topics)} partition" \
                 f"{'s' if len(wanted) > 1 else ''} {partitions}"
        return read_with_letters(self.dead_letters, self.read_id, self.streaming, target,
                                 partial(self._read_ranges, wanted))

    def _read_ranges(self, ranges: list[_Range],
                     letters: DeadLetterWriter | None) -> Iterator[tuple[str, pa.RecordBatch]]:
        from confluent_kafka import TopicPartition

        reading = {(r.topic, r.partition): r for r in ranges}
        with lent(self.config) as consumer:  # a warm consumer of this worker's, given back when the ranges are read
            consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in ranges])
            progressed = time.monotonic()
            while reading:
                with gc_paused():
                    batches, moved = self._fetch(consumer, reading, letters)
                yield from batches
                if moved:  # also when every record of a fetch went aside
                    progressed = time.monotonic()
                elif time.monotonic() - progressed > self.timeout:
                    stalled = min(reading.values(), key=lambda r: (r.topic, r.partition))
                    raise SluiceError(self.scrub(
                        f"reading {stalled.sid} (offsets {stalled.start}..{stalled.end - 1}) made no progress at "
                        f"offset {stalled.position} for timeout-ms={int(self.timeout * 1000)}"
                        f"{f' (and {len(reading) - 1} more partitions)' if len(reading) > 1 else ''}: are the brokers "
                        f"at {self.config['bootstrap.servers']} up? Raise timeout-ms to wait longer."))

    def _fetch(self, consumer: Any, reading: dict[tuple[str, int], _Range],
               letters: DeadLetterWriter | None) -> tuple[list[tuple[str, pa.RecordBatch]], bool]:
        """One consume() and its records up to each range's end as Arrow batches, a range taken out of `reading`
        when finished; and whether any range moved. The fetch's Message objects are freed when it returns."""
        from confluent_kafka import TopicPartition

        # Never more than the ranges hold: consume() returns once it has as many as asked, else only at its
        # timeout, which a micro-batch's last fetch would otherwise always wait out.
        left = sum(r.end - r.position for r in reading.values())
        messages = consumer.consume(min(FETCH_RECORDS, left), timeout=min(1.0, self.timeout))
        records, events = split_errors(messages)
        moved = False
        done: list[Any] = []
        out: list[tuple[str, pa.RecordBatch]] = []
        for (topic, partition), run in by_partition(records):
            r = reading.get((topic, partition))
            if r is None:  # a finished range's, or a pooled consumer's earlier assignment (_consumers.py)
                continue
            batch, after, finished = self._records(r, run, letters)
            moved |= after > r.position or finished
            r.position = after
            if batch is not None:
                out.append((r.sid, batch))
            if finished:
                del reading[(topic, partition)]
                done.append(TopicPartition(topic, partition))
        for event in events:  # after the records: a partition's end comes after its last records
            for hit in list(reading.values()):
                if event.topic() in (None, hit.topic) and event.partition() in (None, -1, hit.partition) and \
                        self._handle(event.error(), hit.sid, hit.position, hit.start, hit.end):
                    del reading[(hit.topic, hit.partition)]
                    done.append(TopicPartition(hit.topic, hit.partition))
                    moved = True
        if done and reading:  # librdkafka stops fetching what is read: its records would only be dropped
            consumer.pause(done)
        return out, moved

    def _records(self, r: _Range, records: list[Any],
                 letters: DeadLetterWriter | None) -> tuple[pa.RecordBatch | None, int, bool]:
        """One partition's records of a fetch up to its range's end as an Arrow batch (None: none left), the position
        after them, and whether the range is finished."""
        from confluent_kafka import Message

        offsets = np.fromiter(map(Message.offset, records), np.int64, len(records))
        if offsets[0] < r.position:  # fetched for an earlier range of this partition (a pooled consumer's)
            keep = int(np.searchsorted(offsets, r.position))
            records, offsets = records[keep:], offsets[keep:]
            if not records:
                return None, r.position, False
        finished = False
        if offsets[-1] >= r.end:  # offsets increase: cut without testing each one
            cut = int(np.searchsorted(offsets, r.end))
            records, offsets, finished = records[:cut], offsets[:cut], True
            if not records:
                return None, r.position, finished
        after = int(offsets[-1]) + 1
        finished |= after >= r.end
        while True:
            try:
                return self._to_arrow(r.topic, r.partition, records, offsets), after, finished
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
