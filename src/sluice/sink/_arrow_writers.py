"""The tasks' side of a sink: Arrow writers that run the engine on a `WritePlan`'s encoder and store, and the
driver's commit of what the tasks sent back (sluice/sink/_datasource.py plans the write)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from sluice._errors import OptionError, RecordError, SinkError
from sluice.engine import (
    PARTITION_ORDERED,
    AsyncSinkWriter,
    BatchCreator,
    RequestBuffer,
    RequestInfo,
    WriteContext,
    WriteStats,
)
from sluice.metrics._push import MetricsPusher
from sluice.metrics._report import MetricsTarget, TaskIdentity
from sluice.sink._deadletters import DeadLetterRoute, DeadLetterWriter
from sluice.sink._encoding import partition_buckets, partition_keys
from sluice.sink._plan import Encoded, TaskWriter, WritePlan
from sluice.spark._compat import StreamArrowWriterBase
from sluice.spark._summary import log_summary, save_summary


@dataclass
class SluiceCommitMessage(WriterCommitMessage):
    """What one task sends back to the driver: its statistics and the store's pre-commit message."""

    stats: dict[str, Any]
    store_message: Any
    context: WriteContext
    dead_letters: Any = None  # the dead-letter target's pre-commit message (errors.tolerance=all)


def batching(plan: WritePlan) -> tuple[BatchCreator | None, RequestBuffer | None]:
    """The write's BatchCreator and RequestBuffer: the sink.* options' classes, else the connector's; None =
    the engine's default for the mode."""
    config = plan.config
    return (config.make_batch_creator() or plan.batch_creator(), config.make_request_buffer() or plan.request_buffer())


def check_batching(plan: WritePlan) -> None:
    """On the driver: a trial batch from an empty buffer, so a creator that cannot work with the buffer (e.g. a
    per-key creator over an unkeyed buffer) fails here, naming the options, not in every task."""
    creator, buffer = batching(plan)
    if creator is None and buffer is None:
        return
    mode_creator, mode_buffer = plan.config.mode_batching()
    creator, buffer = creator or mode_creator, buffer or mode_buffer
    try:
        creator.create_next_batch(RequestInfo(plan.config.batch_max_size, plan.config.flush_buffer_size, 0.0), buffer)
    except Exception as e:
        raise OptionError(f"sink.batch-creator / sink.request-buffer: {type(creator).__name__} cannot cut batches "
                          f"from a {type(buffer).__name__} ({type(e).__name__}: {e}). Choose classes that work "
                          "together (PartitionKeyBatchCreator needs KeyedRequestBuffer).") from None


