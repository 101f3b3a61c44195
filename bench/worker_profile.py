"""Where a Python worker's time goes in bench/engine_throughput.py: sluice_null's tasks beside the bare Arrow writer's.

Run: `.venv/bin/python -m bench.worker_profile [--rows 4000000] [--rounds 2] [--rate 200]`. py-spy (a dev
dependency) samples the bench and every Python process under it (Spark's daemon forks the workers) and writes raw
stacks; this script keeps the samples of Python workers running a write task, drops one-off imports (a worker's
first task imports pyarrow, pandas and sluice) and idle waits, and prints, per kind of task (the bare writer, a
sluice_null task's own thread, its engine thread), the frames that cost most, as shares of the sampled CPU:

- `self`: where the CPU was spent (innermost frame of sluice, Spark's serializers or the bench, and the leaf);
- `inclusive`: per function, its share including what it called.

The share that matters is sluice's own: everything in a sluice_null task that the bare writer's task does
not do. `--stacks FILE` summarizes an earlier recording instead of running the bench again.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench.checkouts import ROOT, module_command

SKIP = ("importlib", "zipimport", "Condition.wait", "Event.wait")  # one-off imports and idle threads
KINDS = ("bare writer", "sluice task thread", "sluice engine thread")


def kind(stack: str) -> str | None:
    if "pyspark.daemon pyspark.worker" not in stack or any(s in stack for s in SKIP):
        return None
    if "CountingWriter.write" in stack:
        return "bare writer"
    if "AsyncSinkWriter._run" in stack or "MetricsPusher._run" in stack:
        return "sluice engine thread"
    if "sluice/sink/_arrow_writers.py" in stack:
        return "sluice task thread"
    return None


def summarize(path: Path, top: int, rounds: int, metered: bool = True) -> str:
    totals: Counter = Counter()
    own = {k: Counter() for k in KINDS}
    inclusive = {k: Counter() for k in KINDS}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        which = kind(stack)
        if which is None:
            continue
        n = int(count)
        totals[which] += n
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        leaf = frames[-1]
        mine = next((f for f in reversed(frames) if any(s in f for s in ("sluice/", "serializers.py",
                                                                        "conversion.py", "engine_throughput"))), leaf)
        own[which][mine if mine == leaf else f"{mine} > {leaf}"] += n
        for function in {f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")" for f in frames}:
            inclusive[which][function] += n
    everything = sum(totals.values()) or 1
    # engine_throughput.py writes bench_count 1 + rounds times and sluice_null 1 + 2 * rounds (metrics off and on;
    # 1 + rounds with --no-metered).
    engine_writes = 1 + (2 if metered else 1) * rounds
    writes = {"bare writer": 1 + rounds, "sluice task thread": engine_writes, "sluice engine thread": engine_writes}
    per_write = {k: round(totals[k] / writes[k]) for k in KINDS}
    out = [f"samples: {dict(totals)}; per write: {per_write} (worker CPU, imports and idle waits left out)",
           f"sluice_null's tasks cost {sum(per_write[k] for k in KINDS[1:]) / max(1, per_write[KINDS[0]]):.2f}x the "
           "bare writer's CPU per write"]
    for which in KINDS:
        if not totals[which]:
            continue
        out.append(f"\n== {which}: {totals[which]} samples, {100 * totals[which] / everything:.1f}% of all")
        out += [f"  {100 * n / totals[which]:5.1f}% self  {frame}" for frame, n in own[which].most_common(top)]
        out += [f"  {100 * n / totals[which]:5.1f}% incl  {frame}" for frame, n in inclusive[which].most_common(top * 2)
                if "sluice/" in frame or "serializers" in frame or "pyarrow" in frame]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--batch", type=int, help="sluice_null's sink.batch.max-size (default: its own)")
    parser.add_argument("--id", action="store_true", help="a bigint id column beside the 100-byte string")
    parser.add_argument("--no-metered", action="store_true", help="skip the writes with live metrics on")
    parser.add_argument("--idle", action="store_true", help="py-spy --idle: also samples of threads off the CPU")
    parser.add_argument("--gil", action="store_true", help="py-spy --gil: only samples of the thread holding the GIL")
    parser.add_argument("--stacks", type=Path, help="summarize this py-spy raw recording instead")
    parser.add_argument("--keep", type=Path, help="also keep the raw recording here")
    args = parser.parse_args()
    if args.stacks is None:
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        if spy is None:
            raise SystemExit("py-spy is missing: run `make .venv/.installed` (it is a dev dependency)")
        folder = Path(tempfile.mkdtemp(prefix="sluice-profile-"))
        args.stacks = args.keep or folder / "stacks.txt"
        bench = ["--entries", "10000", "--rows", str(args.rows), "--rounds", str(args.rounds),
                 *(["--batch", str(args.batch)] if args.batch else []), *(["--id"] if args.id else []),
                 *(["--no-metered"] if args.no_metered else [])]
        spy_flags = [*(["--idle"] if args.idle else []), *(["--gil"] if args.gil else [])]
        subprocess.run([spy, "record", "--subprocesses", *spy_flags, "-r", str(args.rate), "-f", "raw", "-o",
                        str(args.stacks), "--", *module_command("bench.engine_throughput", *bench)],
                       check=True, cwd=ROOT)
    print(summarize(args.stacks, args.top, args.rounds, not args.no_metered))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
