"""Contenders timed in rounds on one server, and each one's best round: what the store benchmarks that compare
sluice with a store's own client share."""

from __future__ import annotations

from collections.abc import Callable


def rotate(contenders: dict[str, Callable[[], None]], rounds: int) -> None:
    """Every contender once a round, each round starting one contender later, so that no contender always comes
    first (or after the same one): the server's flushes, merges and collections fall on different contenders."""
    names = list(contenders)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            contenders[name]()


def best_rounds(runs: dict[str, list[tuple[float, dict[str, float]]]], details: dict[str, list[dict]], rows: int,
                rates: Callable[[float], dict] = lambda seconds: {}) -> dict[str, dict]:
    """Each contender's fastest round of (seconds, CPU by component): its seconds and rows/s, `rates(seconds)`'s
    figures, every round's rows/s, its CPU and that round's `details`."""
    results = {}
    for name, measured in runs.items():
        best = min(range(len(measured)), key=lambda i: measured[i][0])
        seconds, cpu = measured[best]
        results[name] = {"seconds": round(seconds, 3), "rows_per_s": round(rows / seconds), **rates(seconds),
                         "all_rounds_rows_per_s": [round(rows / s) for s, _ in measured],
                         "cpu_s": cpu, **details[name][best]}
    return results


def write_details(summary: dict, rows: int) -> dict:
    """What a sluice write's summary says of its requests, for a contender's details: checks that it wrote `rows`
    and did not fail first."""
    assert summary["status"] != "failed" and summary["records"] == rows, summary
    return {
        "client_p50_ms": summary["submit_latency_p50_ms"], "client_p99_ms": summary["submit_latency_p99_ms"],
        "requests": summary["batches"], "rows_per_request": round(summary["records"] / summary["batches"], 1),
        "request_kib": round(summary["bytes"] / summary["batches"] / 1024, 1),
        "peak_inflight": summary["peak_inflight"], "tasks": summary["tasks"], "retries": summary["retries"],
        "throttles": summary["throttles"], "flush_reasons": summary["flush_reasons"]}
