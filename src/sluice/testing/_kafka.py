"""A throwaway Apache Kafka for tests and benchmarks: real brokers (JVMs) in KRaft mode on loopback.

`LocalKafka()` is one node that is both broker and controller (a one-voter KRaft quorum): it writes a
server.properties into a temporary folder, formats the folder's log directory (`kafka.tools.StorageTool format`)
and starts `kafka.Kafka` on it, every port a free loopback port. It is ready once its admin API answers a metadata
request that lists it as a broker. `LocalKafkaCluster(brokers=3)` (_kafka_cluster.py) is three such nodes forming
a three-voter quorum (one node may die and the quorum, and every topic, lives on), with replication factor 3 and
`min.insync.replicas=2` as the defaults of created topics and of the transaction state log. `read_committed`
(_kafka_reads.py) reads a topic back as a `read_committed` consumer sees it.

The broker is `kafka_2.13` and its runtime dependencies from Maven Central, with log4j 2's SLF4J binding and
log4j-core (Kafka declares no logging backend: without one the broker logs nothing): `make check-kafka` puts them
into ~/.cache/sluice/kafka-<version>/lib for every pinned version (KAFKA_VERSIONS), KAFKA_VERSION's into
$SLUICE_KAFKA_HOME/lib when that is set. The jar set has no command-line tools: topics and SCRAM users are made
through confluent-kafka's AdminClient.

A test server's settings: one node needs replication factor 1 and `min.isr` 1 for its internal topics (else
`init_transactions` and consumer groups time out), few partitions for them (a quick first transaction), no
automatic topic creation (an unknown topic is an error, as a test of one wants), no rebalance delay. The heap is
small (`heap_mb`) with the serial collector and the JVM's quick compiler. Data lives in the page cache as Kafka's
own defaults leave it (no fsync per write): a SIGKILL of the broker (`kill()`) loses nothing it acknowledged, a
power loss could.

Security (`LocalKafka(sasl=..., tls=...)`): the clients' listener speaks SASL_SSL, SSL or SASL_PLAINTEXT; the
brokers' own traffic and the controller stay on plaintext listeners of their own, which the readiness check and the
SCRAM user's creation use too. TLS: a self-signed certificate for 127.0.0.1 (keytool, as LocalCassandra's), which
`ca_path`/`ca_pem` give clients to verify against. SASL: the user `sluice` with a random password (`.password`),
PLAIN from the broker's JAAS settings, SCRAM-SHA-512 made through the admin API after the start (never on a command
line). `client_auth=True` (with tls): the clients' listener demands a client certificate (`ssl.client.auth=required`,
also on SASL_SSL, where the SASL user stays the principal) signed by `.client_ca` (a `sluice.testing._tls.TestCA`,
the broker's PEM trust store); `client_config()` carries the harness's own (`.client_certificate`).
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from sluice.testing._cassandra import self_signed_certificate
from sluice.testing._jvm import JvmServer
from sluice.testing._jvm import find_java as jvm_java
from sluice.testing._postgres import free_port

# The one place the versions are pinned: the Makefile's check-kafka reads these three lines. KAFKA_VERSION is every
# test's broker; OTHER_KAFKA_VERSIONS are the older lines a few tests also run on (LocalKafka(version=...)).
KAFKA_VERSION = "4.1.2"
OTHER_KAFKA_VERSIONS = ("3.9.2",)
LOG4J_VERSION = "2.24.3"
KAFKA_VERSIONS = (KAFKA_VERSION, *OTHER_KAFKA_VERSIONS)
INSTALL_HINT = "fetch it from Maven Central with: make check-kafka"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")
USERNAME = "sluice"

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """The folder `make check-kafka` fills for `version`: ~/.cache/sluice/kafka-<version> ($SLUICE_KAFKA_HOME
    instead, for KAFKA_VERSION)."""
    home = os.environ.get("SLUICE_KAFKA_HOME") if version == KAFKA_VERSION else None
    return Path(home) if home else Path.home() / ".cache" / "sluice" / f"kafka-{version}"


def find_classpath(version: str = KAFKA_VERSION) -> str:
    """The jars `make check-kafka` fetched (RuntimeError saying how, when it has not)."""
    home = kafka_home(version)
    lib = home / "lib"
    if not ((home / ".complete").is_file() and (lib / f"kafka_2.13-{version}.jar").is_file()):
        raise RuntimeError(f"Apache Kafka {version} was not found in {home}; {INSTALL_HINT}")
    return os.pathsep.join(str(j) for j in sorted(lib.glob("*.jar")))


def find_java() -> str:
    return jvm_java("Kafka")


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as Kafka's Uuid prints one (it may
    start with "-": pass it as --cluster-id=<id>)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")


def properties(values: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    return "".join(f"{k}={value(v)}\n" for k, v in values.items())


class _Quorum:
    """What the nodes of one KRaft cluster share: its id, and every node's ports (the voters' controller ports are in
    each node's configuration, so all are picked before the first node writes its own)."""

    def __init__(self, size: int) -> None:
        self.cluster_id = new_cluster_id()
        self.size = size
        self.ports: dict[int, tuple[int, int, int]] = {}  # node id -> (client, internal, controller)
        self._lock = threading.Lock()

    def ports_of(self, node_id: int) -> tuple[int, int, int]:
        with self._lock:
            if not self.ports:
                taken: set[int] = set()
                for node in range(1, self.size + 1):
                    picked: list[int] = []
                    while len(picked) < 3:
                        port = free_port()
                        if port not in taken:
                            taken.add(port)
                            picked.append(port)
                    self.ports[node] = (picked[0], picked[1], picked[2])
            return self.ports[node_id]

    @property
    def voters(self) -> str:
        """controller.quorum.voters: a static quorum of every node."""
        return ",".join(f"{node}@127.0.0.1:{self.ports_of(node)[2]}" for node in range(1, self.size + 1))


