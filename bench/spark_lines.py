"""The same benchmarks on several Spark lines, side by side in one run.

Run (after `make test-spark-4.0`, which builds .venv-spark-4.0 with the wheel):
    .venv/bin/python -m bench.spark_lines --line 4.0=.venv-spark-4.0/bin/python --line 4.3=.venv/bin/python

For each round, every line runs bench/engine_throughput.py (the engine alone, then Spark: sluice_null against a
bare Arrow writer that only counts rows) and bench/stores/s2_sink.py (format("s2") against the raw s2-sdk), one after
the other, so the machine's drift hits every line alike. Prints each line's figures and their ratio to the first line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import date

from bench.checkouts import ROOT, module_command


def run(python: str, module: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "PIP_"))}
    done = subprocess.run(module_command(module, *args, python=python), capture_output=True, text=True, env=env,
                          check=False, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{python} -m {module} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def pyspark_version(python: str) -> str:
    return subprocess.run([python, "-c", "import pyspark; print(pyspark.__version__)"], capture_output=True,
                          text=True, check=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--line", action="append", required=True, metavar="NAME=PYTHON",
                        help="a Spark line and the Python whose environment has it (first = the baseline)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    lines = dict(item.split("=", 1) for item in args.line)
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in lines}
    for _ in range(args.rounds):
        for name, python in lines.items():
            engine = run(python, "bench.engine_throughput", "--rows", str(args.rows), "--rounds", "3",
                         "--entries", "1000000")
            s2 = run(python, "bench.stores.s2_sink", "--records", str(args.records), "--naive-records", "1000")
            found = figures[name]
            found.setdefault("engine alone, unordered (entries/s)", []).append(
                engine["engine_entries_per_s"]["unordered"])
            found.setdefault("sluice_null via Spark (rows/s)", []).append(engine["spark"]["sluice_engine_rows_per_s"])
            found.setdefault("bare Arrow writer via Spark (rows/s)", []).append(
                engine["spark"]["bare_arrow_writer_rows_per_s"])
            found.setdefault("sluice_null / bare writer", []).append(engine["spark"]["ratio_engine_to_bare"])
            found.setdefault("format('s2') (records/s)", []).append(s2["sluice_s2_sink_records_per_s"])
            found.setdefault("raw s2-sdk (records/s)", []).append(s2["raw_sdk_records_per_s"])
            found.setdefault("format('s2') / raw s2-sdk", []).append(s2["sluice_vs_raw_sdk"])
    base = next(iter(lines))
    result = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": sys.version.split()[0], "rounds": args.rounds,
        "lines": {name: pyspark_version(python) for name, python in lines.items()},
        "median": {name: {k: statistics.median(v) for k, v in found.items()} for name, found in figures.items()},
    }
    result[f"ratio_to_{base}"] = {
        name: {k: round(v / result["median"][base][k], 3) for k, v in medians.items()}
        for name, medians in result["median"].items() if name != base}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
