"""ASGI application speaking S2's v1 API, as the official s2-sdk uses it (served by hypercorn).

The routes are declared (`S2App._declare_routes`, Starlette's Route) and matched on the path as sent. One module
past ~400 lines: the handlers, the JSON shapes and the append/read sessions share the request wrapper and the
calls into the core; they are the next split.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import logging
import os
import time
from typing import Any
from urllib.parse import parse_qs, unquote

from s2_sdk._generated.s2.v1 import s2_pb2 as pb
from starlette.routing import Match, Route

from sluice.s2local._core import (
    MIB,
    U64_MAX,
    Core,
    Session,
    Stream,
    basin_config_view,
    check_uint,
    effective_stream_config,
)
from sluice.s2local._crypto import RecordCipher
from sluice.s2local._errors import S2Error
from sluice.s2local._tokens import Caller, TokenRegistry
from sluice.s2local._wire import FrameReader, compress, frame, is_command_record, read_batch, terminal_frame

log = logging.getLogger("sluice.s2local")

# The SDK gives up on a silent read session after 20 s; s2-lite sends one every 5-15 s.
HEARTBEAT_S = float(os.environ.get("SLUICE_S2_HEARTBEAT_S", "5"))
MAX_CONTROL_BODY = 64 * 1024
# S2 caps a unary read's wait at 60 s; tests that fire many requests (the API fuzz test) lower it.
MAX_UNARY_WAIT_S = int(os.environ.get("SLUICE_S2_MAX_UNARY_WAIT_S", "60"))
# Query parameters openapi.json types {"type": "integer", "format": "int32", "minimum": 0} (read's `wait`, the
# metrics' `start` and `end`): past this S2 cannot parse them and answers 400 bad_query.
INT32_MAX = 2**31 - 1
MAX_UNARY_APPEND_BODY = 4 * MIB  # 1 MiB of metered bytes, as JSON with base64 at worst
MAX_UNACKED_BATCHES = 1000
MAX_DRAIN = 16 * MIB  # past this, an oversize request's connection is simply closed
S2S = "s2s/proto"
PROTO = ("application/x-protobuf", "application/protobuf")
# The one location this server is (s2-sdk's LocationInfo; basins report it as their location).
LOCATION = {"name": "local", "is_private": True, "storage_classes": ["express", "standard"],
            "default_storage_class": "express"}
METRIC_SETS = {
    "account": ("active-basins", "account-ops", "estimated-billable-usage"),
    "basin": ("storage", "append-ops", "read-ops", "read-throughput", "append-throughput", "basin-ops"),
    "stream": ("storage",),
}
INTERVALS = ("minute", "hour", "day")
EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]


class Request:
    def __init__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope
        self.method = scope["method"]
        raw = scope.get("raw_path") or scope["path"].encode()
        # The path as sent, each segment still percent-encoded: stream names may contain an encoded '/'.
        self.raw_segments = [s.decode("latin-1") for s in raw.split(b"?")[0].split(b"/") if s]
        self.query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.receive = receive
        self._send = send
        self.started = False
        self.body_read = False
        self.disconnected = asyncio.Event()
        self.caller = Caller()

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def content_type(self) -> str:
        return (self.header("content-type") or "").split(";")[0].strip().lower()

    def response_codec(self) -> str | None:
        accept = self.header("accept-encoding") or ""
        for codec in ("zstd", "gzip"):
            if codec in accept:
                return codec
        return None

    async def body(self, limit: int) -> bytes:
        chunks = bytearray()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                raise asyncio.CancelledError
            chunks.extend(message.get("body", b""))
            if len(chunks) > limit:
                await self._discard_rest(message)
                raise S2Error("payload_too_large", f"request body over {limit} bytes")
            if not message.get("more_body"):
                break
        self.body_read = True
        data = bytes(chunks)
        encoding = (self.header("content-encoding") or "").lower()
        if encoding == "zstd":
            import zstandard

            try:
                data = zstandard.ZstdDecompressor().decompress(data, max_output_size=limit)
            except Exception as error:
                raise S2Error("bad_header", f"cannot decompress zstd body: {error}") from None
        elif encoding == "gzip":
            try:
                data = gzip.decompress(data)
            except Exception as error:
                raise S2Error("bad_header", f"cannot decompress gzip body: {error}") from None
        return data

    async def drain(self) -> None:
        """Before an early error answer to a unary request: read what is left of its body (see below)."""
        if not self.body_read and self.content_type() != S2S:
            await self._discard_rest({"more_body": True})

    async def _discard_rest(self, message: dict[str, Any]) -> None:
        """Read (and drop) the rest of an oversize body, up to MAX_DRAIN, so the client gets the 413.

        Answering while the client is still sending makes hypercorn drop the connection instead.
        """
        drained = 0
        self.body_read = True
        while message.get("more_body") and drained < MAX_DRAIN:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
                return
            drained += len(message.get("body", b""))

    async def start(self, status: int, content_type: str, extra: list[tuple[str, str]] | None = None) -> None:
        headers = [(b"content-type", content_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in extra or []]
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def chunk(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, body: bytes, content_type: str = "application/json",
                      extra: list[tuple[str, str]] | None = None) -> None:
        extra = list(extra or [])
        codec = self.response_codec()
        if codec and len(body) >= 1024:
            body = compress(body, codec)
            extra.append(("content-encoding", codec))
        await self.start(status, content_type, extra)
        await self.chunk(body, more=False)

    async def json(self, status: int, data: Any, extra: list[tuple[str, str]] | None = None) -> None:
        await self.respond(status, json.dumps(data).encode(), "application/json", extra)

    async def json_body(self) -> Any:
        data = await self.body(MAX_CONTROL_BODY)
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError as error:
            raise S2Error("bad_json", f"request body is not valid JSON: {error}") from None


def _accumulation(name: str, unit: str, interval: str, now: int, value: float) -> dict[str, Any]:
    return {"accumulation": {"name": name, "unit": unit, "interval": interval, "values": [[now, float(value)]]}}


def _authorize_commands(req: Request, stream: Stream, inp: Any) -> None:
    """Command records need their own operation: a trim needs `trim`, a fence `fence` (on top of `append`)."""
    for record in inp.records:
        if is_command_record(record):
            op = record.headers[0].value.decode("utf-8", "replace")
            if op in ("trim", "fence"):
                req.caller.authorize(op, basin=stream.basin, stream=stream.name)


def _int_param(req: Request, name: str, maximum: int | None = None) -> int | None:
    raw = req.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise S2Error("bad_query", f"query parameter {name} must be a whole number") from None
    highest = U64_MAX if maximum is None else maximum
    if not 0 <= value <= highest:
        raise S2Error("bad_query", f"query parameter {name} must be between 0 and {highest}")
    return value


def _check_location(body: Any) -> None:
    """create_basin/ensure_basin's `location` (s2-sdk: "Use list_locations or get_default_location to discover valid
    values"): this server is one location, so any other name is refused, as set_default_location refuses it."""
    location = body.get("location") if isinstance(body, dict) else None
    if location is not None and location != LOCATION["name"]:
        raise S2Error("invalid", f"location {location!r} is not available; this server has one location, "
                                 f"{LOCATION['name']!r}")


