"""CPU seconds by component (Spark JVM, Python workers, PostgreSQL, ...) from /proc, for the benchmarks; a
benchmark's own process tree, a process's resident memory, and stdout kept for a benchmark's JSON.

A snapshot sums user+system time of every live process plus what its finished children used (PostgreSQL
backends and Python workers exit into their parents' counters), grouped by what the process is.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

_TICK = os.sysconf("SC_CLK_TCK")


def _component(pid: int, comm: str, cmdline: str) -> str:
    if pid == os.getpid():
        return "bench_process"
    if comm == "java":
        return "spark_jvm"
    if "pyspark.daemon" in cmdline or "pyspark/daemon" in cmdline:
        return "python_workers"
    if comm.startswith("postgres") or cmdline.startswith("postgres"):
        return "postgresql"
    if "s2local" in cmdline:
        return "s2_server"
    if "clickhouse" in comm or "clickhouse" in cmdline:
        return "clickhouse"
    return "other"


def processes() -> Iterator[tuple[int, str, list[str], str]]:
    """Every live process: (pid, comm, the fields of /proc/<pid>/stat after comm, its command line)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(entry), stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split(), cmdline


def snapshot() -> dict[int, tuple[str, float]]:
    out: dict[int, tuple[str, float]] = {}
    for pid, comm, fields, cmdline in processes():
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        out[pid] = (_component(pid, comm, cmdline), ticks / _TICK)
    return out


def used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each component used between two snapshots."""
    total: Counter[str] = Counter()
    for pid, (component, seconds) in after.items():
        earlier = before.get(pid)
        start = earlier[1] if earlier and earlier[0] == component else 0.0
        if seconds > start:
            total[component] += seconds - start
    return {k: round(v, 2) for k, v in sorted(total.items()) if v >= 0.01}


def clocked(action) -> tuple[float, dict[str, float]]:
    """(wall seconds, CPU seconds by component) of running `action()`."""
    import time

    before = snapshot()
    start = time.perf_counter()
    action()
    return time.perf_counter() - start, used(before, snapshot())


def clocked_tree(action, servers: dict[int, str]) -> tuple[float, dict[str, float]]:
    """clocked(), counting only this process and its descendants (not whatever else runs on the machine: other
    Spark jobs' workers and JVMs), and the server processes in `servers` (pid -> name) under their own names rather
    than as spark_jvm (they are all `java`)."""
    import time

    before = snapshot()
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    after, mine = snapshot(), own_processes()

    def ours(shot: dict[int, tuple[str, float]]) -> dict[int, tuple[str, float]]:
        return {pid: (servers.get(pid, kind), cpu) for pid, (kind, cpu) in shot.items() if pid in mine}

    return seconds, used(ours(before), ours(after))


def rss_mib(pid: int | None) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration, TypeError):
        return None


def own_processes() -> set[int]:
    """This process and its descendants (Spark's JVM, its Python workers, the servers it started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at stderr meanwhile: the JVM started then (Ivy prints ":: loading settings ::"
    there) writes to stderr, and stdout keeps only the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
