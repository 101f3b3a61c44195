"""A throwaway OpenSearch server for tests and benchmarks: the real server (a JVM), one node on loopback.

`LocalOpenSearch()` lays out a server folder in a temporary folder (config, data, logs, and the modules a node
loads), starts one OpenSearch node there with its HTTP and transport ports on free loopback ports and a small heap,
then stops it and deletes the folder on exit. The server is the `org.opensearch:opensearch` jar and its runtime
dependencies from Maven Central (the release tarball is on no package registry), and the HTTP/transport module
`transport-netty4-client` with Netty: `make check-opensearch` puts them into ~/.cache/sluice/opensearch-<version>
(lib/, modules/transport-netty4/), or into $SLUICE_OPENSEARCH_HOME when that is set. Java 17 runs it (`java` on
PATH, or $JAVA_HOME/bin/java; OpenSearch 2.x needs the security manager, which Java 24 removed).

Started without OpenSearch's launch scripts, so the JVM flags its launcher adds (SystemJvmOptions of 2.19) are
given here. The Maven jar of a module carries no plugin descriptor or security policy (the distribution's build
writes them): both are written into the server's folder here, and the module's jars linked next to them. JNA's
native library is not loaded (OpenSearch then skips its native checks: it would refuse to run as root, and it can
neither lock memory nor install its system call filter, none of which a test server on loopback needs). The bootstrap
checks only warn, as the node binds to loopback alone. Only the netty4 module is loaded: no painless scripts, no
analysis-common analyzers (the standard analyzer is in the server), no reindex.

`auth=True` adds the security plugin (`org.opensearch.plugin:opensearch-security`, a plugin zip on Maven Central,
which make check-opensearch unpacks into plugins/opensearch-security): HTTP basic authentication against its internal
user database, where `.username` (`sluice`, role all_access) has `.password`; plain HTTP (no TLS on the REST layer)
unless `tls=True` (HTTPS with a certificate for 127.0.0.1/localhost from a throwaway CA, `.ca_pem`), while the
transport layer, which the plugin requires to be TLS, gets a self-signed certificate. `client_auth=True` (with
`tls=True`) makes the REST layer demand a client certificate (`plugins.security.ssl.http.clientauth_mode: REQUIRE`)
signed by a client CA of the server's own (`.client_ca`, a TestCA), and turns on the plugin's client-certificate
authentication (config.yml's clientcert_auth_domain, order 2: before HTTP basic, whose challenge answers a request
without a password at once): a certificate whose common name is `.username` signs in as that user, mapped to
all_access; `request()` presents one. The plugin's newest
2.19 release on Maven Central is older than the server: its descriptor is given the range ~<its version> of
compatible servers (which OpenSearch 2.x reads), in place of its exact version. `settings` are more opensearch.yml
settings (for example `{"thread_pool.write.queue_size": 2}` for 429s). `kill()` and `start()` kill the server and
start it again on the same folder and ports.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.testing._cassandra import self_signed_certificate
from sluice.testing._jvm import JvmServer
from sluice.testing._jvm import find_java as jvm_java
from sluice.testing._postgres import free_port

if TYPE_CHECKING:
    from sluice.testing._tls import ClientCertificate, TestCA

# The one place the versions are pinned: the Makefile's check-opensearch reads these lines.
OPENSEARCH_VERSION = "2.19.6"
SECURITY_PLUGIN_VERSION = "2.19.4.0"
INSTALL_HINT = "fetch it from Maven Central with: make check-opensearch"

# The flags OpenSearch's launcher gives every node (SystemJvmOptions, 2.19), as the distribution's jvm.options
# would add them; no -XX:+AlwaysPreTouch (it would make the whole heap resident at start).
SYSTEM_FLAGS = [
    "-Dopensearch.networkaddress.cache.ttl=60", "-Dopensearch.networkaddress.cache.negative.ttl=10",
    "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8", "-XX:-OmitStackTraceInFastThrow",
    "-Dio.netty.noUnsafe=true", "-Dio.netty.noKeySetOptimization=true", "-Dio.netty.recycler.maxCapacityPerThread=0",
    "-Dio.netty.allocator.numDirectArenas=0", "-Dlog4j.shutdownHookEnabled=false", "-Dlog4j2.disable.jmx=true",
    "-Djava.locale.providers=SPI,COMPAT", "-Djava.security.manager=allow",
    # JNA without its native library (not from the system, not unpacked from its jar): OpenSearch's natives off.
    "-Djna.nosys=true", "-Djna.nounpack=true", "-Djna.boot.library.path=/nonexistent",
    "-Dopensearch.distribution.type=tar", "-Dopensearch.bundled_jdk=false",
]

CONFIG = """\
cluster.name: {cluster_name}
node.name: node-1
discovery.type: single-node
network.host: {host}
http.port: {http_port}
transport.port: {transport_port}
path.data: {dir}/data
path.logs: {dir}/logs
bootstrap.memory_lock: false
cluster.routing.allocation.disk.threshold_enabled: false
"""

SECURITY_CONFIG = """\
plugins.security.ssl.http.enabled: false
plugins.security.ssl.transport.keystore_type: PKCS12
plugins.security.ssl.transport.keystore_filepath: node.p12
plugins.security.ssl.transport.keystore_password: {password}
plugins.security.ssl.transport.truststore_type: PKCS12
plugins.security.ssl.transport.truststore_filepath: trust.p12
plugins.security.ssl.transport.truststore_password: {password}
plugins.security.ssl.transport.enforce_hostname_verification: false
plugins.security.nodes_dn: ["CN=sluice test node"]
plugins.security.authcz.admin_dn: ["CN=sluice test admin"]
plugins.security.allow_default_init_securityindex: true
plugins.security.audit.type: noop
"""

HTTPS_CONFIG = """\
plugins.security.ssl.http.enabled: true
plugins.security.ssl.http.pemcert_filepath: http.crt
plugins.security.ssl.http.pemkey_filepath: http.key
plugins.security.ssl.http.pemtrustedcas_filepath: http-ca.pem
"""

# Client certificates on the REST layer, checked against http-ca.pem (then the client CA).
CLIENT_AUTH_CONFIG = """\
plugins.security.ssl.http.clientauth_mode: REQUIRE
"""

INTERNAL_USERS = """\
_meta:
  type: "internalusers"
  config_version: 2
{username}:
  hash: "{hash}"
  reserved: false
  backend_roles: ["admin"]
