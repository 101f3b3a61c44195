"""The local S2 server's control plane (S2's v1 API: locations, basins, streams, access tokens, metrics): what
each route answers, as S2's OpenAPI document shapes it."""

from __future__ import annotations

import time
from typing import Any

from sluice.s2local._config import basin_config_view, effective_stream_config
from sluice.s2local._core import Core
from sluice.s2local._errors import S2Error
from sluice.s2local._http import INT32_MAX, Request, basin_of, int_param
from sluice.s2local._resources import Stream
from sluice.s2local._tokens import TokenRegistry

# The one location this server is (s2-sdk's LocationInfo; basins report it as their location).
LOCATION = {"name": "local", "is_private": True, "storage_classes": ["express", "standard"],
            "default_storage_class": "express"}
METRIC_SETS = {
    "account": ("active-basins", "account-ops", "estimated-billable-usage"),
    "basin": ("storage", "append-ops", "read-ops", "read-throughput", "append-throughput", "basin-ops"),
    "stream": ("storage",),
}
INTERVALS = ("minute", "hour", "day")


def _accumulation(name: str, unit: str, interval: str, now: int, value: float) -> dict[str, Any]:
    return {"accumulation": {"name": name, "unit": unit, "interval": interval, "values": [[now, float(value)]]}}



def _check_location(body: Any) -> None:
    """create_basin/ensure_basin's `location` (s2-sdk: "Use list_locations or get_default_location to discover valid
    values"): this server is one location, so any other name is refused, as set_default_location refuses it."""
    location = body.get("location") if isinstance(body, dict) else None
    if location is not None and location != LOCATION["name"]:
        raise S2Error("invalid", f"location {location!r} is not available; this server has one location, "
                                 f"{LOCATION['name']!r}")



def _page_params(req: Request) -> tuple[str, str, int]:
    limit = int_param(req, "limit")
    return req.query.get("prefix", ""), req.query.get("start_after", ""), 1000 if limit is None else min(limit, 1000)



class ControlPlane:
    def __init__(self, core: Core, tokens: TokenRegistry) -> None:
        self.core = core
        self.tokens = tokens

    async def locations(self, req: Request, method: str, item: str | None) -> None:
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

    async def basins(self, req: Request, method: str) -> None:
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

    async def basin_item(self, req: Request, method: str, name: str) -> None:
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

    async def streams(self, req: Request, method: str) -> None:
        basin = basin_of(req)
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

    async def stream_item(self, req: Request, method: str, name: str) -> None:
        basin = basin_of(req)
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
    async def access_tokens(self, req: Request, method: str, token_id: str | None) -> None:
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

    async def metrics(self, req: Request, basin: str | None = None, stream: str | None = None) -> None:
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
        start, end = int_param(req, "start", INT32_MAX), int_param(req, "end", INT32_MAX)
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
        if basin is None:  # the routes give a stream's metrics its basin
            raise S2Error("bad_path", f"{level} metrics need a basin")
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
