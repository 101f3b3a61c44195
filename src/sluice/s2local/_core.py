"""The local S2 server's state machine: basins, streams, group-committed appends and reads.

All in-memory state lives on the event loop thread. Appends from every connection go through one FIFO
queue: a group is validated in order against a working copy of the stream state (fencing token, then
match_seq_num; limits; command records), committed in one SQLite transaction, and only then published
and acknowledged. That gives contiguous seq nums, batches that never interleave, and durable acks.

Beside it: S2's names, limits and configs (_config.py), the basins and streams it holds (_resources.py), and the
check of one append against a stream's state (_appends.py). Just past ~400 lines: what is left is the event loop's
state and its one owner (registry, the append queue's group commit, retention, reads).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.s2local._appends import Work, prepare
from sluice.s2local._config import (
    STREAM_DEFAULTS,
    basin_config_view,
    check_basin_name,
    check_stream_name,
    cleared_fields,
    effective_stream_config,
    normalize_stream_config,
    now_ms,
    rfc3339_now,
    set_fields,
)
from sluice.s2local._crypto import check_cipher
from sluice.s2local._errors import S2Error, unwritten
from sluice.s2local._resources import Basin, Session, Stream
from sluice.s2local._storage import Storage

EXPIRE_EVERY_S = 1.0  # how often records past a stream's retention age are looked for


@dataclass
class _Pending:
    stream: Stream
    input: Any  # pb.AppendInput
    session: Session | None
    future: asyncio.Future[bytes]
    raw: bytes | None  # the encoded AppendInput, when the client sent protobuf
    expire_below: int | None = None  # not an append: records below this seq num passed the retention age


class Core:
    def __init__(self, data_dir: Path | None) -> None:
        self.storage = Storage(data_dir)
        self._writer = None if self.storage.in_memory else ThreadPoolExecutor(1, thread_name_prefix="s2-writer")
        self.basins: dict[str, Basin] = {}
        self.streams: dict[tuple[str, str], Stream] = {}
        basins, streams = self.storage.load()
        for name, config, created_at, token in basins:
            self.basins[name] = Basin(name, json.loads(config), created_at, token)
        for row in streams:
            sid, basin, name, config, created_at, token, next_seq, last_ts, fence, trim, cipher = row
            self.streams[(basin, name)] = Stream(sid, basin, name, json.loads(config), created_at, token,
                                                 next_seq, last_ts, fence, trim, cipher, stored_before_start=next_seq)
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._append_loop())
        self._expiry = asyncio.create_task(self._expire_loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        if self._expiry:
            self._expiry.cancel()
        if self._writer:
            self._writer.shutdown(wait=True)
        self.storage.close()

    async def _write(self, fn: Any, *args: Any) -> Any:
        if self._writer is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)

    @staticmethod
    async def _recorded(registry: dict[Any, Any], key: Any) -> Any:
        """The entry a concurrent create is about to record (its durable write is ahead of ours), or None."""
        for _ in range(100):
            if key in registry:
                return registry[key]
            await asyncio.sleep(0.01)
        return None

    # ------------------------------------------------------------------ access tokens (kept by S2App's registry)
    async def save_token(self, token_id: str, info: str) -> None:
        await self._write(self.storage.insert_token, token_id, info)

    async def drop_token(self, token_id: str) -> None:
        await self._write(self.storage.delete_token, token_id)

    # ------------------------------------------------------------------ basins
    def basin(self, name: str) -> Basin:
        basin = self.basins.get(name)
        if basin is None:
            raise S2Error("basin_not_found", f"basin {name!r} not found")
        return basin

    async def create_basin(self, name: str, config: dict[str, Any] | None, token: str | None) -> tuple[Basin, bool]:
        check_basin_name(name)
        existing = self.basins.get(name)
        if existing is not None:
            if token and existing.request_token == token:
                return existing, False  # the same create retried: idempotent
            raise S2Error("resource_already_exists", f"basin {name!r} already exists")
        basin = Basin(name, self._basin_config(config), rfc3339_now(), token)
        try:
            await self._write(self.storage.insert_basin, name, json.dumps(basin.config), basin.created_at, token)
        except sqlite3.IntegrityError:  # created concurrently by another request: its insert won
            raise S2Error("resource_already_exists", f"basin {name!r} already exists") from None
        self.basins[name] = basin
        return basin, True

    def _basin_config(self, config: dict[str, Any] | None, base: dict[str, Any] | None = None, *,
                      reconfigure: bool = False) -> dict[str, Any]:
        out = dict(base or {})
        if config is None:
            return out
        fields = set_fields(config, "basin config", {"default_stream_config", "create_stream_on_append",
                                                      "create_stream_on_read", "stream_cipher"})
        for key in cleared_fields(config, {"default_stream_config", "stream_cipher"}) if reconfigure else ():
            out.pop(key, None)
        for key, value in fields.items():
            if key == "default_stream_config":
                value = normalize_stream_config(value, out.get("default_stream_config"), reconfigure=reconfigure)
            elif key in ("create_stream_on_append", "create_stream_on_read") and not isinstance(value, bool):
                raise S2Error("invalid", f"{key} must be true or false")
            if key == "stream_cipher":
                # May change at any time: it applies to streams created afterwards, each keeps its own (Stream.cipher).
                value = check_cipher(value)
            out[key] = value
        return out

    async def ensure_basin(self, name: str, config: dict[str, Any] | None) -> tuple[Basin, str]:
        check_basin_name(name)
        existing = self.basins.get(name)
        if existing is None:
            try:
                basin, _ = await self.create_basin(name, config, None)
                return basin, "created"
            except S2Error as e:
                if e.code != "resource_already_exists":
                    raise
                # a concurrent create won (another task's ensure); it records the basin once its write returns
                existing = await self._recorded(self.basins, name)
                if existing is None:
                    raise
        new = self._basin_config(config, existing.config)
        # ensure_basin answers "noop" when the effective configuration is unchanged (s2-provision-result), however
        # the request spells it: defaults written out (create_stream_on_append=false) change nothing.
        if basin_config_view(new) == basin_config_view(existing.config):
            return existing, "noop"
        await self._write(self.storage.update_basin, name, json.dumps(new))
        existing.config = new
        return existing, "updated"

    async def reconfigure_basin(self, name: str, config: dict[str, Any] | None) -> Basin:
        basin = self.basin(name)
        new = self._basin_config(config, basin.config, reconfigure=True)
        await self._write(self.storage.update_basin, name, json.dumps(new))
        basin.config = new
        return basin

    async def delete_basin(self, name: str) -> None:
        self.basin(name)
        await self._write(self.storage.delete_basin, name)
        del self.basins[name]
        for key in [k for k in self.streams if k[0] == name]:
            self.streams.pop(key).publish()

    # ------------------------------------------------------------------ streams
    def stream(self, basin: str, name: str) -> Stream:
        self.basin(basin)
        stream = self.streams.get((basin, name))
        if stream is None:
            raise S2Error("stream_not_found", f"stream {name!r} not found in basin {basin!r}")
        return stream

    async def stream_or_create(self, basin: str, name: str, flag: str, header_config: dict[str, Any] | None) -> Stream:
        """The stream, created first if the basin says so for this operation (create_stream_on_append/read)."""
        b = self.basin(basin)
        stream = self.streams.get((basin, name))
        if stream is None and b.config.get(flag):
            try:
                stream, _ = await self.create_stream(basin, name, header_config, None)
            except S2Error as e:  # two appends to a new stream at once: S2 creates it once and both append to it
                if e.code != "resource_already_exists":
                    raise
                stream = await self._recorded(self.streams, (basin, name))  # the winner records it after its write
        if stream is None:
            raise S2Error("stream_not_found", f"stream {name!r} not found in basin {basin!r}")
        return stream

    async def create_stream(self, basin: str, name: str, config: dict[str, Any] | None,
                            token: str | None) -> tuple[Stream, bool]:
        b = self.basin(basin)
        check_stream_name(name)
        existing = self.streams.get((basin, name))
        if existing is not None:
            if token and existing.request_token == token:
                return existing, False
            raise S2Error("resource_already_exists", f"stream {name!r} already exists in basin {basin!r}")
        cfg = normalize_stream_config(config, b.config.get("default_stream_config"))
        created = rfc3339_now()
        cipher = b.config.get("stream_cipher")  # fixed for the stream's life, as S2 does
        try:
            sid = await self._write(self.storage.insert_stream, basin, name, json.dumps(cfg), created, token, cipher)
        except sqlite3.IntegrityError:  # created concurrently by another request: its insert won
            raise S2Error("resource_already_exists", f"stream {name!r} already exists in basin {basin!r}") from None
        if (basin, name) in self.streams:  # created concurrently while we were writing
            raise S2Error("resource_already_exists", f"stream {name!r} already exists in basin {basin!r}")
        stream = Stream(sid, basin, name, cfg, created, token, cipher=cipher)
        self.streams[(basin, name)] = stream
        return stream, True

    async def ensure_stream(self, basin: str, name: str, config: dict[str, Any] | None) -> tuple[Stream, str]:
        existing = self.streams.get((basin, name))
        if existing is None:
            try:
                stream, _ = await self.create_stream(basin, name, config, None)
                return stream, "created"
            except S2Error as e:
                if e.code != "resource_already_exists":
                    raise
                # a concurrent create won; it records the stream once its write returns
                existing = await self._recorded(self.streams, (basin, name))
                if existing is None:
                    raise
        new = normalize_stream_config(config, existing.config)
        # As for basins: "noop" when the effective configuration (S2's defaults filled in) is unchanged.
        if effective_stream_config(new) == effective_stream_config(existing.config):
            return existing, "noop"
        await self._write(self.storage.update_stream, existing.id, json.dumps(new))
        existing.config = new
        return existing, "updated"

    async def reconfigure_stream(self, basin: str, name: str, config: dict[str, Any] | None) -> Stream:
        stream = self.stream(basin, name)
        new = normalize_stream_config(config, stream.config, reconfigure=True)
        await self._write(self.storage.update_stream, stream.id, json.dumps(new))
        stream.config = new
        return stream

    async def delete_stream(self, basin: str, name: str) -> None:
        stream = self.stream(basin, name)
        await self._write(self.storage.delete_stream, stream.id)
        self.streams.pop((basin, name), None)
        stream.publish()

    def list_streams(self, basin: str, prefix: str, start_after: str, limit: int) -> tuple[list[Stream], bool]:
        self.basin(basin)
        names = sorted(n for (b, n) in self.streams if b == basin and n.startswith(prefix) and n > start_after)
        return [self.streams[(basin, n)] for n in names[:limit]], len(names) > limit

    def list_basins(self, prefix: str, start_after: str, limit: int) -> tuple[list[Basin], bool]:
        names = sorted(n for n in self.basins if n.startswith(prefix) and n > start_after)
        return [self.basins[n] for n in names[:limit]], len(names) > limit

    # ------------------------------------------------------------------ appends
    async def append(self, stream: Stream, append_input: Any, session: Session | None = None,
                     raw: bytes | None = None) -> asyncio.Future[bytes]:
        """Queue one AppendInput; the returned future resolves to the encoded AppendAck (or fails)."""
        assert self._queue is not None, "Core.start() was not called"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(stream, append_input, session, future, raw))
        return future

    async def _append_loop(self) -> None:
        assert self._queue is not None
        while True:
            group = [await self._queue.get()]
            while len(group) < 1024 and not self._queue.empty():
                group.append(self._queue.get_nowait())
            await self._apply(group)

    async def _expire_loop(self) -> None:
        """S2's retention_policy.age ("automatic trimming of records older than this threshold"), by the age since
        arrival (a record's timestamp may be a client's, from any time); trimmed through the append queue, so the
        stream's state has one writer. Records stored before the server started, whose arrival it no longer knows,
        go by their timestamps (monotonic in a stream)."""
        queue = self._queue
        if queue is None:  # start() makes the queue before it starts this loop
            raise RuntimeError("Core.start() was not called")
        while True:
            await asyncio.sleep(EXPIRE_EVERY_S)
            for stream in list(self.streams.values()):
                age = (stream.config.get("retention_policy") or STREAM_DEFAULTS["retention_policy"]).get("age")
                if age is None:
                    continue
                cutoff, below = now_ms() - age * 1000, stream.trim_point
                if below < stream.stored_before_start:
                    below = self.storage.first_seq_at(stream.id, cutoff, below, stream.stored_before_start)
                while stream.arrivals and stream.arrivals[0][0] + 1000 < cutoff:  # each entry spans up to 1 s
                    below = max(below, stream.arrivals.popleft()[1])
                if below > stream.trim_point:
                    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
                    queue.put_nowait(_Pending(stream, None, None, future, None, expire_below=below))

    async def _apply(self, group: list[_Pending]) -> None:
        work: dict[int, Work] = {}
        rows: list[tuple[int, int, int, int, bytes]] = []
        results: list[tuple[_Pending, bytes | S2Error]] = []
        for item in group:
            if item.session is not None and item.session.failed is not None:
                results.append((item, S2Error("other", "an earlier batch of this append session failed")))
                continue
            stream = item.stream
            if self.streams.get((stream.basin, stream.name)) is not stream:
                results.append((item, S2Error("stream_not_found", f"stream {stream.name!r} was deleted")))
                continue
            state = work.get(stream.id) or Work(stream.next_seq, stream.last_ts, stream.fencing_token,
                                                  stream.trim_point)
            if item.expire_below is not None:
                state.trim_point = max(state.trim_point, min(item.expire_below, state.next_seq))
                work[stream.id] = state
                results.append((item, b""))
                continue
            try:
                new_rows, ack, new_state = prepare(stream, state, item.input, item.raw)
            except S2Error as error:
                results.append((item, error))
                if item.session is not None:
                    item.session.failed = error
                continue
            work[stream.id] = new_state
            rows.extend(new_rows)
            results.append((item, ack))
        if rows or work:
            states = [(w.next_seq, w.last_ts, w.fencing_token, w.trim_point, sid) for sid, w in work.items()]
            try:
                await self._write(self.storage.commit_appends, rows, states)
            except Exception as error:  # nothing of this group is visible or acknowledged
                failure = S2Error("storage", f"storage failure: {error}")
                for item, _ in results:
                    if item.session is not None:
                        item.session.failed = failure
                    if not item.future.done():
                        item.future.set_exception(failure)
                return
            by_id = {item.stream.id: item.stream for item, _ in results}
            for sid, _seq, _ts, metered, _framed in rows:
                by_id[sid].usage["append-records"] += 1
                by_id[sid].usage["append-bytes"] += metered
            for item, result in results:
                if not isinstance(result, S2Error) and item.expire_below is None:
                    item.stream.usage["append-ops"] += 1
            arrived = now_ms()
            for sid, w in work.items():
                stream = by_id[sid]
                if w.next_seq > stream.next_seq:
                    stream.arrived(arrived, w.next_seq)
                stream.next_seq, stream.last_ts, stream.fencing_token, stream.trim_point = (
                    w.next_seq, w.last_ts, w.fencing_token, w.trim_point)
                stream.publish()
        for item, result in results:
            if item.future.done():
                continue
            if isinstance(result, S2Error):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    # ------------------------------------------------------------------ reads
    def resolve_start(self, stream: Stream, seq_num: int | None, timestamp: int | None, tail_offset: int | None,
                      clamp: bool, *, may_follow: bool, until: int | None = None) -> int:
        """The first seq num to read, as S2 resolves it (s2-lite's read_start_seq_num).

        A start past the tail (a seq num beyond it, a timestamp after the last record's) is 416 with the tail
        unless `clamp`; a start that lands at the tail is 416 too when the read may not wait for new records
        (`may_follow`: a session with no count/bytes/until bound, or a non-zero `wait`).
        """
        if sum(x is not None for x in (seq_num, timestamp, tail_offset)) > 1:
            raise S2Error("bad_query", "only one of seq_num, timestamp, or tail_offset can be provided")
        if timestamp is not None and until is not None and until <= timestamp:
            raise S2Error("invalid", "start `timestamp` exceeds or equal to `until`")
        tail_seq, tail_ts = stream.tail
        past = (seq_num is not None and seq_num > tail_seq) or (timestamp is not None and timestamp > tail_ts)
        if past:
            if not clamp:
                raise unwritten(tail_seq, tail_ts)
            start = tail_seq
        elif seq_num is not None:
            start = max(seq_num, stream.trim_point)
        elif timestamp is not None:
            start = self.storage.first_seq_at(stream.id, timestamp, stream.trim_point, tail_seq)
        else:
            start = max(tail_seq - (tail_offset or 0), stream.trim_point)
        if start >= tail_seq and not may_follow:
            raise unwritten(tail_seq, tail_ts)
        return start

    def read(self, stream: Stream, start: int, count: int, max_bytes: int, until: int | None
             ) -> tuple[list[bytes], int, int, bool]:
        """Records from `start`: (framed records, next seq to read, metered bytes, stopped by `until`)."""
        start = max(start, stream.trim_point)
        rows = self.storage.read(stream.id, start, stream.next_seq, count)
        out: list[bytes] = []
        total = 0
        position = start
        for seq, ts, metered, framed in rows:
            if until is not None and ts >= until:
                return out, position, total, True
            if total + metered > max_bytes:
                break
            out.append(framed)
            total += metered
            position = seq + 1
        return out, position, total, False
