"""The S2 store: one SDK append session per stream, driven from an asyncio loop on its own thread.

The engine's buffer-manager thread calls `submit(batch)`; the batch is split by stream (in order) and
each part is queued to its stream's sender, which submits to the append session in queue order, so the
engine's ordering guarantees carry over to S2. A failed session is replaced before the next send.

Exactly-once (sink.transactional=true): every record carries @writer (write id / epoch / partition) and
@wseq (its index in this writer's output to the stream). Before its first append to a stream, an attempt
fences the stream with its own token (older attempts' appends then fail), reads back from the tail to
the last data record, and, when that record is its own writer's, drops everything up to its @wseq: a
retried task or a replayed micro-batch continues where the previous attempt stopped. Appends carry the
fencing token and match_seq_num, so another writer in between is detected, never interleaved. The driver ends
each micro-batch with a commit fence on every stream written (_commits.py: what readers stop at).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sluice.connector import Batch, ErrorKind, RetryableError, SinkError, Store, ThrottledError, WriteContext
from sluice.connectors.s2._client import Connection, explain_sdk_error
from sluice.connectors.s2._commits import opening_token
from sluice.connectors.s2._letters import letter

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

MIB = 1024 * 1024

RETRYABLE_STATUS = {408, 500, 502, 503, 504}
MAX_APPEND_RECORDS = 1000  # S2's limit per append (and 1 MiB metered)
MAX_CONCURRENT_REQUESTS = 64
SESSION_AFTER_APPENDS = 3


class ExactlyOnceConflict(Exception):
    """Another writer appended to or fenced a stream this exactly-once writer owns for the epoch."""


def _about(error: BaseException, stream: str, operation: str) -> BaseException:
    """Tag an SDK error with the stream and operation it failed on (explain() names them); its type stays, so
    retry classification is unchanged."""
    if not hasattr(error, "s2_stream"):
        error.s2_stream = stream  # type: ignore[attr-defined]
        error.s2_operation = operation  # type: ignore[attr-defined]
    return error


def _settle(futures: list[asyncio.Future[None]], error: BaseException | None = None) -> None:
    for future in futures:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


class _StreamWriter:
    """Appends to one stream, in order. Pieces queued while an append is in flight go out together as the next
    append (up to S2's 1000 records / 1 MiB): a write routed over many streams still makes large appends.
    One request per append, sent one after another, until the stream proves busy (SESSION_AFTER_APPENDS): then
    through an append session (pipelined), while the task has one to spare (s2.max-append-sessions). Opening a
    session costs more than a few single appends: a write over 1,000 streams ran 2.9 s with none and 8.9 s with
    one per stream (bench/stores/s2_many_streams.py)."""

    def __init__(self, store: S2Store, name: str) -> None:
        self.store = store
        self.name = name
        self.pending: deque[tuple[list[Any], int, asyncio.Future[None]]] = deque()  # records, bytes, done
        self.wakeup = asyncio.Event()
        self.handle: Any = None
        self.session: Any = None
        self.appends = 0
        self.broken = True
        self.token: str | None = None
        self.next_seq = 0
        self.skip_below = 0  # exactly-once: @wseq values below this are already on the stream
        self.sender = asyncio.get_running_loop().create_task(self._send_loop())

    async def _connect(self) -> None:
        if self.session is not None:
            with contextlib.suppress(Exception):  # the old session already failed; closing is best effort
                await self.session.close()
            self.session = None
            self.store.sessions_open -= 1
        self.handle = stream = self.store.conn.stream(self.store.basin, self.name)
        if self.store.exactly_once:
            await self._fence_and_resume(stream)
        self.broken = False

    async def _open_session_if_busy(self) -> None:
        if self.appends >= SESSION_AFTER_APPENDS and self.store.sessions_open < self.store.max_sessions:
            self.store.sessions_open += 1
            self.session = self.handle.append_session()
            await self.session.__aenter__()

    async def _fence_and_resume(self, stream: Any) -> None:
        import s2_sdk

        ctx = self.store.context
        token = opening_token(self.store.writer_id, ctx.attempt, ctx.task_attempt_id)
        ack = await stream.append(s2_sdk.AppendInput(records=[s2_sdk.CommandRecord.fence(token)]))
        self.token = token
        self.next_seq = ack.end.seq_num
        self.skip_below = await self._resume_point(stream, self.next_seq)

    async def _resume_point(self, stream: Any, tail: int) -> int:
        """@wseq + 1 of this writer's last record on the stream, or 0 when the last data record is someone else's."""
        import s2_sdk

        window = 16
        while True:
            window = min(window, tail)
            if window == 0:
                return 0
            batch = await stream.read(start=s2_sdk.TailOffset(window), limit=s2_sdk.ReadLimit(count=window))
            for record in reversed(batch.records):
                if record.is_command_record():
                    continue
                headers = dict(record.headers)
                if headers.get(b"@writer") == self.store.writer_id:
                    return int(headers[b"@wseq"]) + 1
                return 0
            if window >= tail:
                return 0
            window *= 4

    def enqueue(self, records: list[Any], size: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append((records, size, future))
        self.wakeup.set()
        return future

    def _next_append(self) -> tuple[list[Any], list[asyncio.Future[None]]]:
        """Queued pieces, in order, that fit one append together (at least one piece)."""
        first, size, future = self.pending.popleft()
        records, futures = first, [future]
        while self.pending:
            more, more_size, more_future = self.pending[0]
            if len(records) + len(more) > MAX_APPEND_RECORDS or size + more_size > MIB:
                break
            self.pending.popleft()
            if records is first:
                records = list(first)  # the engine's batch stays as it was handed over
            records.extend(more)
            size += more_size
            futures.append(more_future)
        return records, futures

    async def _send_loop(self) -> None:
        import s2_sdk

        while True:
            await self._wait_for_work()
            records, futures = self._next_append()
            try:
                if self.broken:
                    await self._connect()
                if self.session is None:
                    await self._open_session_if_busy()
                self.appends += 1
                if self.store.exactly_once:
                    if self.skip_below:  # only after resuming: records a previous attempt already wrote
                        records = [r for r in records if int(dict(r.headers)[b"@wseq"]) >= self.skip_below]
                    if not records:
                        _settle(futures)
                        continue
                    inp = s2_sdk.AppendInput(records=records, fencing_token=self.token, match_seq_num=self.next_seq)
                    self.next_seq += len(records)
                else:
                    inp = s2_sdk.AppendInput(records=records)
                if self.session is None:
                    async with self.store.requests:  # no session to spare: one request, acknowledged before the next
                        await self.handle.append(inp)
                    _settle(futures)
                    continue
                ticket = await self.session.submit(inp)
            except Exception as error:
                self.broken = True
                _settle(futures, error)
                continue
            asyncio.get_running_loop().create_task(self._await_ack(ticket, futures))

    async def _wait_for_work(self) -> None:
        while not self.pending:
            self.wakeup.clear()
            await self.wakeup.wait()

    async def _await_ack(self, ticket: Any, futures: list[asyncio.Future[None]]) -> None:
        try:
            await ticket
        except Exception as error:
            self.broken = True  # the session is gone; the next send opens a new one (and re-fences)
            _settle(futures, error)
            return
        _settle(futures)

    async def close(self) -> None:
        self.sender.cancel()
        if self.session is not None and not self.broken:
            with contextlib.suppress(Exception):
                await self.session.close()


class S2Store(Store):
    name = "s2"
    supports_transactions = True
    max_record_bytes = MIB
    max_batch_records = 1000
    max_batch_bytes = MIB

    def __init__(self, conn: Connection, stream_label: str, *, create_streams: bool, create_basin: bool,
                 exactly_once: bool, max_sessions: int = 200, one_stream: str | None = None) -> None:
        """`one_stream`: entries are bare records, all for that stream (a fixed s2.stream; the encoder's
        bare_records); None: entries are (stream, record) pairs."""
        self.conn = conn
        self.one_stream = one_stream
        self.max_sessions = max_sessions
        self.sessions_open = 0
        self.stream_label = stream_label
        self.create_streams = create_streams
        self.create_basin = create_basin
        self.exactly_once = exactly_once
        self.context = WriteContext()
        self.writer_id = b""
        self.streams_written: dict[str, int] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sluice-s2-io", daemon=True)
        self._writers: dict[str, asyncio.Future[_StreamWriter]] = {}
        self.created_on_append = False  # the basin creates missing streams on their first append
        self.client: Any = None
        self.basin: Any = None

    @property
    def target(self) -> str:
        return f"{self.conn.basin}/{self.stream_label}"

    def open(self, context: WriteContext) -> None:
        self.context = context
        epoch = context.epoch if context.epoch is not None else 0
        self.writer_id = f"{context.write_id}/{epoch}/{context.partition_id}".encode()
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    async def _open(self) -> None:
        self.client = self.conn.client()
        # Unary requests in flight at once, besides the sessions: together they stay well inside the HTTP/2
        # concurrent-stream limit of a connection (the server closes a connection that goes past it).
        self.requests = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
        import s2_sdk

        if self.create_basin:
            try:
                ensured = await self.client.ensure_basin(self.conn.basin)  # no config: an existing basin is kept
                if ensured.status == s2_sdk.EnsureStatus.CREATED and self.create_streams:
                    # A basin created for a write that creates streams creates them on append: no request per
                    # new stream (a write routed into 1,000 streams saves 1,000 of them). PATCH: this field only.
                    await self.client.reconfigure_basin(self.conn.basin,
                                                        config=s2_sdk.BasinConfig(create_stream_on_append=True))
            except s2_sdk.S2Error as error:
                raise explain_sdk_error(error, self.conn.basin, None, "create-basin", self.conn) or error from None
        self.basin = self.client.basin(self.conn.basin)
        if self.create_streams and not self.exactly_once:  # exactly-once reads each stream's tail first
            try:
                basin_config = await self.client.get_basin_config(self.conn.basin)
                self.created_on_append = bool(basin_config.create_stream_on_append)
            except s2_sdk.S2Error:  # e.g. a token without get-basin-config: create each stream explicitly
                self.created_on_append = False

    def submit(self, batch: Batch) -> Future[None]:
        if self.one_stream is not None:
            return asyncio.run_coroutine_threadsafe(self._submit_records(batch.entries, batch.size_bytes), self._loop)
        return asyncio.run_coroutine_threadsafe(self._submit(batch.entries, batch.sizes), self._loop)

    async def _submit_records(self, records: Any, size: int) -> None:
        """A batch of bare records for one_stream: queued as it is, no pass over its records."""
        stream = self.one_stream
        assert stream is not None
        writer = await self._writer(stream)
        self.streams_written[stream] = self.streams_written.get(stream, 0) + len(records)
        try:
            await writer.enqueue(records if type(records) is list else list(records), size)
        except BaseException as error:
            raise _about(error, stream, "append") from None

    async def _submit(self, entries: Sequence[Any], sizes: Sequence[int] | NDArray[np.integer]) -> None:
        parts: dict[str, tuple[list[Any], list[int]]] = {}
        for (stream, record), size in zip(entries, sizes if len(sizes) else [0] * len(entries), strict=True):
            records, part_sizes = parts.setdefault(stream, ([], []))
            records.append(record)
            part_sizes.append(size)
        waits = []
        for stream, (records, part_sizes) in parts.items():
            writer = await self._writer(stream)
            waits.append(writer.enqueue(records, sum(part_sizes)))
            self.streams_written[stream] = self.streams_written.get(stream, 0) + len(records)
        results = await asyncio.gather(*waits, return_exceptions=True)
        for stream, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                raise _about(result, stream, "append")

    async def _writer(self, stream: str) -> _StreamWriter:
        future = self._writers.get(stream)
        if future is None:
            future = self._loop.create_future()
            self._writers[stream] = future
            try:
                if self.create_streams and not self.created_on_append:
                    async with self.requests:
                        await self.basin.ensure_stream(stream)
                future.set_result(_StreamWriter(self, stream))
            except Exception as error:
                del self._writers[stream]
                future.set_exception(error)
                raise _about(error, stream, "create-stream") from None
        return await future

    def classify(self, error: BaseException) -> ErrorKind:
        import s2_sdk

        if isinstance(error, ThrottledError):
            return ErrorKind.THROTTLED
        if isinstance(error, RetryableError):
            return ErrorKind.RETRYABLE
        if isinstance(error, (s2_sdk.FencingTokenMismatchError, s2_sdk.SeqNumMismatchError)):
            return ErrorKind.FATAL
        if isinstance(error, s2_sdk.S2ServerError):
            if error.status_code == 429:
                return ErrorKind.THROTTLED
            return ErrorKind.RETRYABLE if error.status_code in RETRYABLE_STATUS else ErrorKind.FATAL
        if isinstance(error, s2_sdk.S2ClientError):
            return ErrorKind.FATAL
        return ErrorKind.RETRYABLE  # transport errors: connection refused/reset, timeouts

    def explain(self, error: SinkError) -> SinkError:
        """Rewrite the errors users hit most into what to do about them."""
        import s2_sdk

        cause = error.cause
        if isinstance(cause, s2_sdk.S2ServerError) and cause.code in ("stream_not_found", "basin_not_found"):
            hint = "s2.create-streams=true" if cause.code == "stream_not_found" else "s2.create-basin=true"
            return SinkError(f"{cause} (writing to {self.target}); create it first or set {hint}.",
                             store=self.name, target=self.target, batch_records=error.batch_records, cause=cause)
        stream, operation = getattr(cause, "s2_stream", None), getattr(cause, "s2_operation", "append")
        refused = explain_sdk_error(cause, self.conn.basin, stream, operation, self.conn) if cause is not None else None
        if refused is not None:
            return SinkError(str(refused), store=self.name, target=self.target, batch_records=error.batch_records,
                             cause=cause)
        if isinstance(cause, s2_sdk.S2ServerError) and "s2-encryption-key" in str(cause):
            return SinkError(f"{cause.message}: set .option('s2.encryption-key', ...) (or S2_ENCRYPTION_KEY) to the "
                             f"basin's key (writing to {self.target}).",
                             store=self.name, target=self.target, batch_records=error.batch_records, cause=cause)
        if isinstance(cause, (s2_sdk.FencingTokenMismatchError, s2_sdk.SeqNumMismatchError)):
            return SinkError(
                f"exactly-once write to {self.target} lost ownership of a stream: another writer fenced or appended "
                f"to it during this micro-batch ({cause}). Exactly-once needs one writer per stream per "
                "micro-batch: repartition by the columns of the s2.stream template (sluice.write() and "
                "sluice.partitioned() do this), or write from a single partition.",
                store=self.name, target=self.target, batch_records=error.batch_records, cause=cause)
        return error

    def refused_rows(self, entries: Sequence[Any]) -> list[dict[str, object]]:
        """A refused record as its stream, body (UTF-8 text, else base64), headers and timestamp; a body over
        S2's record limit cut to its first 64 KiB (LETTER_BODY_BYTES), with body_bytes giving its whole size."""
        return [letter(*(entry if isinstance(entry, tuple) else (self.one_stream, entry))) for entry in entries]

    def pre_commit(self) -> Any:
        return {"streams": dict(self.streams_written), "writer": self.writer_id.decode()}

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            for future in self._writers.values():
                if future.done() and not future.exception():
                    await future.result().close()
            if self.client is not None:
                await self.client.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
