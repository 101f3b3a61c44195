"""No regression elsewhere: the project's benchmark table, this checkout against commit REV, alternating.

    make check-pgjdbc && flock /tmp/sluice-bench.lock .venv/bin/python -m bench.before_after --before 1a41e05 --runs 3

The table is the one each restructuring is judged by: the engine (bench/engine_throughput.py: Spark into
`sluice_null` and into the bare Arrow writer, and the engine alone), the S2 sink against the raw s2-sdk
(bench/stores/s2_sink.py), the S2 source (bench/stores/s2_source.py) and PostgreSQL append, upsert and read against JDBC
(bench/stores/postgres_write_read.py). Each run of the table runs every benchmark once for each side, the order of the
sides swapped from one run to the next, so a load that comes and goes on a shared machine falls on both; medians over
the runs are compared, with each side's range.

Both sides run this checkout's benchmark scripts (the same measurement), and import sluice from their own tree:
REV's from a git worktree (`PYTHONPATH`), this checkout's as installed. Sizes are the restructuring table's (2M rows
through the engine, 300,000 S2 records, 500,000 PostgreSQL rows), chosen to run a side of one run in ~6 minutes on 2
cores; --scale multiplies them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.checkouts import ROOT, child_env, module_command, remove_worktree, worktree

# name -> (module, arguments at scale 1 with {n} for the scaled sizes, figures: label -> path in its JSON report)
BENCHES: dict[str, tuple[str, list[str], dict[str, tuple[str, ...]]]] = {
    "engine": ("bench.engine_throughput", ["--entries", "{1000000}", "--rows", "{2000000}", "--rounds", "3"], {
        "engine: Spark -> sluice_null (rows/s)": ("spark", "sluice_engine_rows_per_s"),
        "engine: bare Arrow writer (rows/s)": ("spark", "bare_arrow_writer_rows_per_s"),
        "engine: sluice_null / bare writer": ("spark", "ratio_engine_to_bare"),
        "engine: Python worker CPU s per write, sluice_null": ("spark", "cpu_s_per_write", "sluice_null",
                                                               "python_workers"),
        "engine: Python worker CPU s per write, bare writer": ("spark", "cpu_s_per_write", "bench_count",
                                                               "python_workers"),
        "engine alone unordered (entries/s)": ("engine_entries_per_s", "unordered"),
    }),
    "s2_sink": ("bench.stores.s2_sink", ["--records", "{300000}", "--naive-records", "1000", "--rounds", "3"], {
        "s2 sink (records/s)": ("sluice_s2_sink_records_per_s",),
        "s2 sink raw SDK (records/s)": ("raw_sdk_records_per_s",),
        "s2 sink / raw SDK": ("sluice_vs_raw_sdk",),
    }),
    "s2_source": ("bench.stores.s2_source", ["--records", "{300000}", "--rounds", "2"], {
        "s2 source one stream (records/s)": ("records_per_s (best round)", "sluice_one_stream_unsplit"),
        "s2 source 8 streams (records/s)": ("records_per_s (best round)", "sluice_8_streams"),
    }),
    "postgres": ("bench.stores.postgres_write_read",
                 ["--rows", "{500000}", "--upsert-rows", "{50000}", "--rounds", "2"], {
        "postgres append (rows/s)": ("rows_per_s", "append_sluice"),
        "postgres upsert (rows/s)": ("rows_per_s", "upsert_sluice"),
        "postgres read (rows/s)": ("rows_per_s", "read_sluice"),
        "postgres JDBC append (rows/s)": ("rows_per_s", "append_jdbc"),
    }),
    # not in the default table (--benches postgres_changes): change capture, judged by its own table in
    # docs/postgres.md; the floor touches no PostgreSQL, so its ratio is the machine's noise
    "postgres_changes": ("bench.stores.postgres_changes", ["--changes", "{1000000}", "--rounds", "2"], {
        "postgres_changes: bare fetch (changes/s)": ("changes_per_s", "fetch"),
        "postgres_changes: fetch + decoding, fetch-ranges=2 (changes/s)": ("changes_per_s", "decode_r2"),
        "postgres_changes: Spark -> sluice_null, in micro-batches (changes/s)":
            ("changes_per_s", "spark_in_micro_batches_r2"),
        "postgres_changes: Spark -> sluice_null, from start() (changes/s)": ("changes_per_s", "spark_r2"),
        "postgres_changes: Spark -> noop, in micro-batches (changes/s)":
            ("changes_per_s", "spark_in_micro_batches_noop_r2"),
        "postgres_changes: max-changes-per-trigger=100000, in micro-batches (changes/s)":
            ("changes_per_s", "spark_in_micro_batches_budget_100k_r2"),
        "postgres_changes: Spark's floor, no PostgreSQL (changes/s)":
            ("changes_per_s", "spark_floor_in_micro_batches"),
    }),
}
DEFAULT_BENCHES = ("engine", "s2_sink", "s2_source", "postgres")


def arguments(template: list[str], scale: float) -> list[str]:
    return [str(round(int(a[1:-1]) * scale)) if a.startswith("{") else a for a in template]


def run_bench(name: str, tree: Path | None, scale: float) -> dict:
    """One benchmark, one side; its JSON report (the last JSON object it prints)."""
    module, template, _ = BENCHES[name]
    env = child_env(tree)  # the bench and its Spark workers import REV's sluice
    started = time.monotonic()
    out = subprocess.run(module_command(module, *arguments(template, scale)), env=env, cwd=ROOT, capture_output=True,
                         text=True)
    if out.returncode != 0:
        side = "before" if tree else "after"
        raise RuntimeError(f"{module} ({side}) exited with {out.returncode}:\n{out.stderr[-4000:]}")
    text = out.stdout
    report = json.loads(text[text.rindex("\n{") + 1:] if "\n{" in text else text)
    print(f"  {name} {'before' if tree else 'after'}: {time.monotonic() - started:.0f} s", file=sys.stderr,
          flush=True)
    return report


def figure(report: dict, path: tuple[str, ...]) -> float:
    for key in path:
        report = report[key]
    return float(report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, metavar="REV", help="the commit to compare this checkout with")
    ap.add_argument("--runs", type=int, default=3, help="runs of the whole table, sides alternating")
    ap.add_argument("--benches", default=",".join(DEFAULT_BENCHES),
                    help=f"a comma list of {', '.join(BENCHES)} (default: all but postgres_changes)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the benchmarks' sizes")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "before-after.json",
                    help="the figures so far, written after each benchmark (a long run interrupted keeps them)")
    args = ap.parse_args()
    names = [n for n in args.benches.split(",") if n]
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        ap.error(f"unknown bench(es) {unknown}; choose from {', '.join(BENCHES)}")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    values: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    tree, importable = worktree(rev)
    loads = [os.getloadavg()[0]]
    try:
        for run in range(args.runs):
            sides = [("after", None), ("before", importable)]
            for side, where in sides if run % 2 == 0 else sides[::-1]:
                print(f"run {run + 1}/{args.runs}, {side}", file=sys.stderr, flush=True)
                for name in names:
                    report = run_bench(name, where, args.scale)
                    for label, path in BENCHES[name][2].items():
                        values[side].setdefault(label, []).append(figure(report, path))
                    loads.append(os.getloadavg()[0])
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps({"before": rev, "after": head, "values": values,
                                                    "load_1min": loads}))
    finally:
        remove_worktree(tree)

    def cell(xs: list[float]) -> str:
        fmt = (lambda x: f"{x:,.0f}") if max(xs) >= 100 else (lambda x: f"{x:.3f}")
        return f"{fmt(statistics.median(xs))} [{fmt(min(xs))}-{fmt(max(xs))}]"

    print(f"| figure ({args.runs} alternating runs each) | before {rev}: median [min-max] | after {head}: median "
          "[min-max] | after/before |")
    print("| --- | --- | --- | --- |")
    for label, before in values["before"].items():
        after = values["after"][label]
        ratio = statistics.median(after) / statistics.median(before)
        print(f"| {label} | {cell(before)} | {cell(after)} | {ratio:.2f} |")
    print(f"\nload average (1 min) at the start and after each benchmark: "
          f"{', '.join(f'{x:.1f}' for x in loads)}")
    print(json.dumps({"before": rev, "after": head, "runs": args.runs, "scale": args.scale, "values": values,
                      "load_1min": loads}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
