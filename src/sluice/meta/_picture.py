"""`sluice meta lineage --png FILE`: jobs and tables drawn left to right, each table with its last barrier."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sluice.meta._model import RUNNING
from sluice.meta._service import MetaService

if TYPE_CHECKING:
    from PIL import ImageDraw

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 210, 54, 70, 26, 24
COLORS = {"table": ("#e8f1fb", "#2f6db3"), "job": ("#fdf3e3", "#b3782f"), "ended": ("#f0f0f0", "#8a8a8a")}


def draw_lineage(meta: MetaService, path: str | Path, include_ended: bool = False) -> Path:
    """Write a PNG of the lineage: tables (blue, last barrier and version) and jobs (orange; grey when ended)."""
    from PIL import Image, ImageDraw, ImageFont

    jobs = [j for j in meta.jobs() if include_ended or j.status == RUNNING]
    tables = meta.tables()
    names = sorted({t for j in jobs for t in (*j.sources, *j.sinks)} | (set(tables) if include_ended else set()))
    writer = {t: j for j in jobs for t in j.sinks}
    level: dict[str, int] = {}

    def table_level(t: str, seen: frozenset[str] = frozenset()) -> int:
        if t not in level:
            job = writer.get(t)
            level[t] = 0 if job is None or t in seen else job_level(job.job_id, seen | {t}) + 1
        return level[t]

    def job_level(job_id: str, seen: frozenset[str]) -> int:
        key = f"job:{job_id}"
        if key not in level:
            job = next(j for j in jobs if j.job_id == job_id)
            level[key] = max((table_level(s, seen) for s in job.sources), default=-1) + 1
        return level[key]

    nodes: dict[str, tuple[str, str, str]] = {}  # key -> (kind, title, subtitle)
    for t in names:
        last = tables.get(t)
        nodes[t] = ("table", t, f"barrier {last[0]}  v{last[1]}" if last else "no barrier yet")
        table_level(t)
    for j in jobs:
        nodes[f"job:{j.job_id}"] = ("job" if j.status == RUNNING else "ended", f"[{j.name}]", j.status)
        job_level(j.job_id, frozenset())
    columns: dict[int, list[str]] = {}
    for key in sorted(nodes, key=lambda k: (level[k], k)):
        columns.setdefault(level[key], []).append(key)
    width = MARGIN * 2 + max(len(columns), 1) * (BOX_W + GAP_X) - GAP_X
    rows = max((len(c) for c in columns.values()), default=1)
    lanes = 1 + sum(1 for j in jobs for _ in (*j.sources, *j.sinks))  # room below the boxes for long edges
    height = MARGIN * 2 + rows * (BOX_H + GAP_Y) - GAP_Y + 20 + lanes * 8
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    where: dict[str, tuple[int, int]] = {}
    for col, keys in columns.items():
        for row, key in enumerate(keys):
            x, y = MARGIN + col * (BOX_W + GAP_X), MARGIN + 20 + row * (BOX_H + GAP_Y)
            where[key] = (x, y)
    lane = [MARGIN + 20 + rows * (BOX_H + GAP_Y)]

    def connect(a: tuple[int, int], b: tuple[int, int]) -> None:
        start, end = (a[0] + BOX_W, a[1] + BOX_H // 2), (b[0], b[1] + BOX_H // 2)
        if end[0] - start[0] <= GAP_X:  # neighbouring columns: straight
            _arrow(pen, start, end)
            return
        # an edge that skips columns runs in its own lane below the boxes, so no box hides it
        y = lane[0]
        lane[0] += 8
        down, up = (start[0] + GAP_X // 3, y), (end[0] - GAP_X // 3, y)
        pen.line((start, (down[0], start[1]), down, up, (up[0], end[1])), fill="#555555", width=2)
        _arrow(pen, (up[0], end[1]), end)

    for j in jobs:
        for s in j.sources:
            connect(where[s], where[f"job:{j.job_id}"])
        for t in j.sinks:
            connect(where[f"job:{j.job_id}"], where[t])
    for key, (kind, title, subtitle) in nodes.items():
        x, y = where[key]
        fill, line = COLORS[kind]
        pen.rounded_rectangle((x, y, x + BOX_W, y + BOX_H), radius=12 if kind != "table" else 3, fill=fill,
                              outline=line, width=2)
        pen.text((x + 10, y + 10), title, fill="black", font=font)
        pen.text((x + 10, y + 30), subtitle, fill=line, font=font)
    pen.text((MARGIN, 6), f"sluice lineage ({meta!r}): tables with their last completed barrier; jobs in []",
             fill="black", font=font)
    out = Path(path)
    image.save(out, "PNG")
    return out


def _arrow(pen: ImageDraw.ImageDraw, start: tuple[int, int], end: tuple[int, int]) -> None:
    pen.line((start, end), fill="#555555", width=2)
    x, y = end
    pen.polygon(((x, y), (x - 10, y - 5), (x - 10, y + 5)), fill="#555555")