"""

# The server's own log, warnings and errors (and deprecations) only, to a file read back when it fails.
LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${{sys:{prefix}.logs.base_path}}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d{{ISO8601}}][%-5p][%-25c{{1.}}] %marker%m%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.node.name = org.{prefix}.node
logger.node.level = info
"""

NETTY4_DESCRIPTOR = f"""\
description=Netty 4 based transport implementation
version={OPENSEARCH_VERSION}
name=transport-netty4
classname=org.opensearch.transport.Netty4Plugin
java.version=11
opensearch.version={OPENSEARCH_VERSION}
custom.foldername=
extended.plugins=
has.native.controller=false
"""

# modules/transport-netty4/src/main/plugin-metadata/plugin-security.policy of OpenSearch 2.19.
NETTY4_POLICY = """\
grant {
  permission java.io.FilePermission "/proc/sys/net/core/somaxconn", "read";
  permission java.net.SocketPermission "*", "accept,connect";
  permission java.lang.RuntimePermission "*", "setContextClassLoader";
  permission java.lang.RuntimePermission "getClassLoader";
  permission java.util.PropertyPermission "sun.nio.ch.bugLevel", "write";
};
"""


def opensearch_home() -> Path:
    """The folder `make check-opensearch` fills: $SLUICE_OPENSEARCH_HOME, else ~/.cache/sluice/opensearch-<version>."""
    home = os.environ.get("SLUICE_OPENSEARCH_HOME")
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"opensearch-{OPENSEARCH_VERSION}"