class _Clients:
    """Clients of a running Kafka: `client_config()` for confluent_kafka, `admin()`, `create_topic()`."""

    @property
    def bootstrap_servers(self) -> str:
        """The brokers' host:port, comma-separated (each kind of server gives its own)."""
        raise NotImplementedError

    def _security_config(self) -> dict[str, str]:
        return {}

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """Settings for a confluent_kafka Producer, Consumer or AdminClient reaching this Kafka: the bootstrap
        servers and the security settings of the clients' listener; `overrides` are more (or other) librdkafka
        settings, dotted keys: `client_config(**{"sasl.password": "wrong"})`."""
        return {"bootstrap.servers": self.bootstrap_servers, **self._security_config(), **overrides}

    def admin(self, **overrides: Any) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.client_config(**overrides))

    def _addresses(self) -> list[str]:
        """The brokers whose metadata must know a new topic before create_topic returns."""
        return [self.bootstrap_servers]

    def create_topic(self, name: str, partitions: int = 1, config: dict[str, str] | None = None, *,
                     replication_factor: int = -1, timeout: float = 60) -> None:
        """Create topic `name` (replication factor -1: the brokers' default) and return once every partition has a
        leader in every running broker's metadata (each broker learns of a topic on its own time)."""
        from confluent_kafka.admin import NewTopic

        admin = self.admin()  # alive until the future is done: its end would fail the request
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                      config={k: str(v) for k, v in (config or {}).items()})],
            operation_timeout=timeout, request_timeout=timeout)
        futures[name].result(timeout)
        deadline = time.monotonic() + timeout
        for address in self._addresses():
            admin = self.admin(**{"bootstrap.servers": address})  # metadata from that broker
            while True:
                topic = admin.list_topics(name, timeout=timeout).topics.get(name)
                if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                        and all(p.leader >= 0 for p in topic.partitions.values())):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {name!r} was created but {address} does not list its {partitions} "
                                       f"partitions with leaders after {timeout:.0f} s: {topic}")
                time.sleep(0.05)


