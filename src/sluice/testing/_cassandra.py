"""A throwaway Apache Cassandra server for tests and benchmarks: the real server (a JVM), on loopback.

One module past ~400 lines on purpose: its parts (configuration, JVM command line, class-data sharing,
readiness, TLS keystore, peers of a cluster, nodetool over its JMX port) all serve one object and share its folder
and ports; the process's life cycle itself (start, kill, stop) is _jvm.py's, shared with LocalOpenSearch.

`LocalCassandra()` writes a minimal cassandra.yaml into a temporary folder and starts one Cassandra node there with
its native (CQL) port and its storage port on free loopback ports, a small heap and no JMX, then stops it and
deletes the folder on exit. The server is the `cassandra-all` jar and its runtime dependencies from Maven Central
(the release tarball is on no package registry): `make check-cassandra` puts them into
~/.cache/sluice/cassandra-<CASSANDRA_VERSION>/lib, or into $SLUICE_CASSANDRA_HOME/lib when that is set. Java 17 runs
it (`java` on PATH, or $JAVA_HOME/bin/java).

Started without Cassandra's launch scripts, so the JVM flags of the tarball's conf/jvm17-server.options are given
here: the module-system exports and opens Cassandra and its libraries need on Java 17, and Netty's settings. The
heap is at most 512 MiB (`heap`) with the serial collector, as the tests run Spark and other servers next to it.
What makes a one-node start quick suits a test server only: no wait for gossip to settle, no ring delay, the
default superuser made at once, a class-data-sharing archive kept next to the jars, and the JVM's quick compiler
only (`full_jit=True` for benchmarks). `fsync=False` (the default) skips Cassandra's fsyncs, like the test
PostgreSQL's `fsync=off`: a write acknowledged under `commitlog_sync="batch"` still survives the process being
killed (`kill()`, SIGKILL), as it is in the page cache, but not the machine losing power (under the default
"periodic" sync Cassandra promises it for none of the writes of the last 10 s).

A cluster of several nodes: one per loopback address (127.0.0.1, 127.0.0.2, ...), each later one started with
`seeds=[first.storage_endpoint]` ("host:storage_port"; since Cassandra 4.0 every node may have its own storage
port), one after the other (a node joining while another joins fails), each followed by `wait_for_peers()` on it
and on the nodes before it. They join without bootstrapping (`auto_bootstrap: false`), right for an empty cluster.

`jmx=True` opens local JMX on a free port of 127.0.0.1 (`.jmx_port`; no JMX otherwise), for `nodetool(...)`:
Cassandra's own nodetool from the server's jars (`nodetool("flush", "ks", "t")`, `nodetool("compact", ...)`), for
tests of what the server forgets at a compaction.

`tls=True` makes clients use TLS (`.ca_pem` verifies the node); `client_auth=True` with it makes the node demand a
client certificate (require_client_auth) signed by a client CA of the server's own (`.client_ca`, a TestCA, its
certificate in the node's truststore); `cluster()` then presents one of that CA's.

`auth=True` turns on password authentication: after start a superuser `sluice` (`.username`, `.password`) is made,
and `cluster()` signs in with it. `kill()` and `start()` kill the server and start it again on the same folder and
ports, for tests of a node that dies mid-write.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from sluice.testing._jvm import JvmServer
from sluice.testing._jvm import find_java as jvm_java
from sluice.testing._postgres import free_port
from sluice.testing._tls import ClientCertificate, TestCA

# The one place the version is pinned: the Makefile's check-cassandra reads this line.
CASSANDRA_VERSION = "5.0.9"
INSTALL_HINT = "fetch it from Maven Central with: make check-cassandra"

# From the tarball's conf/jvm17-server.options (Cassandra 5.0): without them Java 17 refuses Cassandra's reflective
# access to JDK internals (direct buffers, the commit log's mmap cleaner, jamm's object sizing, Chronicle's, ...).
JVM17_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql", "java.base/java.lang.ref",
        "jdk.unsupported/sun.misc", "jdk.compiler/com.sun.tools.javac.file", "jdk.attach/sun.tools.attach")),
    *(f"--add-opens={m}=ALL-UNNAMED" for m in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect", "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal", "java.base/sun.nio.ch",
        "java.base/java.io", "java.base/java.lang.reflect", "jdk.compiler/com.sun.tools.javac",
        "java.base/java.lang", "java.base/java.util", "java.base/java.nio")),
    # Netty: direct buffers through Unsafe, and the allocator defaults Cassandra is tuned for.
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
]

CONFIG = """\
cluster_name: {cluster_name}
num_tokens: {num_tokens}
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
auto_bootstrap: false
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
listen_address: {host}
rpc_address: {host}
storage_port: {storage_port}
native_transport_port: {port}
start_native_transport: true
authenticator: {authenticator}
authorizer: {authorizer}
role_manager: CassandraRoleManager
data_file_directories:
  - {dir}/data
