"""A throwaway Apache HBase server for tests: the real server (a JVM) in standalone mode on loopback, with HBase's
Thrift2 gateway (a second JVM) in front of it.

`LocalHBase()` writes an hbase-site.xml into a temporary folder and starts HMaster there in standalone mode: the
master, one region server (`region_servers=N`: N, each on a port of its own, a new table's regions dealt round robin
over them by the master) and their ZooKeeper in one JVM, the data under the folder (`hbase.rootdir` is a file://
URL), every port on a free loopback port and no web UI; next to it, the Thrift2 gateway
(`org.apache.hadoop.hbase.thrift2.ThriftServer`: plain binary protocol, not framed, a thread pool) on `.host`/`.port`.
It is ready once the master has finished its initialization (hbase:meta and hbase:namespace online) and a request
through the gateway reaches the master. `client()` is a thriftpy2 client of the gateway. `stop()` ends both and
deletes the folder.

The server is the `hbase-server` jar of the -hadoop3 build and its runtime dependencies from Maven Central (the
release tarball is on no package registry), with `hbase-thrift`: `make check-hbase` puts them into
~/.cache/sluice/hbase-<HBASE_VERSION>/lib, or into $SLUICE_HBASE_HOME/lib when that is set. Java 17 runs it (`java`
on PATH, or $JAVA_HOME/bin/java), with the module-system flags of HBase's own launch script for Java 11 and later.
The -hadoop3 build matters: the default build's Hadoop 2.10 does not run on Java 17. hbase-thrift is published for
the default build only; its classes run on the -hadoop3 jars of the same HBase release.

A test server's settings: small heaps (`heap` for the server, `gateway_heap` for the gateway) with the serial
collector and the JVM's quick compiler (`full_jit=True` for benchmarks), the master not waiting the usual 4.5 s for
more region servers nor the region server 3 s to report in, ZooKeeper's admin server off: a start takes ~9 s on 2
cores. `hbase.unsafe.stream.capability.enforce` is false: HBase otherwise refuses a file system whose streams do not
declare hflush/hsync, as the local one's do not. Writes acknowledged right before a SIGKILL of the server were all
there after its restart in the tests here (`kill()`, then `start()` replays the WAL), but on a local file system HBase
promises it for none, and for nothing after a power loss. `settings` are more hbase-site.xml properties for both
processes (for example `{"hbase.client.keyvalue.maxsize": 0}`: the gateway's own check of a cell's size off, leaving
the region server's, `hbase.server.keyvalue.maxsize`, both 10 MiB by default). The gateway closes a connection idle
for 60 s (`hbase.thrift.server.socket.read.timeout`), as a deployed one does.

Tests of what HBase forgets: `major_compact(table)` flushes a table and major-compacts it, which drops its delete
markers and the cells they masked. The Thrift2 gateway offers no compaction, so it runs HBase's own Admin API in a
third JVM (Java's single-file source launch of COMPACT_JAVA, on the server's classpath and hbase-site.xml).

`LocalHBase(kdc=LocalKdc())`: HBase and its gateway secured by that realm (_hbase_kerberos.py: SASL GSSAPI inside,
SPNEGO on the gateway's HTTP mode); `client()` then signs in as the test principal `kerberos` names.

Fault tests: `kill_gateway()`, `start_gateway()` and `restart_gateway()` kill the gateway (SIGKILL, as a crash would)
and start it again on the same port, while the server keeps running; `kill()` and `start()` do the same to both.
`stop()` kills both too: HMaster in standalone mode stops its ZooKeeper before its region server, which then waits
~20 s for ZooKeeper on SIGTERM; a test server has nothing to flush that its WAL does not hold.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import ssl
import subprocess
import time
from functools import cache
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from sluice.testing._hbase_kerberos import SecuredHBase, kerberos_settings
from sluice.testing._jvm import JvmServer
from sluice.testing._jvm import find_java as jvm_java
from sluice.testing._kdc import LocalKdc
from sluice.testing._postgres import free_port
from sluice.testing._site_xml import site_xml

# The one place the version is pinned: the Makefile's check-hbase reads this line (hbase-thrift's version is this
# one without -hadoop3).
HBASE_VERSION = "2.6.1-hadoop3"
THRIFT_VERSION = HBASE_VERSION.removesuffix("-hadoop3")
INSTALL_HINT = "fetch it from Maven Central with: make check-hbase"

# HBase's bin/hbase adds these on Java 11 and later: Netty (shaded) and HBase's own reflective access to JDK
# internals (direct buffers, the WAL's async output, Kerberos names, DNS).
JVM17_FLAGS = [
    "-Dorg.apache.hbase.thirdparty.io.netty.tryReflectionSetAccessible=true", "--add-modules", "jdk.unsupported",
    *(f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
        "java.io", "java.nio", "sun.nio.ch", "java.lang", "jdk.internal.ref", "java.lang.reflect", "java.util",
        "java.util.concurrent")),
    *(f"--add-exports={m}=ALL-UNNAMED" for m in (
        "java.base/jdk.internal.misc", "java.security.jgss/sun.security.krb5", "java.base/sun.net.dns",
        "java.base/sun.net.util")),
]

# The log (log4j 1 through reload4j, Hadoop 3.3's logging) into a file of the folder; the master writes the line
# READY_LINE into it once it has finished its initialization.
LOG4J = """\
log4j.rootLogger=INFO,FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=${hbase.log.dir}/${hbase.log.file}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{2}: %m%n
log4j.logger.org.apache.hadoop.hbase.metrics=WARN
log4j.logger.org.apache.hadoop.metrics2=WARN
log4j.logger.org.apache.zookeeper=WARN
"""
READY_LINE = b"master.HMaster: Master has completed initialization"

# Admin.majorCompact only queues the compaction; it is done once the region server has reported a major compaction
# newer than the one before (getLastMajorCompactionTimestamp, from its load reports) and none runs any more.
# Its Java source: MajorCompact.java beside this file, run with Java 17's single-file launch.


def hbase_home() -> Path:
    """The folder `make check-hbase` fills: $SLUICE_HBASE_HOME, else ~/.cache/sluice/hbase-<version>."""
    home = os.environ.get("SLUICE_HBASE_HOME")
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"hbase-{HBASE_VERSION}"


def find_classpath() -> str:
    """The jars `make check-hbase` fetched (RuntimeError saying how, when it has not)."""
    home = hbase_home()
    lib = home / "lib"
    if not ((home / ".complete").is_file() and (lib / f"hbase-server-{HBASE_VERSION}.jar").is_file()
            and (lib / f"hbase-thrift-{THRIFT_VERSION}.jar").is_file()):
        raise RuntimeError(f"Apache HBase {HBASE_VERSION} was not found in {home}; {INSTALL_HINT}")
    return os.pathsep.join(str(j) for j in sorted(lib.glob("*.jar")))


def find_java() -> str:
    return jvm_java("HBase")


@cache
def thrift() -> ModuleType:
    """HBase's Thrift2 interface (thriftpy2, from sluice/connectors/hbase/hbase.thrift), under the module name the
    connector loads it with: the same classes (and exception types) as the connector's."""
    import thriftpy2

    path = Path(__file__).resolve().parent.parent / "connectors" / "hbase" / "hbase.thrift"
    return thriftpy2.load(str(path), module_name="sluice_hbase_thrift")


