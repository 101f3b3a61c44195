"""Fault injection for Spark-level tests: slow pass-through stages, dying workers, small Arrow batches."""

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def slow(rows_per_batch: int, pause: float):
    """A pass-through mapInArrow that yields small batches slowly, so a write is still running when we strike."""

    def fn(batches):
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, rows_per_batch):
                _time.sleep(pause)
                yield batch.slice(start, rows_per_batch)

    return fn


def sockets_to(port: int) -> set[str]:
    """Inodes of the TCP sockets on this machine connected to 127.0.0.1:`port` (from /proc/net/tcp)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port == port and fields[3] == "01":  # ESTABLISHED
            inodes.add(fields[9])
    return inodes


class Striker(threading.Thread):
    """A fault struck from a background thread while the test's write runs in the foreground; `join()` raises what
    the strike raised (an assertion that the event never came), so a failed strike fails the test."""

    def __init__(self, strike: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self._strike = strike
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._strike()
        except BaseException as error:  # handed to join(): the test's thread raises it
            self.error = error

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"the strike did not end within {timeout} s")
        if self.error is not None:
            raise self.error


def poll_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Call `predicate` until it returns something true, and return that; fail naming `what` after `timeout` s.

    For state that lives in another process and has no notification to wait on (a broker's high watermarks, the
    MetaService's barriers, a query's progress seen through its sink): polled, never slept through blindly."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(interval)


def wait_for_a_client(host: str, port: int, timeout: float = 120.0) -> None:
    """While a killed server's port is free, stand in for it until a client of another process (the write's Spark
    workers) connects, then drop that connection: the event that proves a write met the outage (its request failed
    there), before the test heals the fault. A server restarted straight after a kill may be back before the write
    reaches it, and the write never fails. The test's own clients are dropped and not counted: a Cassandra
    session's control connection, for one, reconnects on its own schedule, without any write."""
    deadline = time.monotonic() + timeout
    with socket.create_server((host, port), reuse_port=False) as listener:
        while True:
            listener.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                client, peer = listener.accept()
            except TimeoutError:
                raise AssertionError(f"no client of the write reached {host}:{port} within {timeout:.0f} s of the "
                                     "outage") from None
            ours = _ours(peer[1])  # asked while the client's socket is still open
            client.close()
            if not ours:
                return


def _ours(local_port: int) -> bool:
    """Whether the TCP socket whose local port is `local_port` (a client's) is this process's (/proc/net/tcp)."""
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if int(line.split()[1].split(":")[1], 16) == local_port}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def kill_python_workers(store_port: int | None = None, opened_before: Collection[str] = ()) -> int:
    """SIGKILL Spark's forked Python workers (children of pyspark.daemon), as an executor losing them would.

    With `store_port`, only the workers connected to the store (the sink's writers): killing every worker
    also kills idle pooled ones, which Spark may hand to the retried task a moment later, so the retry
    dies too (seen in CI). `opened_before` (sockets_to's inodes, taken before the write started): connections
    that are not the write's, left alone, such as the Kafka consumers an idle worker keeps for its life."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    procs = [line.split(None, 2) for line in out.splitlines() if "pyspark.daemon" in line or "pyspark/daemon" in line]
    daemons = {pid for pid, _, _ in procs}
    wanted = sockets_to(store_port) - set(opened_before) if store_port is not None else None
    killed = 0
    for pid, ppid, _ in procs:
        if ppid not in daemons:
            continue
        if wanted is not None:
            try:
                fds = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            except OSError:  # the process ended meanwhile
                continue
            if not any(f"socket:[{inode}]" in fds for inode in wanted):
                continue
        os.kill(int(pid), signal.SIGKILL)
        killed += 1
    return killed


def held_at(row: int, marker: str, rows_per_batch: int, pause: float):
    """Like slow(), but while `marker` exists the input stops before id `row` (until the file is removed): a strike
    that waits for the write's progress lands while the write is still running, however loaded the machine. The
    striker kills, then removes the marker, so the retried task runs through."""

    def fn(batches):
        import os as _os
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, rows_per_batch):
                part = batch.slice(start, rows_per_batch)
                while _os.path.exists(marker) and part.column(0)[0].as_py() >= row:
                    _time.sleep(0.05)  # polls a file in another process: no event to wait on
                _time.sleep(pause)
                yield part

    return fn


def dying_at(row: int, marker: str, rows_per_batch: int, pause: float):
    """Like slow(), but while `marker` exists the Python worker dies (os._exit) on reaching id `row`."""

    def fn(batches):
        import os as _os
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, rows_per_batch):
                part = batch.slice(start, rows_per_batch)
                if _os.path.exists(marker) and part.column(0)[0].as_py() >= row:
                    _os._exit(1)  # the worker process dies mid-task, like a lost executor
                _time.sleep(pause)
                yield part

    return fn


def dying_stream(spark, tmp_path, pause: float):
    """A stream of ids 0..2999 (three parquet files, one per micro-batch, rows padded to ~1 KB) whose worker
    dies on reaching id 1500 while the returned marker file exists. Returns (stream, marker, checkpoint dir)."""
    src, marker = tmp_path / "in", tmp_path / "die"
    for part in range(3):
        spark.range(part * 1000, (part + 1) * 1000, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
            .write.mode("append").parquet(str(src))
    marker.touch()
    stream = (spark.readStream.schema("id long, pad string").option("maxFilesPerTrigger", 1).parquet(str(src))
              .mapInArrow(dying_at(1500, str(marker), 50, pause), "id long, pad string"))
    return stream, marker, tmp_path / "checkpoint"


def fails_while(marker, at_id: int):
    """A column expression's UDF: returns id, but raises at `at_id` while the file `marker` exists (a job that fails
    part-way through, then succeeds once the marker is removed)."""
    from pyspark.sql.functions import udf

    path = str(marker)

    @udf("long")
    def guard(i):
        import os

        if i == at_id and os.path.exists(path):
            raise RuntimeError(f"injected failure at id {i}")
        return i

    return guard


def dies_once_at(row: int, marker: str):
    """A pass-through mapInArrow whose Python worker dies (os._exit) on reaching id `row`, once: the first to get
    there removes `marker` before dying, so Spark's retry of the task runs through."""

    def fn(batches):
        import os as _os

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                part = batch.slice(start, 100)
                if part.column(0)[0].as_py() >= row and _os.path.exists(marker):
                    _os.remove(marker)
                    _os._exit(1)
                yield part

    return fn


