"""Helpers for the deployment tests: Spark processes started the way users start them, each its own process."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pyspark
import pytest

SPARK_HOME = Path(pyspark.__file__).parent
EVERY_FORMAT = Path(__file__).with_name("every_format.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A child process whose merged output is collected; `wait_for` blocks until a line matches (an event)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def explain(self, tail: int = 3000) -> str:
        """For a failure message: the output's error lines (a stack trace's first lines and causes, which a
        long trace pushes out of the tail), then its tail."""
        errors = [line for line in self.lines if re.search(r"Error|Exception|Caused by|FAILED|failed", line)
                  and not line.lstrip().startswith("at ")]
        return ("error lines:\n" + "".join(errors[:40]) + f"\n... the output's last {tail} characters:\n"
                + self.output[-tail:])

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        regex = re.compile(pattern)
        with self._changed:
            ok = self._changed.wait_for(
                lambda: any(regex.search(line) for line in self.lines) or not self._reader.is_alive(), timeout)
            for line in self.lines:
                found = regex.search(line)
                if found:
                    return found
        state = "exited" if self.proc.poll() is not None else ("still running" if ok else "timed out")
        raise AssertionError(f"{self.args[0]}: no line matching {pattern!r} ({state}); output:\n{self.output[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self._reader.join(10)


def spark_env(tmp: Path, **more: str) -> dict[str, str]:
    """The environment of a Spark process of ours: its own temp dir, logs and stats dir (another machine)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_", "SLUICE_"))}
    env.update({"TMPDIR": str(tmp), "SLUICE_STATS_DIR": str(tmp / "stats"), "SPARK_LOG_DIR": str(tmp / "logs"),
                "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, **more})
    return env


# The formats every_format.py writes and reads back, each True in its result when what was read is what was written.
STORED = ("s2", "s2_upsert", "postgres", "postgres_changes", "clickhouse", "cassandra", "elasticsearch", "hbase",
          "tablestore", "sluice_kafka")

# A deployment test starts Spark processes of its own: under make test's load (two jobs on two cores) one took 222 s
# here and ran over 300 s on CI. A bound for a hung run, not a wait: each ends as soon as its run does.
DEPLOY_TIMEOUT_S = 600


def run_every_format(python: str, cfg: dict, env: dict[str, str], timeout: float = DEPLOY_TIMEOUT_S - 60) -> dict:
    """Run tests/deploy/every_format.py with `python`; its RESULT line as a dict (fails with its output, which
    names the steps it finished and their seconds). The timeout is below pytest's (DEPLOY_TIMEOUT_S) so that it is
    this one that ends a stuck run, with that output."""
    try:
        done = subprocess.run([python, str(EVERY_FORMAT), json.dumps(cfg)], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=env["TMPDIR"])
    except subprocess.TimeoutExpired as e:
        out, err = (text.decode() if isinstance(text, bytes) else text or "" for text in (e.stdout, e.stderr))
        raise AssertionError(f"every_format.py ran over {timeout:.0f} s; its steps:\n{out[-3000:]}\n"
                             f"{err[-6000:]}") from None
    found = re.search(r"^RESULT (.*)$", done.stdout, re.M)
    assert done.returncode == 0 and found, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    print(*re.findall(r"^STEP .*$", done.stdout, re.M), sep="\n")  # shown with -rA or on a later failure
    return json.loads(found.group(1))


def start_together(stack: ExitStack, *servers):
    """Each server's start (its `__enter__`) in a thread of its own, all at once: JVM starts wait on the disk and on
    their own readiness more than on a core. Each one started is stopped by `stack`, a failed start too."""
    with ThreadPoolExecutor(len(servers)) as pool:
        started = [pool.submit(server.__enter__) for server in servers]
    for server, future in zip(servers, started, strict=True):
        if future.exception() is None:
            stack.push(server.__exit__)
    return [future.result() for future in started]  # raises the first failure, after every start was registered


@pytest.fixture(scope="session")
def stores(tmp_path_factory, pg) -> Iterator[dict[str, str]]:
    """An S2 server, a ClickHouse server, the suite's PostgreSQL (tablestore meta too), and the design's stores: a
    Cassandra node, an OpenSearch node and an HBase with its Thrift2 gateway, each with the table every_format.py
    writes into, and a Kafka broker (every_format.py makes a topic per run), as every_format.py takes them."""
    from sluice.connectors.hbase._client import Connection, thrift
    from sluice.s2local import LocalS2
    from sluice.testing import LocalCassandra, LocalHBase, LocalKafka, LocalOpenSearch
    from tests.clickhouse_chdb import clickhouse_server

    with ExitStack() as stack:
        s2, ch, cassandra, search, hbase, kafka = start_together(
            stack, LocalS2(), clickhouse_server(), LocalCassandra(), LocalOpenSearch(), LocalHBase(), LocalKafka())
        with cassandra.cluster() as cluster:
            session = cluster.connect()
            session.execute("CREATE KEYSPACE deploy WITH replication = {'class': 'SimpleStrategy', "
                            "'replication_factor': 1}")
            session.execute("CREATE TABLE deploy.rows (id bigint PRIMARY KEY, name text)")
        t = thrift()
        table = t.TTableDescriptor(tableName=t.TTableName(ns=b"default", qualifier=b"deploy_rows"),
                                   columns=[t.TColumnFamilyDescriptor(name=b"d")])
        Connection((hbase.host,), hbase.port, 60.0).call("createTable", table, None)
        yield {"s2": s2.url, "pg": pg.url, "meta": pg.url, "ch": {"url": ch.url, "password": ch.password},
               "warehouse": str(tmp_path_factory.mktemp("warehouse")),
               "cassandra": {"host": cassandra.host, "port": str(cassandra.port), "keyspace": "deploy",
                             "table": "rows"},
               "search": {"nodes": search.url, "index": "deploy"},
               "hbase": {"host": hbase.host, "port": str(hbase.port), "table": "default:deploy_rows", "rowkey": "id",
                         "family": "d"},
               "kafka": kafka.bootstrap_servers}
