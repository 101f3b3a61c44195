"""The local S2 server's data plane: appends and reads of a stream's records, unary (JSON) or in sessions (s2s,
S2's framed protobuf), with S2's limits, formats, encryption and heartbeats."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from typing import Any

from sluice.s2local import _proto as pb
from sluice.s2local._config import MIB, check_uint
from sluice.s2local._core import Core
from sluice.s2local._crypto import RecordCipher
from sluice.s2local._errors import S2Error
from sluice.s2local._http import INT32_MAX, S2S, Request, basin_of, header_config, int_param
from sluice.s2local._resources import Session, Stream
from sluice.s2local._wire import FrameReader, frame, is_command_record, read_batch, terminal_frame

# The SDK gives up on a silent read session after 20 s; s2-lite sends one every 5-15 s.
HEARTBEAT_S = float(os.environ.get("SLUICE_S2_HEARTBEAT_S", "5"))
# S2 caps a unary read's wait at 60 s; tests that fire many requests (the API fuzz test) lower it.
MAX_UNARY_WAIT_S = int(os.environ.get("SLUICE_S2_MAX_UNARY_WAIT_S", "60"))
MAX_UNARY_APPEND_BODY = 4 * MIB  # 1 MiB of metered bytes, as JSON with base64 at worst
MAX_UNACKED_BATCHES = 1000


def _authorize_commands(req: Request, stream: Stream, inp: Any) -> None:
    """Command records need their own operation: a trim needs `trim`, a fence `fence` (on top of `append`)."""
    for record in inp.records:
        if is_command_record(record):
            op = record.headers[0].value.decode("utf-8", "replace")
            if op in ("trim", "fence"):
                req.caller.authorize(op, basin=stream.basin, stream=stream.name)



def parse_append_input(body: bytes, what: str) -> Any:
    """An AppendInput protobuf, or S2's bad_proto naming `what` was not one."""
    inp = pb.AppendInput()
    try:
        inp.ParseFromString(body)
    except Exception:
        raise S2Error("bad_proto", f"{what} is not a valid AppendInput protobuf") from None
    return inp