def die_while(marker: str):
    """Pass-through that kills its Python worker while `marker` exists (a streaming query dying mid-batch)."""

    def fn(batches):
        import os as _os

        for batch in batches:
            if _os.path.exists(marker) and batch.num_rows:
                _os._exit(1)
            yield batch

    return fn


def dies_once_when_stored(row: int, marker: str, stored) -> callable:
    """As dies_once_at, but the worker first waits (up to 60 s) until `stored()` is true: e.g. until the sink has
    written some of this task's rows, so the retried task certainly repeats rows already in the store."""

    def fn(batches):
        import os as _os
        import threading as _threading
        import time as _time

        for batch in batches:
            for start in range(0, batch.num_rows, 100):
                part = batch.slice(start, 100)
                if part.column(0)[0].as_py() >= row and _os.path.exists(marker):
                    deadline = _time.monotonic() + 60
                    while not stored():
                        if _time.monotonic() > deadline:
                            raise AssertionError("the sink stored none of the task's rows within 60 s")
                        _threading.Event().wait(0.05)
                    _os.remove(marker)
                    _os._exit(1)
                yield part

    return fn


def replay_first_micro_batch(spark, workdir: Path, schema: str, batch: Callable[[int], pa.Table], format: str,
                             options: dict[str, str], stored: Callable[[], Any]) -> tuple[Any, Any]:
    """A micro-batch whose write reached the store but not the checkpoint's commit log (the driver was killed),
    replayed after a later batch changed the same rows: batch 0 is written from a parquet file, a copy of the
    checkpoint loses batch 0's commit, batch 1 is written, then the copy runs and replays batch 0. Returns what
    `stored()` said after batch 1 and after the replay."""
    src, checkpoint, backup = workdir / "src", workdir / "checkpoint", workdir / "backup"
    src.mkdir(parents=True)

    def run(checkpoint_dir: Path) -> None:
        query = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.format(format).options(**options).option("checkpointLocation", str(checkpoint_dir))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None

    pq.write_table(batch(0), src / "0.parquet")
    run(checkpoint)
    shutil.copytree(checkpoint, backup)
    for name in ("0", ".0.crc"):  # the backup: batch 0 written, its commit not recorded
        (backup / "commits" / name).unlink(missing_ok=True)
    pq.write_table(batch(1), src / "1.parquet")
    run(checkpoint)
    after_batch_1 = stored()
    (src / "1.parquet").unlink()  # the backup's source log knows only batch 0's file
    run(backup)  # replays batch 0
    return after_batch_1, stored()
