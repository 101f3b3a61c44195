"""Reading Kafka, the driver's side: a split per topic partition, positions are Kafka offsets (the split framework's
positions, sluice/source). The enumerator lists topics and partitions through the admin client (which topics: a
`TopicDiscovery`, _discovery.py) and resolves positions with one ListOffsets request per planning (KIP-396's
AdminClient.list_offsets): earliest, latest, by timestamp. Under read_committed "latest" is the last stable offset
(KIP-98): a read never waits on, nor reads past, an open transaction. The records themselves are read in _reader.py.

Transaction markers (and, under read_committed, aborted records) take offsets: a range of offsets may hold fewer
records than its length, and records behind on the metrics count them as offsets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.connector import OptionError, SluiceError, Split, SplitEnumerator, forward_bounds
from sluice.connectors.kafka._client import client_certificate_refused
from sluice.connectors.kafka._discovery import TopicDiscovery
from sluice.connectors.kafka._options import EARLIEST, LATEST, Positions, ReadOptions

LOOKUP_SECONDS = 3.0  # one ListOffsets attempt (timeout-ms bounds them all)


def split_of(topic: str, partition: int) -> Split:
    return Split(f"{topic}:{partition}")


def topic_partition(split_id: str) -> tuple[str, int]:
    """A split id "<topic>:<partition>" back into its parts (topic names hold no ':')."""
    topic, partition = split_id.rsplit(":", 1)
    return topic, int(partition)


class KafkaEnumerator(SplitEnumerator):
    """Splits: every partition of the topics `discovery` picks, listed again every discovery-interval-ms (streaming).
    `batch`: the read ends at endingOffsets, else at the latest offset of each planning."""

    def __init__(self, options: ReadOptions, discovery: TopicDiscovery, batch: bool) -> None:
        self.options = options
        self.discovery = discovery
        self.start = options.starting
        self.end = options.ending if batch else Positions("latest")
        self.timeout = options.timeout_ms / 1000
        self.interval = options.discovery_interval_ms / 1000
        self._admin: Any = None
        self._errors: list[Any] = []
        self._splits: list[Split] = []
        self._listed_at = float("-inf")
        self._seen: set[str] = set()  # topics listed before: one missing now was deleted
        self._started = False

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_admin": None, "_errors": []}  # the client stays on the driver

    # ------------------------------------------------------------------ the cluster
    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._errors = []  # what librdkafka reported on its own (failed authentication, ...)
            self._admin = AdminClient(self.options.client.config(**{
                "socket.timeout.ms": self.options.timeout_ms, "error_cb": self._errors.append}))
        return self._admin

    def _failure(self, what: str, error: BaseException) -> SluiceError:
        from confluent_kafka import KafkaError

        servers = self.options.client.bootstrap_servers
        if self._admin is not None:
            self._admin.poll(0 if self._errors else 0.5)  # serves the error callbacks queued meanwhile
        signed_in = [e for e in self._errors if e.code() == KafkaError._AUTHENTICATION]
        tls = [e for e in self._errors if e.code() == KafkaError._SSL]
        alerts = [(e.str(), refused) for e in self._errors if (refused := client_certificate_refused(e.str()))]
        why = f"authentication failed: {signed_in[-1].str()}" if signed_in else str(error)
        if alerts and not signed_in:  # librdkafka reports a broker's alert as a transport failure
            why = f"TLS failed: {alerts[-1][0]}; {alerts[-1][1]}"
        elif tls and not signed_in:
            why = f"TLS failed: {tls[-1].str()}; check that kafka.ssl.ca.pem holds the CA that signed the brokers' " \
                  "certificates"
        return SluiceError(self.options.client.scrub(
            f"Kafka at {servers} did not answer {what} within timeout-ms={self.options.timeout_ms} ({why}). Check "
            "kafka.bootstrap.servers and the security settings (kafka.security.protocol, kafka.sasl.*), or raise "
            "timeout-ms."))

    def _topics(self) -> dict[str, int]:
        """Every topic of the cluster and its number of partitions."""
        from confluent_kafka import KafkaException

        try:
            metadata = self._client().list_topics(timeout=self.timeout)
        except KafkaException as error:
            raise self._failure("a metadata request", error) from None
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def _offsets(self, specs: Mapping[tuple[str, int], Any]) -> dict[tuple[str, int], int]:
        """A ListOffsets request, (topic, partition) -> OffsetSpec, answered with offsets (-1: no record matched a
        timestamp); partitions whose leader moved are asked again, within timeout-ms. A topic deleted meanwhile is
        reported (failOnDataLoss); with failOnDataLoss=false its partitions answer 0, which the split framework
        reads as nothing more to read."""
        from confluent_kafka import OFFSET_INVALID, IsolationLevel, KafkaError, KafkaException, TopicPartition

        level = IsolationLevel.READ_COMMITTED if self.options.read_committed else IsolationLevel.READ_UNCOMMITTED
        found: dict[tuple[str, int], int] = {}
        gone: set[str] = set()
        asked = dict(specs)
        deadline = time.monotonic() + self.timeout
        while asked:
            # A short request, asked again: the client's metadata may still name a leader that died, and the
            # client then answers OFFSET_INVALID for that partition after the whole request timeout.
            futures = self._client().list_offsets({TopicPartition(t, p): spec for (t, p), spec in asked.items()},
                                                   isolation_level=level,
                                                   request_timeout=max(0.1, min(LOOKUP_SECONDS, self.timeout)))
            for tp, future in futures.items():
                key = (tp.topic, tp.partition)
                try:
                    offset = future.result().offset
                except KafkaException as error:
                    code = error.args[0].code() if error.args else None
                    if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                KafkaError._UNKNOWN_PARTITION):
                        gone.add(tp.topic)
                        asked.pop(key)
                        continue
                    if time.monotonic() > deadline:
                        raise self._failure(f"a ListOffsets request for {tp.topic}:{tp.partition}", error) from None
                    continue
                if offset != OFFSET_INVALID:
                    found[key] = offset
                    asked.pop(key)
            if asked:
                if time.monotonic() > deadline:
                    raise self._failure(f"a ListOffsets request for {sorted(asked)}", TimeoutError("no leader"))
                self._topics()  # fresh metadata: the partitions' leaders now
        if gone:
            self._listed_at = float("-inf")
            self.discover()  # reports the deletion: fails, or (failOnDataLoss=false) warns and drops the topics
            for key in specs:  # nothing to read there any more: every position of theirs is 0 (empty ranges)
                if key[0] in gone:
                    found[key] = 0
        return found

    # ------------------------------------------------------------------ splits
    def discover(self) -> list[Split]:
        if self._started and time.monotonic() - self._listed_at < self.interval:
            return self._splits
        listed = self._topics()
        if not self._started:
            missing = sorted(self.discovery.required() - set(listed))
            if missing:
                raise OptionError(f"topic(s) {missing} do not exist in Kafka at "
                                  f"{self.options.client.bootstrap_servers}; check subscribe (topics are not "
                                  "created by reading)")
        picked = self.discovery.pick(listed)
        topics = {t for t, _ in picked}
        gone = sorted(self._seen - topics)
        if gone:
            self._topics_deleted(gone)
        self._seen = topics
        self._splits = [split_of(t, p) for t, p in picked]
        self._listed_at = time.monotonic()
        self._started = True
        return self._splits

    def _topics_deleted(self, topics: list[str]) -> None:
        self.options.data_lost(f"topic(s) {topics} were deleted while the query read them "
                               f"({self.discovery.describe()}): their records not read yet are gone. Restart the "
                               "query from a new checkpoint", "go on without them")

    # ------------------------------------------------------------------ positions
    @staticmethod
    def _spec(rule: str, offset: int | None, timestamp: int | None) -> Any:
        from confluent_kafka.admin import OffsetSpec

        if offset == EARLIEST or (offset is None and rule == "earliest"):
            return OffsetSpec.earliest()
        if offset == LATEST or (offset is None and rule == "latest"):
            return OffsetSpec.latest()
        if offset is None:
            if timestamp is None:  # parse_positions gives every rule but earliest and latest its timestamp
                raise OptionError(f"reading from '{rule}' needs a timestamp, and none was given")
            return OffsetSpec.for_timestamp(timestamp)
        return None  # a given offset: checked against the partition's earliest and latest

    def _resolve(self, splits: Sequence[Split], *rules: Positions) -> dict[str, list[int]]:
        """Each split's offset under each rule: one ListOffsets request per rule, and each given offset within the
        partition's earliest..latest (one below earliest is data loss: failOnDataLoss)."""
        from confluent_kafka.admin import OffsetSpec

        keys = {s.split_id: topic_partition(s.split_id) for s in splits}
        out: dict[str, list[int]] = {sid: [] for sid in keys}
        bounds: tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]] | None = None
        for rule in rules:
            specs: dict[tuple[str, int], Any] = {}
            given: dict[str, int] = {}
            for sid, key in keys.items():
                offset = rule.offsets.get(key)
                spec = self._spec(rule.kind, offset, rule.timestamp)
                if spec is None:
                    given[sid] = offset  # type: ignore[assignment]  # not None: _spec() is None for a given one
                else:
                    specs[key] = spec
            found = self._offsets(specs)
            unmatched = [key for key, offset in found.items() if offset < 0]
            if unmatched:  # no record at or after the timestamp: from the end
                found.update(self._offsets(dict.fromkeys(unmatched, OffsetSpec.latest())))
            if given and bounds is None:
                bounds = (self._offsets({k: OffsetSpec.earliest() for k in keys.values()}),
                          self._offsets({k: OffsetSpec.latest() for k in keys.values()}))
            for sid, key in keys.items():
                if sid in given:
                    assert bounds is not None
                    out[sid].append(self._given(sid, given[sid], bounds[0][key], bounds[1][key]))
                else:
                    out[sid].append(found[key])
        return out

    def _given(self, sid: str, offset: int, earliest: int, latest: int) -> int:
        if offset < earliest:
            self.options.data_lost(f"offset {offset} of {sid} was deleted (the partition starts at {earliest} now)",
                                   f"start at {earliest}")
            return earliest
        return min(offset, latest)

    def start_positions(self, splits: Sequence[Split]) -> dict[str, int]:
        return {sid: found[0] for sid, found in self._resolve(splits, self.start).items()}

    def end_positions(self, splits: Sequence[Split], starts: Mapping[str, int] | None = None) -> dict[str, int]:
        live = set(self._seen)
        kept = [s for s in splits if topic_partition(s.split_id)[0] in live]
        ends = {sid: found[0] for sid, found in self._resolve(kept, self.end).items()}
        # A deleted topic's partitions (failOnDataLoss=false): nothing more to read where the query stands.
        for s in splits:
            if s.split_id not in ends:
                ends[s.split_id] = (starts or {}).get(s.split_id, 0)
        return ends

    def bounds(self, splits: Sequence[Split]) -> dict[str, tuple[int, int]]:
        return forward_bounds(self._resolve(splits, self.start, self.end), "the start is after the end in "
                              "partition(s) {}", "Check startingOffsets (or startingTimestamp) and endingOffsets.")

    def new_split_position(self, split: Split) -> int:
        """A partition found while a query runs (a new topic, or partitions added): from its earliest offset."""
        from confluent_kafka.admin import OffsetSpec

        key = topic_partition(split.split_id)
        return self._offsets({key: OffsetSpec.earliest()})[key]

    def close(self) -> None:
        self._admin = None
