"""The options of format("sluice_kafka"), declared once per direction (parsing, ranges, did-you-mean, redaction and
docs follow) and parsed once on the driver into the typed `WriteOptions` and `ReadOptions` the sink and the source
read. The client settings (`kafka.*`) are declared in _client.py, for both directions.

Read options take the names of Spark's Kafka source where it has the option (subscribe, subscribePattern,
startingOffsets, startingTimestamp, endingOffsets, failOnDataLoss, includeHeaders), sluice's split sources'
otherwise (max-records-per-trigger, max-records-per-partition).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.connector import (
    ERROR_OPTIONS,
    SINK_SPEC,
    DataLossError,
    Option,
    OptionError,
    Options,
    OptionSpec,
    TypedOptions,
    check_error_options,
)
from sluice.connectors.kafka._client import BOOTSTRAP_SERVERS, ClientSettings, client_of, client_option, refuse_owned
from sluice.connectors.kafka._format_options import (
    READ_FORMAT_OPTIONS,
    WRITE_FORMAT_OPTIONS,
    Payloads,
    check_formats,
    check_subject_topics,
    payloads_of,
)

log = logging.getLogger("sluice.kafka")

FORMAT_NAME = "sluice_kafka"  # not "kafka": docs/kafka.md says why
MiB = 1024 * 1024
EARLIEST, LATEST = -2, -1  # in startingOffsets/endingOffsets JSON, as Spark's Kafka source reads them

PRODUCER_SETTINGS = client_option("producer", "kafka.compression.type=zstd, kafka.linger.ms=20")
CONSUMER_SETTINGS = client_option("consumer", "kafka.fetch.max.bytes=...")

WRITE_OPTIONS = (
    Option("topic", "str", None,
           "Topic every row is written to; overrides the `topic` column (as Spark's Kafka sink). Without it, "
           "each row's `topic` column names its topic."),
    Option("timeout-ms", "int", 30_000,
           "How long the checks before the write (brokers reachable, topic exists) and a task's transaction calls "
           "wait, and how long its flushes wait with no record acknowledged; unreachable kafka.bootstrap.servers "
           "fail after this long, named.", minimum=100,
           maximum=3_600_000),
    Option("transactional-id-prefix", "str", None,
           "sink.transactional: prefix of the tasks' transactional.id (<prefix>-<task partition>), a pool bounded "
           "by the write's partitions. Default: from the query id (streaming) or sink.write-id / the write's id "
           "(batch). One prefix per concurrently running write: two writes sharing one fence each other."),
    Option("transaction.timeout-ms", "int", 60_000,
           "sink.transactional: the producer's transaction.timeout.ms. A transaction a killed task left open is "
           "aborted when the task's retry starts, at the latest after this long (the broker's timeout), so "
           "read_committed readers wait at most this long for it.", minimum=1000, maximum=900_000),
    Option("transaction.by-partition", "bool", False,
           "sink.transactional with sluice.write() or sluice.partitioned(): the rows are repartitioned by their Kafka "
           "partition (the `partition` column, else the one Kafka's murmur2 partitioner gives the key, set as the "
           "`partition` column), so each task's transaction adds a share of the topic's partitions, not all of "
           "them. For topics of hundreds of partitions."),
)

# librdkafka settings sluice sets itself: a user's value would break the mode's guarantee or the sink's accounting.
PRODUCER_OWNED = {
    "transactional.id": "set sink.transactional=true (and transactional-id-prefix); sluice gives each task its id",
    "enable.idempotence": "every mode uses the idempotent producer (retries never reorder or duplicate a record)",
    "transaction.timeout.ms": "use the option transaction.timeout-ms",
    "delivery.report.only.error": "the sink sets it itself (a batch is stored once the producer's queue drained "
                                  "after it; only failed records are reported)",
    "sasl.jaas.config": "librdkafka takes kafka.sasl.username and kafka.sasl.password (and kafka.sasl.mechanism)",
    "key.serializer": "the key column is written as its bytes (string columns as UTF-8), or set key.format",
    "value.serializer": "the value column is written as its bytes (string columns as UTF-8), or set value.format",
}


def _check_transactional(opts: Options) -> None:
    if not opts["sink.transactional"]:
        for key in ("transactional-id-prefix", "transaction.timeout-ms", "transaction.by-partition"):
            if opts.is_set(key):
                raise OptionError(f"{key} only applies to sink.transactional=true; remove it or set "
                                  ".option('sink.transactional', 'true') (with sink.mode=global-ordered).")


def _check_write_subjects(opts: Options) -> None:
    check_subject_topics(opts, (opts["topic"],) if opts["topic"] else (), sink=True)


WRITE_SPEC = SINK_SPEC.extend(
    (BOOTSTRAP_SERVERS, PRODUCER_SETTINGS, *WRITE_OPTIONS, *WRITE_FORMAT_OPTIONS),
    (refuse_owned(PRODUCER_OWNED), _check_transactional, check_formats, _check_write_subjects),
    # librdkafka batches per partition itself (linger.ms); an engine batch is only the unit the sink tracks
    # acknowledgements by, so large ones cost nothing and save a Future per thousand records.
    sink_batch_max_size=10_000, sink_flush_buffer_size=16 * MiB, sink_requests_max_buffered=100_000,
    sink_flush_buffer_timeout=50,
).renamed(FORMAT_NAME)


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("sluice_kafka"), parsed and checked once; `client`: the librdkafka settings,
    declared and passed through (its repr hides secrets)."""

    declared = WRITE_OPTIONS

    topic: str | None
    timeout_ms: int
    transactional_id_prefix: str | None
    transaction_timeout_ms: int
    transaction_by_partition: bool
    client: ClientSettings
    payloads: Payloads

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"client": client_of(opts), "payloads": payloads_of(opts, sink=True)}


