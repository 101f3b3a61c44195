"""The tests' side: the stand-in in a subprocess of its own, and the choice between it and clickhouse-server."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sluice.testing._clickhouse import ClickHouseHTTP
from sluice.testing._postgres import free_port
from tests.clickhouse_chdb._http import PASSWORD_VARIABLE

ROOT = Path(__file__).resolve().parents[2]


class ChdbClickHouse(ClickHouseHTTP):
    """Context manager: the stand-in in a subprocess of its own; `.url` is its HTTP endpoint, `.password` the
    default user's (the surface of sluice.testing.LocalClickHouse). `tls=True`: HTTPS only, with a certificate for
    127.0.0.1/localhost that a throwaway CA signed (`.ca_pem`, what clients trust; sluice.testing._tls), or for
    `tls_names` only (then `.url` names the first). `client_auth=True` (with tls): every client must present a
    certificate that `.client_ca` signed (Python's ssl, verify_mode=CERT_REQUIRED); the harness presents its own."""

    def __init__(self, *, password: str = "sluice-test-pw", tls: bool = False,
                 tls_names: tuple[str, ...] = (), client_auth: bool = False) -> None:
        if client_auth and not tls:
            raise ValueError("client_auth needs tls=True (client certificates are part of TLS)")
        super().__init__(password=password, tls=tls)
        self.tls_names = tls_names
        self.client_ca: Any = None
        if client_auth:
            from sluice.testing._tls import TestCA

            self.client_ca = TestCA("sluice test client CA (clickhouse)")
            self.client_certificate = self.client_ca.client_certificate("sluice-test-harness")
        if tls_names:
            self.host = tls_names[0]

    def __enter__(self) -> ChdbClickHouse:
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-chdb-"))
        self.port = free_port()
        if self.tls:
            from sluice.testing._tls import TestCA

            ca = TestCA("sluice test CA (clickhouse)")
            self.ca_pem = ca.pem
            ca.server_certificate(*(self.tls_names and (self.tls_names,))).write(self._dir)
            if self.client_ca is not None:
                (self._dir / "client-ca.pem").write_text(self.client_ca.pem)
        self._launch()
        return self

    def restart(self) -> None:
        """Stop the server process and start it again on the same port and data (clients see refused connections
        meanwhile)."""
        from sluice.testing._postgres import stop

        stop(self._proc)
        self._launch()

    def start(self) -> None:
        self._launch()

    def _launch(self) -> None:
        assert self._dir is not None
        log = self._dir / "server.log"
        with log.open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.clickhouse_chdb", "--port", str(self.port), "--data",
                 str(self._dir / "data"), *self._certificate_arguments()],
                cwd=ROOT, env={**os.environ, PASSWORD_VARIABLE: self.password, "PYTHONPATH": os.pathsep.join(filter(
                    None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(log, "the chdb stand-in")

    def _certificate_arguments(self) -> list[str]:
        assert self._dir is not None
        if not self.tls:
            return []
        client = ["--client-cafile", str(self._dir / "client-ca.pem")] if self.client_ca is not None else []
        return ["--certfile", str(self._dir / "server.crt"), "--keyfile", str(self._dir / "server.key"), *client]


def clickhouse_server() -> Any:
    """The ClickHouse the tests run on: this stand-in on ClickHouse 26's engine (default), or with
    SLUICE_TEST_CLICKHOUSE=server the clickhouse-server binary sluice.testing.LocalClickHouse finds (23.3 or newer:
    older servers are refused by the connector)."""
    choice = os.environ.get("SLUICE_TEST_CLICKHOUSE", "chdb")
    if choice == "chdb":
        return ChdbClickHouse()
    if choice == "server":
        from sluice.testing import LocalClickHouse

        return LocalClickHouse()
    raise ValueError(f"SLUICE_TEST_CLICKHOUSE={choice!r}: use 'chdb' (the stand-in, the default) or 'server'")
