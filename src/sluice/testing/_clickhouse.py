"""A throwaway ClickHouse server for tests and benchmarks: the real server binary, on loopback.

`LocalClickHouse()` writes a minimal config into a temporary folder and starts `clickhouse-server` with its HTTP
interface on a free loopback port and a password for the `default` user, then stops it and deletes the folder on
exit. The binary comes from Debian's `clickhouse-server` package or from PATH (`clickhouse-server`, or the single
`clickhouse` binary of ClickHouse's own packages). sluice's connector needs 23.3 or newer: Debian bookworm's package
is 18.16, which the connector refuses; install a current ClickHouse for a server it writes to.

Fault tests: `kill()` SIGKILLs the server, as a crash would, and `start()` brings it back on the same port and data
(tests/clickhouse_chdb's stand-in has both too).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any
from xml.sax.saxutils import escape

from sluice.testing._postgres import free_port, stop

INSTALL_HINT = "install the server: apt-get install -y clickhouse-server"

CONFIG = """<yandex>
  <logger><level>warning</level><log>{dir}/server.log</log><errorlog>{dir}/error.log</errorlog></logger>
  <http_port>{port}</http_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{dir}/data/</path>
  <tmp_path>{dir}/tmp/</tmp_path>
  <mark_cache_size>67108864</mark_cache_size>
  <max_concurrent_queries>200</max_concurrent_queries>
  <users>
    <default>
      <password>{password}</password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <profiles><default/></profiles>
  <quotas><default/></quotas>
</yandex>
"""


def find_server() -> str:
    for candidate in ("/usr/sbin/clickhouse-server", shutil.which("clickhouse-server"), shutil.which("clickhouse")):
        if candidate and Path(candidate).exists():
            return candidate
    raise RuntimeError(f"the ClickHouse server binary (clickhouse-server) was not found; {INSTALL_HINT}")


class ClickHouseHTTP:
    """A test server on a loopback port with a password for `default`, and SQL over its HTTP interface."""

    def __init__(self, *, password: str = "sluice-test-pw", tls: bool = False) -> None:
        self.password = password
        self.tls = tls  # HTTPS (the chdb stand-in of tests/clickhouse_chdb serves it; LocalClickHouse does not yet)
        self.ca_pem = ""
        self.client_certificate: Any = None  # a server demanding client certificates: the harness's own
        self.host = "127.0.0.1"  # the name in .url (the server listens on 127.0.0.1)
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def _context(self) -> Any:
        """The TLS context of the test's own requests: trusts the server's CA, and presents the harness's client
        certificate when the server demands one (None for plain HTTP)."""
        import ssl

        if not self.tls:
            return None
        context = ssl.create_default_context(cadata=self.ca_pem)
        if self.client_certificate is not None:
            assert self._dir is not None
            context.load_cert_chain(*self.client_certificate.write(self._dir, "harness-client"))
        return context

    def _wait_ready(self, log: Path, what: str, timeout: float = 60) -> None:
        """Until GET /ping answers Ok.; if the process ends or the time runs out, stop it and raise with its log."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1, context=self._context()) as response:
                    if response.read().strip() == b"Ok.":
                        return
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                output = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                self.__exit__(None, None, None)
                raise RuntimeError(f"{what} did not start: {output}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (its folder stays: start() brings it back on the same port and
        data)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def start(self) -> None:
        """Start the server again on its port and data, after kill(); returns once it answers."""
        raise NotImplementedError

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        stop(self._proc)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def sql(self, query: str, body: bytes | None = None) -> str:
        """Run one statement as the default user; returns the response text (errors raise with the server's)."""
        request = urllib.request.Request(f"{self.url}/?query={urllib.parse.quote(query)}" if body is not None
                                         else f"{self.url}/", data=body if body is not None else query.encode(),
                                         method="POST")
        token = base64.b64encode(f"default:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=60, context=self._context()) as response:
                return response.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"ClickHouse: {e.read().decode()[:2000]}") from None

    def rows(self, query: str) -> list[list[Any]]:
        """Tab-separated result rows as lists of strings."""
        text = self.sql(query + " FORMAT TabSeparated")
        return [line.split("\t") for line in text.splitlines()]


class LocalClickHouse(ClickHouseHTTP):
    """Context manager: a fresh ClickHouse server; `.url` is its HTTP endpoint, `.password` the default user's."""

    def __enter__(self) -> LocalClickHouse:
        if self.tls:
            raise RuntimeError("LocalClickHouse serves plain HTTP only; the chdb stand-in (tests/clickhouse_chdb) "
                               "serves HTTPS")
        find_server()  # a missing binary fails here, before any folder is made
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-ch-"))
        self.port = free_port()
        (self._dir / "config.xml").write_text(CONFIG.format(dir=self._dir, port=self.port,
                                                            password=escape(self.password)))
        self.start()
        return self

    def start(self) -> None:
        assert self._dir is not None
        binary = find_server()
        config = self._dir / "config.xml"
        args = [binary] if binary.endswith("server") else [binary, "server"]
        self._proc = subprocess.Popen([*args, f"--config-file={config}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(self._dir / "error.log", "clickhouse-server", 60)