READ_OPTIONS = (
    Option("subscribe", "list", (),
           "Topics to read (comma-separated): every partition of each, partitions added while a query runs too. "
           "Or use subscribePattern."),
    Option("subscribePattern", "str", None,
           "Read every topic whose whole name matches this regular expression (Python's re), topics created while a "
           "query runs too."),
    Option("assign", "str", None,
           'Read exactly these partitions, JSON as Spark\'s Kafka source takes it: {"orders": [0, 1]} (partitions '
           "added later are not read). Or subscribe, or subscribePattern."),
    Option("startingOffsets", "str", "earliest",
           'earliest, latest, or JSON per partition as Spark\'s Kafka source takes it: {"orders": {"0": 23, "1": -2}} '
           "(-2: earliest, -1: latest; a partition left out starts at earliest). Streaming: where a new query "
           "starts (a checkpoint's offsets win)."),
    Option("startingTimestamp", "int", None,
           "Start each partition at its first record with a timestamp at or after this (epoch ms); a partition with "
           "none starts at its end. Instead of startingOffsets.", minimum=0),
    Option("endingOffsets", "str", "latest",
           'Batch reads: where to stop (exclusive): latest (the end when the read is planned), or JSON per partition '
           '{"orders": {"0": 50}} (-1: latest; a partition left out reads to latest).'),
    Option("kafka.isolation.level", "choice", "read_committed",
           "read_committed: records of committed transactions only, up to the last stable offset (an open "
           "transaction holds back what follows it); read_uncommitted: everything written, aborted records too.",
           choices=("read_committed", "read_uncommitted")),
    Option("failOnDataLoss", "bool", True,
           "Fail when offsets to read were deleted (retention) or a topic was deleted while a query read it "
           "(false: warn and skip ahead)."),
    Option("includeHeaders", "bool", False, "Add the column headers array<struct<key string, value binary>>."),
    Option("max-records-per-trigger", "int", None,
           "Streaming: most offsets per micro-batch over all partitions (shared fairly). Transaction markers and "
           "aborted records take offsets too, so a micro-batch may hold fewer rows.", minimum=1),
    Option("max-records-per-partition", "int", 500_000,
           "Cut a partition's offsets into Spark partitions of at most this many, read in parallel (0: never).",
           minimum=0),
    Option("records-per-task", "int", 100_000,
           "Partitions' ranges of fewer offsets than this are read together, one after another, by read tasks of up "
           "to this many offsets (a topic of hundreds of small partitions: a few tasks, not one each); a range of "
           "at least this many, or cut by max-records-per-partition, is read alone. 0: a task per partition, as "
           "Spark's Kafka source.",
           minimum=0),
    Option("discovery-interval-ms", "int", 10_000,
           "Streaming: how often topics and partitions are listed again (partitions added, topics created that "
           "match subscribePattern, topics deleted).", minimum=0),
    Option("timeout-ms", "int", 30_000,
           "How long metadata, offset lookups and a fetch that makes no progress may wait; unreachable "
           "kafka.bootstrap.servers fail after this long, named.", minimum=100, maximum=3_600_000),
)

