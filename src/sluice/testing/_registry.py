"""A throwaway schema registry for tests and benchmarks: Apicurio Registry (a Quarkus JVM) on loopback, serving
Confluent's Schema Registry API at `<url>/apis/ccompat/v7`.

The server is Apicurio's prebuilt bundle from Maven Central (`io.apicurio:apicurio-registry-app:<version>:tar.gz:all`:
quarkus-run.jar and its libraries): `make check-registry` unpacks it into ~/.cache/sluice/apicurio-registry-<version>
($SLUICE_REGISTRY_HOME instead). It needs Java 21 or newer, which is not the `java` Spark uses (17): `find_java()`
takes $SLUICE_REGISTRY_JAVA, else $JAVA_HOME's or PATH's `java` when it is 21 or newer, else the newest JDK >= 21
under /usr/lib/jvm.

Its settings are a config/application.properties in the server's folder (Quarkus reads that file from its working
directory, so the embedded user's password is on no command line): the HTTP and the management interface on
loopback (Quarkus binds both to every interface by default, management on 9000) on free ports; a small heap; storage
in an H2 database in a file of the folder (Apicurio's default is an in-memory H2), so that `restart()` (or `kill()`
then `start()`) keeps every schema, its id and every subject's compatibility level, on the same port. Ready when
the management interface's `GET /health/ready` answers 200; its log is output.log of the folder, whose end a failed
start shows.

`auth=True`: every request must authenticate, by HTTP basic authentication (Quarkus's embedded users, which
Apicurio's build enables) of the user `.username` with `.password`, or by a bearer token: a JWT that
`.bearer_token()` signs (RS256) with a key made at the first start, which Quarkus OIDC verifies locally against its
public key (`quarkus.oidc.public-key`: no OpenID Connect server). Anything else is refused with 401.
`tls=True`: HTTPS only, with a certificate for loopback signed by a throwaway CA (`.ca_pem`; `_tls.TestCA`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sluice.testing._jvm import JvmServer
from sluice.testing._postgres import free_port

# The one place the version is pinned: the Makefile's check-registry reads this line.
REGISTRY_VERSION = "3.3.3"
INSTALL_HINT = "fetch it from Maven Central with: make check-registry"
MIN_JAVA = 21
JVM_ROOT = Path("/usr/lib/jvm")
USERNAME = "sluice"
CCOMPAT = "/apis/ccompat/v7"  # Confluent's Schema Registry API, as Apicurio serves it


def registry_home() -> Path:
    """The folder `make check-registry` fills: $SLUICE_REGISTRY_HOME, else ~/.cache/sluice/apicurio-registry-<v>."""
    home = os.environ.get("SLUICE_REGISTRY_HOME")
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"apicurio-registry-{REGISTRY_VERSION}"


def find_jar() -> Path:
    """quarkus-run.jar of the unpacked bundle (RuntimeError saying how to fetch it, when make check-registry has
    not)."""
    home = registry_home()
    jar = home / "quarkus-run.jar"
    if not ((home / ".complete").is_file() and jar.is_file()):
        raise RuntimeError(f"Apicurio Registry {REGISTRY_VERSION} was not found in {home}; {INSTALL_HINT}")
    return jar


def java_major(java: Path) -> int | None:
    """The major version of the JDK or JRE whose bin/java is `java`, from its `release` file (None: no such file)."""
    release = java.resolve().parent.parent / "release"
    try:
        text = release.read_text()
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', text, re.MULTILINE)
    return int(found.group(1)) if found else None


def find_java() -> str:
    """A `java` of version 21 or newer: $SLUICE_REGISTRY_JAVA (taken as it is), else $JAVA_HOME's or PATH's when
    new enough, else the newest under /usr/lib/jvm. RuntimeError saying what to do when there is none."""
    override = os.environ.get("SLUICE_REGISTRY_JAVA")
    if override:
        if not Path(override).is_file():
            raise RuntimeError(f"SLUICE_REGISTRY_JAVA={override} is not a file; point it at the bin/java of a JDK "
                               f">= {MIN_JAVA}")
        return override
    candidates: list[Path] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(Path(java_home) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path))
    for java in candidates:
        major = java_major(java) if java.is_file() else None
        if major is not None and major >= MIN_JAVA:
            return str(java)
    found = [(major, java) for java in sorted(JVM_ROOT.glob("*/bin/java"))
             if (major := java_major(java)) is not None and major >= MIN_JAVA]
    if found:
        return str(max(found)[1])
    raise RuntimeError(f"Apicurio Registry {REGISTRY_VERSION} needs Java {MIN_JAVA} or newer, and none was found "
                       f"($JAVA_HOME, PATH, {JVM_ROOT}/*): install a JDK >= {MIN_JAVA} under {JVM_ROOT}, or set "
                       "SLUICE_REGISTRY_JAVA to its bin/java")


class LocalSchemaRegistry(JvmServer):
    """Context manager: a fresh Apicurio Registry; `.url` (its root; Confluent's API is `.url + CCOMPAT`, also
    `.ccompat_url`), `restart()`, `kill()` then `start()` on the same port and data, `stop()`."""

    server = "Apicurio Registry"
    logs = ()

    def __init__(self, *, auth: bool = False, tls: bool = False, heap_mb: int = 256, start_timeout: float = 120,
                 settings: dict[str, Any] | None = None) -> None:
        super().__init__(start_timeout)
        self.auth, self.tls, self.heap_mb = auth, tls, heap_mb
        self.settings = dict(settings or {})
        self.username: str | None = USERNAME if auth else None
        self.password: str | None = secrets.token_urlsafe(16) if auth else None
        self.ca_pem: str | None = None  # tls: the CA that signed the server's certificate
        self._signing_key: Any = None  # auth: the private key of the bearer tokens the server accepts
        self.port = 0
        self.management_port = 0

    @property
    def url(self) -> str:
        """The registry's root, e.g. http://127.0.0.1:41234 (https:// with tls=True)."""
        if not self.port:
            raise RuntimeError("the registry has not been started")
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ccompat_url(self) -> str:
        """Confluent's Schema Registry API: what a Confluent client's `schema.registry.url` is."""
        return self.url + CCOMPAT

    def _check_installed(self) -> None:
        find_jar()
        find_java()

    def _properties(self) -> dict[str, Any]:
        assert self._dir is not None
        values: dict[str, Any] = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": self.management_port,
            # A file-based H2 in the folder: restart() keeps the schemas and their ids.
            "apicurio.datasource.url": f"jdbc:h2:file:{self._dir / 'data' / 'registry'}",
            "apicurio.datasource.jdbc.initial-size": 2,
            "apicurio.datasource.jdbc.min-size": 2,
            "apicurio.datasource.jdbc.max-size": 20,
            "apicurio.storage.snapshot.location": self._dir / "tmp",
            "apicurio.import.work-dir": self._dir / "tmp",
            "quarkus.log.category.\"io.quarkus.http.access-log\".level": "WARN",
        }
        if self.tls:
            from sluice.testing._tls import TestCA

            ca = TestCA("sluice registry test CA")
            cert, key = ca.server_certificate().write(self._dir)
            self.ca_pem = ca.pem
            values.update({"quarkus.http.ssl-port": self.port, "quarkus.http.port": free_port(),
                           "quarkus.http.insecure-requests": "disabled",
                           "quarkus.http.ssl.certificate.files": cert, "quarkus.http.ssl.certificate.key-files": key})
        else:
            values["quarkus.http.port"] = self.port
        if self.auth:
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric import rsa

            self._signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            public = self._signing_key.public_key().public_bytes(serialization.Encoding.DER,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
            values.update({"quarkus.http.auth.basic": True, "apicurio.authn.mechanism.priority": "basic,oidc",
                           "quarkus.oidc.tenant-enabled": True,
                           "quarkus.oidc.public-key": base64.b64encode(public).decode(),
                           "quarkus.security.users.embedded.plain-text": True,
                           f"quarkus.security.users.embedded.users.{self.username}": self.password,
                           f"quarkus.security.users.embedded.roles.{self.username}": "sr-admin"})
        return {**values, **self.settings}

    def bearer_token(self, *, forged: bool = False, lifetime_s: int = 3600) -> str:
        """auth=True: a JWT for `.username` the server accepts as a bearer token; `forged`: one signed by another
        key, which it refuses."""
        if self._signing_key is None:
            raise RuntimeError("bearer tokens need LocalSchemaRegistry(auth=True), started")
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding, rsa

        def b64(data: bytes) -> str:
            return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

        now = int(time.time())
        claims = {"sub": self.username, "preferred_username": self.username, "iat": now, "exp": now + lifetime_s}
        signed = f"{b64(json.dumps({'alg': 'RS256', 'typ': 'JWT'}).encode())}.{b64(json.dumps(claims).encode())}"
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if forged else self._signing_key
        return f"{signed}.{b64(key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256()))}"

    def _write_config(self) -> None:
        assert self._dir is not None
        self.port, self.management_port = free_port(), free_port()
        for sub in ("config", "data", "tmp"):
            (self._dir / sub).mkdir()
        text = "".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n" for k, v in self._properties().items())
        config = self._dir / "config" / "application.properties"
        config.write_text(text)
        config.chmod(0o600)  # the embedded user's password

    def _command(self) -> list[str]:
        assert self._dir is not None
        return [find_java(), "-Xms32m", f"-Xmx{self.heap_mb}m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
                "-XX:TieredStopAtLevel=1", "-XX:+PerfDisableSharedMem", "-Djava.net.preferIPv4Stack=true",
                f"-Djava.io.tmpdir={self._dir / 'tmp'}", "-jar", str(find_jar())]

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One request to the registry as its own user (status, body): a test's direct look at the server."""
        all_headers = {"Content-Type": "application/vnd.schemaregistry.v1+json", **(headers or {})}
        if self.auth and "Authorization" not in all_headers:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            all_headers["Authorization"] = f"Basic {token}"
        context = ssl.create_default_context(cadata=self.ca_pem) if self.tls else None
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _wait_ready(self, timeout: float) -> None:
        """Until the management interface's readiness check (GET /health/ready: storage among its checks) answers 200,
        then Confluent's API answers (any status: a 401 too, when it takes credentials); if the process ends or the
        time runs out, raise with the end of its log."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        health = f"http://127.0.0.1:{self.management_port}/health/ready"
        last = ""
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.server} exited with {self._proc.returncode} while starting:\n"
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.server} was not ready on {health} within {timeout:.0f} s (last: {last}):\n"
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(health, timeout=2) as response:
                    if response.status == 200:
                        status, body = self.request("GET", f"{CCOMPAT}/schemas/types")
                        if status < 500:
                            return
                        last = f"{CCOMPAT}/schemas/types: {status}: {body[:200]!r}"
            except urllib.error.HTTPError as e:  # 503 while a check is down
                last = f"{e.code}: {e.read()[:300]!r}"
            except OSError as e:  # not listening yet
                last = repr(e)
            time.sleep(0.2)

    def restart(self) -> None:
        """Stop the server (SIGTERM) and start it again on the same port and storage: registered schemas, their
        ids, subjects and compatibility levels survive."""
        self.stop(keep_data=True)
        self.start()


def main() -> int:
    """`python -m sluice.testing._registry`: exit 1 with what to do when the bundle or a Java >= 21 is missing
    (make check-registry's last check)."""
    import sys

    try:
        find_jar()
        find_java()
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