commitlog_directory: {dir}/commitlog
saved_caches_directory: {dir}/saved_caches
hints_directory: {dir}/hints
cdc_raw_directory: {dir}/cdc_raw
commitlog_sync: {commitlog_sync}
{commitlog_sync_setting}
commitlog_segment_size: 8MiB
batch_size_warn_threshold: {batch_size_warn_threshold_kib}KiB
batch_size_fail_threshold: {batch_size_fail_threshold_kib}KiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 8
concurrent_compactors: 1
file_cache_size: 32MiB
networking_cache_size: 16MiB
{client_encryption}"""

# TLS only (optional: false): a client without TLS is refused. The keystore holds a self-signed certificate for the
# node's address, which is its own CA (LocalCassandra.ca_pem).
CLIENT_ENCRYPTION = """\
client_encryption_options:
  enabled: true
  optional: false
  keystore: {keystore}
  keystore_password: {password}
  store_type: PKCS12
  require_client_auth: {client_auth}
{truststore}"""

# Cassandra's own log, warnings and errors only (and gossip's news of peers), to a file in the server's folder (read
# back when it fails).
LOGBACK = """\
<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{dir}/system.log</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <!-- Gossip at INFO too: in a cluster of several nodes, when a peer was marked DOWN and UP again. -->
  <logger name="org.apache.cassandra.gms" level="INFO"/>
  <root level="WARN"><appender-ref ref="FILE"/></root>
</configuration>
"""

COMMITLOG_SYNC = {"periodic": "commitlog_sync_period: 10000ms", "batch": "",
                  "group": "commitlog_sync_group_window: 10ms"}


def cassandra_home() -> Path:
    """The folder `make check-cassandra` fills: $SLUICE_CASSANDRA_HOME, else ~/.cache/sluice/cassandra-<version>."""
    home = os.environ.get("SLUICE_CASSANDRA_HOME")
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"cassandra-{CASSANDRA_VERSION}"


def find_classpath() -> str:
    """The server's classpath: every jar `make check-cassandra` fetched (RuntimeError saying how, when it has not)."""
    home = cassandra_home()
    jars = sorted((home / "lib").glob("*.jar"))
    if not (home / ".complete").is_file() or not any(j.name.startswith("cassandra-all-") for j in jars):
        raise RuntimeError(f"Apache Cassandra {CASSANDRA_VERSION} was not found in {home}; {INSTALL_HINT}")
    return os.pathsep.join(str(j) for j in jars)


def find_java() -> str:
    return jvm_java("Cassandra")


def self_signed_certificate(folder: Path, host: str, password: str, name: str = "node") -> str:
    """A PKCS12 keystore `folder`/`name`.p12 with a new self-signed certificate for `host` (its IP address as
    subject alternative name, so clients verify the hostname), made by the JDK's keytool; returns its PEM text."""
    keytool = str(Path(find_java()).resolve().parent / "keytool")
    store = folder / f"{name}.p12"
    common = ["-keystore", str(store), "-storetype", "PKCS12", "-storepass", password, "-alias", name]
    # keytool takes the store password on its command line; it is a throwaway test server's own.
    subprocess.run([keytool, "-genkeypair", *common, "-keypass", password, "-keyalg", "EC", "-groupname",
                    "secp256r1", "-validity", "30", "-dname", f"CN=sluice test {name}", "-ext", f"SAN=ip:{host}"],
                   check=True, capture_output=True)
    pem = subprocess.run([keytool, "-exportcert", "-rfc", *common], check=True, capture_output=True, text=True)
    return pem.stdout