# librdkafka settings the source sets itself.
# The source's consumer settings a `kafka.*` option may override. librdkafka stops fetching a partition whose local
# queue holds queued.min.messages (100,000) or queued.max.messages.kbytes, and asks again only after
# fetch.queue.backoff.ms (1,000 ms by default, librdkafka's CONFIGURATION.md): a reader that drains the queue
# sooner would wait out the rest of that second at every refill (a batch read of 1,000,000 records took 2-3x as long).
# fetch.wait.max.ms (500 ms by default) is how long the broker holds a fetch that found nothing new: a pooled
# consumer assigned its next partition waits for the fetch still held for the last one (60 partitions of 600 records
# read in turn, a /tmp experiment: 26.8 s at 500 ms, 0.88 s at 10, 0.22 s at 1, 0.12 s at 0). A range never waits for
# records to come (it ends at most where its partition ended when planned), so the long poll buys nothing; 1 ms, not
# 0, so that a range waiting for its partition's end does not send fetches back to back.
CONSUMER_DEFAULTS = {"fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 1}

CONSUMER_OWNED = {
    "group.id": "the source commits no offsets to Kafka: Spark's checkpoint holds them",
    "enable.auto.commit": "the source commits no offsets to Kafka: Spark's checkpoint holds them",
    "auto.offset.reset": "use startingOffsets (and failOnDataLoss for offsets deleted meanwhile)",
    "enable.partition.eof": "the source uses it to know where a partition ends",
    "key.deserializer": "key is read as binary (cast it: CAST(key AS STRING)), or set key.format",
    "value.deserializer": "value is read as binary (cast it: CAST(value AS STRING)), or set value.format",
}

@dataclass(frozen=True)
class Positions:
    """Where reading starts (or, for batch reads, ends) in each partition: one rule for all (`kind`: earliest,
    latest or timestamp), with `offsets` per (topic, partition) that override it (EARLIEST, LATEST or an offset)."""

    kind: str
    timestamp: int | None = None
    offsets: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def topics(self) -> set[str]:
        return {topic for topic, _ in self.offsets}


def parse_positions(text: str, option: str, default: str) -> Positions:
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return Positions(value.lower())
    try:
        parsed = json.loads(value)
        if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
            raise ValueError("not an object of objects")
        offsets = {(str(topic), int(partition)): int(offset)
                   for topic, partitions in parsed.items() for partition, offset in partitions.items()}
    except (ValueError, TypeError):
        raise OptionError(f'{option}={text!r}: use earliest, latest or JSON like {{"orders": {{"0": 23, "1": -2}}}} '
                          "(partition numbers to offsets; -2 earliest, -1 latest)") from None
    bad = sorted(f"{t}:{p}={o}" for (t, p), o in offsets.items() if o < EARLIEST or p < 0)
    if bad:
        raise OptionError(f"{option}: {', '.join(bad)} is not a partition and offset (offsets are >= 0, or -2 "
                          "earliest, -1 latest)")
    if option == "endingOffsets" and any(o == EARLIEST for o in offsets.values()):
        raise OptionError("endingOffsets: -2 (earliest) would read nothing of that partition; use -1 (latest) or an "
                          "offset")
    return Positions(default, offsets=offsets)


def parse_assign(text: str) -> dict[str, tuple[int, ...]]:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict) or not all(isinstance(v, list) for v in parsed.values()):
            raise ValueError("not an object of lists")
        assigned = {str(topic): tuple(int(p) for p in partitions) for topic, partitions in parsed.items()}
    except (ValueError, TypeError):
        raise OptionError(f'assign={text!r}: use JSON like {{"orders": [0, 1]}} (topics to partition '
                          "numbers)") from None
    if not assigned or any(not ps or min(ps) < 0 for ps in assigned.values()):
        raise OptionError(f"assign={text!r}: name at least one partition (numbers from 0) of each topic")
    return assigned