def jvm_command(java: str, heap: str, full_jit: bool, folder: Path, log_dir: Path, log_file: str) -> list[str]:
    """The JVM flags both processes share: a heap that grows as needed, the serial collector (one GC thread next to
    Spark on a small machine), the quick compiler unless `full_jit`, no perf data file in /tmp, temporary files and
    the log in the server's folder."""
    return [
        java, "-Xms32m", f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
        *([] if full_jit else ["-XX:TieredStopAtLevel=1"]), "-XX:+PerfDisableSharedMem",
        "-Djava.net.preferIPv4Stack=true", *JVM17_FLAGS, f"-Djava.io.tmpdir={folder}/tmp",
        f"-Dhbase.log.dir={log_dir}", f"-Dhbase.log.file={log_file}",
        f"-Dlog4j.configuration=file:{folder}/conf/log4j.properties", "-Dzookeeper.admin.enableServer=false",
    ]


class _ThriftGateway(JvmServer):
    """The Thrift2 gateway of a LocalHBase: its folder is thrift/ in the server's; the server's conf/ (ZooKeeper's
    address) is on its classpath."""

    server = "HBase Thrift gateway"
    logs = ("thrift.log",)

    def __init__(self, owner: LocalHBase, start_timeout: float) -> None:
        super().__init__(start_timeout)
        self.owner = owner

    def _check_installed(self) -> None:
        find_classpath()
        find_java()

    def _write_config(self) -> None:
        raise AssertionError("the gateway's folder is made by LocalHBase")

    def launch(self) -> None:
        """Start the gateway's JVM without waiting for it to answer (LocalHBase's start then waits)."""
        assert self._dir is not None
        self.kill()  # one left from before, when the server died on its own
        with (self._dir / "output.log").open("ab") as output:
            self._proc = subprocess.Popen(self._command(), stdout=output, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=self._dir, start_new_session=True)

    def _command(self) -> list[str]:
        owner = self.owner
        assert self._dir is not None and owner.folder is not None
        return [
            *jvm_command(find_java(), owner.gateway_heap, owner.full_jit, owner.folder, self._dir, "thrift.log"),
            *owner.jvm_options, "-cp", os.pathsep.join([str(owner.folder / "conf"), find_classpath()]),
            "org.apache.hadoop.hbase.thrift2.ThriftServer", "-threadpool", "-b", owner.host, "-p", str(owner.port),
            "start",
        ]

    def _wait_ready(self, timeout: float) -> None:
        """Until a request through the gateway reaches the master (the namespaces); if the process ends or the time
        runs out, raise with the end of its logs."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the HBase Thrift gateway exited with {self._proc.returncode} while starting:\n"
                                   f"{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HBase Thrift gateway did not answer on {self.owner.host}:{self.owner.port} "
                                   f"within {timeout:.0f} s (last error: {last!r}):\n{self._log_tail()}")
            try:
                with socket.create_connection((self.owner.host, self.owner.port), timeout=1):
                    pass
                client = self.owner.client(timeout=10)
                try:
                    names = {d.name for d in client.listNamespaceDescriptors()}
                finally:
                    client.close()
                if {"default", "hbase"} <= names:
                    return
                last = RuntimeError(f"namespaces: {sorted(names)}")
            except Exception as e:  # not listening yet
                last = e
            time.sleep(0.1)

    def stop(self, *, keep_data: bool = True) -> None:
        """End the gateway (SIGTERM: it exits at once); its folder goes with the server's (LocalHBase.stop)."""
        super().stop(keep_data=True)