def task_context(write_id: str, streaming: bool = True) -> WriteContext:
    """The task's identity in a write. A streaming write is its query's micro-batch (query id, batch id); a batch
    write is `write_id` alone, also when it runs inside a streaming query's foreachBatch, whose jobs carry the
    query's local properties: taken from those, every batch write of a query would share one identity, and a
    store's replay detection would take the second for a replay of the first and drop it."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return WriteContext(write_id=write_id)
    batch_id = tc.getLocalProperty("streaming.sql.batchId") if streaming else None
    query_id = tc.getLocalProperty("sql.streaming.queryId") if streaming else None
    return WriteContext(
        write_id=query_id or write_id,
        epoch=int(batch_id) if batch_id is not None else None,
        partition_id=tc.partitionId(),
        attempt=tc.attemptNumber(),
        task_attempt_id=tc.taskAttemptId(),
    )


class _EngineWriterMixin:
    """The Spark writer around a plan: tasks run the engine on the plan's encoder and store; the driver commits."""

    streaming = False  # a streaming query's writer: tasks are identified by (query id, batch id)

    def __init__(self, plan: WritePlan, write_id: str, metrics: MetricsTarget | None = None,
                 dead_letters: DeadLetterRoute | None = None) -> None:
        self.plan = plan
        self.write_id = write_id
        self.metrics = metrics  # where tasks report their write while it runs (sluice.metrics); None: nowhere
        self.dead_letters = dead_letters  # where refused records go (errors.tolerance=all); None: they fail the write

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> SluiceCommitMessage:
        context = task_context(self.write_id, self.streaming)
        if self._replayed(context):
            for _ in iterator:  # Spark sends the partition whatever the task does with it
                pass
            return SluiceCommitMessage(WriteStats(tasks=0, replays_skipped=1).to_dict(), None, context)
        iterator = iter(iterator)
        first = next((batch for batch in iterator if batch.num_rows), None)  # stops at the first batch with rows
        if first is None:
            # A task with no rows opens no connection or session (a write of 200 mostly empty partitions
            # must not open 200 connections).
            return SluiceCommitMessage(WriteStats(tasks=0).to_dict(), None, context)
        task = self.plan.open_task(context)
        creator, buffer = batching(self.plan)
        pusher = self._pusher(context)
        letters = self.dead_letters.open(context, task.store.target) if self.dead_letters is not None else None
        with AsyncSinkWriter(task.store, self.plan.config, context=context, batch_creator=creator, buffer=buffer,
                             observer=pusher.offer if pusher is not None else None,
                             on_refused=_refusals_to(letters, task)) as writer:
            try:
                message = self._write_batches(writer, task, itertools.chain((first,), iterator), letters)
                letters_message = letters.finish() if letters is not None else None
            finally:
                if pusher is not None:
                    pusher.close(writer.live())
                if letters is not None:
                    letters.close()
        return SluiceCommitMessage(writer.stats.to_dict(), message, context, letters_message)

    def _replayed(self, context: WriteContext) -> bool:
        """A micro-batch the sink's replay guard says was committed already (a replay from an older checkpoint)."""
        guard = self.plan.replay_guard() if context.epoch is not None else None
        if guard is None:
            return False
        last = guard.last_committed(context.write_id)
        return last is not None and context.epoch is not None and context.epoch <= last

    def _pusher(self, context: WriteContext) -> MetricsPusher | None:
        if self.metrics is None:
            return None
        task = TaskIdentity(self.plan.format_name, context.write_id, context.partition_id or 0, context.attempt or 0,
                            context.task_attempt_id or 0, context.epoch)
        return MetricsPusher(self.metrics, task)

    def _write_batches(self, writer: AsyncSinkWriter, task: TaskWriter, batches: Iterator[pa.RecordBatch],
                       letters: DeadLetterWriter | None = None) -> Any:
        config = self.plan.config
        keyed = config.mode == PARTITION_ORDERED
        # No generator in front: it would cost a frame's resumption per Arrow batch, and each comes after the read
        # of a batch from Spark's socket, with the CPU's caches cold (docs/engine.md, "Runs of full batches").
        for batch in batches:
            if not batch.num_rows:
                continue
            if letters is not None:
                letters.drain()  # what the store refused so far, written from this thread
                encoded, batch = _encode_tolerant(task, batch, letters, writer)
                if encoded is None:
                    continue
            else:
                encoded = task.encode(batch)
            if not keyed:
                writer.write_chunk(encoded.entries, encoded.sizes, running=encoded.running)
                continue
            if encoded.groups is not None:  # the store's own grouping (e.g. HBase's regions)
                codes, names = encoded.groups, None
            elif config.batch_by == "key":
                codes, names = partition_keys(batch, config.partition_key)
            else:
                codes, names = partition_buckets(batch, config.partition_key, config.parallelism), None
            if encoded.rows is not None and encoded.groups is None:  # the encoder kept only some rows
                codes = np.asarray(codes)[np.asarray(encoded.rows, dtype=np.int64)]
            writer.write_keyed(encoded.entries, encoded.sizes, codes, names, encoded.running)
        return writer.finish()

    def _epoch_context(self, done: list[SluiceCommitMessage], epoch: int | None) -> WriteContext:
        """The write as the tasks saw it: streaming tasks know the query id, which the driver-side writer does not."""
        write_id = done[0].context.write_id if done else self.write_id
        return WriteContext(write_id=write_id, epoch=epoch)

    def _commit(self, messages: list[SluiceCommitMessage | None], epoch: int | None) -> None:
        done = [m for m in messages if m is not None]
        self._check_refusals(done)
        ordered = sorted(done, key=lambda m: m.context.partition_id)
        own = [m.store_message for m in ordered if m.store_message is not None]
        staged = [m.dead_letters for m in ordered if m.dead_letters is not None]  # none sent aside: no commit there
        context = self._epoch_context(done, epoch)
        letters = self.dead_letters.committer() if self.dead_letters is not None and staged else None
        committer = self.plan.committer() if self.plan.commits_on_driver else None
        # One transaction where the store can hold both; else the dead letters first: a record is in one of the two
        # once the write is committed, each commit once per (write id, epoch).
        together = letters is not None and committer is not None and committer.commit_with(own, context, letters,
                                                                                             staged)
        if letters is not None and not together:
            letters.commit(staged, context)
        if committer is not None and not together:
            committer.commit(own, context)
        guard = self.plan.replay_guard() if epoch is not None else None
        if guard is not None and epoch is not None:
            guard.mark_committed(self._epoch_context(done, epoch).write_id, epoch)
        if self.dead_letters is not None:
            self.dead_letters.record(sum(int(m.stats.get("dead_letters", 0)) for m in done),
                                     self._epoch_context(done, epoch).write_id)
        self._record(done, epoch, "committed")

    def _check_refusals(self, done: list[SluiceCommitMessage]) -> None:
        """errors.max-records / errors.max-ratio over the whole write (or micro-batch), before anything of it is
        committed: a transactional write past a bound commits nothing."""
        if self.dead_letters is None:
            return
        stats = WriteStats.merge([WriteStats.from_dict(m.stats) for m in done])
        bound = self.plan.config.errors.over_bound(stats.dead_letters, stats.records + stats.dead_letters)
        if bound is not None:
            raise SinkError(f"{self.plan.format_name}: {bound}", store=self.plan.format_name)

    def _abort(self, messages: list[SluiceCommitMessage | None], epoch: int | None) -> None:
        done = [m for m in messages if m is not None]
        try:
            committer = self.plan.committer() if self.plan.commits_on_driver else None
            if committer is not None:
                committer.abort([m.store_message for m in done if m.store_message is not None],
                                 self._epoch_context(done, epoch))
            letters = self.dead_letters.committer() if self.dead_letters is not None else None
            if letters is not None:
                letters.abort([m.dead_letters for m in done if m.dead_letters is not None],
                              self._epoch_context(done, epoch))
        finally:
            # A failed write is the last write too: never leave the previous one's summary in its place.
            self._record(done, epoch, "failed")

    def _record(self, done: list[SluiceCommitMessage], epoch: int | None, status: str) -> None:
        stats = WriteStats.merge([WriteStats.from_dict(m.stats) for m in done])
        summary = {**stats.summary(), "status": status}
        if epoch is not None:
            summary["batch_id"] = epoch
        save_summary(self.plan.format_name, summary)
        where = f" batch {epoch}" if epoch is not None else ""
        failed = " FAILED (tasks that finished before the failure)" if status == "failed" else ""
        log_summary(f"{self.plan.format_name}{where}{failed}: {stats.summary_line()}")


