"""A throwaway S3-compatible server for tests and benchmarks: moto's standalone server, a separate process.

`LocalS3()` starts `python -m moto.server` (PyPI: `moto[s3]`, flask, flask-cors) on a free loopback port and
creates one bucket; clients reach it over HTTP like any S3 endpoint (it enforces conditional writes,
`If-None-Match: *`, which Delta commits on S3 rely on). `.storage` holds the table store's `storage.*` options.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from sluice.testing._postgres import free_port, stop

INSTALL_HINT = "install the test dependencies: make test (or pip install 'moto[s3]' flask flask-cors)"


class LocalS3:
    """Context manager: a fresh S3-compatible server with bucket `bucket`; `.endpoint` is its URL."""

    def __init__(self, bucket: str = "sluice-test", *, access_key: str = "sluice-test-key",
                 secret_key: str = "sluice-test-secret") -> None:
        self.bucket, self.access_key, self.secret_key = bucket, access_key, secret_key
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage(self) -> dict[str, str]:
        """The table store's options reaching this server."""
        return {"storage.endpoint": self.endpoint, "storage.access-key-id": self.access_key,
                "storage.secret-access-key": self.secret_key}

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def __enter__(self) -> LocalS3:
        try:
            import moto.server  # noqa: F401
        except ImportError:
            raise RuntimeError(f"moto's S3 server is not installed; {INSTALL_HINT}") from None
        self.port = free_port()
        self._log = Path(tempfile.mkstemp(prefix="sluice-s3-", suffix=".log")[1])
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                           str(self.port)], stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                output = self._log.read_text()[-2000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"moto's S3 server did not start: {output}")
            time.sleep(0.05)

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under `prefix` in the bucket (read back over S3's API, not from the server's memory)."""
        from pyarrow import fs

        s3 = fs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, endpoint_override=self.endpoint,
                             region="us-east-1")
        infos = s3.get_file_info(fs.FileSelector(f"{self.bucket}/{prefix}", recursive=True, allow_not_found=True))
        return sorted(i.path.split("/", 1)[1] for i in infos if i.type == fs.FileType.File)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        stop(self._proc)
        if self._log is not None:
            self._log.unlink(missing_ok=True)