class RecordsPlane:
    """/v1/streams/{stream}/records: POST appends, GET reads."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def serve(self, req: Request, method: str, name: str) -> None:
        basin = basin_of(req)
        session = req.content_type() == S2S
        if method in ("GET", "POST"):
            req.caller.authorize("append" if method == "POST" else "read", basin=basin, stream=name)
        if method == "POST":
            stream = await self.core.stream_or_create(basin, name, "create_stream_on_append",
                                                      header_config(req))
            cipher = self._cipher(req, stream)
            return await (self._append_session(req, stream, cipher) if session else
                          self._unary_append(req, stream, cipher))
        if method == "GET":
            if "text/event-stream" in (req.header("accept") or ""):
                raise S2Error("not_implemented", "server-sent events are not implemented; use s2s sessions")
            stream = await self.core.stream_or_create(basin, name, "create_stream_on_read",
                                                      header_config(req))
            cipher = self._cipher(req, stream)
            return await (self._read_session(req, stream, cipher) if session else
                          self._unary_read(req, stream, cipher))
        raise S2Error("bad_path", f"{method} is not allowed on records", 405)

    def _format(self, req: Request) -> str:
        fmt = (req.header("s2-format") or "raw").strip()
        if fmt in ("raw", "json"):
            return "raw"
        if fmt in ("base64", "json-binsafe"):
            return "base64"
        raise S2Error("bad_header", f"s2-format must be raw or base64, got {fmt!r}")

    def _decode_json_input(self, data: Any, fmt: str) -> Any:
        def decode(value: Any, what: str) -> bytes:
            if not isinstance(value, str):
                raise S2Error("invalid", f"{what} must be a string")
            if fmt == "raw":
                return value.encode()
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                raise S2Error("invalid", f"{what} is not valid base64") from None

        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            raise S2Error("invalid", "append body must be {\"records\": [...]}")
        inp = pb.AppendInput()
        for i, rec in enumerate(data["records"]):
            if not isinstance(rec, dict):
                raise S2Error("invalid", f"record {i} must be an object")
            out = inp.records.add()
            if rec.get("timestamp") is not None:
                out.timestamp = check_uint(rec["timestamp"], f"record {i}: timestamp")
            for header in rec.get("headers") or []:
                if not isinstance(header, list) or len(header) != 2:
                    raise S2Error("invalid", f"record {i}: headers are [name, value] pairs")
                out.headers.add(name=decode(header[0], "header name"), value=decode(header[1], "header value"))
            out.body = decode(rec.get("body", ""), "body")
        if data.get("match_seq_num") is not None:
            inp.match_seq_num = check_uint(data["match_seq_num"], "match_seq_num")
        if data.get("fencing_token") is not None:
            if not isinstance(data["fencing_token"], str):
                raise S2Error("invalid", "fencing_token must be a string")
            inp.fencing_token = data["fencing_token"]
        return inp

    def _cipher(self, req: Request, stream: Stream) -> RecordCipher | None:
        """The record cipher of an encrypted stream (the key is required); None for a plain one."""
        name = stream.cipher
        return RecordCipher(name, req.header("s2-encryption-key"), stream.basin, stream.name) if name else None

    async def _unary_append(self, req: Request, stream: Stream, cipher: RecordCipher | None) -> None:
        body = await req.body(MAX_UNARY_APPEND_BODY)
        json_in = req.content_type() == "application/json"
        if json_in:
            try:
                data = json.loads(body)
            except ValueError as error:
                raise S2Error("bad_json", f"append body is not valid JSON: {error}") from None
            inp = self._decode_json_input(data, self._format(req))
        else:
            inp = parse_append_input(body, "append body")
        _authorize_commands(req, stream, inp)
        if cipher is not None:
            inp = cipher.encrypt_input(inp)
        ack = await (await self.core.append(stream, inp, raw=None if json_in or cipher else body))
        if (req.header("accept") or "").startswith("application/json") or (json_in and not req.header("accept")):
            parsed = pb.AppendAck()
            parsed.ParseFromString(ack)
            pos = {k: {"seq_num": getattr(parsed, k).seq_num, "timestamp": getattr(parsed, k).timestamp}
                   for k in ("start", "end", "tail")}
            return await req.json(200, pos)
        return await req.respond(200, ack, "application/x-protobuf")

    def _read_params(self, req: Request, stream: Stream, *, unary: bool
                     ) -> tuple[int, int | None, int | None, int | None, int | None]:
        clamp = (req.query.get("clamp") or "").lower() == "true"
        count, max_bytes = int_param(req, "count"), int_param(req, "bytes")
        until, wait = int_param(req, "until"), int_param(req, "wait", INT32_MAX)
        if unary and wait is not None:
            wait = min(wait, MAX_UNARY_WAIT_S)  # S2 clamps a unary read's wait, it does not refuse it
        # Unary reads are always bounded (1000 records / 1 MiB); sessions follow the tail when unbounded.
        unbounded = not unary and count is None and max_bytes is None and until is None
        may_follow = unbounded or bool(wait)
        start = self.core.resolve_start(stream, int_param(req, "seq_num"), int_param(req, "timestamp"),
                                        int_param(req, "tail_offset"), clamp, may_follow=may_follow, until=until)
        return start, count, max_bytes, until, wait

    async def _unary_read(self, req: Request, stream: Stream, cipher: RecordCipher | None) -> None:
        start, count, max_bytes, until, wait = self._read_params(req, stream, unary=True)
        count = min(count if count is not None else 1000, 1000)
        max_bytes = min(max_bytes if max_bytes is not None else MIB, MIB)
        deadline = time.monotonic() + (wait or 0)
        while True:
            records, position, used, hit_until = self.core.read(stream, start, count, max_bytes, until)
            if records or hit_until or time.monotonic() >= deadline or count == 0:
                break
            changed = stream.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), deadline - time.monotonic())
        tail = stream.tail if position >= stream.next_seq else None
        payload = read_batch(cipher.decrypt_framed(records) if cipher else records, tail)
        stream.usage["read-ops"] += 1
        stream.usage["read-bytes"] += used
        if (req.header("accept") or "").startswith("application/json"):
            return await req.json(200, self._batch_json(payload, self._format(req)))
        return await req.respond(200, payload, "application/x-protobuf")

    def _batch_json(self, payload: bytes, fmt: str) -> dict[str, Any]:
        batch = pb.ReadBatch()
        batch.ParseFromString(payload)

        def enc(value: bytes) -> str:
            return value.decode("utf-8", "replace") if fmt == "raw" else base64.b64encode(value).decode()

        records = []
        for r in batch.records:
            item: dict[str, Any] = {"seq_num": r.seq_num, "timestamp": r.timestamp}
            if r.headers:
                item["headers"] = [[enc(h.name), enc(h.value)] for h in r.headers]
            if r.body:
                item["body"] = enc(r.body)
            records.append(item)
        out: dict[str, Any] = {"records": records}
        if batch.HasField("tail"):
            out["tail"] = {"seq_num": batch.tail.seq_num, "timestamp": batch.tail.timestamp}
        return out

    async def _append_session(self, req: Request, stream: Stream, cipher: RecordCipher | None) -> None:
        codec = req.response_codec()
        await req.start(200, S2S)
        session = Session()
        acks: asyncio.Queue[asyncio.Future[bytes] | S2Error | None] = asyncio.Queue(MAX_UNACKED_BATCHES)

        async def read_inputs() -> None:
            frames = FrameReader()
            try:
                while True:
                    message = await req.receive()
                    if message["type"] == "http.disconnect":
                        req.disconnected.set()
                        await acks.put(None)
                        return
                    for body in frames.feed(message.get("body", b"")):
                        inp = parse_append_input(body, "frame")
                        _authorize_commands(req, stream, inp)
                        raw: bytes | None = body  # the input as received, stored as it is unless re-encrypted
                        if cipher is not None:
                            inp, raw = cipher.encrypt_input(inp), None
                        await acks.put(await self.core.append(stream, inp, session, raw))
                    if not message.get("more_body"):
                        if frames.pending:
                            raise S2Error("bad_frame", "request ended inside a frame")
                        await acks.put(None)
                        return
            except S2Error as error:
                session.failed = error
                await acks.put(error)

        reader = asyncio.create_task(read_inputs())
        try:
            while True:
                item = await acks.get()
                if item is None:
                    if not req.disconnected.is_set():
                        await req.chunk(b"", more=False)
                    return
                if isinstance(item, S2Error):
                    await req.chunk(terminal_frame(item), more=False)
                    return
                try:
                    ack = await item
                except S2Error as error:
                    await req.chunk(terminal_frame(error), more=False)
                    return
                await req.chunk(frame(ack, codec))
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _read_session(self, req: Request, stream: Stream, cipher: RecordCipher | None) -> None:
        start, count, max_bytes, until, wait = self._read_params(req, stream, unary=False)
        bounded = count is not None or max_bytes is not None or until is not None
        if wait is None:
            wait = 0 if bounded else None  # S2: 0 with a bound on count/bytes/until, otherwise follow forever
        stream.usage["read-ops"] += 1
        codec = req.response_codec()
        await req.start(200, S2S)

        async def watch_disconnect() -> None:
            while (await req.receive())["type"] != "http.disconnect":
                pass
            req.disconnected.set()

        watcher = asyncio.create_task(watch_disconnect())
        position, last_data = start, time.monotonic()
        following = False  # waiting at the tail for new records, rather than catching up from storage
        try:
            while not req.disconnected.is_set():
                if self.core.streams.get((stream.basin, stream.name)) is not stream:
                    raise S2Error("stream_not_found", f"stream {stream.name!r} was deleted")
                take = 1000 if count is None else min(count, 1000)
                cap = MIB if max_bytes is None else min(max_bytes, MIB)
                changed = stream.changed
                records, position, used, hit_until = self.core.read(stream, position, take, cap, until)
                if records:
                    stream.usage["read-bytes"] += used
                    caught_up = position >= stream.next_seq
                    if cipher is not None:
                        records = cipher.decrypt_framed(records)
                    await req.chunk(frame(read_batch(records, stream.tail if caught_up else None), codec))
                    last_data = time.monotonic()
                    if count is not None:
                        count -= len(records)
                    if max_bytes is not None:
                        max_bytes -= used
                    if count == 0 or max_bytes == 0 or hit_until:
                        break
                    if not caught_up:
                        following = False
                        continue
                if hit_until or (count is not None and take == 0):
                    break
                if position < stream.next_seq:
                    if not records and cap > 0:
                        break  # the next record is larger than what the byte limit allows
                    following = False
                    continue
                remaining = None if wait is None else wait - (time.monotonic() - last_data)
                if remaining is not None and remaining <= 0:
                    break
                if not following:
                    # s2.proto ReadBatch: "A heartbeat will be sent whenever a switch to following in real-time
                    # happens, and then at a randomized gap between 5 and 15 seconds": the tail, at once, is how a
                    # reader learns it has caught up (the SDK's ReadSession.caught_up) on a stream with nothing new.
                    await req.chunk(frame(read_batch([], stream.tail)))
                    following = True
                timeout = HEARTBEAT_S if remaining is None else min(HEARTBEAT_S, remaining)
                try:
                    await asyncio.wait_for(changed.wait(), timeout)
                except TimeoutError:
                    await req.chunk(frame(read_batch([], stream.tail)))  # heartbeat
            if not req.disconnected.is_set():
                await req.chunk(b"", more=False)
        finally:
            watcher.cancel()