def _encode_tolerant(task: TaskWriter, batch: pa.RecordBatch, letters: DeadLetterWriter,
                     writer: AsyncSinkWriter) -> tuple[Encoded | None, pa.RecordBatch]:
    """Encode `batch`, sending aside the rows the encoder refuses (RecordError with rows) and encoding the rest
    again; None when every row was refused."""
    while True:
        try:
            return task.encode(batch), batch
        except RecordError as error:
            if not error.rows:
                raise
            refused = sorted(set(error.rows))
            letters.add(batch.take(pa.array(refused, pa.int64())).to_pylist(), [error] * len(refused))
            writer.count_refused(len(refused))
            keep = np.ones(batch.num_rows, dtype=bool)
            keep[refused] = False
            batch = batch.filter(pa.array(keep))
            if not batch.num_rows:
                return None, batch


def _refusals_to(letters: DeadLetterWriter | None, task: TaskWriter) -> Callable[[Sequence[Any], list[BaseException]],
                                                                                 None] | None:
    """The engine's route for refused entries: the rows they came from, to the task's dead letters."""
    if letters is None:
        return None

    def refused(entries: Sequence[Any], errors: list[BaseException]) -> None:
        letters.add(task.store.refused_rows(entries), errors)

    return refused


class EngineArrowWriter(_EngineWriterMixin, DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> SluiceCommitMessage:
        return self._write(iterator)

    # override: Spark hands commit/abort back the messages this writer's write() made, not any WriterCommitMessage.
    def commit(self, messages: list[SluiceCommitMessage | None]) -> None:  # type: ignore[override]
        self._commit(messages, None)

    def abort(self, messages: list[SluiceCommitMessage | None]) -> None:  # type: ignore[override]
        self._abort(messages, None)


class EngineStreamArrowWriter(_EngineWriterMixin, StreamArrowWriterBase):
    streaming = True

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SluiceCommitMessage:
        return self._write(iterator)

    # override: as EngineArrowWriter's, the messages are those this writer's write() made.
    def commit(self, messages: list[SluiceCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._commit(messages, batchId)

    def abort(self, messages: list[SluiceCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        self._abort(messages, batchId)
