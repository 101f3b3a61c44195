"""Cassandra connection options, one driver session per Python process and server, and the driver's errors
sorted into retry, slow down and fail.

The client is the Apache Cassandra Python driver (`cassandra-driver`): the project's own driver, token-aware by
default (a statement with a routing key goes to a replica of its partition), with a compiled serializer and
asynchronous execution; `scylla-driver` is its fork with the same API, `acsylla` wraps the C++ driver for asyncio
(sluice's engine is thread-based). A `Cluster` costs a control connection and a metadata fetch, so
tasks in one Python worker share one session per server and credentials (`session_for`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from sluice.connector import (
    ClientCertificate,
    Option,
    OptionError,
    Options,
    RecordError,
    RetryableError,
    SinkError,
    ThrottledError,
    client_certificate,
)
from sluice.connectors.cassandra._refusals import ADVICE, refuses_record
from sluice.connectors.cassandra._tls import explain as explain_tls_failure
from sluice.connectors.cassandra._tls import ssl_context

if TYPE_CHECKING:
    from cassandra.cluster import Session

T = TypeVar("T")

CONSISTENCY_LEVELS = ("ANY", "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE")

CONNECTION_OPTIONS = (
    Option("host", "list", (), "Contact points: host names or addresses of Cassandra nodes (the driver finds the "
           "others).", required=True),
    Option("port", "int", 9042, "The nodes' native (CQL) port.", minimum=1, maximum=65535),
    Option("keyspace", "str", None, "Keyspace of the table.", required=True),
    Option("table", "str", None, "Table name (as created; quoted for you).", required=True),
    Option("username", "str", None, "User for PasswordAuthenticator."),
    Option("password", "str", None, "Password (else CASSANDRA_PASSWORD on the driver). Never logged.", secret=True),
    Option("ssl", "bool", False, "TLS to the nodes, verified against the system's trusted CAs (or ssl.ca-pem)."),
    Option("ssl.ca-pem", "str", None, "PEM text of the CA that signed the nodes' certificates (text, not a path: "
           "executors are other machines). Implies ssl=true."),
    Option("ssl.cert-pem", "str", None, "PEM text of this client's certificate, for nodes that demand one "
           "(client_encryption_options' require_client_auth); with ssl.key-pem. Implies ssl=true."),
    Option("ssl.key-pem", "str", None, "PEM text of the client certificate's private key (unencrypted); with "
           "ssl.cert-pem. Never shown; each process loads it into its TLS context through a private temp file "
           "removed at once.", secret=True),
    Option("local-dc", "str", None, "The data center whose nodes take requests (DCAwareRoundRobinPolicy); "
           "default: the driver's choice from the contact points."),
    Option("request.timeout-ms", "int", 12_000, "Client-side timeout of one request.", minimum=100),
)


class CassandraError(SinkError):
    """A request Cassandra refused, or that failed for good; the message never holds the password."""


@dataclass(frozen=True)
class Connection:
    """Resolved on the driver (password from the option or the driver's CASSANDRA_PASSWORD), pickled to tasks."""

    hosts: tuple[str, ...]
    port: int
    keyspace: str
    table: str
    username: str | None
    timeout_s: float
    ssl: bool = False
    ca_pem: str | None = field(default=None, repr=False)
    local_dc: str | None = None
    password: str | None = field(default=None, repr=False)
    certificate: ClientCertificate | None = field(default=None, repr=False)  # mutual TLS; its repr hides the key

    @classmethod
    def from_options(cls, opts: Options) -> Connection:
        if not opts["host"]:
            raise OptionError("host must name at least one Cassandra node, e.g. .option('host', '10.0.0.1,10.0.0.2')")
        password = opts["password"] if opts["password"] is not None else os.environ.get("CASSANDRA_PASSWORD")
        if password is not None and not opts["username"]:
            raise OptionError("password is set but username is not: set .option('username', ...) too.")
        certificate = client_certificate(opts)
        tls = opts["ssl"] or opts["ssl.ca-pem"] is not None or certificate is not None
        return cls(tuple(opts["host"]), opts["port"], opts["keyspace"], opts["table"], opts["username"],
                   opts["request.timeout-ms"] / 1000, tls, opts["ssl.ca-pem"], opts["local-dc"], password,
                   certificate)

    @property
    def target(self) -> str:
        return f"{quote_ident(self.keyspace)}.{quote_ident(self.table)}"

    @property
    def display(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"cassandra://{user}{','.join(self.hosts)}:{self.port}/{self.keyspace}.{self.table}"

    def session(self) -> Session:
        return session_for(self)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


TUPLES = "sluice-tuples"  # the execution profile whose rows are plain tuples (reads build Arrow columns from them)
_SESSIONS: dict[tuple[Any, ...], Session] = {}
_SESSIONS_LOCK = threading.Lock()


def session_for(conn: Connection) -> Session:
    """This process's session to `conn`'s cluster as `conn`'s user (one per server, user and TLS setting)."""
    key = _session_key(conn)
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
        if session is not None and not session.is_shutdown and _all_down(session):
            # Every node is down for this session (a restart, or connections lost to refusals): its reconnection
            # waits out a backoff, while a new session asks the nodes now (a Spark task retried in this worker).
            session.cluster.shutdown()
        if session is None or session.is_shutdown:
            session = _SESSIONS[key] = while_overloaded(lambda: _connect(conn), conn, "connect")
        return session


def _session_key(conn: Connection) -> tuple[Any, ...]:
    return (conn.hosts, conn.port, conn.username, conn.password, conn.ssl, conn.ca_pem, conn.local_dc,
            conn.certificate)


def _all_down(session: Session) -> bool:
    hosts = session.cluster.metadata.all_hosts()
    return bool(hosts) and all(host.is_up is False for host in hosts)


def forget_session(conn: Connection) -> None:
    """Close this process's session to `conn`'s cluster, so the next session_for() connects anew (after a restart
    of the cluster, before the old session's reconnection finds it)."""
    key = _session_key(conn)
    with _SESSIONS_LOCK:
        session = _SESSIONS.pop(key, None)
    if session is not None:
        session.cluster.shutdown()


def close_sessions() -> None:
    """Shut down every session this process holds (a process done with its clusters: their reconnections to nodes
    that went away would go on in the background)."""
    with _SESSIONS_LOCK:
        sessions = list(_SESSIONS.values())
        _SESSIONS.clear()
    for session in sessions:
        session.cluster.shutdown()


def _connect(conn: Connection) -> Session:
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy
    from cassandra.query import tuple_factory

    context = ssl_context(conn) if conn.ssl else None
    auth = PlainTextAuthProvider(conn.username, conn.password or "") if conn.username else None
    policy = TokenAwarePolicy(DCAwareRoundRobinPolicy(conn.local_dc))
    profiles = {EXEC_PROFILE_DEFAULT: ExecutionProfile(load_balancing_policy=policy, request_timeout=conn.timeout_s),
                TUPLES: ExecutionProfile(load_balancing_policy=policy, request_timeout=conn.timeout_s,
                                         row_factory=tuple_factory)}
    cluster = Cluster(list(conn.hosts), port=conn.port, auth_provider=auth, ssl_context=context,
                      execution_profiles=profiles, protocol_version=5,
                      # A restarted node is found again within seconds (the driver's default waits up to 10 min).
                      reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0),
                      connect_timeout=max(5.0, conn.timeout_s / 2))
    try:
        return cluster.connect()
    except NoHostAvailable as e:
        cluster.shutdown()
        if _overloaded(e):
            raise  # while_overloaded waits the node's rate limiter out
        raise CassandraError(f"cannot connect to Cassandra at {conn.display}: {_describe_no_host(e, conn)}",
                             store="cassandra", target=conn.display) from None


def _overloaded(error: BaseException) -> bool:
    from cassandra.cluster import NoHostAvailable
    from cassandra.protocol import OverloadedErrorMessage

    if isinstance(error, NoHostAvailable):
        causes = list(getattr(error, "errors", {}).values())
        return bool(causes) and all(isinstance(c, OverloadedErrorMessage) for c in causes)
    return isinstance(error, OverloadedErrorMessage)


def while_overloaded(call: Callable[[], T], conn: Connection, what: str) -> T:
    """`call` (a connection or a prepare: a few requests per task, before any row is written) repeated while the
    nodes refuse it as overloaded, for up to request.timeout-ms. The write's own requests are retried by the engine
    within sink.max-retries; these are not the write's, and a node whose rate limiter (native_transport_max_requests
    _per_second) another write just emptied refills it within a second."""
    deadline = time.monotonic() + conn.timeout_s
    delay = 0.05
    while True:
        try:
            return call()
        except Exception as e:
            if not _overloaded(e):
                raise
            if time.monotonic() + delay > deadline:
                raise CassandraError(f"cannot {what} at {conn.display}: the nodes refused it as overloaded for "
                                     f"{conn.timeout_s:g} s (request.timeout-ms); lower sink.requests.max-inflight "
                                     "of the writes that share them", store="cassandra", target=conn.display) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _describe_no_host(error: Any, conn: Connection) -> str:
    from cassandra import AuthenticationFailed

    causes = list(getattr(error, "errors", {}).values())
    if any(isinstance(c, AuthenticationFailed) for c in causes):
        return ("authentication failed: check username and password (or CASSANDRA_PASSWORD), and that the user "
                "exists")
    detail = "; ".join(f"{type(c).__name__}: {c}" for c in causes) or str(error)
    if conn.ssl and (tls := explain_tls_failure(getattr(error, "errors", {}), conn)) is not None:
        return tls
    if not conn.ssl:
        return (f"{detail}. If the nodes take TLS clients only (client_encryption_options), set ssl=true and "
                "ssl.ca-pem.")
    return detail


def classify(error: BaseException, conn: Connection, rows: int | None = None) -> BaseException:
    """A driver error as sluice's: RetryableError for what passes (timeouts, unavailable replicas, lost
    connections), ThrottledError for an overloaded node (the engine slows down), RecordError for a statement refused
    for what it holds (_refusals.py; the engine finds it in its batch), CassandraError otherwise."""
    from cassandra import (
        CoordinationFailure,
        InvalidRequest,
        OperationTimedOut,
        RequestExecutionException,
        Unavailable,
    )
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException
    from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage

    text = f"{type(error).__name__}: {error}"
    if isinstance(error, OverloadedErrorMessage | IsBootstrappingErrorMessage):
        return ThrottledError(text)
    if isinstance(error, NoHostAvailable) and any(
            isinstance(c, OverloadedErrorMessage) for c in getattr(error, "errors", {}).values()):
        return ThrottledError(text)
    if isinstance(error, OperationTimedOut | Unavailable | NoHostAvailable | ConnectionException |
                  CoordinationFailure) or (isinstance(error, RequestExecutionException)
                                           and "timeout" in type(error).__name__.lower()):
        return RetryableError(text)
    if refuses_record(error):
        where = "a statement" if rows in (None, 1) else f"a statement of a batch of {rows}"
        return RecordError(f"Cassandra refused {where} into {conn.target} for what it holds: {text}. {ADVICE}")
    if isinstance(error, InvalidRequest) and "Batch too large" in str(error):
        return CassandraError(f"a batch of {rows} statements into {conn.target} is over the server's "
                              f"batch_size_fail_threshold ({error}). Lower sink.flush-buffer.size (the bytes of one "
                              "batch) or sink.batch.max-size, or raise the threshold in cassandra.yaml.",
                              store="cassandra", target=conn.display, batch_records=rows)
    return CassandraError(f"Cassandra refused a request into {conn.target}: {text}", store="cassandra",
                          target=conn.display, batch_records=rows, cause=error)
