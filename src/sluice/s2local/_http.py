"""The HTTP side of the local S2 server: one request as the handlers see it (headers, query, a body read within a
limit and decompressed, JSON and chunked answers), and the header and query parameters every route reads."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any
from urllib.parse import parse_qs

from sluice.s2local._config import MIB, U64_MAX
from sluice.s2local._errors import S2Error
from sluice.s2local._tokens import Caller
from sluice.s2local._wire import compress

MAX_CONTROL_BODY = 64 * 1024
MAX_DRAIN = 16 * MIB  # past this, an oversize request's connection is simply closed
S2S = "s2s/proto"
PROTO = ("application/x-protobuf", "application/protobuf")
# Query parameters openapi.json types {"type": "integer", "format": "int32", "minimum": 0} (read's `wait`, the
# metrics' `start` and `end`): past this S2 cannot parse them and answers 400 bad_query.
INT32_MAX = 2**31 - 1


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




def basin_of(req: Request) -> str:
    basin = req.header("s2-basin")
    if not basin:
        raise S2Error("bad_header", "basin-scoped requests need the s2-basin header (use a basin endpoint "
                                    "without {basin} in the host)")
    return basin


def header_config(req: Request) -> dict[str, Any] | None:
    """The s2-stream-config header: the config of a stream the request creates (create_stream_on_append/read)."""
    raw = req.header("s2-stream-config")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise S2Error("bad_header", "s2-stream-config is not valid JSON") from None


def int_param(req: Request, name: str, maximum: int | None = None) -> int | None:
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