def _check_topics(opts: Options) -> None:
    if sum(1 for key in ("subscribe", "subscribePattern", "assign") if opts[key]) != 1:
        raise OptionError("set exactly one of subscribe (a list of topics), subscribePattern (a regular expression) "
                          'or assign (partitions: {"orders": [0, 1]})')
    if opts["subscribePattern"]:
        try:
            re.compile(opts["subscribePattern"])
        except re.error as error:
            raise OptionError(f"subscribePattern={opts['subscribePattern']!r} is not a regular expression: "
                              f"{error}") from None
    if opts.is_set("startingTimestamp") and opts.is_set("startingOffsets"):
        raise OptionError("set startingOffsets or startingTimestamp, not both")
    starting = parse_positions(opts["startingOffsets"], "startingOffsets", "earliest")
    ending = parse_positions(opts["endingOffsets"], "endingOffsets", "latest")
    read = set(opts["subscribe"]) or (set(parse_assign(opts["assign"])) if opts["assign"] else None)
    if read is not None:
        for name, positions in (("startingOffsets", starting), ("endingOffsets", ending)):
            others = sorted(positions.topics() - read)
            if others:
                raise OptionError(f"{name} names topic(s) {others} that the read does not cover "
                                  f"({', '.join(sorted(read))})")
    check_subject_topics(opts, tuple(sorted(read)) if read is not None else None, sink=False)


READ_SPEC = OptionSpec(FORMAT_NAME, (BOOTSTRAP_SERVERS, CONSUMER_SETTINGS, *READ_OPTIONS, *READ_FORMAT_OPTIONS,
                                     *ERROR_OPTIONS),
                       (refuse_owned(CONSUMER_OWNED), check_formats, _check_topics, check_error_options))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("sluice_kafka"), parsed and checked once; `client`: the librdkafka settings
    (its repr hides secrets); `starting`/`ending`: startingOffsets (or startingTimestamp) and endingOffsets."""

    declared = READ_OPTIONS

    subscribe: tuple[str, ...]
    subscribe_pattern: str | None
    assign: str | None
    starting_offsets: str
    starting_timestamp: int | None
    ending_offsets: str
    kafka_isolation_level: str
    fail_on_data_loss: bool
    include_headers: bool
    max_records_per_trigger: int | None
    max_records_per_partition: int
    records_per_task: int
    discovery_interval_ms: int
    timeout_ms: int
    client: ClientSettings
    starting: Positions
    ending: Positions
    assigned: Mapping[str, tuple[int, ...]] | None
    payloads: Payloads

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        starting = (Positions("timestamp", opts["startingTimestamp"]) if opts["startingTimestamp"] is not None
                    else parse_positions(opts["startingOffsets"], "startingOffsets", "earliest"))
        return {"client": client_of(opts), "starting": starting,
                "ending": parse_positions(opts["endingOffsets"], "endingOffsets", "latest"),
                "assigned": parse_assign(opts["assign"]) if opts["assign"] else None,
                "payloads": payloads_of(opts, sink=False)}

    def data_lost(self, what: str, instead: str) -> None:
        """Records to read are gone (`what`): a DataLossError, or with failOnDataLoss=false a warning, and the read
        does `instead` ("go on without it")."""
        if self.fail_on_data_loss:
            raise DataLossError(f"{what}. Set .option('failOnDataLoss', 'false') to {instead} (a warning instead).")
        log.warning("%s; failOnDataLoss=false: %s", what, instead)

    @property
    def read_committed(self) -> bool:
        return self.kafka_isolation_level == "read_committed"

    def consumer_config(self) -> dict[str, Any]:
        """A consumer of the source: no group membership, no offsets committed, read_committed unless told (the
        settings it owns are refused as options: CONSUMER_OWNED), CONSUMER_DEFAULTS unless the user's differ."""
        return self.client.config(**CONSUMER_DEFAULTS, **{
            "group.id": "sluice-source", "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "error", "isolation.level": self.kafka_isolation_level,
            "socket.timeout.ms": self.timeout_ms})
