"""A JVM server for the tests, in a folder of its own: started, waited for, killed (as a crash would) and started
again on the same data, stopped with its folder removed. LocalCassandra and LocalOpenSearch say what differs: how
the server is found and configured, its command line and when it is ready."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from sluice.testing._postgres import stop


def find_java(server: str) -> str:
    """The `java` of $JAVA_HOME, else the one on PATH (RuntimeError saying how to install one)."""
    java_home = os.environ.get("JAVA_HOME")
    for candidate in (java_home and str(Path(java_home) / "bin" / "java"), shutil.which("java")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError(f"{server} needs Java 17, which was not found: apt-get install -y openjdk-17-jre-headless")


class JvmServer:
    """Subclasses set `server` and `logs`, and implement `_check_installed`, `_write_config`, `_command` and
    `_wait_ready`; `_after_ready` and `_exited` are optional hooks."""

    server: ClassVar[str]  # its name, in errors
    logs: ClassVar[tuple[str, ...]]  # files of its folder whose ends explain a failed start

    def __init__(self, start_timeout: float) -> None:
        self.start_timeout = start_timeout
        self.start_seconds = 0.0  # how long the last start() took, until the server answered
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def folder(self) -> Path | None:
        """The server's folder: its configuration, data and logs (output.log holds its standard output)."""
        return self._dir

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _check_installed(self) -> None:
        """Raise (with the command that installs it) when the server or Java is missing."""
        raise NotImplementedError

    def _write_config(self) -> None:
        """Fill the new folder `self._dir`: configuration, ports."""
        raise NotImplementedError

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _wait_ready(self, timeout: float) -> None:
        """Return once the server answers; raise (with `_log_tail()`) if it exits or the time runs out."""
        raise NotImplementedError

    def _environment(self) -> dict[str, str] | None:
        """The server's environment variables (None: this process's)."""
        return None

    def _after_ready(self) -> None:
        """After each start, once the server answers (e.g. make a user)."""

    def _exited(self, returncode: int | None) -> None:
        """After the process ended: its exit code, None when it was killed."""

    def start(self) -> Self:
        """Start the server: in a new folder on new ports the first time, on the same ones after kill()/stop()."""
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError(f"this {self.server} server is running already")
        self._check_installed()  # the install hint, before a folder is made
        began = time.monotonic()
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix=f"sluice-{self.server.lower()}-"))
            try:
                self._write_config()
            except BaseException:
                self.stop()
                raise
        with (self._dir / "output.log").open("ab") as output:
            self._proc = subprocess.Popen(self._command(), stdout=output, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self._dir, start_new_session=True,
                                          env=self._environment())
        try:
            self._wait_ready(self.start_timeout)
            self._after_ready()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _log_tail(self) -> str:
        assert self._dir is not None
        parts = []
        for name in ("output.log", *self.logs):
            path = self._dir / name
            if path.exists():
                parts.append(f"--- {name}:\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would (its folder stays: start() brings it back on the same data)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        self._exited(None)

    def stop(self, *, keep_data: bool = False) -> None:
        """End the server (SIGTERM, then SIGKILL after 30 s) and delete its folder, unless `keep_data` (then
        start() brings it back on the same data and ports)."""
        stop(self._proc)
        self._exited(self._proc.returncode if self._proc is not None else None)
        self._proc = None
        if not keep_data and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