def find_classpath() -> str:
    """The server's classpath: the jars of lib/ `make check-opensearch` fetched (RuntimeError saying how, when it
    has not)."""
    home = opensearch_home()
    jars = sorted((home / "lib").glob("*.jar"))
    if not (home / ".complete").is_file() or not (home / "lib" / f"opensearch-{OPENSEARCH_VERSION}.jar").is_file():
        raise RuntimeError(f"OpenSearch {OPENSEARCH_VERSION} was not found in {home}; {INSTALL_HINT}")
    return os.pathsep.join(str(j) for j in jars)


def find_java() -> str:
    return jvm_java("OpenSearch")


def _link_plugin(source: Path, target: Path, descriptor: str, policy: str | None = None) -> None:
    """A plugin folder `target`: the jars of `source` hard-linked in (copied across file systems), and its
    descriptor and security policy. Not symbolic links: the security manager lets the server read the jars under
    its modules/ and plugins/ folders only, by their real paths."""
    target.mkdir(parents=True)
    for jar in source.glob("*.jar"):
        try:
            os.link(jar, target / jar.name)
        except OSError:
            shutil.copyfile(jar, target / jar.name)
    (target / "plugin-descriptor.properties").write_text(descriptor)
    if policy is not None:
        (target / "plugin-security.policy").write_text(policy)


