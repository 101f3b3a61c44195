"""`format("sluice_kafka")` writes: the plan every task opens its encoder and KafkaStore from, and the driver's
Committer.

Modes (the sink-modes design on Kafka):
- unordered: idempotent producer, the engine's batches in flight concurrently. At-least-once: a retried batch or
  task re-sends its records.
- partition-ordered (sink.partition-key, default the key column): as unordered, and the engine never has two
  batches of one key in flight, so a key's records reach its partition in the task's order, also across the
  engine's retries. A re-run task re-sends its records: readers then see a key's records again, in the same order,
  after the first copy.
- global-ordered + sink.transactional: one Kafka transaction per task, committed by the task at most once per
  (write, epoch, task) (_txn.py). read_committed readers see each record once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    ArrowRows,
    Committer,
    Encoded,
    OptionError,
    RecordError,
    RecordTooLargeError,
    TaskWriter,
    WriteContext,
    WritePlan,
)
from sluice.connectors.kafka._checks import RecordColumns
from sluice.connectors.kafka._encode import PayloadEncoder
from sluice.connectors.kafka._options import WriteOptions
from sluice.connectors.kafka._store import KafkaStore, show_key
from sluice.connectors.kafka._txn import default_transactional_prefix

log = logging.getLogger("sluice.kafka")

# A record alone in a record batch (Kafka's v2 format): the batch header (61 bytes) and the record's own varints and
# attributes (up to 21), plus per header two varints. What a broker's max.message.bytes is compared with.
BATCH_OVERHEAD = 61 + 21
HEADER_OVERHEAD = 10


def record_sizes(batch: pa.RecordBatch, columns: RecordColumns) -> np.ndarray:
    """Each row's size as one record in a record batch, vectorized."""
    sizes = _lengths(batch.column("value")) + BATCH_OVERHEAD
    if columns.key:
        sizes += _lengths(batch.column("key"))
    if columns.headers:
        headers = batch.column("headers")
        flat = pc.list_flatten(headers)
        per_header = (_lengths(flat.field("key")) + _lengths(flat.field("value")) + HEADER_OVERHEAD
                      if len(flat) else np.zeros(0, np.int64))
        counts = pc.fill_null(pc.list_value_length(headers), 0).to_numpy(zero_copy_only=False)
        ends = np.cumsum(counts)
        totals = np.concatenate([[0], np.cumsum(per_header)])
        sizes += totals[ends] - totals[ends - counts]
    return sizes


def _lengths(column: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)


class OversizedRecordError(RecordError, RecordTooLargeError):
    """Records over the target's limit per record, found before any was sent (`rows`: their positions in the Arrow
    batch); with errors.tolerance=all they go to the dead-letter target, the rest of the batch is written."""


class KafkaEncoder:
    """Arrow batch -> engine entries (row numbers in the task's ArrowRows) with each record's size; refuses a record
    over the limit, and a topic that does not exist, before any row of the batch is buffered."""

    def __init__(self, columns: RecordColumns, limit: int, topics: frozenset[str], rows: ArrowRows,
                 store: KafkaStore, fixed_topic: bool, payloads: PayloadEncoder | None = None,
                 tolerant: bool = False) -> None:
        self.payloads = payloads
        self.columns = columns
        self.limit = limit
        self.known_topics = set(topics)
        self.rows = rows
        self.store = store
        self.fixed_topic = fixed_topic
        self.tolerant = tolerant  # errors.tolerance=all: records over the limit go aside (OversizedRecordError)

    def __call__(self, batch: pa.RecordBatch) -> Encoded:
        if self.payloads is not None:  # key/value formats: encoded and framed before anything else
            batch = self.payloads(batch)
        sizes = record_sizes(batch, self.columns)
        largest = int(sizes.argmax())
        if sizes[largest] > self.limit and self.tolerant:
            self._refuse_oversized(batch, sizes)
        if sizes[largest] > self.limit:
            key = batch.column("key")[largest].as_py() if self.columns.key else None
            raise RecordTooLargeError(
                f"kafka: the record with key {show_key(key)} is {int(sizes[largest])} bytes, over the limit of "
                f"{self.limit} bytes per record (the topic's max.message.bytes, or the broker's message.max.bytes) "
                f"on {self.store.target}. Nothing of its Arrow batch was sent. Shrink or split the record, raise "
                "the topic's max.message.bytes, or set errors.tolerance=all and errors.deadletter.format to send "
                "such records aside.", store="kafka", target=self.store.target, batch_records=1)
        if not self.fixed_topic:
            self._check_topics(batch.column("topic"))
        entries, _ = self.rows.add(batch)
        return Encoded(entries, sizes)

    def _refuse_oversized(self, batch: pa.RecordBatch, sizes: np.ndarray) -> None:
        over = np.flatnonzero(sizes > self.limit)
        keys = batch.column("key").take(pa.array(over[:5])).to_pylist() if self.columns.key else [None] * 5
        named = ", ".join(f"key {show_key(key)} ({int(sizes[i])} bytes)" for key, i in zip(keys, over[:5],
                                                                                          strict=False))
        more = f" and {len(over) - 5} more" if len(over) > 5 else ""
        raise OversizedRecordError(
            f"kafka: over the limit of {self.limit} bytes per record (the topic's max.message.bytes, or the broker's "
            f"message.max.bytes) on {self.store.target}: {named}{more} in this Arrow batch; sent aside, not "
            "written.", rows=over.tolist())

    def _check_topics(self, column: pa.Array) -> None:
        if column.null_count:
            raise OptionError(f"column 'topic' is null in {column.null_count} row(s); every row needs a topic (or "
                              "set .option('topic', ...)). Nothing of this Arrow batch was sent.")
        for topic in pc.unique(column).to_pylist():
            if topic not in self.known_topics:
                if not self.store.topic_exists(topic):
                    raise OptionError(f"topic '{topic}' (column 'topic') does not exist on "
                                      f"{self.store.client.bootstrap_servers}; the sink does not create topics. "
                                      "Create it first. Nothing of this Arrow batch was sent.")
                self.known_topics.add(topic)


