"""What a task reports about its write, and where reports go: the typed state that crosses from executors to the
driver's collector."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from sluice.engine import LiveStats


@dataclass(frozen=True)
class MetricsTarget:
    """Where tasks push their reports: the collector's URL and the token it asks for. Travels to the executors in
    the write's plan; the token never shows in a repr, a log line or an error."""

    url: str
    token: str | None = dataclasses.field(default=None, repr=False)


@dataclass(frozen=True)
class TaskIdentity:
    """Which task attempt a report is about (a retried task is another attempt, counted on its own)."""

    format: str
    write_id: str  # a batch write's id, or a streaming query's id
    partition: int
    attempt: int
    task_attempt_id: int
    epoch: int | None  # a streaming query's batch id

    @property
    def key(self) -> tuple[str, str, int, int, int, int | None]:
        return (self.format, self.write_id, self.partition, self.attempt, self.task_attempt_id, self.epoch)


def current_task(format_name: str, run_id: str) -> TaskIdentity:
    """The Spark task running this code, for a read's or a lookup's reports (`run_id`: the read's or the lookup's
    id, made when it was planned); outside a Spark task (a test calling a reader), one anonymous task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return TaskIdentity(format_name, run_id, 0, 0, 0, None)
    batch_id = tc.getLocalProperty("streaming.sql.batchId")
    return TaskIdentity(format_name, run_id, tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId(),
                        int(batch_id) if batch_id is not None else None)


class _TaskReportJson:
    """A task's report as JSON, version 1: {"v": 1, "task": ..., <stats_key>: ..., "done": ...}."""

    stats_type: ClassVar[type]
    stats_key: ClassVar[str]  # the JSON key of the stats
    kind: ClassVar[str]  # what errors call it: a task report, a read report
    path: ClassVar[str]  # where the collector takes it (metrics/_server.py's routes)
    task: TaskIdentity
    stats: Any
    done: bool

    def to_json(self) -> dict[str, Any]:
        return {"v": 1, "task": dataclasses.asdict(self.task), self.stats_key: dataclasses.asdict(self.stats),
                "done": self.done}

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Refuses anything but a version-1 report with every field (a ValueError naming what is wrong)."""
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError(f"not a version-1 sluice {cls.kind} report")
        try:
            task, stats = TaskIdentity(**data["task"]), cls.stats_type(**data[cls.stats_key])
        except (KeyError, TypeError) as e:
            raise ValueError(f"a {cls.kind} report with missing or unknown fields: {e}") from None
        if not isinstance(data.get("done"), bool):
            raise ValueError(f"a {cls.kind} report without a boolean 'done'")
        return cls(task, stats, data["done"])  # type: ignore[call-arg]  # the subclasses: dataclasses of these three


@dataclass(frozen=True)
class TaskReport(_TaskReportJson):
    stats_type = LiveStats
    stats_key = "stats"
    kind = "task"
    path = "/push"
    task: TaskIdentity
    stats: LiveStats
    done: bool  # the task's write ended (committed or failed): its counters are final


@dataclass(frozen=True)
class ReadStats:
    """One read task's progress: what it has fetched so far (Flink's source metrics numRecordsIn, numBytesIn) and,
    where records carry the time they were committed (S2's record timestamps, change capture's commit times), how
    far the newest fetched record's time is behind the moment it was fetched (currentFetchEventTimeLag)."""

    records: int
    bytes: int  # Arrow bytes of the batches handed to Spark
    batches: int
    event_lag_ms: float | None  # None: the records carry no commit time
    at: float  # epoch seconds
    split: str | None = None  # the split the task reads (a split source's: Kafka's "<topic>:<partition>"), else None
    # A task that reads several splits in turn (a group of small ranges): each one's fetch lag when it was read.
    split_lags: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ReadReport(_TaskReportJson):
    stats_type = ReadStats
    stats_key = "read"
    kind = "read"
    path = "/push/read"
    task: TaskIdentity  # write_id: the read's id, made when it is planned
    stats: ReadStats
    done: bool


@dataclass(frozen=True)
class LookupStats:
    """One lookup join task's work so far (`sluice.lookup`, docs/lookup.md), with the cache metrics of Flink's
    lookup joins (FLIP-221: hitCount, missCount, loadCount, latestLoadTime, numCachedRecords) plus evictions."""

    records_in: int  # the DataFrame's rows the task enriched
    records_out: int  # the rows it gave back (a key with several rows gives several; inner drops the unmatched)
    hits: int  # distinct keys of a batch the cache answered
    misses: int  # distinct keys of a batch the cache did not have (read from the store); all of them without cache
    evictions: int  # cached keys dropped, for the cache's size or expiry
    loads: int  # calls to the store (one per batch with keys to read)
    keys_loaded: int  # keys the store was asked for
    records_loaded: int  # rows the store returned
    load_ms: float | None  # the latest store call's duration; None: none yet
    cached_records: int  # rows the task's worker process holds in its cache now
    at: float  # epoch seconds


@dataclass(frozen=True)
class LookupReport(_TaskReportJson):
    stats_type = LookupStats
    stats_key = "lookup"
    kind = "lookup"
    path = "/push/lookup"
    task: TaskIdentity  # write_id: the lookup's id, made when it is planned
    stats: LookupStats
    done: bool


@dataclass(frozen=True)
class SplitLag:
    """One split of a split source (a Kafka topic partition, an S2 stream) in a `SourceReport`: its committed
    position against its head as the last planning saw it."""

    split: str  # the split's id: Kafka's "<topic>:<partition>", S2's stream name
    position: int  # the committed position (Kafka: the next offset to read; S2: the next seq num)
    head: int  # the position after the last readable record
    pending_records: int  # head - position, in positions (which are records where a position is a record)


@dataclass(frozen=True, kw_only=True)
class SourceReport:
    """How far a streaming source is behind its store's head, sent by the source's driver side after each
    micro-batch it commits. PostgreSQL change capture: the slot's confirmed position against the server's WAL
    (bytes); split sources (Kafka, S2): the committed positions against the heads the last planning saw (records),
    in all and per split (`splits`); the table store: the committed barrier against the table's newest (time).
    Built from keywords only: what a source cannot tell keeps its default."""

    format: str
    source: str  # what is read: a replication slot, a basin's streams
    pending_bytes: int | None = None  # behind the head (Flink: pendingBytes); None: the source cannot tell
    pending_records: int | None = None  # behind the head (Flink: pendingRecords); None: the source cannot tell
    retained_bytes: int = 0  # what the source makes the store keep (a slot's WAL from its restart_lsn on); 0: nothing
    position: str = ""  # the committed position as the store writes it (an LSN), or "" where it is many (S2's streams)
    head: str = ""  # the store's head at the same moment, likewise
    at: float = dataclasses.field(default_factory=time.time)  # epoch seconds; default: when the report is made
    time_behind_ms: float | None = None  # the head's time minus the committed position's (the table store's
    # barriers are commit times); None: the source cannot tell
    splits: tuple[SplitLag, ...] = ()  # a split source's splits, each on its own; (): not a split source

    def to_json(self) -> dict[str, Any]:
        return {"v": 1, "source": dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> SourceReport:
        if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("source"), dict):
            raise ValueError("not a version-1 sluice source report")
        fields = dict(data["source"])
        try:
            fields["splits"] = tuple(SplitLag(**split) for split in fields.get("splits", ()))
            return cls(**fields)
        except TypeError as e:
            raise ValueError(f"a source report with missing or unknown fields: {e}") from None
