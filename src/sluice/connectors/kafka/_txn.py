"""Exactly-once into Kafka: each task commits its own Kafka transaction, at most once per (write, epoch, task).

librdkafka cannot resume another process's transaction, so the driver cannot commit what the tasks wrote (Kafka's
two-phase commit for external coordinators, KIP-939, is in the Java client only). Each task therefore commits its
transaction in pre_commit, and makes that commit idempotent with a marker committed atomically with its records:
the offset `epoch + 1` of the consumer group `sluice-eos-<write id>-<task partition>` on partition 0 of the marker
topic, sent with `send_offsets_to_transaction`, so the records and the marker commit together or not at all.

A task's open:
1. `init_transactions()` with transactional.id `<prefix>-<task partition>`: fences every older producer of that id
   (a zombie attempt of the task: its commit then fails) and aborts a transaction one left open, at once rather
   than after transaction.timeout.ms; waits for one that was committing to finish.
2. the marker, read by a read_committed consumer (KIP-447: offsets still pending in a transaction are waited for):
   an offset > epoch means this task's records of this epoch are in Kafka already (a replay after a driver crash,
   a restart from an older checkpoint, a batch write re-run with its sink.write-id), as many as the marker's
   metadata says ("records=N"): the task sends none of its first N records.
3. `begin_transaction()`, at once or (a marker of this epoch) when a record past the first N is to be sent.
pre_commit: flush, marker (with the count of the task's records), commit. A failure aborts the transaction and fails
the task; Spark's retry starts at 1.

Why the count: Spark ends a Python writer's input when the operator feeding it in the same task fails (a UDF that
raises, a shuffle fetch that fails), and pyarrow reads an Arrow stream that stops at a message boundary as complete;
such an attempt may commit the records it had. Its retry, with the whole input, sends the rest (the same rows in the
same order, as every replay needs) instead of skipping the task.

What bounds the transactional ids (FLINK-34554: one id per attempt or checkpoint piles producer state up on the
brokers until transactional.id.expiration.ms): one per task partition of the write, reused by every epoch and retry.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sluice.connector import SinkError, WriteContext
from sluice.connectors.kafka._client import ClientSettings

log = logging.getLogger("sluice.kafka")

# Settings a marker consumer shares with the producer: how to reach and authenticate to the brokers. A producer-only
# setting given to a consumer makes librdkafka warn on every task.
_CONNECTION_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.", "ssl_", "enable.ssl", "socket.", "client.",
                        "broker.", "api.version", "reconnect.", "resolve.", "metadata.", "topic.metadata",
                        "connections.", "enable.sasl", "https.")


MARKER_GROUP_PREFIX = "sluice-eos-"  # + <write id>-<task partition>: the group whose offset marks a task's commits


def default_transactional_prefix(write_id: str) -> str:
    """The tasks' transactional.id prefix when the user sets no transactional-id-prefix (sluice doctor finds a
    job's ids by it)."""
    return f"sluice-{write_id}"


@dataclass(frozen=True)
class TxnIdentity:
    """Who commits what: the transactional id of the task's producer and the marker of its commit."""

    transactional_id: str
    group: str  # the consumer group whose committed offset on the marker topic is the last committed epoch + 1
    marker_topic: str
    epoch: int  # this write's epoch (batch writes: 0)

    @classmethod
    def of(cls, prefix: str, marker_topic: str, context: WriteContext) -> TxnIdentity:
        group = f"{MARKER_GROUP_PREFIX}{context.write_id}-{context.partition_id}"
        return cls(f"{prefix}-{context.partition_id}", group, marker_topic,
                   context.epoch if context.epoch is not None else 0)


RECORDS = "records="  # the marker's metadata: how many of the task's records its epoch committed


@dataclass(frozen=True)
class CommittedMark:
    """A task's marker as read back: the last epoch it committed and how many records (None: a marker written
    without the count, by an older sluice)."""

    epoch: int
    records: int | None

    @classmethod
    def of(cls, found: Any) -> CommittedMark | None:
        if found.offset < 0:
            return None
        meta = found.metadata or ""
        return cls(found.offset - 1, int(meta[len(RECORDS):]) if meta.startswith(RECORDS) else None)


class FencedError(SinkError):
    """Another producer took this task's transactional id over: a newer attempt of the task, or another write with
    the same transactional-id-prefix."""


def connection_settings(client: ClientSettings) -> dict[str, str]:
    return {k: v for k, v in client.items() if k.startswith(_CONNECTION_PREFIXES)}


def kafka_error(exc: BaseException) -> Any:
    """The KafkaError inside a KafkaException (or None)."""
    args = getattr(exc, "args", ())
    return args[0] if args and hasattr(args[0], "code") else None


def describe(error: Any) -> str:
    """librdkafka's text of a KafkaError or KafkaException (its code name and reason), else str()."""
    err = error if hasattr(error, "code") and hasattr(error, "str") else kafka_error(error)
    return f"{err.name()}: {err.str()}" if err is not None else str(error)


