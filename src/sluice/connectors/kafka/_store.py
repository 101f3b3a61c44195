"""The Kafka store: one confluent_kafka.Producer per task, a produce call per record, acknowledgements tracked per
engine batch without a Python call per record.

The engine's buffer-manager thread calls `submit(batch)`: the batch's rows come back from the task's Arrow rows as a
few Python lists (the arguments produce() needs anyway) and go to `produce` in a tight loop. The producer runs with
librdkafka's `delivery.report.only.error`: a record Kafka took costs no delivery report (a Python callback with a
Message object per record was the largest share of a task's CPU, bench/stores/kafka_sink_source.py's profile), and a
record it refused calls its batch's `delivered` with the error. A batch is acknowledged once every record produced
before it was handed over is out of the producer (rd_kafka_outq_len reaches 0 after a poll that served every error
report): the poll thread settles, at that moment, every batch fully produced before it looked. The engine bounds the
records in flight (its window), so the producer's queue drains between windows and every batch is settled; librdkafka
batches per partition itself (linger.ms), so an engine batch is only the unit acknowledgements are tracked by. The
window starts at `window_start_batches` batches (the plan's sink.requests.max-buffered over sink.batch.max-size): one
batch in flight would wait for its own drain, a ProduceRequest per partition it touches (at 600 partitions about
12,000 requests for a task of 200,000 records in batches of 10,000; 10 batches in flight take about 1,700).

Every mode uses the idempotent producer: librdkafka's own retries neither duplicate nor reorder a partition's
records. sink.transactional wraps the task in one Kafka transaction (_txn.py), whose commit is the only
acknowledgement that counts: a batch is acknowledged once handed to produce(), and the first record Kafka refuses
fails the next batch or the commit. Waiting for the queue to drain after every batch cost a ProduceRequest per
partition per batch (librdkafka sends one partition per request, at most 5 in flight per broker): at 600
partitions, 600 requests and 120 round trips for every 10,000 records.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import (
    ArrowRows,
    Batch,
    BatchRun,
    ErrorKind,
    RefusedRecords,
    RetryableError,
    SinkError,
    Store,
    WriteContext,
    completed_future,
)
from sluice.connectors.kafka._client import ClientSettings
from sluice.connectors.kafka._refused import refused_records
from sluice.connectors.kafka._txn import (
    FencedError,
    Transaction,
    TxnIdentity,
    coordinator_moving,
    describe,
    kafka_error,
)

log = logging.getLogger("sluice.kafka")

NO_PARTITION = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses


class DeliveryError(Exception):
    """A record Kafka did not take; `error` is librdkafka's KafkaError, `key` the record's key."""

    def __init__(self, message: str, error: Any) -> None:
        super().__init__(message)
        self.error = error


class _Acks:
    """One engine batch's outcome. `delivered` runs on the poll thread, for refused records only (the producer reports
    errors only); `produced` is set by the submitting thread once every record was handed to produce(). `error` is
    the first failure (a report, or produce() raising), `reports` every report (error, topic, partition, key, value):
    which records were refused (_refused.py)."""

    __slots__ = ("error", "future", "produced", "reports", "settle")

    def __init__(self, future: Future[None], settle: Any) -> None:
        self.error: Any = None
        self.future = future
        self.produced = -1
        self.reports: list[tuple[Any, Any, Any, Any, Any]] = []
        self.settle = settle

    def delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        self.reports.append((err, msg.topic(), msg.partition(), msg.key(), msg.value()))
        if self.error is None:
            self.error = (err, msg.topic(), msg.partition(), msg.key())


class KafkaStore(Store):
    name = "kafka"
    supports_transactions = True

    def __init__(self, client: ClientSettings, columns: Any, rows: ArrowRows, *, topic: str | None,
                 producer_config: dict[str, Any], timeout_ms: int, transaction: tuple[str, str] | None,
                 check_marker: bool = True, acknowledge_at_commit: bool = True,
                 window_start_batches: int = 1) -> None:
        """`transaction`: (transactional-id prefix, marker topic) of exactly-once writes, else None;
        `acknowledge_at_commit`: False only in the tests' negative controls (a transaction's batches then wait for
        the producer's queue to drain, as at-least-once batches do); `window_start_batches`: the engine's window
        at the start, in batches (Store.window_start_batches)."""
        self.client = client
        self.columns = columns
        self.rows = rows
        self.topic = topic
        self.producer_config = producer_config
        self.timeout_s = timeout_ms / 1000.0
        self.transaction_spec = transaction
        self.check_marker = check_marker
        self.acknowledge_at_commit = acknowledge_at_commit and transaction is not None
        self.window_start_batches = max(1, window_start_batches)
        # A transaction's first record Kafka refused (error, topic, partition, key), set on the poll thread.
        self._refused_in_txn: tuple[Any, Any, Any, Any] | None = None
        self.producer: Any = None
        self.txn: Transaction | None = None
        # Exactly-once: how many of the task's first records an earlier attempt of this epoch committed (a replay;
        # None: all of them), acknowledged without being sent; `seen` counts the task's records so far, in order.
        self.committed_before: int | None = 0
        self.seen = 0
        self.records = 0
        self.skipped = 0
        self.context = WriteContext()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._fatal: Any = None
        # Batches whose records were all handed to produce(), not settled yet; the submitting thread appends, the
        # poll thread settles (deque appends and pops are atomic).
        self._unsettled: deque[_Acks] = deque()

    @property
    def target(self) -> str:
        return f"{self.client.bootstrap_servers} topic {self.topic or '(topic column)'}"

    # ------------------------------------------------------------------ life cycle
    def open(self, context: WriteContext) -> None:
        self.context = context
        self.producer = self._new_producer(context)
        if self.transaction_spec is not None:
            self._start_transaction(context)
        self._poller = threading.Thread(target=self._poll, name="sluice-kafka-poll", daemon=True)
        self._poller.start()

    def _start_transaction(self, context: WriteContext) -> None:
        """Fence, read the marker, begin. A producer whose init_transactions timed out (a coordinator moving during
        a broker failure) is dropped and a new one tries once more: librdkafka leaves a transactional producer
        whose initialization failed in a state it may not leave."""
        prefix, marker_topic = self.transaction_spec  # type: ignore[misc]  # set: called for transactional writes
        identity = TxnIdentity.of(prefix, marker_topic, context)
        for attempt in (1, 2):
            self.txn = Transaction(self.producer, identity, self.client, self.timeout_s, self.check_marker,
                                   self.producer_config.get("transaction.timeout.ms", 60_000))
            try:
                self.committed_before = self.txn.start()
                return
            except FencedError:
                raise
            except SinkError as e:
                err = kafka_error(e.cause) if e.cause is not None else None
                if attempt == 2 or err is None or not (err.retriable() or err.code() in coordinator_moving()):
                    raise
                log.warning("kafka: %s; trying once more with a new producer", e)
                self._drop_producer()
                self.producer = self._new_producer(context)

    def _drop_producer(self) -> None:
        producer, self.producer = self.producer, None
        if producer is None:
            return
        try:
            producer.purge()  # a failed task's records are sent again by its retry: do not wait for them
            producer.close()
        except Exception as e:  # a fenced producer refuses even these; its handle goes with the object
            log.debug("kafka: closing the producer: %s", describe(e))

    def _new_producer(self, context: WriteContext) -> Any:
        from confluent_kafka import Producer

        config = dict(self.producer_config)
        if self.transaction_spec is not None:
            config["transactional.id"] = f"{self.transaction_spec[0]}-{context.partition_id}"
        config["error_cb"] = self._on_error
        # Acknowledgements come from the producer's queue draining (module docstring): no report per record taken.
        config["delivery.report.only.error"] = True
        return Producer(config)

    def _on_error(self, err: Any) -> None:
        """librdkafka's global errors (brokers down, authentication, fatal idempotence errors), on the poll thread."""
        if err.fatal():
            self._fatal = err
        log.warning("kafka producer: %s", self.client.scrub(describe(err)))

    def _poll(self) -> None:
        """Serve librdkafka's events (error reports, errors), and settle the batches handed over once nothing produced
        before them is outstanding. With batches waiting, the producer's queue is looked at every millisecond: a
        taken record raises no event that would end a longer poll early."""
        producer, unsettled, stop = self.producer, self._unsettled, self._stop
        while not stop.is_set():
            producer.poll(0.001 if unsettled else 0.05)
            waiting = len(unsettled)  # counted before the queue is looked at: those were produced before it
            if waiting and len(producer) == 0:
                for _ in range(waiting):
                    acks = unsettled.popleft()
                    acks.settle(acks)

    def topic_exists(self, topic: str) -> bool:
        """One metadata request for a topic the driver did not see (a topic column naming a new one)."""
        metadata = self.producer.list_topics(topic, timeout=self.timeout_s)
        found = metadata.topics.get(topic)
        return found is not None and found.error is None

    # ------------------------------------------------------------------ writing
    def submit(self, batch: Batch) -> Future[None]:
        n = batch.record_count
        before = n if self.committed_before is None else max(0, min(n, self.committed_before - self.seen))
        self.seen += n
        self.skipped += before
        if before == n:
            self.rows.release(batch.entries)
            return completed_future()
        if self._fatal is not None:
            fatal = self._fatal
            return completed_future(DeliveryError(f"the producer failed for good: {describe(fatal)}", fatal))
        if self.txn is not None and not self.txn.open:
            self.txn.begin()  # the first record past those an earlier attempt committed
        table = self.rows.table(batch.entries)
        if before:
            table = table.slice(before)
        if self.acknowledge_at_commit:
            return self._submit_in_transaction(batch, table)
        future: Future[None] = Future()
        acks = _Acks(future, lambda a: self._settle(a, batch, n - before))
        try:
            acks.produced = self._produce(table, acks.delivered)
        except Exception as e:
            acks.error = acks.error or (kafka_error(e) or e, None, None, None)
            acks.reports.append((None, None, None, None, None))  # not a delivery report: the batch fails whole
            acks.produced = getattr(e, "produced", 0)
        self._unsettled.append(acks)
        return future

    def submit_run(self, run: BatchRun) -> Future[None] | None:
        """In a transaction, acknowledged at its commit: the run's rows in one pass of produce(), as `submit` would
        produce them batch after batch (one table of the rows, one loop). Otherwise each batch waits for its own
        delivery reports: not taken."""
        if not self.acknowledge_at_commit:
            return None
        return self.submit(Batch(run.entries, run.size_bytes, run.record_count, sizes=run.sizes))

    def _submit_in_transaction(self, batch: Batch, table: pa.Table) -> Future[None]:
        """Hand the rows to produce() and acknowledge at once: nothing is visible before the commit, which fails if
        any record failed (librdkafka makes the transaction abortable). A refusal reported by now fails this
        batch, so the task stops early and names the record."""
        try:
            self._produce(table, self._refused_record)
        except Exception as e:
            # A transaction made abortable by a refused record refuses later produce() calls: name the record.
            return completed_future(self._delivery_error(self._refused_in_txn or (kafka_error(e) or e, None, None,
                                                                                  None)))
        if self._refused_in_txn is not None:
            return completed_future(self._delivery_error(self._refused_in_txn))
        self.rows.release(batch.entries)
        self.records += table.num_rows
        return completed_future()

    def _refused_record(self, err: Any, msg: Any) -> None:
        """A transaction's delivery report: called for refused records only (delivery.report.only.error)."""
        if err is not None and self._refused_in_txn is None:
            self._refused_in_txn = (err, msg.topic(), msg.partition(), msg.key())

    def _delivery_error(self, error: tuple[Any, Any, Any, Any]) -> DeliveryError:
        err, topic, partition, key = error
        where = f"topic {topic} partition {partition}, key {show_key(key)}" if topic else "producing"
        return DeliveryError(f"kafka refused a record ({where}): {self.client.scrub(describe(err))}", err)

    def _produce(self, table: pa.Table, callback: Any) -> int:
        """Every row of `table` handed to produce(), in order; the count handed over."""
        columns = self.columns
        n = table.num_rows
        values = _bytes_column(table, "value")
        keys = _bytes_column(table, "key") if columns.key else [None] * n
        produce, room = self.producer.produce, self._stop
        plain = self.topic and not (columns.partition or columns.timestamp or columns.headers)
        if plain:  # the usual write: a fixed topic, key and value only; fewer arguments parsed per record
            topic = self.topic
        else:
            topics = [self.topic] * n if self.topic else table.column("topic").to_pylist()
            partitions = (pc.fill_null(table.column("partition"), NO_PARTITION).to_pylist() if columns.partition
                          else [NO_PARTITION] * n)
            stamps = _millis(table.column("timestamp")) if columns.timestamp else [0] * n
            headers = _headers(table.column("headers")) if columns.headers else [None] * n
        i = 0
        while True:
            try:
                if plain:
                    for i in range(i, n):  # noqa: B020 - resumes where a full queue stopped it
                        produce(topic, values[i], keys[i], NO_PARTITION, callback)
                else:
                    for i in range(i, n):  # noqa: B020
                        produce(topics[i], values[i], keys[i], partitions[i], callback, None, stamps[i], headers[i])
                return n
            except BufferError:  # librdkafka's queue is full: the poll thread drains it
                room.wait(0.005)
            except Exception as e:
                e.produced = i  # type: ignore[attr-defined]
                raise

    def _settle(self, acks: _Acks, batch: Batch, sent: int) -> None:
        if acks.error is None:
            self.rows.release(batch.entries)
            self.records += sent
            acks.future.set_result(None)
            return
        refused = self._refused(acks, batch) if self.txn is None else None
        if refused is not None:
            again = refused.retry.positions if refused.retry is not None else []
            gone = set(refused.positions) | set(again)
            stored = [entry for i, entry in enumerate(batch.entries) if i not in gone]
            self.rows.release(stored)
            self.records += len(stored)
            acks.future.set_exception(refused)
            return
        acks.future.set_exception(self._delivery_error(acks.error))

    def _refused(self, acks: _Acks, batch: Batch) -> RefusedRecords | None:
        """The batch's outcome as the records Kafka refused for what they hold (the others stored, or sent again for a
        passing failure); None: it fails as a whole. Not under sink.transactional: librdkafka makes a transaction
        abortable when any of its records fails, so the task fails and its retry sends everything again."""
        if any(report[0] is None for report in acks.reports):
            return None
        batch_size = int(self.producer_config.get("batch.size", 1_000_000))
        return refused_records(acks.reports, self.rows.table(batch.entries), self.topic, batch_size, self._passing,
                               self._describe_refusal)

    def _passing(self, err: Any) -> bool:
        return self.classify(DeliveryError("", err)) is ErrorKind.RETRYABLE

    def _describe_refusal(self, err: Any, topic: str, partition: Any, key: Any) -> str:
        return (f"kafka refused the record with key {show_key(key)} (topic {topic} partition {partition}): "
                f"{self.client.scrub(describe(err))}: over the topic's max.message.bytes")

    def refused_rows(self, entries: Sequence[int]) -> pa.Table:
        """The refused records as the task's rows: Spark's Kafka sink columns (or, with key/value formats, the
        encoded key and value)."""
        return self.rows.take(entries)

    def classify(self, error: BaseException) -> ErrorKind:
        if isinstance(error, RetryableError):
            return ErrorKind.RETRYABLE
        if self.txn is not None or not isinstance(error, DeliveryError):
            return ErrorKind.FATAL  # a failed record makes the transaction abortable: the task's retry re-sends
        err = error.error
        retriable = getattr(err, "retriable", None)
        if callable(retriable) and retriable() and not err.fatal():
            return ErrorKind.RETRYABLE
        from confluent_kafka import KafkaError

        passing = coordinator_moving() | {KafkaError._MSG_TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS,
                                 KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND}
        return ErrorKind.RETRYABLE if getattr(err, "code", lambda: None)() in passing else ErrorKind.FATAL

    def explain(self, error: SinkError) -> SinkError:
        cause = error.cause
        if isinstance(cause, DeliveryError):
            from confluent_kafka import KafkaError

            code = getattr(cause.error, "code", lambda: None)()
            hint = {
                KafkaError.UNKNOWN_TOPIC_OR_PART: "the topic does not exist (topics are not created by the sink)",
                KafkaError._UNKNOWN_TOPIC: "the topic does not exist (topics are not created by the sink)",
                KafkaError._UNKNOWN_PARTITION: "the partition column names a partition the topic does not have",
                KafkaError.TOPIC_AUTHORIZATION_FAILED: "the user may not write to this topic",
            }.get(code) if code is not None else None
            if hint:
                return SinkError(f"{cause}: {hint}.", store=self.name, target=self.target,
                                 batch_records=error.batch_records, cause=cause)
        return error

    def pre_commit(self) -> Any:
        message: dict[str, int | str] = {"partition": self.context.partition_id, "records": self.records,
                                         "skipped": self.skipped}
        if self.txn is not None:
            if self.txn.open:
                self._stop.set()  # commit_transaction serves the delivery callbacks itself from here on
                if self._poller is not None:
                    self._poller.join()
                self.txn.flush()  # serves the last delivery reports: a refused record is named before the commit
                if self._refused_in_txn is not None:
                    cause = self._delivery_error(self._refused_in_txn)
                    self.txn.abort()
                    raise self.explain(SinkError(
                        f"kafka: {cause}. The transaction of {self.txn.identity.transactional_id} is aborted (none "
                        "of its records are visible) and the task fails.", store=self.name, target=self.target,
                        cause=cause))
                self.txn.commit(self.seen)
            elif self.committed_before is not None and self.seen < self.committed_before:
                log.warning("kafka: %s epoch %s: an earlier attempt committed %d records, this one has %d: the "
                            "task's input is not the first run's (a replay needs the same rows in the same order)",
                            self.txn.identity.transactional_id, self.txn.identity.epoch, self.committed_before,
                            self.seen)
            message["transactional_id"] = self.txn.identity.transactional_id
        return message

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join()
        if self.producer is None:
            return
        if self.txn is not None:
            self.txn.abort()  # a failed task: nothing of it becomes visible
        self._drop_producer()  # after a successful task nothing is outstanding; after a failure, what is stays unsent



def _bytes_column(table: pa.Table, name: str) -> list[bytes | None]:
    column = table.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary() if pa.types.is_string(column.type) else pa.large_binary())
    return column.to_pylist()


def _millis(column: pa.ChunkedArray) -> list[int]:
    """Timestamps as epoch milliseconds; null: 0 (librdkafka's "now")."""
    unit = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[column.type.unit]
    raw = pc.fill_null(column.cast(pa.int64()), 0)
    scaled = pc.multiply(raw, 1000) if unit == 1000 else raw if unit == 1 else pc.divide(raw, int(1 / unit))
    return scaled.to_pylist()


def _headers(column: pa.ChunkedArray) -> list[list[tuple[str, bytes]] | None]:
    return [None if row is None else [(h["key"], h["value"]) for h in row] for row in column.to_pylist()]


def show_key(key: Any) -> str:
    if key is None:
        return "null"
    text = key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)
    return repr(text if len(text) <= 80 else text[:77] + "...")


__all__ = ["DeliveryError", "FencedError", "KafkaStore"]
