"""The measures several benchmarks report alike: a quantile of latencies, and their p50/p99 summary."""

from __future__ import annotations

import statistics
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by nearest rank: element int(q * n) of the n values sorted (the last for q = 1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def p50_p99(seconds: Iterable[float]) -> dict[str, float | int | None]:
    """How many latencies, their median and their 99th percentile (rounded to the millisecond; None when none)."""
    ordered = sorted(seconds)
    return {"samples": len(ordered), "p50": round(statistics.median(ordered), 3) if ordered else None,
            "p99": round(percentile(ordered, 0.99), 3) if ordered else None}
