"""The tests' side: the stand-in in a subprocess of its own, and the choice between it and clickhouse-server."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChdbClickHouse:
    """Context manager: the stand-in in a subprocess of its own; `.url` is its HTTP endpoint, `.password` the
    default user's (the surface of sluice.testing.LocalClickHouse)."""

    def __init__(self, *, password: str = "sluice-test-pw") -> None:
        self.password = password
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ChdbClickHouse:
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-chdb-"))
        self.port = free_port()
        log = self._dir / "server.log"
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.clickhouse_chdb", "--port", str(self.port), "--data",
                 str(self._dir / "data"), "--password", self.password],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
                    "PYTHONPATH")]))}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as response:
                    if response.read() == b"Ok.\n":
                        return self
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                output = log.read_text(errors="replace")[-3000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"the chdb stand-in did not start: {output}")
            time.sleep(0.05)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def sql(self, query: str, body: bytes | None = None) -> str:
        """Run one statement as the default user; returns the response text (errors raise with the server's)."""
        url = f"{self.url}/?query={urllib.parse.quote(query)}" if body is not None else f"{self.url}/"
        request = urllib.request.Request(url, data=body if body is not None else query.encode(), method="POST")
        token = base64.b64encode(f"default:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"ClickHouse: {e.read().decode()[:2000]}") from None

    def rows(self, query: str) -> list[list[Any]]:
        """Tab-separated result rows as lists of strings."""
        text = self.sql(query + " FORMAT TabSeparated")
        return [line.split("\t") for line in text.splitlines()]


def clickhouse_server() -> Any:
    """The ClickHouse the tests run on: Debian's clickhouse-server (default), or this stand-in on ClickHouse 26's
    engine with SLUICE_TEST_CLICKHOUSE=chdb."""
    choice = os.environ.get("SLUICE_TEST_CLICKHOUSE", "server")
    if choice == "chdb":
        return ChdbClickHouse()
    if choice == "server":
        from sluice.testing import LocalClickHouse

        return LocalClickHouse()
    raise ValueError(f"SLUICE_TEST_CLICKHOUSE={choice!r}: use 'server' (clickhouse-server, the default) or 'chdb'")
