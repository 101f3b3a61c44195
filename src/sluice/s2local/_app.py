"""ASGI application speaking S2's v1 API, as the official s2-sdk uses it (served by hypercorn): the routes,
declared path by path (Starlette's Route) and matched on the path as sent; authentication; errors as S2 answers
them. What each route does is in `_control.py` (basins, streams, tokens, metrics) and `_records.py` (appends and
reads); the request wrapper in `_http.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import unquote

from starlette.routing import Match, Route

from sluice.s2local._control import ControlPlane
from sluice.s2local._core import Core
from sluice.s2local._errors import S2Error
from sluice.s2local._http import Request, basin_of, header_config
from sluice.s2local._records import RecordsPlane
from sluice.s2local._tokens import TokenRegistry
from sluice.s2local._wire import terminal_frame

log = logging.getLogger("sluice.s2local")

EVERY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]


class S2App:
    def __init__(self, core: Core, token: str | None = None) -> None:
        self.core = core
        self.tokens = TokenRegistry(token, core.storage.load_tokens())
        self.control = ControlPlane(core, self.tokens)
        self.records = RecordsPlane(core)
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

    def _declare_routes(self) -> list[Route]:
        """S2's v1 API (../shared/specs/s2/openapi.json), path by path; each handler answers every method the path
        has and refuses the others. Stream names are in the caller's namespace (auto_prefix_streams)."""
        stream, control = self._caller_stream, self.control

        def route(path: str, endpoint: Any) -> Route:
            return Route(path, endpoint, methods=EVERY_METHOD)  # Starlette would route a function for GET alone

        return [
            route("/v1/locations", lambda req: control.locations(req, req.method, None)),
            route("/v1/locations/{item}", lambda req, item: control.locations(req, req.method, item)),
            route("/v1/access-tokens", lambda req: control.access_tokens(req, req.method, None)),
            route("/v1/access-tokens/{token_id}",
                  lambda req, token_id: control.access_tokens(req, req.method, token_id)),
            route("/v1/metrics", lambda req: self._get_only(req, control.metrics(req))),
            route("/v1/metrics/{basin}", lambda req, basin: self._get_only(req, control.metrics(req, basin))),
            route("/v1/metrics/{basin}/{name}",
                  lambda req, basin, name: self._get_only(req, control.metrics(req, basin, stream(req, name)))),
            route("/v1/basins", lambda req: control.basins(req, req.method)),
            route("/v1/basins/{name}", lambda req, name: control.basin_item(req, req.method, name)),
            route("/v1/streams", lambda req: control.streams(req, req.method)),
            route("/v1/streams/{name}", lambda req, name: control.stream_item(req, req.method, stream(req, name))),
            route("/v1/streams/{name}/records",
                  lambda req, name: self.records.serve(req, req.method, stream(req, name))),
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
        basin = basin_of(req)
        req.caller.authorize("check-tail", basin=basin, stream=name)
        # S2 creates the stream on a tail check too where the basin says create_stream_on_read.
        stream = await self.core.stream_or_create(basin, name, "create_stream_on_read", header_config(req))
        return await req.json(200, {"tail": {"seq_num": stream.next_seq, "timestamp": stream.last_ts}})
