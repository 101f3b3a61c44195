"""The collector on the driver: tasks POST their reports to /push, Prometheus scrapes /metrics (Starlette routes,
served by hypercorn on a thread of the user's interpreter)."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from sluice._driver import stats_dir  # the folder the driver's planning workers already share
from sluice._errors import OptionError
from sluice.metrics._collect import LookupMetrics, PrometheusCollector, ReadMetrics, SinkMetrics, SourceMetrics
from sluice.metrics._history import MetricsHistory
from sluice.metrics._report import LookupReport, MetricsTarget, ReadReport, SourceReport, TaskReport

log = logging.getLogger("sluice.metrics")

URL_ENV, TOKEN_ENV = "SLUICE_METRICS_URL", "SLUICE_METRICS_TOKEN"
_ADVERTISED = "metrics-target.json"


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _advertised_file() -> Path:
    return stats_dir() / _ADVERTISED


def find_target() -> MetricsTarget | None:
    """On the driver, when a write is planned: where its tasks push reports. $SLUICE_METRICS_URL (and
    $SLUICE_METRICS_TOKEN) wins; else the collector `serve()` runs on this machine, if its process is alive."""
    url = os.environ.get(URL_ENV)
    if url:
        return MetricsTarget(url, os.environ.get(TOKEN_ENV) or None)
    try:
        found = json.loads(_advertised_file().read_text())
        os.kill(found["pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return MetricsTarget(found["url"], found.get("token"))


class MetricsServer:
    """Live metrics of every sluice write planned on this machine while it runs (see `serve`)."""

    def __init__(self, host: str, port: int, advertise: str | None, token: str | None,
                 extra_routes: Callable[[MetricsServer], Sequence[Any]] | None = None,
                 history_interval_s: float = 5.0, collectors: Sequence[Any] = ()) -> None:
        if not _is_loopback(host) and not token:
            raise OptionError(f"sluice.metrics.serve(host={host!r}) without token: anyone who can reach it could "
                              "push fake metrics and read them. Pass token='...' (tasks send it, Prometheus scrapes "
                              "with it as a bearer token), or bind 127.0.0.1.")
        self.metrics = SinkMetrics()
        self.sources = SourceMetrics()
        self.reads = ReadMetrics()
        self.lookups = LookupMetrics()
        # The page's charts: samples of the above every history_interval_s, the last 15 minutes of them.
        self.history = MetricsHistory(self.metrics, self.sources, self.reads, interval_s=history_interval_s)
        self._token = token
        self._extra_routes = extra_routes  # more Starlette routes on the same server (sluice ui's page)
        self._collectors = tuple(collectors)  # more prometheus_client collectors on /metrics (sluice doctor's)
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        shown = advertise or (socket.getfqdn() if host in ("0.0.0.0", "::") else host)
        self.url = f"http://{shown}:{self.port}"
        self.target = MetricsTarget(self.url, token)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="sluice-metrics-server", daemon=True)

    def __repr__(self) -> str:
        return f"MetricsServer(url={self.url!r})"

    # ---- the application
    def _app(self):
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, PlainTextResponse, Response
        from starlette.routing import Route

        registry = CollectorRegistry(auto_describe=False)
        registry.register(PrometheusCollector(self.metrics, self.sources, self.reads, self.lookups))
        for collector in self._collectors:
            registry.register(collector)

        guarded = self.guarded

        def receiver(parse: Callable[[Any], Any], add: Callable[[Any], None]):
            async def receive(request: Request) -> Response:
                try:
                    report = parse(json.loads(await request.body()))
                except ValueError as e:  # also what json raises: the sender is told what is wrong
                    return PlainTextResponse(str(e), status_code=400)
                add(report)
                return Response(status_code=204)

            return guarded(receive)

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        async def metrics_json(request: Request) -> Response:
            return JSONResponse({"sinks": self.metrics.snapshot(), "reads": self.reads.snapshot(),
                                 "lookups": self.lookups.snapshot(),
                                 "sources": [dataclasses.asdict(r) for r in self.sources.snapshot()],
                                 "split_fetch_lags": [dataclasses.asdict(lag) for lag in self.reads.split_lags()]})

        async def history(request: Request) -> Response:
            return JSONResponse(self.history.to_json())

        extra = list(self._extra_routes(self)) if self._extra_routes else []
        return Starlette(routes=[
            Route("/push", receiver(TaskReport.from_json, self.metrics.add), methods=["POST"]),
            Route("/push/source", receiver(SourceReport.from_json, self.sources.add), methods=["POST"]),
            Route("/push/read", receiver(ReadReport.from_json, self.reads.add), methods=["POST"]),
            Route("/push/lookup", receiver(LookupReport.from_json, self.lookups.add), methods=["POST"]),
            Route("/metrics", guarded(metrics)), Route("/metrics.json", guarded(metrics_json)),
            Route("/metrics/history.json", guarded(history)), *extra])

    def guarded(self, answer: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """A Starlette endpoint that answers 401 unless the request is `authorized`."""
        from starlette.responses import PlainTextResponse

        async def endpoint(request: Any) -> Any:
            if not self.authorized(request):
                return PlainTextResponse("a token is required: send it as a bearer token (a browser: /?token=...)",
                                         status_code=401)
            return await answer(request)

        return endpoint

    def authorized(self, request: Any) -> bool:
        """No token set, or the request carries it: as a bearer token, or (a browser's page) a `token` parameter."""
        if self._token is None:
            return True
        given = request.headers.get("authorization", "")
        return secrets.compare_digest(given, f"Bearer {self._token}") or secrets.compare_digest(
            request.query_params.get("token", ""), self._token)

    def _serve(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"fd://{self._sock.fileno()}"]
        config.accesslog = None
        config.loglevel = "WARNING"
        config.graceful_timeout = 1

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            await serve(self._app(), config, shutdown_trigger=self._stop.wait)

        asyncio.run(main())

    # ---- life cycle
    def start(self) -> MetricsServer:
        self._thread.start()
        self._started.wait()
        self.history.start()
        path = _advertised_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the token
        with os.fdopen(fd, "w") as f:
            json.dump({"url": self.url, "token": self._token, "pid": os.getpid()}, f)
        os.replace(tmp, path)
        log.info("sluice metrics at %s/metrics", self.url)
        return self

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.history.close()
        try:
            path = _advertised_file()
            if json.loads(path.read_text()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, ValueError):
            pass  # already gone, or another process's collector now
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
            self._sock.detach()  # hypercorn served from this descriptor and closed it
        else:
            self._sock.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def serve(host: str = "127.0.0.1", port: int = 0, *, advertise: str | None = None,
          token: str | None = None) -> MetricsServer:
    """Collect live metrics from every sluice write planned on this machine, and serve them to Prometheus.

        server = sluice.metrics.serve(port=9464)   # http://127.0.0.1:9464/metrics
        ...writes and streaming queries...
        server.close()

    Tasks push their reports to it over HTTP, so on a cluster bind an address the executors reach
    (`host="0.0.0.0"`, `advertise=` the name they know this machine by) and set a `token`.
    """
    return MetricsServer(host, port, advertise, token).start()