def _page_params(req: Request) -> tuple[str, str, int]:
    limit = _int_param(req, "limit")
    return req.query.get("prefix", ""), req.query.get("start_after", ""), 1000 if limit is None else min(limit, 1000)


class S2App:
    def __init__(self, core: Core, token: str | None = None) -> None:
        self.core = core
        self.tokens = TokenRegistry(token, core.storage.load_tokens())
        self.routes = self._declare_routes()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        req = Request(scope, receive, send)
        try:
            req.caller = self.tokens.authenticate(req.header("authorization"))
            await self._route(req)
        except asyncio.CancelledError:
            pass
        except S2Error as error:
            await self._fail(req, error)
        except Exception as error:  # a bug must answer 500, never kill the server
            log.exception("internal error on %s %s", req.method, scope.get("path"))
            await self._fail(req, S2Error("other", f"internal error: {type(error).__name__}"))

    async def _fail(self, req: Request, error: S2Error) -> None:
        with contextlib.suppress(Exception):
            if not req.started:
                await req.drain()
                await req.respond(error.status, error.body())
            else:
                await req.chunk(terminal_frame(error), more=False)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.core.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.core.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _basin(self, req: Request) -> str:
        basin = req.header("s2-basin")
        if not basin:
            raise S2Error("bad_header", "basin-scoped requests need the s2-basin header (use a basin endpoint "
                                        "without {basin} in the host)")
        return basin

    def _declare_routes(self) -> list[Route]:
        """S2's v1 API (../shared/specs/s2/openapi.json), path by path; each handler answers every method the path
        has and refuses the others. Stream names are in the caller's namespace (auto_prefix_streams)."""
        stream = self._caller_stream

        def route(path: str, endpoint: Any) -> Route:
            return Route(path, endpoint, methods=EVERY_METHOD)  # Starlette would route a function for GET alone

        return [
            route("/v1/locations", lambda req: self._locations(req, req.method, None)),
            route("/v1/locations/{item}", lambda req, item: self._locations(req, req.method, item)),
            route("/v1/access-tokens", lambda req: self._access_tokens(req, req.method, None)),
            route("/v1/access-tokens/{token_id}", lambda req, token_id: self._access_tokens(req, req.method, token_id)),
            route("/v1/metrics", lambda req: self._get_only(req, self._metrics(req))),
            route("/v1/metrics/{basin}", lambda req, basin: self._get_only(req, self._metrics(req, basin))),
            route("/v1/metrics/{basin}/{name}",
                  lambda req, basin, name: self._get_only(req, self._metrics(req, basin, stream(req, name)))),
            route("/v1/basins", lambda req: self._basins(req, req.method)),
            route("/v1/basins/{name}", lambda req, name: self._basin_item(req, req.method, name)),
            route("/v1/streams", lambda req: self._streams(req, req.method)),
            route("/v1/streams/{name}", lambda req, name: self._stream_item(req, req.method, stream(req, name))),
            route("/v1/streams/{name}/records", lambda req, name: self._records(req, req.method, stream(req, name))),
            route("/v1/streams/{name}/records/tail",
                  lambda req, name: self._get_only(req, self._tail(req, stream(req, name)))),
        ]

    async def _route(self, req: Request) -> None:
        if len(req.raw_segments) < 2 or req.raw_segments[0] != "v1":
            raise S2Error("bad_path", f"no such endpoint: {req.scope.get('path')}", 404)
        # Matched on the path as sent, so that an encoded '/' in a stream name stays inside its segment.
        where = {"type": "http", "method": req.method, "path": "/" + "/".join(req.raw_segments)}
        for route in self.routes:
            found, child = route.matches(where)
            if found is Match.FULL:
                return await route.endpoint(req, **{k: unquote(v) for k, v in child["path_params"].items()})
        raise S2Error("bad_path", f"no such endpoint: {req.method} {req.scope.get('path')}", 404)

    @staticmethod
    def _caller_stream(req: Request, name: str) -> str:
        return req.caller.stream_name(name)

    @staticmethod
    async def _get_only(req: Request, answer: Any) -> None:
        """Paths S2 serves for GET alone: anything else is no such endpoint (the coroutine never runs)."""
        if req.method != "GET":
            answer.close()
            raise S2Error("bad_path", f"no such endpoint: {req.method} {req.scope.get('path')}", 404)
        await answer

    async def _tail(self, req: Request, name: str) -> None:
        basin = self._basin(req)
        req.caller.authorize("check-tail", basin=basin, stream=name)
        # S2 creates the stream on a tail check too where the basin says create_stream_on_read.
        stream = await self.core.stream_or_create(basin, name, "create_stream_on_read", self._header_config(req))
        return await req.json(200, {"tail": {"seq_num": stream.next_seq, "timestamp": stream.last_ts}})

    # ------------------------------------------------------------------ control plane
    async def _locations(self, req: Request, method: str, item: str | None) -> None:
        """s2-sdk's list_locations, get_default_location and set_default_location: this server is one location,
        so it is the list and the default, and setting the default to it is all that can succeed."""
        if item is None and method == "GET":
            req.caller.authorize("list-locations")
            return await req.json(200, [LOCATION])
        if item == "default" and method == "GET":
            req.caller.authorize("get-default-location")
            return await req.json(200, LOCATION)
        if item == "default" and method == "PUT":
            req.caller.authorize("set-default-location")
            name = await req.json_body()
            if name != LOCATION["name"]:
                raise S2Error("invalid", f"location {name!r} is not available; this server has one location, "
                                         f"{LOCATION['name']!r}")
            return await req.json(200, LOCATION)
        raise S2Error("bad_path", f"no such endpoint: {method} {req.scope.get('path')}", 404)

    def _stream_info(self, req: Request, stream: Stream) -> dict[str, Any]:
        """StreamInfo as the caller is shown it: the name without its namespace (auto_prefix_streams)."""
        info = stream.info()
        info["name"] = req.caller.visible_name(info["name"])
        return info

    async def _basins(self, req: Request, method: str) -> None:
        if method == "GET":
            req.caller.authorize("list-basins")
            basins, more = self.core.list_basins(*_page_params(req))
            seen = [b.info() for b in basins if req.caller.may_see("basins", b.name)]
            return await req.json(200, {"basins": seen, "has_more": more})
        if method == "POST":
            body = await req.json_body()
            if not isinstance(body, dict) or not isinstance(body.get("basin"), str):
                raise S2Error("invalid", "body must be {\"basin\": NAME, \"config\": {...}}")
            req.caller.authorize("create-basin", basin=body["basin"])
            _check_location(body)
            basin, created = await self.core.create_basin(body["basin"], body.get("config"),
                                                          req.header("s2-request-token"))
            return await req.json(201 if created else 200, basin.info())
        raise S2Error("bad_path", f"{method} is not allowed on /v1/basins", 405)

    async def _basin_item(self, req: Request, method: str, name: str) -> None:
        exists = name in self.core.basins
        op = {"GET": "get-basin-config", "PATCH": "reconfigure-basin", "DELETE": "delete-basin",
              "PUT": "reconfigure-basin" if exists else "create-basin"}.get(method)
        if op:
            req.caller.authorize(op, basin=name)
        if method == "GET":
            return await req.json(200, basin_config_view(self.core.basin(name).config))
        if method == "PUT":
            body = await req.json_body() or {}
            _check_location(body)
            basin, result = await self.core.ensure_basin(name, body.get("config") if isinstance(body, dict) else None)
            status = 201 if result == "created" else 200
            return await req.json(status, basin.info(), [("s2-provision-result", result)])
        if method == "PATCH":
            body = await req.json_body()
            if not isinstance(body, dict):
                raise S2Error("invalid", "a basin reconfiguration is a JSON object of the fields to change")
            basin = await self.core.reconfigure_basin(name, body)
            return await req.json(200, basin_config_view(basin.config))
        if method == "DELETE":
            await self.core.delete_basin(name)
            return await req.respond(202, b"")
        raise S2Error("bad_path", f"{method} is not allowed on a basin", 405)

    async def _streams(self, req: Request, method: str) -> None:
        basin = self._basin(req)
        if method == "GET":
            req.caller.authorize("list-streams", basin=basin)
            prefix, start_after, limit = _page_params(req)
            # `prefix` and `start_after` are relative to a namespaced caller's namespace, as are the names it gets.
            namespace = req.caller.namespace
            streams, more = self.core.list_streams(basin, namespace + prefix, namespace + start_after, limit)
            seen = [self._stream_info(req, s) for s in streams if req.caller.may_see("streams", s.name)]
            return await req.json(200, {"streams": seen, "has_more": more})
        if method == "POST":
            body = await req.json_body()
            if not isinstance(body, dict) or not isinstance(body.get("stream"), str):
                raise S2Error("invalid", "body must be {\"stream\": NAME, \"config\": {...}}")
            name = req.caller.stream_name(body["stream"])
            req.caller.authorize("create-stream", basin=basin, stream=name)
            stream, created = await self.core.create_stream(basin, name, body.get("config"),
                                                            req.header("s2-request-token"))
            return await req.json(201 if created else 200, self._stream_info(req, stream))
        raise S2Error("bad_path", f"{method} is not allowed on /v1/streams", 405)

    async def _stream_item(self, req: Request, method: str, name: str) -> None:
        basin = self._basin(req)
        exists = (basin, name) in self.core.streams
        op = {"GET": "get-stream-config", "PATCH": "reconfigure-stream", "DELETE": "delete-stream",
              "PUT": "reconfigure-stream" if exists else "create-stream"}.get(method)
        if op:
            req.caller.authorize(op, basin=basin, stream=name)
        if method == "GET":
            return await req.json(200, effective_stream_config(self.core.stream(basin, name).config))
        if method == "PUT":
            stream, result = await self.core.ensure_stream(basin, name, await req.json_body())
            status = 201 if result == "created" else 200
            return await req.json(status, self._stream_info(req, stream), [("s2-provision-result", result)])
        if method == "PATCH":
            body = await req.json_body()
            if not isinstance(body, dict):
                raise S2Error("invalid", "a stream reconfiguration is a JSON object of the fields to change")
            stream = await self.core.reconfigure_stream(basin, name, body)
            return await req.json(200, effective_stream_config(stream.config))
        if method == "DELETE":
            await self.core.delete_stream(basin, name)
            return await req.respond(202, b"")
        raise S2Error("bad_path", f"{method} is not allowed on a stream", 405)

    # ------------------------------------------------------------------ access tokens and metrics
    async def _access_tokens(self, req: Request, method: str, token_id: str | None) -> None:
        if token_id is None and method == "GET":
            req.caller.authorize("list-access-tokens")
            tokens, more = self.tokens.page(req.caller, *_page_params(req))
            return await req.json(200, {"access_tokens": [t.info(req.caller.namespace) for t in tokens],
                                        "has_more": more})
        if token_id is None and method == "POST":
            token, secret = self.tokens.issue(await req.json_body(), req.caller)
            await self.core.save_token(token.id, token.to_json())
            self.tokens.add(token)
            return await req.json(201, {"access_token": secret})
        if token_id is not None and method == "DELETE":
            req.caller.authorize("revoke-access-token", token_id=token_id)
            token = self.tokens.remove(token_id)
            await self.core.drop_token(token.id)
            return await req.json(200, token.info(req.caller.namespace))
        raise S2Error("bad_path", f"{method} is not allowed on {req.scope.get('path')}", 405)

    async def _metrics(self, req: Request, basin: str | None = None, stream: str | None = None) -> None:
        """What this server knows: its basins, and per basin/stream the records and bytes appended, read and
        stored (ops and throughput count since the server started; storage is what is stored now)."""
        level = "stream" if stream is not None else "basin" if basin is not None else "account"
        req.caller.authorize(f"{level}-metrics", basin=basin, stream=stream)
        metric_set = req.query.get("set")
        if metric_set not in METRIC_SETS[level]:
            raise S2Error("bad_query", f"set must be one of {', '.join(METRIC_SETS[level])} for {level} metrics")
        interval = req.query.get("interval") or "minute"
        if interval not in INTERVALS:
            raise S2Error("bad_query", f"interval must be one of {', '.join(INTERVALS)}")
        start, end = _int_param(req, "start", INT32_MAX), _int_param(req, "end", INT32_MAX)
        if start is not None and end is not None and start > end:
            # A range that ends before it starts: the metrics operations list 400 (ErrorInfo) for bad requests.
            raise S2Error("bad_query", f"start ({start}) must not be after end ({end})")
        now = int(time.time())
        if level == "account":
            if metric_set == "active-basins":
                names = sorted(b for b in self.core.basins if req.caller.may_see("basins", b))
                return await req.json(200, {"values": [{"label": {"name": "active-basins", "values": names}}]})
            if metric_set == "estimated-billable-usage":  # a local server bills nothing
                return await req.json(200, {"values": [_accumulation(metric_set, "usd", interval, now, 0)]})
            total = sum(sum(s.usage[k] for k in ("append-ops", "read-ops")) for s in self.core.streams.values())
            return await req.json(200, {"values": [_accumulation("account-ops", "operations", interval, now,
                                                                 total)]})
        self.core.basin(basin)
        streams = [self.core.stream(basin, stream)] if stream is not None else \
            [s for (b, _), s in self.core.streams.items() if b == basin]
        if metric_set == "storage":
            _, stored = self.core.storage.stored([s.id for s in streams])
            return await req.json(200, {"values": [{"gauge": {"name": "storage", "unit": "bytes",
                                                              "values": [[now, float(stored)]]}}]})
        key, unit = {"append-ops": ("append-ops", "operations"), "read-ops": ("read-ops", "operations"),
                     "append-throughput": ("append-bytes", "bytes"), "read-throughput": ("read-bytes", "bytes"),
                     "basin-ops": ("append-ops", "operations")}[metric_set]
        total = sum(s.usage[key] for s in streams)
        if metric_set == "basin-ops":
            total += sum(s.usage["read-ops"] for s in streams)
        return await req.json(200, {"values": [_accumulation(metric_set, unit, interval, now, total)]})

    # ------------------------------------------------------------------ data plane
    def _header_config(self, req: Request) -> dict[str, Any] | None:
        raw = req.header("s2-stream-config")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise S2Error("bad_header", "s2-stream-config is not valid JSON") from None

    async def _records(self, req: Request, method: str, name: str) -> None:
        basin = self._basin(req)
        session = req.content_type() == S2S
        if method in ("GET", "POST"):
            req.caller.authorize("append" if method == "POST" else "read", basin=basin, stream=name)
        if method == "POST":
            stream = await self.core.stream_or_create(basin, name, "create_stream_on_append",
                                                      self._header_config(req))
            cipher = self._cipher(req, stream)
            return await (self._append_session(req, stream, cipher) if session else
                          self._unary_append(req, stream, cipher))
        if method == "GET":
            if "text/event-stream" in (req.header("accept") or ""):
                raise S2Error("not_implemented", "server-sent events are not implemented; use s2s sessions")
            stream = await self.core.stream_or_create(basin, name, "create_stream_on_read",
                                                      self._header_config(req))
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
            inp = pb.AppendInput()
            try:
                inp.ParseFromString(body)
            except Exception:
                raise S2Error("bad_proto", "append body is not a valid AppendInput protobuf") from None
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
        count, max_bytes = _int_param(req, "count"), _int_param(req, "bytes")
        until, wait = _int_param(req, "until"), _int_param(req, "wait", INT32_MAX)
        if unary and wait is not None:
            wait = min(wait, MAX_UNARY_WAIT_S)  # S2 clamps a unary read's wait, it does not refuse it
        # Unary reads are always bounded (1000 records / 1 MiB); sessions follow the tail when unbounded.
        unbounded = not unary and count is None and max_bytes is None and until is None
        may_follow = unbounded or bool(wait)
        start = self.core.resolve_start(stream, _int_param(req, "seq_num"), _int_param(req, "timestamp"),
                                        _int_param(req, "tail_offset"), clamp, may_follow=may_follow, until=until)
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
                        inp = pb.AppendInput()
                        try:
                            inp.ParseFromString(body)
                        except Exception:
                            raise S2Error("bad_proto", "frame is not a valid AppendInput protobuf") from None
                        _authorize_commands(req, stream, inp)
                        if cipher is not None:
                            inp, body = cipher.encrypt_input(inp), None
                        await acks.put(await self.core.append(stream, inp, session, body))
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