class KafkaNode(JvmServer, _Clients):
    """One KRaft node, broker and controller, of a quorum of `quorum.size` nodes. Its folder: server.properties,
    data/ (the log directory, KRaft's metadata log included), server.log, output.log."""

    server = "Kafka"
    logs = ("server.log",)

    def __init__(self, quorum: _Quorum, node_id: int, *, sasl: str | None = None, tls: bool = False,
                 heap_mb: int = 512, start_timeout: float = 90, broker_config: dict[str, Any] | None = None,
                 version: str = KAFKA_VERSION, client_auth: bool = False) -> None:
        if client_auth and not tls:
            raise ValueError("client_auth needs tls=True (client certificates are part of TLS)")
        if sasl is not None and sasl not in SASL_MECHANISMS:
            raise ValueError(f"sasl must be one of {', '.join(SASL_MECHANISMS)} or None, not {sasl!r}")
        if version not in KAFKA_VERSIONS:
            raise ValueError(f"Kafka {version!r} is not one the tests pin: one of {', '.join(KAFKA_VERSIONS)} "
                             "(src/sluice/testing/_kafka.py; make check-kafka fetches them)")
        super().__init__(start_timeout)
        self.version = version
        self.quorum, self.node_id, self.sasl, self.tls, self.heap_mb = quorum, node_id, sasl, tls, heap_mb
        self.broker_config = dict(broker_config or {})
        self.username: str | None = USERNAME if sasl else None
        self.password: str | None = secrets.token_urlsafe(16) if sasl else None
        self.ca_pem: str | None = None  # tls: the certificate clients verify the broker's against
        self.client_auth = client_auth
        self.client_ca: Any = None  # client_auth: the TestCA the broker trusts client certificates of
        self.client_certificate: Any = None  # client_auth: the harness's own, signed by client_ca
        if client_auth:
            from sluice.testing._tls import TestCA

            self.client_ca = TestCA("sluice test client CA (kafka)")
            self.client_certificate = self.client_ca.client_certificate("sluice-test-harness")
        self._scram_made = False

    @property
    def secured(self) -> bool:
        return bool(self.sasl or self.tls)

    @property
    def port(self) -> int:
        """The clients' listener."""
        return self.quorum.ports_of(self.node_id)[0]

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def internal_bootstrap(self) -> str:
        """The plaintext listener of the brokers' own traffic (the clients' one when it is plaintext too)."""
        client, internal, _ = self.quorum.ports_of(self.node_id)
        return f"127.0.0.1:{internal if self.secured else client}"

    @property
    def ca_path(self) -> Path | None:
        """tls: a PEM file of the certificate clients verify the broker's against."""
        return self._dir / "ca.pem" if self.tls and self._dir is not None else None

    @property
    def protocol(self) -> str:
        return {(False, False): "PLAINTEXT", (False, True): "SSL", (True, False): "SASL_PLAINTEXT",
                (True, True): "SASL_SSL"}[(bool(self.sasl), self.tls)]

    def _security_config(self) -> dict[str, str]:
        config = {"security.protocol": self.protocol}
        if self.sasl:
            assert self.username is not None and self.password is not None
            config.update({"sasl.mechanism": self.sasl, "sasl.username": self.username,
                           "sasl.password": self.password})
        if self.tls:
            config["ssl.ca.location"] = str(self.ca_path)
        if self.client_certificate is not None:
            config["ssl.certificate.pem"] = self.client_certificate.cert_pem
            config["ssl.key.pem"] = self.client_certificate.key_pem
        return config

    def _server_properties(self) -> dict[str, Any]:
        assert self._dir is not None
        client, internal, controller = self.quorum.ports_of(self.node_id)
        one = self.quorum.size == 1
        listeners = {"CLIENT": (client, self.protocol), "CONTROLLER": (controller, "PLAINTEXT")}
        if self.secured:
            listeners["INTERNAL"] = (internal, "PLAINTEXT")
        values: dict[str, Any] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": self.quorum.voters,
            "controller.listener.names": "CONTROLLER",
            "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, (port, _) in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, (port, _) in listeners.items()
                                             if name != "CONTROLLER"),
            "listener.security.protocol.map": ",".join(f"{name}:{p}" for name, (_, p) in listeners.items()),
            "inter.broker.listener.name": "INTERNAL" if self.secured else "CLIENT",
            "log.dirs": self._dir / "data",
            "num.partitions": 1,
            "auto.create.topics.enable": False,
            "group.initial.rebalance.delay.ms": 0,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.num.partitions": 4,
            "offsets.topic.replication.factor": 1 if one else 3,
            "transaction.state.log.replication.factor": 1 if one else 3,
            "transaction.state.log.min.isr": 1 if one else 2,
            "share.coordinator.state.topic.replication.factor": 1 if one else 3,
            "share.coordinator.state.topic.min.isr": 1 if one else 2,
            "default.replication.factor": 1 if one else 3,
            "min.insync.replicas": 1 if one else 2,
            # A dead broker is fenced (and leaves the ISRs, so acks=all writes go on) after 3 s, not 9.
            "broker.heartbeat.interval.ms": 500,
            "broker.session.timeout.ms": 3000,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "log.cleaner.threads": 1,
        }
        if self.tls:
            password = secrets.token_urlsafe(12)
            self.ca_pem = self_signed_certificate(self._dir, "127.0.0.1", password, name="broker")
            (self._dir / "ca.pem").write_text(self.ca_pem)
            values.update({"listener.name.client.ssl.keystore.location": self._dir / "broker.p12",
                           "listener.name.client.ssl.keystore.type": "PKCS12",
                           "listener.name.client.ssl.keystore.password": password,
                           "listener.name.client.ssl.key.password": password})
        if self.client_ca is not None:
            (self._dir / "client-ca.pem").write_text(self.client_ca.pem)
            values.update({"listener.name.client.ssl.client.auth": "required",
                           "listener.name.client.ssl.truststore.type": "PEM",
                           "listener.name.client.ssl.truststore.location": self._dir / "client-ca.pem"})
        if self.sasl == "PLAIN":
            values["listener.name.client.plain.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{self.username}="{self.password}";')
        elif self.sasl:
            values["listener.name.client.scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if self.sasl:
            values["sasl.enabled.mechanisms"] = self.sasl
        return {**values, **self.broker_config}

    def _jvm(self, heap_mb: int, main: str, *args: str) -> list[str]:
        assert self._dir is not None
        return [
            find_java(), "-Xms32m", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1", "-XX:+PerfDisableSharedMem", "-Djava.awt.headless=true",
            "-Djava.net.preferIPv4Stack=true", f"-Djava.io.tmpdir={self._dir / 'tmp'}",
            f"-Dkafka.logs.dir={self._dir}", f"-Dlog4j2.configurationFile={self._dir / 'log4j2.properties'}",
            "-cp", find_classpath(self.version), main, *args,
        ]

    def _write_config(self) -> None:
        assert self._dir is not None
        (self._dir / "tmp").mkdir()
        (self._dir / "log4j2.properties").write_text(LOG4J2)
        (self._dir / "server.properties").write_text(properties(self._server_properties()))
        formatted = subprocess.run(
            self._jvm(128, "kafka.tools.StorageTool", "format", f"--cluster-id={self.quorum.cluster_id}",
                      "--config", str(self._dir / "server.properties")),
            capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=self._dir)
        if formatted.returncode != 0:
            raise RuntimeError(f"formatting Kafka's log directory failed ({formatted.returncode}):\n"
                               f"{formatted.stdout[-3000:]}{formatted.stderr[-3000:]}")

    def _command(self) -> list[str]:
        assert self._dir is not None
        return self._jvm(self.heap_mb, "kafka.Kafka", str(self._dir / "server.properties"))

    def _check_installed(self) -> None:
        find_classpath(self.version)
        find_java()
        try:
            import confluent_kafka  # noqa: F401  (the readiness check's client)
        except ImportError:
            raise RuntimeError("LocalKafka needs confluent-kafka: pip install confluent-kafka") from None

    def _wait_ready(self, timeout: float) -> None:
        """Until the broker's plaintext listener answers a metadata request that lists this node as a broker (it
        has joined the quorum and caught up on its metadata); if the process ends or the time runs out, raise with
        the end of its logs."""
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        deadline = time.monotonic() + timeout
        host, port = self.internal_bootstrap.split(":")
        admin = None
        last = ""
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self._proc.returncode} while starting:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kafka (node {self.node_id}) did not answer on {self.internal_bootstrap} within "
                                   f"{timeout:.0f} s (last: {last}):\n{self._log_tail()}")
            try:
                if admin is None:
                    with socket.create_connection((host, int(port)), timeout=1):
                        pass
                    admin = AdminClient({"bootstrap.servers": self.internal_bootstrap})
                brokers = admin.list_topics(timeout=1).brokers
                if self.node_id in brokers:
                    return
                last = f"brokers: {sorted(brokers)}"
            except Exception as e:  # not listening yet, or metadata not served yet
                last = repr(e)  # not the exception: its traceback would keep this frame's client alive
            time.sleep(0.1)

    def _after_ready(self) -> None:
        """sasl: the SCRAM user made (the first time), then until a client signs in on the clients' listener."""
        if not self.sasl:
            return
        from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        if self.sasl == "SCRAM-SHA-512" and not self._scram_made:
            assert self.username is not None and self.password is not None
            upsert = UserScramCredentialUpsertion(self.username, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512,
                                                                                     4096), self.password.encode())
            admin = AdminClient({"bootstrap.servers": self.internal_bootstrap})
            for future in admin.alter_user_scram_credentials([upsert]).values():
                future.result(30)
            self._scram_made = True
        deadline = time.monotonic() + self.start_timeout
        admin = AdminClient(self.client_config())
        while True:
            try:
                admin.list_topics(timeout=2)
                return
            except Exception as e:  # the credential reaches the broker's cache through the metadata log
                if time.monotonic() > deadline:
                    raise RuntimeError(f"signing in to Kafka as {self.username} ({self.sasl}) failed: {e}") from None
            time.sleep(0.1)

    def stop(self, *, keep_data: bool = False) -> None:
        """keep_data: a clean shutdown (SIGTERM: the broker's controlled shutdown), the folder kept for start().
        Otherwise the broker is killed and its folder deleted (nothing in it is needed any more)."""
        if not keep_data:
            self.kill()
        super().stop(keep_data=keep_data)


class LocalKafka(KafkaNode):
    """Context manager: a fresh one-node Kafka (broker and controller); `.bootstrap_servers`, `client_config()`,
    `create_topic()`, `admin()`; `kill()`/`stop(keep_data=True)` then `start()` bring it back on the same port and
    data. `broker_config`: more server.properties settings (dotted keys: `LocalKafka(**{"a.b": 1})`). `version`:
    one of KAFKA_VERSIONS (the same KRaft settings serve 4.1 and 3.9)."""

    def __init__(self, sasl: str | None = None, tls: bool = False, heap_mb: int = 512, *, start_timeout: float = 90,
                 version: str = KAFKA_VERSION, client_auth: bool = False, **broker_config: Any) -> None:
        super().__init__(_Quorum(1), 1, sasl=sasl, tls=tls, heap_mb=heap_mb, start_timeout=start_timeout,
                         broker_config=broker_config, version=version, client_auth=client_auth)