class LocalHBase(JvmServer):
    """Context manager: a fresh standalone HBase; `.host`/`.port` are its Thrift2 gateway, `client()` a thriftpy2
    client of it. Its folder: conf/ (hbase-site.xml), hbase/ (the data), zookeeper/, logs/master.log, output.log,
    thrift/ (the gateway's thrift.log and output.log)."""

    server = "HBase"
    logs = ("logs/master.log",)

    def __init__(self, *, host: str = "127.0.0.1", heap: str = "384m", gateway_heap: str = "128m",
                 full_jit: bool = False, jvm_options: list[str] | None = None, start_timeout: float = 120,
                 port: int = 0, settings: dict[str, Any] | None = None, tls: bool = False,
                 kdc: LocalKdc | None = None, region_servers: int = 1) -> None:
        if region_servers < 1:
            raise ValueError(f"LocalHBase(region_servers={region_servers}): at least 1")
        # region_servers: that many region servers in the master's JVM (HMasterCommandLine reads the count from
        # `hbase.regionservers` and hands it to LocalHBaseCluster), each on a free port of its own.
        self.region_servers = region_servers
        self.host, self.heap, self.gateway_heap, self.full_jit = host, heap, gateway_heap, full_jit
        # tls: the gateway in its HTTP mode over TLS (HBase has no TLS on the binary protocol), with a certificate
        # of a throwaway CA (sluice.testing._tls) for 127.0.0.1 and localhost; `ca_pem` is what clients trust.
        self.tls = tls
        self.ca_pem: str | None = None
        # kdc: HBase and its gateway secured by this realm (_hbase_kerberos.py); `kerberos` is the clients' side.
        if kdc is not None and importlib.util.find_spec("gssapi") is None:  # the gateway's readiness check signs in
            raise RuntimeError("LocalHBase(kdc=...) needs python-gssapi in this environment: make check-kerberos")
        self.kdc = kdc
        self.kerberos: SecuredHBase | None = None
        self.jvm_options = list(jvm_options or [])  # last on both command lines: they override the flags above
        self.settings = dict(settings or {})
        super().__init__(start_timeout)
        self.gateway = _ThriftGateway(self, start_timeout)
        self._port_wanted = port  # 0: a free one, picked at the first start
        self.port = 0  # the Thrift2 gateway
        self.zookeeper_port = self.master_port = self.regionserver_port = 0
        self._log_offset = 0  # where master.log ended when the server last started

    def _write_config(self) -> None:
        assert self._dir is not None
        ports: set[int] = set()
        for _ in range(4):
            port = free_port()
            while port in ports or port == self._port_wanted:
                port = free_port()
            ports.add(port)
        self.zookeeper_port, self.master_port, self.regionserver_port, port = sorted(ports)
        servers = self.region_servers
        if servers > 1:  # their ports are picked by each server when it binds (see getAllRegionLocations)
            self.regionserver_port = 0
        self.port = self._port_wanted or port
        for sub in ("conf", "logs", "tmp", "thrift"):
            (self._dir / sub).mkdir()
        properties: dict[str, Any] = {
            "hbase.cluster.distributed": False,
            "hbase.rootdir": f"file://{self._dir}/hbase",
            "hbase.tmp.dir": f"{self._dir}/tmp",
            "hbase.zookeeper.quorum": self.host,
            "hbase.zookeeper.property.clientPort": self.zookeeper_port,
            "hbase.zookeeper.property.dataDir": f"{self._dir}/zookeeper",
            "hbase.master.port": self.master_port,
            "hbase.master.ipc.address": self.host,
            "hbase.master.hostname": self.host,
            "hbase.master.info.port": -1,
            "hbase.regionserver.port": self.regionserver_port,
            "hbase.regionserver.ipc.address": self.host,
            "hbase.unsafe.regionserver.hostname": self.host,
            "hbase.regionserver.info.port": -1,
            "hbase.thrift.info.port": -1,
            "hbase.unsafe.stream.capability.enforce": False,
            # The region servers are in the same JVM: the master waits for all of them, and for no more (so that
            # a pre-split table's regions are dealt round robin over all of them when it is created); and the
            # master places regions on a server once it has reported its load, every `msginterval` (3 s by default).
            "hbase.regionservers": servers,
            "hbase.master.wait.on.regionservers.mintostart": servers,
            "hbase.master.wait.on.regionservers.maxtostart": servers,
            "hbase.regionserver.msginterval": 500,
            **self.settings,
        }
        if self.tls:
            properties.update(self._tls_settings(self._dir / "conf"))
        if self.kdc is not None:
            secured, flags, self.kerberos = kerberos_settings(self.kdc, self._dir / "conf")
            properties.update(secured)
            self.jvm_options = [*flags, *self.jvm_options]
        (self._dir / "conf" / "hbase-site.xml").write_text(site_xml(properties))
        (self._dir / "conf" / "log4j.properties").write_text(LOG4J)

    def _tls_settings(self, conf: Path) -> dict[str, Any]:
        """A PKCS#12 key store of a certificate for this host (Java 17 reads it as the default JKS type), and the
        gateway's settings for HTTPS (ThriftServer's HTTP mode: Jetty with hbase.thrift.ssl.*)."""
        import secrets

        from sluice.testing._tls import TestCA

        ca = TestCA("sluice test HBase CA")
        cert = ca.server_certificate(tuple(dict.fromkeys((self.host, "127.0.0.1", "localhost"))))
        password = secrets.token_urlsafe(12)
        store = cert.pkcs12(password)
        (conf / "gateway.p12").write_bytes(store)
        self.ca_pem = ca.pem
        return {"hbase.regionserver.thrift.http": True, "hbase.thrift.ssl.enabled": True,
                "hbase.thrift.ssl.keystore.store": str(conf / "gateway.p12"),
                "hbase.thrift.ssl.keystore.password": password, "hbase.thrift.ssl.keystore.keypassword": password}

    def _command(self) -> list[str]:
        assert self._dir is not None
        log = self._dir / "logs" / "master.log"
        self._log_offset = log.stat().st_size if log.exists() else 0
        # ZooKeeper holds none of the data in standalone mode, only who is up: a fresh one after a kill(), so that
        # the new master does not wait out the dead one's session.
        shutil.rmtree(self._dir / "zookeeper", ignore_errors=True)
        return [
            *jvm_command(find_java(), self.heap, self.full_jit, self._dir, self._dir / "logs", "master.log"),
            *self.jvm_options, "-cp", os.pathsep.join([str(self._dir / "conf"), find_classpath()]),
            "org.apache.hadoop.hbase.master.HMaster", "start",
        ]

    def _check_installed(self) -> None:
        find_classpath()
        find_java()
        try:
            import thriftpy2  # noqa: F401  (the readiness check's client)
        except ImportError:
            raise RuntimeError("LocalHBase needs the Thrift client thriftpy2: pip install thriftpy2") from None

    def _wait_ready(self, timeout: float) -> None:
        """Until the master has finished its initialization (its log says so: hbase:meta and hbase:namespace are
        online), then until the gateway, started meanwhile, answers a request that reaches the master; if a process
        ends or the time runs out, raise with the end of its logs."""
        assert self._proc is not None and self._dir is not None
        began = time.monotonic()
        deadline = began + timeout
        # The gateway's JVM starts next to the master's (it reaches ZooKeeper only at its first request).
        self.gateway._dir = self._dir / "thrift"
        self.gateway.launch()
        log = self._dir / "logs" / "master.log"
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"HBase exited with {self._proc.returncode} while starting:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"HBase's master did not finish its initialization within {timeout:.0f} s:\n"
                                   f"{self._log_tail()}")
            if log.exists():
                with log.open("rb") as f:
                    f.seek(self._log_offset)
                    if READY_LINE in f.read():
                        break
            time.sleep(0.1)
        self.gateway._wait_ready(max(deadline - time.monotonic(), 1))
        self.gateway.start_seconds = time.monotonic() - began

    def client(self, *, timeout: float = 60) -> Any:
        """A thriftpy2 `THBaseService` client of the gateway (binary protocol, buffered transport); `close()` it.
        `timeout` in seconds, for connecting and for each call. A secured server's: signed in as
        `kerberos.client_principal`, on the host name its SPNEGO principal names."""
        if self.kerberos is not None:
            from sluice.connectors.hbase._kerberos import Kerberos
            from sluice.connectors.hbase._kerberos import make_client as make_kerberos_client

            k = self.kerberos
            context = ssl.create_default_context(cadata=self.ca_pem) if self.tls else None
            return make_kerberos_client(thrift().THBaseService, k.host, self.port,
                               Kerberos(k.client_principal, k.client_keytab, krb5_conf=k.krb5_conf), timeout, context)
        if self.tls:
            from thriftpy2.http import make_client as make_http_client

            context = ssl.create_default_context(cadata=self.ca_pem)
            return make_http_client(thrift().THBaseService, self.host, self.port, scheme="https",
                                    ssl_context_factory=lambda: context, timeout=int(timeout * 1000),
                                    keep_alive=True)
        from thriftpy2.rpc import make_client

        return make_client(thrift().THBaseService, self.host, self.port, timeout=int(timeout * 1000))

    def major_compact(self, table: str, timeout: float = 120) -> None:
        """Flush `table` ("namespace:name") and major-compact it; returns once the compaction is done (RuntimeError
        with the tool's output when it fails or the time runs out). HBase then has dropped the table's delete
        markers, and with them its memory of what was deleted."""
        if self.pid is None or self._dir is None:
            raise RuntimeError("this HBase server is not running")
        source = self._dir / "tmp" / "MajorCompact.java"
        source.write_text((resources.files("sluice.testing") / "MajorCompact.java").read_text())
        command = [*jvm_command(find_java(), "128m", False, self._dir, self._dir / "logs", "compact.log"),
                   "-cp", os.pathsep.join([str(self._dir / "conf"), find_classpath()]), str(source), table,
                   str(int(timeout * 1000))]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 60,
                              stdin=subprocess.DEVNULL, cwd=self._dir)
        if done.returncode:
            log = self._dir / "logs" / "compact.log"
            raise RuntimeError(f"the major compaction of {table} failed ({done.returncode}):\n{done.stderr[-3000:]}"
                               f"{log.read_text()[-3000:] if log.exists() else ''}")

    def kill_gateway(self) -> None:
        """SIGKILL the Thrift2 gateway, as a crash would (the server keeps running)."""
        self.gateway.kill()

    def start_gateway(self) -> None:
        """Start the gateway again, on the same port; returns once it answers."""
        if self.pid is None:
            raise RuntimeError("this HBase server is not running")
        self.gateway.start()

    def restart_gateway(self) -> None:
        """Kill the gateway (SIGKILL) and start it again on the same port: a gateway restart mid-write."""
        self.kill_gateway()
        self.start_gateway()

    def kill(self) -> None:
        """SIGKILL the gateway and the server, as a crash would (the folder stays: start() brings both back on the
        same data and ports, replaying the WAL; see the module's notes on what survives)."""
        self.gateway.kill()
        super().kill()

    def stop(self, *, keep_data: bool = False) -> None:
        """End the gateway and the server (both killed: see the module's notes) and delete the folder, unless
        `keep_data`."""
        self.kill()
        super().stop(keep_data=keep_data)
        if not keep_data:
            self.gateway._dir = None