# librdkafka settings sluice chooses; a kafka.* option of the same name wins.
PRODUCER_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("enable.idempotence", True),
    ("acks", "all"),
    # Java's default partitioner (murmur2 of the key): a key lands in the partition Spark's Kafka sink and Java
    # producers put it in. librdkafka's own default (CRC32) would not.
    ("partitioner", "murmur2_random"),
    ("linger.ms", 5),
    # The engine bounds the records in flight (sink.requests.max-buffered); librdkafka's default of 100,000 queued
    # messages would make produce() wait below that.
    ("queue.buffering.max.messages", 1_000_000),
    ("log_level", 3),
)


@dataclass(frozen=True)
class KafkaWritePlan(WritePlan):
    """`write`: the format's options (its client settings hide secrets in every repr; its payloads carry the writer
    schemas resolved on the driver); `columns`, `record_limit` and `topics`: what the driver learned once;
    `check_marker`: False only in the tests' negative controls; `payloads`: the key/value encoder of typed formats."""

    write: WriteOptions
    columns: RecordColumns
    record_limit: int
    topics: frozenset[str]
    marker_topic: str | None
    check_marker: bool = True
    payloads: PayloadEncoder | None = None

    def producer_config(self) -> dict[str, Any]:
        defaults = dict(PRODUCER_DEFAULTS)
        if self.config.transactional:
            # A transaction's batches are acknowledged once produced (_store.py): librdkafka's queue, not the
            # engine's window, then holds the records in flight; bounded as the engine bounds what it buffers.
            defaults["queue.buffering.max.messages"] = max(self.config.requests_max_buffered,
                                                           self.config.batch_max_size)
        config = self.write.client.config(**defaults)
        config.setdefault("message.max.bytes", max(self.record_limit, 1_000_000))
        # The broker compares a whole record batch with the topic's max.message.bytes: librdkafka's batches (1 MB by
        # default) must stay within it, or a topic with a smaller limit refuses batches of records that each fit.
        # A record over the limit is then alone in its batch, and the broker's refusal names it alone (_refused.py).
        if self.record_limit:
            config.setdefault("batch.size", min(self.record_limit, 1_000_000))
        if self.config.transactional:
            config["transaction.timeout.ms"] = self.write.transaction_timeout_ms
        return config

    def transactional_prefix(self, context: WriteContext) -> str:
        return self.write.transactional_id_prefix or default_transactional_prefix(context.write_id)

    def window_start_batches(self) -> int:
        """The engine's window at the start, in batches: as many records as the task may buffer. At-least-once
        batches are acknowledged together, once the producer's queue drained (_store.py); one batch in flight would
        cost a ProduceRequest per partition per batch."""
        return max(1, self.config.requests_max_buffered // self.config.batch_max_size)

    def open_task(self, context: WriteContext) -> TaskWriter:
        rows = ArrowRows()
        transaction = None
        if self.config.transactional:
            assert self.marker_topic is not None
            transaction = (self.transactional_prefix(context), self.marker_topic)
        store = KafkaStore(self.write.client, self.columns, rows, topic=self.write.topic,
                           producer_config=self.producer_config(), timeout_ms=self.write.timeout_ms,
                           transaction=transaction, check_marker=self.check_marker,
                           window_start_batches=self.window_start_batches())
        encoder = KafkaEncoder(self.columns, self.record_limit, self.topics, rows, store, self.write.topic is not None,
                               self.payloads, self.config.errors.tolerates)
        return TaskWriter(encoder, store)

    def committer(self) -> Committer:
        return KafkaCommitter()


class KafkaCommitter(Committer):
    """Each task committed its own transaction before Spark's commit (_txn.py), so the driver has nothing to publish:
    it checks that every task that wrote reports a committed transaction, and logs replays. A repeated (write id,
    epoch) is a no-op like any other: no Kafka call is made here."""

    def commit(self, messages: list[Any], context: WriteContext) -> None:
        uncommitted = [m.get("partition") for m in messages if "transactional_id" not in m]
        if uncommitted:
            raise OptionError(f"kafka: task(s) {uncommitted} of write {context.write_id} epoch {context.epoch} "
                              "report no transaction; the write ran without sink.transactional on its tasks.")
        records = sum(int(m["records"]) for m in messages)
        skipped = sum(int(m["skipped"]) for m in messages)
        if skipped:
            log.warning("kafka: write %s epoch %s: %d record(s) of tasks committed before were not sent again "
                        "(a replay); %d record(s) committed now", context.write_id, context.epoch, skipped, records)
        log.debug("kafka: write %s epoch %s: %d task transaction(s), %d record(s)", context.write_id, context.epoch,
                  len(messages), records)

    def abort(self, messages: list[Any], context: WriteContext) -> None:
        committed = sorted(m.get("transactional_id") for m in messages)
        log.warning("kafka: write %s epoch %s failed. Tasks commit their own Kafka transactions, so the records of "
                    "the tasks that finished (%s) are visible to read_committed readers; the failed tasks' are not. "
                    "Restarting the query from its checkpoint, or re-running a batch write with the same "
                    "sink.write-id, writes the rest without duplicates.", context.write_id, context.epoch,
                    committed or "none")
