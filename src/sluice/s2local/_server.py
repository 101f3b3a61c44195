"""Running the local S2 server: in this process (the CLI) or as a child process (tests, demo)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

TOKEN_ENV = "SLUICE_S2_TOKEN"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tolerate_data_for_closed_streams() -> None:
    """hypercorn's HTTP/2 protocol raises KeyError on a DATA frame for a stream it already answered and closed,
    and that error ends the whole connection - every append and read session on it (seen with a task writing to
    1,000 streams). Such frames are legal HTTP/2 (the client had sent them before it saw the answer): acknowledge
    their flow-control window and drop them, as StreamEnded already is."""
    import contextlib

    import h2.events
    from hypercorn.protocol.h2 import H2Protocol

    if getattr(H2Protocol, "_sluice_patched", False):
        return
    handle_events = H2Protocol._handle_events

    async def _handle_events(self: H2Protocol, events: list[h2.events.Event]) -> None:
        for event in events:  # one at a time: an earlier event of the list may open the stream a later one uses
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                with contextlib.suppress(Exception):
                    self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                continue
            await handle_events(self, [event])

    H2Protocol._handle_events = _handle_events  # type: ignore[method-assign]
    H2Protocol._sluice_patched = True  # type: ignore[attr-defined]


def run_server(host: str = "127.0.0.1", port: int = 0, data_dir: Path | None = Path(".sluice/s2"),
               token: str | None = None, ready_file: Path | None = None, certfile: Path | None = None,
               keyfile: Path | None = None) -> None:
    """Serve until SIGINT/SIGTERM. `data_dir=None` keeps everything in memory; `certfile` and `keyfile` (PEM): HTTPS
    (HTTP/2 by ALPN, as the SDK asks) instead of plaintext HTTP/2."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from sluice.s2local._app import S2App
    from sluice.s2local._core import Core

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not _is_loopback(host) and not token:
        print(f"WARNING: serving S2 on {host} without --token: anyone who can reach this address can read and "
              "write every stream. Pass --token, or bind 127.0.0.1.", file=sys.stderr, flush=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    actual = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.keep_alive_timeout = 180  # above the SDK's 90 s idle reaper
    config.h2_max_concurrent_streams = 1000
    # hypercorn closes a connection after 1,000 requests by default (GOAWAY), failing whatever is in flight on it;
    # a client writing to many streams passes that within seconds. S2 keeps connections for as long as they are used.
    config.keep_alive_max_requests = 2**62
    config.accesslog = None
    config.loglevel = "WARNING"
    config.graceful_timeout = 2
    if certfile is not None:
        config.certfile, config.keyfile = str(certfile), str(keyfile)
    where = "in memory" if data_dir is None else f"data in {data_dir}"
    scheme = "https" if certfile is not None else "http"
    print(f"sluice s2 server listening on {scheme}://{host}:{actual} ({where})", flush=True)
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(str(actual))
        os.replace(tmp, ready_file)
    app = S2App(Core(data_dir), token)
    _tolerate_data_for_closed_streams()
    # arg-type: S2App's __call__ takes ASGI's scope as a plain dict, hypercorn's type its TypedDicts.
    asyncio.run(serve(app, config))  # type: ignore[arg-type]


class LocalS2:
    """A local S2-compatible server in a child process, on a free loopback port.

        with LocalS2() as s2:                       # in memory
            client = s2_sdk.S2("any-token", endpoints=s2.endpoints)
        with LocalS2(data_dir=".sluice/s2") as s2:  # durable
            ...

    `tls=True`: HTTPS with a certificate for 127.0.0.1/localhost that a throwaway CA signed (sluice.testing._tls);
    `.ca_pem` is what a client trusts (format("s2")'s s2.ssl.ca-pem; the SDK alone trusts only the system's CAs).
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, token: str | None = None,
                 host: str = "127.0.0.1", startup_timeout: float = 30.0, port: int = 0, tls: bool = False) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.token = token
        self.host = host
        self.startup_timeout = startup_timeout
        self.requested_port = port  # 0: any free port
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = tls
        self.ca_pem = ""
        self._tls_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the local S2 server is not running")
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def endpoints(self):  # -> s2_sdk.Endpoints
        from s2_sdk import Endpoints

        return Endpoints(account=self.url, basin=self.url)

    @property
    def access_token(self) -> str:
        """What to give the SDK: the server's token, or any string when it has none."""
        return self.token or "local"

    def start(self) -> LocalS2:
        with tempfile.TemporaryDirectory() as tmp:
            ready = Path(tmp) / "port"
            cmd = [sys.executable, "-m", "sluice.s2local", "--host", self.host, "--port", str(self.requested_port),
                   "--ready-file", str(ready)]
            cmd += ["--data-dir", str(self.data_dir)] if self.data_dir is not None else ["--in-memory"]
            cmd += self._certificate_arguments()
            env = dict(os.environ)
            if self.token:
                env[TOKEN_ENV] = self.token  # not on the command line, where `ps` would show it
            self.process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + self.startup_timeout
            while not ready.exists():
                if self.process.poll() is not None:
                    raise RuntimeError(f"the local S2 server exited with code {self.process.returncode} at start-up")
                if time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"the local S2 server did not start within {self.startup_timeout} s")
                time.sleep(0.02)
            self.port = int(ready.read_text())
        return self

    def _certificate_arguments(self) -> list[str]:
        """--certfile/--keyfile of a certificate made at the first start (a restart keeps it), or none."""
        if not self.tls:
            return []
        if self._tls_dir is None:
            from sluice.testing._tls import TestCA

            self._tls_dir = tempfile.TemporaryDirectory(prefix="sluice-s2-tls-")
            ca = TestCA("sluice test CA (s2)")
            self.ca_pem = ca.pem
            ca.server_certificate().write(Path(self._tls_dir.name))
        folder = Path(self._tls_dir.name)
        return ["--certfile", str(folder / "server.crt"), "--keyfile", str(folder / "server.key")]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._tls_dir is not None:
            self._tls_dir.cleanup()
            self._tls_dir = None

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; for crash tests."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> LocalS2:
        """Start again after `kill` or `stop`, on the same port and data (a durable server's clients reconnect)."""
        if self.port is not None:
            self.requested_port = self.port
        return self.start()

    def __enter__(self) -> LocalS2:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
