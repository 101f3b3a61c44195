"""The floor, side by side (what no Python sink beats, and what sluice's engine adds to it): Flink's AsyncSinkWriter,
sluice_null, Spark's noop and the bare Arrow writer.

Run: `make check-flink && .venv/bin/python -m bench.floors.flink_async_sink [--rows 4000000] [--rounds 5]`. Not part of
`make test`.

The same rows everywhere: 4,000,000 of 100 bytes (an id zero-padded to 20 digits, then 80 x's), made in place in 2
partitions, batches of 500 where a sink batches:
- Flink: bench/floors/java/FlinkFloor.java on a local MiniCluster (parallelism 2): a sequence source, a map that makes
  the rows, Flink's AsyncSinkWriter into a store that counts each request and completes it at once. Figure: the job's
  net runtime. Compiled with javac here against the jars `make check-flink` fetched (SLUICE_FLINK_HOME).
- Spark (one session, local[2]): the rows cached, then written to `noop` (Spark's own no-op sink, no Python), the bare
  Arrow writer (a Python Data Source that only counts: the floor of any Python sink, bench/floors/bare_writer.py) and
  `sluice_null` (sluice's engine with a store that drops every batch; sink.batch.max-size=500). Figure: the write's
  wall time.
Runs alternate (Flink, noop, bare, sluice_null, then again) after a warm-up of each; medians; the ratios of the
medians are the result. Goal: sluice_null >= 0.40 of Flink.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

from bench.floors.bare_writer import register_bare_writer, rows_frame

# The one pin of Flink's version: the Makefile's check-flink reads it from here.
FLINK_VERSION = "2.2.0"
JAVA = Path(__file__).resolve().with_name("java")  # FlinkFloor.java
HOME = Path(os.environ.get("SLUICE_FLINK_HOME", Path.home() / ".cache" / "sluice" / f"flink-{FLINK_VERSION}"))
BATCH = 500


class Flink:
    """FlinkFloor.java in its own JVM: one job per `job()` call, answered with the job's net runtime in seconds."""

    def __init__(self, rows: int, workdir: Path) -> None:
        if not (HOME / ".complete").exists():
            raise SystemExit(f"Flink {FLINK_VERSION} is not in {HOME}: run `make check-flink`")
        javac = shutil.which("javac")
        if javac is None:
            raise SystemExit("javac is missing (the bench compiles its Java main): "
                             "apt-get install -y openjdk-17-jdk-headless")
        classpath = f"{workdir}{os.pathsep}{HOME / 'lib'}/*"
        subprocess.run([javac, "-d", str(workdir), "-cp", classpath, str(JAVA / "FlinkFloor.java")],
                       check=True)
        self.rows = rows
        self.process = subprocess.Popen(["java", "-Xmx1g", "-cp", classpath, "FlinkFloor", str(rows)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        text=True)
        self._expect("ready")  # after its warm-up job

    def _expect(self, word: str) -> list[str]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if not line or line[0] != word:
            raise RuntimeError(f"FlinkFloor answered {line!r} (exit code {self.process.poll()}), not {word!r}")
        return line

    def job(self) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write("run\n")
        self.process.stdin.flush()
        _, millis, counted = self._expect("job")
        assert int(counted) == self.rows, f"Flink's sink counted {counted} rows of {self.rows}"
        return int(millis) / 1000.0

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import sluice

    workdir = Path(tempfile.mkdtemp(prefix="sluice-flink-floor-"))
    flink = Flink(args.rows, workdir)
    spark = sluice.session("sluice-flink-floor", **{"spark.sql.shuffle.partitions": "2",
                                                    "spark.driver.memory": "2g"})  # the rows stay cached
    bare = register_bare_writer(spark)
    df = rows_frame(spark, args.rows)

    def spark_write(fmt: str) -> float:
        options = {"sink.batch.max-size": str(BATCH)} if fmt == "sluice_null" else {}
        start = time.perf_counter()
        df.write.format(fmt).options(**options).mode("append").save()
        return time.perf_counter() - start

    runs: dict[str, list[float]] = {"flink": [], "noop": [], bare: [], "sluice_null": []}
    try:
        for fmt in ("noop", bare, "sluice_null"):
            spark_write(fmt)  # warm-up: Python workers, imports
        for _ in range(args.rounds):
            runs["flink"].append(flink.job())
            for fmt in ("noop", bare, "sluice_null"):
                runs[fmt].append(spark_write(fmt))
        summary = sluice.last_write_summary("sluice_null")
        assert summary and summary["records"] == args.rows, summary
    finally:
        flink.close()
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    rate = {name: args.rows / statistics.median(seconds) for name, seconds in runs.items()}
    print(json.dumps({
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "flink": FLINK_VERSION, "rows": args.rows, "rounds": args.rounds, "batch": BATCH,
        "rows_per_s": {name: round(r) for name, r in rate.items()},
        "vs_flink": {name: round(r / rate["flink"], 3) for name, r in rate.items() if name != "flink"},
        "sluice_null_vs_bare_writer": round(rate["sluice_null"] / rate[bare], 3),
        "seconds": {name: [round(s, 3) for s in seconds] for name, seconds in runs.items()},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
