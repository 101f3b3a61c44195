"""What the page shows, read from the MetaService in one pass: jobs, tables with their barriers and lag, the
lineage graph laid out in columns (upstream to downstream), and a consistent-read point for a set of tables.
Barriers are the commit timestamps of FLIP-276 (epoch milliseconds): shown as UTC times, lag in seconds."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sluice.meta import RUNNING, MetaService, NoConsistentVersionError


def as_time(epoch: float | None, millis: bool = False) -> str | None:
    if epoch is None:
        return None
    seconds = epoch / 1000.0 if millis else epoch
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class JobView:
    job_id: str
    name: str
    status: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    where: str  # host:pid
    started: str | None
    ended: str | None
    last_commit_age_s: float | None  # seconds since its newest barrier in any of its tables: a job's heartbeat


@dataclass(frozen=True)
class TableView:
    name: str
    version: int | None
    last_barrier: str | None
    barriers: int
    upstream: tuple[str, ...]  # the tables jobs write it from
    lag_s: float | None  # its last barrier behind the newest of its upstream tables'
    age_s: float | None  # now minus its last barrier: how fresh it is


@dataclass(frozen=True)
class Node:
    id: str
    kind: str  # "job" or "table"
    label: str
    column: int  # 0 = most upstream
    row: int
    status: str | None


@dataclass(frozen=True)
class PipelineState:
    now: str
    jobs: tuple[JobView, ...]
    tables: tuple[TableView, ...]
    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]  # (from node id, to node id)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_state(meta: MetaService, include_ended: bool = True, now: float | None = None) -> PipelineState:
    now = time.time() if now is None else now
    jobs = [j for j in meta.jobs() if include_ended or j.status == RUNNING]
    last = meta.tables()
    counts = {name: len(meta.barriers(name)) for name in last}
    fed_by: dict[str, set[str]] = {}
    for job in jobs:
        for sink in job.sinks:
            fed_by.setdefault(sink, set()).update(job.sources)
    tables = []
    for name, newest in sorted(last.items()):
        upstream = tuple(sorted(fed_by.get(name, ())))
        ups = [barrier[0] for u in upstream if (barrier := last.get(u))]
        lag = max(0.0, (max(ups) - newest[0]) / 1000.0) if newest and ups else None
        tables.append(TableView(name, newest[1] if newest else None, as_time(newest[0], True) if newest else None,
                                counts[name], upstream, lag, round(now - newest[0] / 1000.0, 3) if newest else None))
    def commit_age(sinks: tuple[str, ...]) -> float | None:
        newest = [barrier[0] for s in sinks if (barrier := last.get(s))]
        return round(now - max(newest) / 1000.0, 3) if newest else None

    views = tuple(JobView(j.job_id, j.name, j.status, j.sources, j.sinks, f"{j.host}:{j.pid}" if j.host else "",
                          as_time(j.started_at), as_time(j.ended_at), commit_age(j.sinks)) for j in jobs)
    nodes, edges = _layout(jobs, sorted(last))
    return PipelineState(as_time(now) or "", views, tuple(tables), nodes, edges)


def _layout(jobs: list, tables: list[str]) -> tuple[tuple[Node, ...], tuple[tuple[str, str], ...]]:
    """Columns by depth: a table with no writing job is column 0; a job one column right of its deepest source;
    a table one right of its deepest writing job."""
    edges = [(f"table:{s}", f"job:{j.job_id}") for j in jobs for s in j.sources]
    edges += [(f"job:{j.job_id}", f"table:{s}") for j in jobs for s in j.sinks]
    ids = [f"table:{t}" for t in tables] + [f"job:{j.job_id}" for j in jobs]
    ids += sorted({i for edge in edges for i in edge} - set(ids))
    into: dict[str, list[str]] = {}
    for a, b in edges:
        into.setdefault(b, []).append(a)
    depth: dict[str, int] = {}

    def column(node: str, seen: frozenset[str] = frozenset()) -> int:
        if node not in depth:
            parents = [p for p in into.get(node, ()) if p not in seen]  # a lineage cycle is cut, not followed
            depth[node] = 1 + max((column(p, seen | {node}) for p in parents), default=-1)
        return depth[node]

    rows: dict[int, int] = {}
    labels = {f"job:{j.job_id}": (j.name, j.status) for j in jobs}
    nodes = []
    for node in ids:
        col = column(node)
        rows[col] = rows.get(col, -1) + 1
        kind, _, name = node.partition(":")
        label, status = labels.get(node, (name, None))
        nodes.append(Node(node, kind, label, col, rows[col], status))
    return tuple(nodes), tuple(edges)


def consistent_point(meta: MetaService, tables: list[str]) -> dict[str, Any]:
    """The newest barrier every table in `tables` completed, with each one's version at it; or why there is none."""
    try:
        found = meta.consistent_version(tables)
    except NoConsistentVersionError as e:
        return {"tables": tables, "error": str(e)}
    return {"tables": tables, "barrier": as_time(found.barrier, True), "barrier_ms": found.barrier,
            "versions": found.versions}