def _free_port(host: str) -> int:
    """A TCP port free on `host` (a loopback address: each node of a local cluster has its own)."""
    if host == "127.0.0.1":
        return free_port()
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalCassandra(JvmServer):
    """Context manager: a fresh one-node Cassandra cluster; `.host`/`.port` are its CQL endpoint, `cluster()` a
    driver `Cluster` reaching it (signed in when `auth=True`). Its folder: cassandra.yaml, data, commit log,
    system.log (warnings and errors), output.log."""

    server = "Cassandra"
    logs = ("system.log",)

    def __init__(self, *, host: str = "127.0.0.1", seeds: list[str] | None = None, auth: bool = False,
                 username: str = "sluice", password: str = "sluice-test-pw", cluster_name: str = "sluice-test",
                 commitlog_sync: str = "periodic", fsync: bool = False, heap: str = "512m", num_tokens: int = 16,
                 batch_size_warn_threshold_kib: int = 5, batch_size_fail_threshold_kib: int = 50,
                 full_jit: bool = False, jvm_options: list[str] | None = None, start_timeout: float = 180,
                 port: int = 0, storage_port: int = 0, tls: bool = False, client_auth: bool = False,
                 jmx: bool = False, settings: dict[str, str | int | bool] | None = None) -> None:
        if client_auth and not tls:
            raise ValueError("client_auth=True needs tls=True: client certificates are part of the TLS handshake")
        if commitlog_sync not in COMMITLOG_SYNC:
            raise ValueError(f"commitlog_sync must be one of {', '.join(COMMITLOG_SYNC)}, not {commitlog_sync!r}")
        self.host, self.auth, self.cluster_name = host, auth, cluster_name
        # `seeds`: "host:storage_port" of the nodes a new node asks about the cluster (default: itself, one node).
        self.seeds = seeds
        self.username: str | None = username if auth else None
        self.password: str | None = password if auth else None
        self.commitlog_sync, self.fsync, self.heap, self.num_tokens = commitlog_sync, fsync, heap, num_tokens
        self.batch_size_warn_threshold_kib = batch_size_warn_threshold_kib
        self.batch_size_fail_threshold_kib = batch_size_fail_threshold_kib
        # False: the JVM's quick compiler only (C1), which halves the start and spends less CPU next to Spark; True
        # for benchmarks, where the optimizing compiler (C2) gives the server its full speed.
        self.full_jit = full_jit
        self.jvm_options = list(jvm_options or [])  # last on the command line: they override the flags above
        # More cassandra.yaml settings, appended to the ones above (for example the native transport's rate limiter).
        self.settings = dict(settings or {})
        super().__init__(start_timeout)
        # tls: clients must use TLS; the node's certificate is self-signed, `ca_pem` (set at the first start) is
        # what a client verifies it against (sluice's ssl.ca-pem).
        self.tls = tls
        self.ca_pem: str | None = None
        # client_auth: the node demands a certificate `client_ca` signed; `cluster()` presents `_own_certificate`.
        self.client_auth = client_auth
        self.client_ca: TestCA | None = None
        self._own_certificate: ClientCertificate | None = None
        # The ports asked for (0: a free one on `host`, picked at the first start).
        self._ports_wanted = (port, storage_port)
        self.port = 0  # native transport (CQL)
        self.storage_port = 0  # node to node
        self.jmx = jmx
        self.jmx_port = 0  # local JMX (with jmx=True), on 127.0.0.1 whatever `host` is
        self._cds_dump: tuple[Path, Path] | None = None  # (the archive the server writes at exit, its final name)

    @property
    def contact_points(self) -> list[tuple[str, int]]:
        """The driver's `contact_points` for this node: (host, CQL port)."""
        return [(self.host, self.port)]

    @property
    def storage_endpoint(self) -> str:
        """"host:storage_port", as another node's `seeds` names this one."""
        return f"{self.host}:{self.storage_port}"

    def _write_config(self) -> None:
        assert self._dir is not None
        port, storage_port = self._ports_wanted
        self.port = port or _free_port(self.host)
        self.storage_port = storage_port or _free_port(self.host)
        while self.storage_port == self.port:
            self.storage_port = _free_port(self.host)
        if self.jmx:
            self.jmx_port = self.jmx_port or free_port()
        config = CONFIG.format(
            cluster_name=self.cluster_name, num_tokens=self.num_tokens, host=self.host, port=self.port,
            storage_port=self.storage_port, seeds=",".join(self.seeds or [self.storage_endpoint]), dir=self._dir,
            authenticator="PasswordAuthenticator" if self.auth else "AllowAllAuthenticator",
            authorizer="CassandraAuthorizer" if self.auth else "AllowAllAuthorizer",
            commitlog_sync=self.commitlog_sync, commitlog_sync_setting=COMMITLOG_SYNC[self.commitlog_sync],
            batch_size_warn_threshold_kib=self.batch_size_warn_threshold_kib,
            batch_size_fail_threshold_kib=self.batch_size_fail_threshold_kib,
            client_encryption=self._client_encryption())
        config += "".join(f"{key}: {str(value).lower() if isinstance(value, bool) else value}\n"
                          for key, value in self.settings.items())
        (self._dir / "cassandra.yaml").write_text(config)
        (self._dir / "logback.xml").write_text(LOGBACK.format(dir=self._dir))
        (self._dir / "triggers").mkdir()

    def _client_encryption(self) -> str:
        if not self.tls:
            return ""
        assert self._dir is not None
        password = "sluice-test-keystore"
        self.ca_pem = self_signed_certificate(self._dir, self.host, password)
        truststore = ""
        if self.client_auth:
            if self.client_ca is None:
                self.client_ca = TestCA("sluice test client CA (cassandra)")
                self._own_certificate = self.client_ca.client_certificate("sluice-test-admin")
            (self._dir / "client-ca.pem").write_text(self.client_ca.pem)
            keytool = str(Path(find_java()).resolve().parent / "keytool")
            subprocess.run([keytool, "-importcert", "-noprompt", "-keystore", str(self._dir / "trust.p12"),
                            "-storetype", "PKCS12", "-storepass", password, "-alias", "client-ca", "-file",
                            str(self._dir / "client-ca.pem")], check=True, capture_output=True)
            truststore = f"  truststore: {self._dir / 'trust.p12'}\n  truststore_password: {password}\n"
        return CLIENT_ENCRYPTION.format(keystore=self._dir / "node.p12", password=password,
                                        client_auth=str(self.client_auth).lower(), truststore=truststore)

    def _class_data_sharing(self, java: str, classpath: str) -> list[str]:
        """Class data sharing: the classes a start loads, archived by the first server that stops cleanly next to
        the jars and mapped in by the later ones (a few seconds off each start). The archive's name holds the JVM
        and the classpath it was made for (a JVM that does not match an archive ignores it)."""
        home = cassandra_home()
        jvm = Path(java).resolve()
        libjvm = next(jvm.parent.parent.glob("lib/server/libjvm.so"), jvm)
        key = hashlib.sha256(f"{jvm}|{libjvm.stat().st_mtime_ns}|{classpath}".encode()).hexdigest()[:16]
        archive = home / f"classes-{key}.jsa"
        if archive.is_file():
            return [f"-XX:SharedArchiveFile={archive}"]
        if not os.access(home, os.W_OK):
            return []
        self._cds_dump = (home / f".classes-{key}-{os.getpid()}-{id(self)}.jsa", archive)
        return [f"-XX:ArchiveClassesAtExit={self._cds_dump[0]}"]

    def _keep_class_archive(self, returncode: int | None) -> None:
        """After the server exited: the class archive it wrote on a clean exit (SIGTERM: 143; none, or half of one,
        after a SIGKILL) is the one later starts map in (renamed into place whole: concurrent starts see all of one
        or none)."""
        if self._cds_dump is not None:
            written, archive = self._cds_dump
            self._cds_dump = None
            if returncode in (0, 143) and written.is_file() and written.stat().st_size > 0:
                os.replace(written, archive)
            else:
                written.unlink(missing_ok=True)

    def _command(self) -> list[str]:
        assert self._dir is not None
        java, classpath = find_java(), find_classpath()
        return [
            # A small heap that grows as needed (-Xms below -Xmx keeps the resident size down) and the serial
            # collector: one GC thread and almost no GC memory next to Spark on a small machine (pauses on a 512 MiB
            # heap are short).
            java, "-Xms128m", f"-Xmx{self.heap}", "-Xss256k", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
            *([] if self.full_jit else ["-XX:TieredStopAtLevel=1"]), "-XX:+PerfDisableSharedMem",
            "-Djava.net.preferIPv4Stack=true", *self._class_data_sharing(java, classpath),
            *JVM17_FLAGS,
            f"-Dcassandra.config=file://{self._dir}/cassandra.yaml", "-Dcassandra-foreground=yes",
            f"-Dcassandra.storagedir={self._dir}", f"-Dcassandra.logdir={self._dir}",
            f"-Dlogback.configurationFile=file://{self._dir}/logback.xml",
            f"-Dcassandra.triggers_dir={self._dir}/triggers",
            # No JMX unless asked: without cassandra.jmx.local.port the server opens no JMX port.
            *([f"-Dcassandra.jmx.local.port={self.jmx_port}"] if self.jmx else []),
            # A quick start for one node: no wait for gossip to settle, no ring delay, the default superuser made
            # at once (not after 10 s), cheap password hashes, and the memtable's per-row overhead given (the value
            # 5.0.9 measures on Java 17) rather than measured at start by sizing 100,000 rows (4 s).
            "-Dcassandra.skip_wait_for_gossip_to_settle=0", "-Dcassandra.ring_delay_ms=0",
            "-Dcassandra.superuser_setup_delay_ms=0", "-Dcassandra.auth_bcrypt_gensalt_log2_rounds=4",
            "-Dcassandra.memtable.row_overhead_size=180",
            # Stopping: peers (of a cluster of several) hear of it at once on loopback; 2 s is for real networks.
            "-Dcassandra.shutdown_announce_in_ms=500",
            *([] if self.fsync else ["-Dcassandra.skip_sync=true"]),
            *self.jvm_options,
            "-cp", classpath, "org.apache.cassandra.service.CassandraDaemon",
        ]

    def _check_installed(self) -> None:
        find_classpath()
        find_java()

    def nodetool(self, *args: str, timeout: float = 300) -> str:
        """Run Cassandra's nodetool (org.apache.cassandra.tools.NodeTool, from the server's jars) on this node,
        through its local JMX port (`jmx=True`); its output (RuntimeError with it when it fails). Flush and compact
        wait until the work is done."""
        if not self.jmx or self.pid is None or self._dir is None:
            raise RuntimeError("nodetool needs a running LocalCassandra(jmx=True)")
        command = [find_java(), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *JVM17_FLAGS,
                   f"-Dlogback.configurationFile=file://{self._dir}/logback.xml", "-cp", find_classpath(),
                   "org.apache.cassandra.tools.NodeTool", "-h", "127.0.0.1", "-p", str(self.jmx_port), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode:
            raise RuntimeError(f"nodetool {' '.join(args)} failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr)[-3000:]}")
        return done.stdout

    def _after_ready(self) -> None:
        if self.auth:
            self._create_user()

    def _wait_ready(self, timeout: float) -> None:
        """Until `SELECT release_version FROM system.local` answers over CQL; if the process ends or the time runs
        out, raise with the end of its logs."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Cassandra exited with {self._proc.returncode} while starting:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Cassandra did not answer CQL on {self.host}:{self.port} within {timeout:.0f} s "
                                   f"(last error: {last!r}):\n{self._log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    pass
                # The default superuser signs in until `sluice` exists (it is made once the server is up).
                with self.cluster(username="cassandra", password="cassandra", connect_timeout=5) as cluster:
                    session = cluster.connect()
                    if session.execute("SELECT release_version FROM system.local").one() is not None:
                        return
            except Exception as e:  # not listening yet, or the default superuser not made yet
                last = e
            time.sleep(0.2)

    def _create_user(self) -> None:
        from cassandra import AuthenticationFailed
        from cassandra.cluster import NoHostAvailable

        deadline = time.monotonic() + 60
        while True:
            try:
                with self.cluster(username="cassandra", password="cassandra") as cluster:
                    cluster.connect().execute(f"CREATE ROLE IF NOT EXISTS {self.username} WITH PASSWORD = %s "
                                              "AND LOGIN = true AND SUPERUSER = true", [self.password])
                return
            except NoHostAvailable as e:  # the default superuser may not be there in the first moments
                if time.monotonic() > deadline or not all(isinstance(v, AuthenticationFailed)
                                                          for v in e.errors.values()):
                    raise
                time.sleep(0.2)

    def wait_for_peers(self, count: int, timeout: float = 120) -> list[Any]:
        """Until this node knows `count` other nodes, all in the ring (gossip status NORMAL) and listed in its
        system.peers_v2 with their host id, tokens and CQL address: the check that a cluster has formed, after
        each node's start. Returns those peers_v2 rows (RuntimeError with what is missing when the time runs out)."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, ExecutionProfile
        from cassandra.policies import WhiteListRoundRobinPolicy

        deadline = time.monotonic() + timeout
        # Queries of this node's own view: to this node only, not routed to the others the driver finds.
        only_this = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([self.host]), request_timeout=30)
        with self.cluster(execution_profiles={EXEC_PROFILE_DEFAULT: only_this}) as cluster:
            session = cluster.connect()
            while True:
                peers = [p for p in session.execute("SELECT peer, peer_port, host_id, tokens, native_address, "
                                                    "native_port FROM system.peers_v2")
                         if p.host_id is not None and p.tokens and p.native_port]
                status = {(g.address, g.port): (g.status_with_port or "").split(",")[0] for g in
                          session.execute("SELECT address, port, status_with_port FROM system_views.gossip_info")}
                if len(peers) == count and len(status) == count + 1 and set(status.values()) == {"NORMAL"}:
                    return peers
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {self.storage_endpoint} sees {len(peers)} of {count} peers within "
                                       f"{timeout:.0f} s; gossip: {status}")
                time.sleep(0.5)

    def cluster(self, *, username: str | None = None, password: str | None = None, **kwargs: Any) -> Any:
        """A driver `cassandra.cluster.Cluster` for this node (a context manager; `.connect()` gives a session),
        signed in as `.username` when auth is on (or as `username`/`password`)."""
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

        username, password = username or self.username, password or self.password
        if username is not None and self.auth:
            kwargs.setdefault("auth_provider", PlainTextAuthProvider(username=username, password=password))
        profile = ExecutionProfile(load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy("datacenter1")),
                                   request_timeout=kwargs.pop("request_timeout", 30))
        kwargs.setdefault("execution_profiles", {EXEC_PROFILE_DEFAULT: profile})
        kwargs.setdefault("protocol_version", 5)
        if self.tls:
            import ssl

            context = ssl.create_default_context(cadata=self.ca_pem)
            if self._own_certificate is not None:
                from sluice._client_certs import ClientCertificate as Presented

                Presented(self._own_certificate.cert_pem, self._own_certificate.key_pem).load_into(context)
            kwargs.setdefault("ssl_context", context)
        return Cluster(contact_points=self.contact_points, **kwargs)

    def _exited(self, returncode: int | None) -> None:
        self._keep_class_archive(returncode)