class Transaction:
    """One task's Kafka transaction on its producer, with the marker that makes its commit happen once."""

    def __init__(self, producer: Any, identity: TxnIdentity, client: ClientSettings, timeout_s: float,
                 check_marker: bool = True, transaction_timeout_ms: int = 60_000) -> None:
        self.producer = producer
        self.transaction_timeout_ms = transaction_timeout_ms
        self.began = 0.0
        self.identity = identity
        self.client = client
        self.timeout_s = timeout_s
        self.check_marker = check_marker  # False only in the tests' negative controls
        self.group_metadata: Any = None
        self.open = False  # a transaction begun and neither committed nor aborted

    def start(self) -> int | None:
        """Fence and read the marker; how many of the task's first records are committed already: 0 (none: the
        transaction is begun), N (this epoch's marker counts N: `begin()` once a later record is to be sent), or
        None (all: a later epoch's marker, or one without a count)."""
        self._call("init_transactions", self.producer.init_transactions)
        committed = self._committed_mark()
        if self.check_marker and committed is not None and committed.epoch >= self.identity.epoch:
            # A later epoch's marker: this epoch finished whole before Spark went on (the count is the later one's).
            records = committed.records if committed.epoch == self.identity.epoch else None
            log.info("kafka: %s epoch %s was committed before (a replay): %s of its records are in Kafka",
                     self.identity.transactional_id, self.identity.epoch, "all" if records is None else records)
            return records
        self.begin()
        return 0

    def begin(self) -> None:
        self.producer.begin_transaction()  # local: no request, no timeout
        self.began = time.monotonic()
        self.open = True

    def _committed_mark(self) -> CommittedMark | None:
        from confluent_kafka import Consumer, TopicPartition

        ident = self.identity
        consumer = Consumer({**connection_settings(self.client), "group.id": ident.group,
                             "isolation.level": "read_committed", "enable.auto.commit": False})
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:  # a group coordinator still loading or moving answers with retriable errors
                try:
                    found = consumer.committed([TopicPartition(ident.marker_topic, 0)],
                                               timeout=max(0.1, deadline - time.monotonic()))
                    break
                except Exception as e:
                    err = kafka_error(e)
                    passing = err is not None and (err.retriable() or err.code() in coordinator_moving())
                    if not passing or time.monotonic() >= deadline:
                        raise self._failure("reading the commit marker", e) from None
            self.group_metadata = consumer.consumer_group_metadata()
        finally:
            consumer.close()
        return CommittedMark.of(found[0])

    def commit(self, records: int) -> None:
        """Flush, mark this epoch committed with the task's `records` (those sent now and those an earlier attempt
        committed), commit: records and marker become visible together."""
        from confluent_kafka import TopicPartition

        ident = self.identity
        self.flush()
        marker = [TopicPartition(ident.marker_topic, 0, ident.epoch + 1, f"{RECORDS}{records}")]
        self._call("send_offsets_to_transaction", self.producer.send_offsets_to_transaction, marker,
                   self.group_metadata)
        self._call("commit_transaction", self.producer.commit_transaction)
        self.open = False

    def flush(self) -> None:
        """Wait until every record produced is acknowledged or refused (its delivery report served), for as long as
        records keep going out: a task's batches are not waited for as they are produced (_store.py), so up to
        sink.requests.max-buffered records may be left here; fails once timeout-ms passes with none acknowledged."""
        left = self.producer.flush(self.timeout_s)
        while left:
            before, left = left, self.producer.flush(self.timeout_s)
            if left >= before:
                raise self._failure("flushing", None, f"{left} record(s) left, none acknowledged within timeout-ms")

    def abort(self) -> None:
        """Abort an open transaction (a failed task), best effort: if this fails, the retry's init_transactions
        aborts it, or at the latest the broker after transaction.timeout.ms."""
        if not self.open:
            return
        self.open = False
        try:
            self.producer.abort_transaction(self.timeout_s)
        except Exception as e:
            log.warning("kafka: aborting the transaction of %s failed (%s); the task's retry aborts it",
                        self.identity.transactional_id, self.client.scrub(describe(e)))

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        """A transactional call, repeated while librdkafka says it may be (e.g. a coordinator moving) until
        timeout-ms; an abortable error aborts the transaction; fencing and fatal errors fail the task."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                fn(*args, left)
                return
            except Exception as e:
                err = kafka_error(e)
                if err is not None and err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    continue
                if err is not None and err.txn_requires_abort():
                    self.abort()
                elif err is not None and err.fatal():
                    self.open = False  # a fenced or failed producer can abort nothing; the broker or a retry will
                raise self._failure(what, e) from None

    def _failure(self, what: str, error: BaseException | None, detail: str | None = None) -> SinkError:
        err = kafka_error(error) if error is not None else None
        ident = self.identity
        text = detail or self.client.scrub(describe(error))
        if err is not None and err.code() in _fenced_codes():
            open_ms = int((time.monotonic() - self.began) * 1000) if self.began else 0
            if open_ms >= self.transaction_timeout_ms:  # a lone producer is fenced too when the broker aborts
                why = (f"the transaction was open {open_ms} ms, longer than transaction.timeout-ms "
                       f"({self.transaction_timeout_ms}), so the broker aborted it and bumped the producer's epoch. "
                       "Raise transaction.timeout-ms (up to the brokers' transaction.max.timeout.ms) or make tasks "
                       "smaller")
            else:
                why = ("a newer attempt of this task, or another write with the same transactional-id-prefix, took "
                       "its transactional.id over. Give concurrently running writes different "
                       "transactional-id-prefix values")
            return FencedError(
                f"kafka: transactional.id {ident.transactional_id} was fenced during {what}: {why}. This attempt's "
                f"transaction is aborted and none of its records are visible. ({text})",
                store="kafka", target=ident.marker_topic, cause=error)
        return SinkError(
            f"kafka: {what} of the transaction of {ident.transactional_id} (epoch {ident.epoch}) failed: {text}. "
            "The transaction is aborted (none of its records are visible) and the task fails; Spark's retry "
            f"writes them again. Brokers: {self.client.bootstrap_servers}.",
            store="kafka", target=ident.marker_topic, cause=error)


def _fenced_codes() -> set[int]:
    from confluent_kafka import KafkaError

    return {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def coordinator_moving() -> set[int]:
    """Errors of a coordinator that is loading, moving or unreachable for now: worth asking again."""
    from confluent_kafka import KafkaError

    return {KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TRANSPORT}
