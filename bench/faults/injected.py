"""What bench/faults/ injects and how it runs a write under a fault: the strike inside the write's own stage, the
pace that lets a strike land mid-write, the local S2 server it kills and restarts in place, and the streaming driver
(bench/faults/stream_driver.py) it SIGKILLs and starts again on its checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import s2_sdk

import sluice
from bench.checkouts import ROOT, module_command


def write(base, fmt: str, opts: dict, fault) -> None:
    """Rows laid out as sluice.write() lays them out, the fault injected in the writing stage itself (a fault
    before a shuffle would fail the job before any row is written), then written."""
    laid_out = base if fmt == "tablestore" else sluice.partitioned(base, fmt, opts)
    laid_out.mapInArrow(fault, base.schema).write.format(fmt).options(**opts).mode("append").save()


def expect_failure(write) -> None:
    """Run a write that the scenario makes fail; it must fail."""
    try:
        write()
    except Exception:
        return
    raise AssertionError("the injected failure did not fail the write")


def strike_at(row: int, marker: str, *, die: bool):
    """Pass-through mapInArrow that strikes on reaching id `row` while the file `marker` exists: `die` removes the
    marker and kills the worker (os._exit; Spark retries the task), else it raises (the write fails)."""

    def fn(batches):
        import os as _os

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                part = batch.slice(start, 100)
                if part.column(0)[0].as_py() >= row and _os.path.exists(marker):
                    if die:
                        _os.remove(marker)
                        _os._exit(1)
                    raise RuntimeError(f"injected failure at id {row}")
                yield part

    return fn


def paced(pause: float):
    def fn(batches):
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                _time.sleep(pause)
                yield batch.slice(start, 100)

    return fn


class S2Server:
    """The local S2 server on a fixed port and data dir, so it can be killed and started again in place."""

    def __init__(self, data: Path) -> None:
        self.data = data
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        ready = self.data.with_suffix(".ready")
        ready.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "sluice.s2local", "--port", str(self.port),
                                      "--data-dir", str(self.data), "--ready-file", str(ready)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError("the S2 server did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def records(self, basin: str, stream: str) -> list[dict]:
        async def go():
            endpoints = s2_sdk.Endpoints(account=self.url, basin=self.url)
            async with s2_sdk.S2("bench", endpoints=endpoints) as s2:
                handle = s2.basin(basin).stream(stream)
                tail = (await handle.check_tail()).seq_num
                out = []
                if tail:
                    async for batch in handle.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=tail)):
                        out.extend(batch.records)
                return [{**json.loads(r.body or b"{}"), **json.loads(dict(r.headers).get(b"@key", b"{}"))}
                        for r in out if not r.is_command_record()]

        return asyncio.run(go())


PAUSE = 0.03  # per 100 rows: a 20,000-row write runs a few seconds, so a strike at 1 s lands mid-write


def landed(struck: list[float], ended: float) -> str:
    if not struck or struck[0] == float("inf"):
        return "strike found nothing to strike"
    return "struck mid-write" if struck[0] < ended else "strike came after the write (not a valid run)"


STREAM_FILES = 10  # micro-batches of the streaming scenario
KILL_AFTER_BATCHES = 3


def restarted_mid_write(server, write_it: Callable[[], None]) -> str:
    """Run `write_it` while, a second in, `server` (kill() and start(): the S2 server, a LocalCassandra) is killed
    and started again on its data; says whether the strike landed mid-write."""
    struck: list[float] = []

    def strike() -> None:
        time.sleep(1.0)  # a bench, not a test: strike once the write is under way
        server.kill()
        struck.append(time.monotonic())
        server.start()

    striker = threading.Thread(target=strike)
    striker.start()
    write_it()
    ended = time.monotonic()
    striker.join()
    return landed(struck, ended)


def run_driver(fmt: str, opts: dict, inputs: Path, checkpoint: Path, **popen) -> subprocess.Popen:
    args = module_command("bench.faults.stream_driver", fmt, json.dumps(opts), str(inputs), str(checkpoint))
    if popen:
        return subprocess.Popen(args, cwd=ROOT, **popen)
    return subprocess.run(args, capture_output=True, cwd=ROOT)


def kill_driver_after(fmt: str, opts: dict, inputs: Path, checkpoint: Path, batches: int) -> int:
    """Start the streaming driver; once `batches` micro-batches are committed and the next one is under way (its
    offsets logged, its commit not), let it write for a moment, then SIGKILL the process group (driver, JVM,
    Python workers). Returns how many micro-batches were committed when it died."""
    log = checkpoint.with_suffix(".log")
    with log.open("wb") as out:
        proc = run_driver(fmt, opts, inputs, checkpoint, start_new_session=True, stdout=out, stderr=out)

    def count(folder: str) -> int:
        path = checkpoint / folder
        return len(list(path.glob("[0-9]*"))) if path.exists() else 0

    while not (count("commits") >= batches and count("offsets") > count("commits")):
        if proc.poll() is not None:
            raise RuntimeError(f"the streaming driver for {fmt} exited ({proc.returncode}) before the kill; its "
                               f"log: {log}")
        time.sleep(0.05)
    time.sleep(0.5)  # a bench, not a test: the micro-batch's tasks are writing now (each takes ~1 s, paced)
    committed = count("commits")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return committed


def counts(ids: list[int], n: int) -> dict[str, int]:
    seen = Counter(ids)
    return {"lost": sum(1 for i in range(n) if i not in seen), "duplicated": sum(c - 1 for c in seen.values())}
