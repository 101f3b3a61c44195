"""`sluice ui`: a read-only page over the MetaService and the live metrics, on the metrics collector's server (one
process on the driver's machine: tasks push there, the browser and Prometheus read there)."""

from __future__ import annotations

import asyncio
import dataclasses
from importlib.resources import files
from typing import Any

from sluice.doctor import DoctorWatch
from sluice.meta import MetaService
from sluice.metrics._collect import split_views
from sluice.metrics._server import MetricsServer
from sluice.ui._state import as_time, consistent_point, read_state


def ui_routes(meta_url: str | None, include_ended: bool = True, doctor: DoctorWatch | None = None):
    """The page's routes for a MetricsServer: / (the page), /api/state, /api/consistent?tables=a,b, /api/doctor (the
    doctor's last findings; {"enabled": false} without one)."""
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    page = files("sluice.ui").joinpath("page.html").read_text()
    meta = MetaService(meta_url)

    def build(server: MetricsServer) -> list[Any]:
        async def index(request: Request) -> Response:
            return HTMLResponse(page)

        async def state(request: Request) -> Response:
            # The MetaService is a blocking database client: off the event loop.
            found = await asyncio.to_thread(read_state, meta, include_ended)
            sources = [{**dataclasses.asdict(r), "reported": as_time(r.at)} for r in server.sources.snapshot()]
            reads = {fmt: {**values, "reported": as_time(values["lag_at"])}
                     for fmt, values in server.reads.snapshot().items()}
            splits = [{**dataclasses.asdict(v), "reported": as_time(v.at)}
                      for v in split_views(server.sources.snapshot(), server.reads.split_lags())]
            return JSONResponse({**found.to_json(), "metrics": server.metrics.snapshot(), "sources": sources,
                                 "splits": splits, "reads": reads, "lookups": server.lookups.snapshot()})

        async def consistent(request: Request) -> Response:
            tables = [t for t in request.query_params.get("tables", "").split(",") if t]
            if not tables:
                return JSONResponse({"error": "name the tables: /api/consistent?tables=orders,totals"},
                                    status_code=400)
            return JSONResponse(await asyncio.to_thread(consistent_point, meta, tables))

        async def findings(request: Request) -> Response:
            return JSONResponse({"enabled": False} if doctor is None else {"enabled": True, **doctor.to_json()})

        return [Route("/", server.guarded(index)), Route("/api/state", server.guarded(state)),
                Route("/api/consistent", server.guarded(consistent)), Route("/api/doctor", server.guarded(findings))]

    return build


def serve_ui(meta: str | None = None, host: str = "127.0.0.1", port: int = 0, *, advertise: str | None = None,
             token: str | None = None, include_ended: bool = True, doctor: DoctorWatch | None = None,
             chart_interval_s: float = 5.0) -> MetricsServer:
    """The page at the returned server's `.url`, and the live-metrics collector every write planned on this machine
    reports to (see sluice.metrics.serve). Loopback by default; any other address needs a token. `doctor`: a started
    DoctorWatch whose findings the page shows and /metrics exports (sluice_doctor_*); the caller stops it. The page's
    charts show the last 15 minutes, a point every `chart_interval_s`."""
    return MetricsServer(host, port, advertise, token, extra_routes=ui_routes(meta, include_ended, doctor),
                         collectors=(doctor,) if doctor is not None else (),
                         history_interval_s=chart_interval_s).start()