class LocalOpenSearch(JvmServer):
    """Context manager: a fresh one-node OpenSearch cluster; `.url` is its HTTP endpoint, `request()` a small client
    (signed in when `auth=True`). Its folder: config/, data/, logs/server.log (warnings and errors), output.log,
    modules/."""

    server = "OpenSearch"
    logs = ("logs/server.log",)
    # What differs between OpenSearch and Elasticsearch (LocalElasticsearch): names, flags and the module's files.
    config_file = "opensearch.yml"
    main_class = "org.opensearch.bootstrap.OpenSearch"
    property_prefix = "opensearch"  # -D<prefix>.path.home, ${sys:<prefix>.logs.base_path}
    system_flags = SYSTEM_FLAGS
    netty4_files = (NETTY4_DESCRIPTOR, NETTY4_POLICY)

    @staticmethod
    def _home() -> Path:
        return opensearch_home()

    @staticmethod
    def _classpath() -> str:
        return find_classpath()

    def __init__(self, *, host: str = "127.0.0.1", auth: bool = False, username: str = "sluice",
                 password: str = "sluice-test-pw", cluster_name: str = "sluice-test", heap: str = "512m",
                 full_jit: bool = False, jvm_options: list[str] | None = None, start_timeout: float = 120,
                 http_port: int = 0, transport_port: int = 0,
                 settings: dict[str, Any] | None = None, tls: bool = False, client_auth: bool = False) -> None:
        if tls and not auth:
            raise ValueError("tls=True needs auth=True: HTTPS comes from the security plugin")
        if client_auth and not tls:
            raise ValueError("client_auth=True needs tls=True: client certificates are part of the TLS handshake")
        # client_auth: the REST layer demands a certificate `client_ca` signed; request() presents `_own_certificate`.
        self.client_auth = client_auth
        self.client_ca: TestCA | None = None
        self._own_certificate: ClientCertificate | None = None
        self.host, self.auth, self.cluster_name, self.heap = host, auth, cluster_name, heap
        # tls: HTTPS on the REST layer with a certificate for 127.0.0.1/localhost that a throwaway CA signed
        # (sluice.testing._tls); `ca_pem` is what a client trusts (the connector's ssl.ca-pem).
        self.tls, self.ca_pem = tls, ""
        self.username: str | None = username if auth else None
        self.password: str | None = password if auth else None
        # False: the JVM's quick compiler only (C1), a quicker start and less CPU next to Spark; True for benchmarks.
        self.full_jit = full_jit
        self.jvm_options = list(jvm_options or [])  # last on the command line: they override the flags above
        # More opensearch.yml settings (values written as JSON, which YAML reads: lists, numbers, true/false).
        self.settings = dict(settings or {})
        super().__init__(start_timeout)
        self._ports_wanted = (http_port, transport_port)  # 0: a free one, picked at the first start
        self.http_port = 0
        self.transport_port = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_port}"

    def _write_config(self) -> None:
        assert self._dir is not None
        http_port, transport_port = self._ports_wanted
        self.http_port = http_port or free_port()
        self.transport_port = transport_port or free_port()
        while self.transport_port == self.http_port:
            self.transport_port = free_port()
        home, conf = self._home(), self._dir / "config"
        for sub in ("config", "data", "logs", "tmp", "plugins"):
            (self._dir / sub).mkdir()
        config = CONFIG.format(cluster_name=self.cluster_name, host=self.host, http_port=self.http_port,
                               transport_port=self.transport_port, dir=self._dir)
        _link_plugin(home / "modules" / "transport-netty4", self._dir / "modules" / "transport-netty4",
                     *self.netty4_files)
        if self.auth:
            config += self._security(home / "plugins" / "opensearch-security", conf)
        config += "".join(f"{key}: {json.dumps(value)}\n" for key, value in self.settings.items())
        (conf / self.config_file).write_text(config)
        (conf / "log4j2.properties").write_text(LOG4J2.format(prefix=self.property_prefix))
        # The security plugin warns of configuration others can read.
        for path in conf.rglob("*"):
            path.chmod(0o700 if path.is_dir() else 0o600)
        conf.chmod(0o700)

    def _security(self, plugin: Path, conf: Path) -> str:
        """The security plugin's folder, its configuration (users, TLS for the transport layer) and settings."""
        assert self._dir is not None and self.username is not None and self.password is not None
        if not (plugin / "plugin-descriptor.properties").is_file():
            raise RuntimeError(f"the OpenSearch security plugin was not found in {plugin}; {INSTALL_HINT}")
        descriptor = "".join(
            f'dependencies={{"opensearch":"~{line.split("=", 1)[1].strip()}"}}\n'
            if line.startswith("opensearch.version=") else line
            for line in (plugin / "plugin-descriptor.properties").read_text().splitlines(keepends=True))
        _link_plugin(plugin, self._dir / "plugins" / "opensearch-security", descriptor,
                     (plugin / "plugin-security.policy").read_text())
        (conf / "opensearch-security").mkdir()
        for yml in (plugin / "config").glob("*.yml"):
            if yml.name != "internal_users.yml":
                shutil.copy(yml, conf / "opensearch-security" / yml.name)
        hasher = subprocess.run(
            [find_java(), "-cp", os.pathsep.join([find_classpath(), str(plugin / "*")]),
             "org.opensearch.security.tools.Hasher", "-env", "SLUICE_OPENSEARCH_PASSWORD", "-r", "4"],
            env={**os.environ, "SLUICE_OPENSEARCH_PASSWORD": self.password},
            check=True, capture_output=True, text=True)
        (conf / "opensearch-security" / "internal_users.yml").write_text(
            INTERNAL_USERS.format(username=self.username, hash=hasher.stdout.strip().splitlines()[-1]))
        # The node's certificate (CN=sluice test node, SECURITY_CONFIG's nodes_dn), self-signed, is also the one it
        # trusts (the transport layer checks its peers). Cheap password hashes (bcrypt rounds 4), as for Cassandra.
        store_password = "sluice-test-keystore"
        pem = self_signed_certificate(conf, self.host, store_password)
        (conf / "node.pem").write_text(pem)
        keytool = str(Path(find_java()).resolve().parent / "keytool")
        subprocess.run([keytool, "-importcert", "-noprompt", "-keystore", str(conf / "trust.p12"), "-storetype",
                        "PKCS12", "-storepass", store_password, "-alias", "ca", "-file", str(conf / "node.pem")],
                       check=True, capture_output=True)
        config = SECURITY_CONFIG.format(password=store_password)
        if self.tls:
            from sluice.testing._tls import TestCA

            ca = TestCA("sluice test CA (opensearch)")
            self.ca_pem = ca.pem
            ca.server_certificate().write(conf, "http")
            (conf / "http-ca.pem").write_text(ca.pem)
            config = config.replace("plugins.security.ssl.http.enabled: false\n", HTTPS_CONFIG)
            if self.client_auth:
                self._client_certificates(conf)
                config += CLIENT_AUTH_CONFIG
        return config

    def _client_certificates(self, conf: Path) -> None:
        """The client CA the REST layer checks certificates against, the plugin's client-certificate
        authentication (its own order, before HTTP basic) and the user it signs in mapped to all_access."""
        from sluice.testing._tls import TestCA

        assert self.username is not None
        if self.client_ca is None:
            self.client_ca = TestCA("sluice test client CA (opensearch)")
            self._own_certificate = self.client_ca.client_certificate(self.username)
        (conf / "http-ca.pem").write_text(self.client_ca.pem)
        security = conf / "opensearch-security"
        config = (security / "config.yml").read_text()
        domain = config.index("clientcert_auth_domain:")
        head, tail = config[:domain], config[domain:]
        if "http_enabled: false" not in tail:
            raise RuntimeError("the security plugin's config.yml has no 'http_enabled: false' in its clientcert "
                               "domain")
        tail = tail.replace("http_enabled: false", "http_enabled: true", 1)
        (security / "config.yml").write_text(head + tail)
        mapping = (security / "roles_mapping.yml").read_text()
        marker = '  description: "Maps admin to all_access"\n'
        if marker not in mapping:
            raise RuntimeError("the security plugin's roles_mapping.yml maps all_access otherwise than expected")
        (security / "roles_mapping.yml").write_text(
            mapping.replace(marker, marker + f'  users:\n  - "{self.username}"\n', 1))

    def _command(self) -> list[str]:
        assert self._dir is not None
        return [
            # A small heap that grows as needed and the serial collector, as for the test Cassandra: one GC thread
            # next to Spark on a small machine. OpenSearch warns of both (bootstrap checks, warnings on loopback).
            find_java(), "-Xms128m", f"-Xmx{self.heap}", "-Xss1m", "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError", *([] if self.full_jit else ["-XX:TieredStopAtLevel=1"]),
            "-XX:+PerfDisableSharedMem", *self.system_flags, f"-Djava.io.tmpdir={self._dir}/tmp",
            f"-D{self.property_prefix}.path.home={self._dir}", f"-D{self.property_prefix}.path.conf={self._dir}/config",
            *self.jvm_options,
            "-cp", self._classpath(), self.main_class,
        ]

    def _check_installed(self) -> None:
        self._classpath()
        find_java()

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 60,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One HTTP request to the node (signed in when auth is on): (status, JSON answer or text). `body`: JSON
        (a dict or list), or str/bytes sent as they are (e.g. a _bulk body with content_type application/x-ndjson)."""
        data = body if body is None or isinstance(body, bytes) else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.auth:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            context = ssl.create_default_context(cadata=self.ca_pem) if self.tls else None
            if context is not None and self._own_certificate is not None:
                from sluice._client_certs import ClientCertificate as Presented

                Presented(self._own_certificate.cert_pem, self._own_certificate.key_pem).load_into(context)
            with urllib.request.urlopen(req, timeout=timeout, context=context) as answer:
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text.decode(errors="replace")

    def _wait_ready(self, timeout: float) -> None:
        """Until GET /_cluster/health?wait_for_status=yellow answers 200 (with auth: once the security plugin made
        its index and signs users in); if the process ends or the time runs out, raise with the end of its logs."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.server} exited with {self._proc.returncode} while starting:\n"
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.server} did not answer on {self.url} within {timeout:.0f} s "
                                   f"(last answer: {last!r}):\n{self._log_tail()}")
            try:
                status, answer = self.request("GET", "/_cluster/health?wait_for_status=yellow&timeout=1s", timeout=5)
                if status == 200:
                    return
                last = (status, answer)
            except OSError as e:  # not listening yet
                last = e
            time.sleep(0.2)
