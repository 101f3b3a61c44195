"""The soak's report: growth per hour over the run's second half, the figures per window of a long run, and where
the Python processes' memory went, from the samples taken once a minute."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.measures import p50_p99

SAMPLE_EVERY_S = 60.0


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the pipeline was through
    driver_starts: int
    values: dict[str, float]
    python: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # pid: role, PSS, RSS (python_memory)


def growth_report(samples: list[Sample]) -> dict:
    """Growth per hour over the second half of the run; the driver's memory over its longest life in that half (a
    killed driver starts small again); and the samples at a quarter, half, three quarters and the end."""
    end = samples[-1]
    half = [x for x in samples if x.at_s >= end.at_s / 2] or [end]

    def per_hour(first: Sample, last: Sample, key: str) -> float | None:
        hours = (last.at_s - first.at_s) / 3600
        return round((last.values[key] - first.values[key]) / hours) if hours > 0 else None

    driver_keys = ("driver_rss_bytes", "driver_jvm_rss_bytes", "driver_processes", "python_processes",
                   "python_pss_bytes", "python_largest_rss_bytes")
    out = {key: per_hour(half[0], end, key) for key in end.values if key not in driver_keys}
    lives: dict[int, list[Sample]] = {}
    for x in half:
        lives.setdefault(x.driver_starts, []).append(x)
    longest = max(lives.values(), key=lambda life: life[-1].at_s - life[0].at_s)
    for key in driver_keys:
        out[key] = per_hour(longest[0], longest[-1], key)
    marks = [samples[min(len(samples) - 1, round(f * (len(samples) - 1)))] for f in (0.25, 0.5, 0.75, 1.0)]
    return {"growth_per_hour": out,
            "growth_window": {"from_min": round(half[0].at_s / 60, 1), "to_min": round(end.at_s / 60, 1),
                              "driver_life_min": round((longest[-1].at_s - longest[0].at_s) / 60, 1)},
            "samples": [{"at_min": round(x.at_s / 60, 1), **x.values} for x in marks], "at_end": end.values}


def windows_report(samples: list[Sample], latencies: list[tuple[float, float]], window_s: float,
                   end_s: float) -> list[dict]:
    """Per window of `window_s` from the pipeline's first change through to `end_s` (the writers stop; the last
    sample, after the copies caught up, is not in any): the latency (commit to the PostgreSQL copy, outside fault
    windows; `latencies` as (seconds since through, seconds)) and the transfers committed in it, and at its last
    sample the memory of the driver's JVM and of its Python processes (the driver's and Spark's workers: their
    proportional set size, as they share the daemon's pages, and the largest one's RSS), the S2 server's and the
    broker's, the MetaService's rows, the checkpoints' bytes and the warehouse's by kind (its Delta logs, change
    data, live and removed data files). A steady write shows them flat from window to window."""
    out = []
    mib = 1024 * 1024
    before = samples[0].values
    for k in range(max(1, math.ceil(end_s / window_s))):
        lo, hi = k * window_s, min((k + 1) * window_s, end_s + 1)
        # A sample is taken a little after its minute: the one nearest a window's end closes it.
        inside = [x for x in samples if lo + SAMPLE_EVERY_S / 2 < x.at_s <= hi + SAMPLE_EVERY_S / 2]
        if not inside:
            continue
        last = inside[-1].values
        out.append({"from_min": round(lo / 60, 1), "to_min": round(min(hi, end_s) / 60, 1),
                    **{f"latency_{key}_s": value for key, value in p50_p99(
                        [lat for at, lat in latencies if lo <= at < hi]).items()},
                    "transfers": int(last["transfers"] - before["transfers"]),
                    "driver_jvm_mib": round(last["driver_jvm_rss_bytes"] / mib, 1),
                    "python_pss_mib": round(last["python_pss_bytes"] / mib, 1),
                    "python_largest_mib": round(last["python_largest_rss_bytes"] / mib, 1),
                    "python_processes": last["python_processes"],
                    "s2_server_mib": round(last["s2_server_rss_bytes"] / mib, 1),
                    "kafka_broker_mib": round(last["kafka_broker_rss_bytes"] / mib, 1),
                    "meta_rows": last["meta_rows"], "checkpoint_mib": round(last["checkpoint_bytes"] / mib, 2),
                    **{f"warehouse_{kind}_mib": round(last[f"warehouse_{kind}_bytes"] / mib, 3)
                       for kind in ("log", "change", "live", "removed")}})
        before = last
    return out


def python_report(samples: list[Sample], window_s: float, top: int = 8) -> dict:
    """Where the Python processes' memory went: each process sampled at least twice, from its first sample to its
    last (role, minutes, PSS and RSS, and its PSS at each `window_s` so that a step is told from a slope), the `top`
    whose PSS grew most; and how many lived through the whole run. A sum that grows while every process that lives on
    stays flat is workers coming and going, not a leak."""
    mib = 1024 * 1024
    seen: dict[int, list[tuple[float, str, int, int]]] = {}
    for x in samples:
        for pid, (role, pss, rss) in x.python.items():
            seen.setdefault(pid, []).append((x.at_s, role, pss, rss))

    def trace(life: list[tuple[float, str, int, int]]) -> list[float]:
        marks: dict[int, int] = {}
        for at_s, _, pss, _ in life:
            marks.setdefault(int(at_s // window_s), pss)  # the first sample in each window
        return [round(pss / mib, 1) for pss in [*marks.values(), life[-1][2]]]

    lives = [{"pid": pid, "role": life[-1][1], "from_min": round(life[0][0] / 60, 1),
              "to_min": round(life[-1][0] / 60, 1), "pss_first_mib": round(life[0][2] / mib, 1),
              "pss_last_mib": round(life[-1][2] / mib, 1), "grew_mib": round((life[-1][2] - life[0][2]) / mib, 1),
              "rss_first_mib": round(life[0][3] / mib, 1), "rss_last_mib": round(life[-1][3] / mib, 1),
              "pss_per_window_mib": trace(life)}
             for pid, life in seen.items() if len(life) > 1]
    lives.sort(key=lambda life: -life["grew_mib"])
    whole = [life for life in lives if samples and life["from_min"] <= round(samples[0].at_s / 60, 1)
             and life["to_min"] >= round(samples[-1].at_s / 60, 1)]
    return {"processes_seen": len(seen), "lived_whole_run": len(whole),
            "whole_run_grew_mib": round(sum(life["grew_mib"] for life in whole), 1),
            "whole_run_rss_grew_mib": round(sum(life["rss_last_mib"] - life["rss_first_mib"] for life in whole), 1),
            "grew_most": lives[:top]}
