"""HBase through its Thrift2 gateway: connection options, one client per thread, table facts, error sorting.

The client is `thriftpy2` (PyPI; the Thrift runtime happybase is built on, with Cython codecs) speaking HBase's
own Thrift2 interface (`hbase.thrift` beside this file, from the hbase-thrift jar of the pinned release).
Thrift2 is chosen over happybase's Thrift1 and over the REST gateway because it is HBase's Java client API
itself: every put and delete carries its cell timestamps, scans take time ranges and max versions, and
`getAllRegionLocations` gives each region's key range and server (what batching by region and one split per
region need). A Thrift client is one TCP connection serving one call at a time, so each thread has its own.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import ModuleType
from typing import Any

from sluice.connector import Option, OptionError, Options, RecordError, RetryableError, SinkError, ThrottledError
from sluice.connectors.hbase._kerberos import KERBEROS_OPTIONS, Kerberos
from sluice.connectors.hbase._kerberos import make_client as make_kerberos_client

CONNECTION_OPTIONS = (
    Option("host", "list", (), "Thrift2 gateways (hbase thrift2 start): host names or addresses; a task picks one "
           "by its partition id.", required=True),
    Option("port", "int", 9090, "The gateways' Thrift port (binary protocol, not framed; with ssl, their HTTPS port).",
           minimum=1, maximum=65535),
    Option("request.timeout-ms", "int", 60_000, "Client-side timeout of one call to a gateway.", minimum=100),
    Option("ssl", "bool", False, "HTTPS to the gateways: HBase's Thrift2 gateway in its HTTP mode with TLS "
           "(hbase.regionserver.thrift.http and hbase.thrift.ssl.enabled; its binary protocol has no TLS). The "
           "certificate and the host name are checked against the system's trusted CAs, or ssl.ca-pem."),
    Option("ssl.ca-pem", "str", None, "PEM text of the CA that signed the gateways' certificates (text, not a path: "
           "executors are other machines). Implies ssl=true."),
    *KERBEROS_OPTIONS,
)

# Server-side exceptions (their Java class names reach us in TIOError's message) that say: slow down.
BUSY = ("RegionTooBusyException", "CallQueueTooBigException", "CallDroppedException", "RpcThrottlingException",
        "MultiActionResultTooLarge")
# ... and those that pass: a region moving or splitting, a region server restarting.
PASSING = ("NotServingRegionException", "RegionMovedException", "RegionOpeningException", "ServerNotRunningYet",
           "RegionServerStoppedException", "RetriesExhaustedException", "ConnectException", "SocketTimeout",
           "CallTimeoutException", "PleaseHoldException", "ConnectionClosing", "DoNotRetryNowException")


class HBaseError(SinkError):
    """A call HBase refused, or that failed for good."""


@cache
def thrift() -> ModuleType:
    """HBase's Thrift2 interface, loaded once per process."""
    import thriftpy2

    with resources.as_file(resources.files("sluice.connectors.hbase") / "hbase.thrift") as path:
        return thriftpy2.load(str(path), module_name="sluice_hbase_thrift")


@dataclass(frozen=True)
class Connection:
    """Where the gateways are; pickled to tasks."""

    hosts: tuple[str, ...]
    port: int
    timeout_s: float
    ssl: bool = False  # HTTPS (the gateway's HTTP mode) instead of the binary protocol
    ca_pem: str | None = None
    kerberos: Kerberos | None = None  # SPNEGO on the gateway's HTTP mode (with ssl, HTTPS)

    @classmethod
    def from_options(cls, opts: Options) -> Connection:
        if not opts["host"]:
            raise OptionError("host must name at least one HBase Thrift2 gateway, e.g. .option('host', "
                              "'hbase-thrift.internal')")
        return cls(tuple(opts["host"]), opts["port"], opts["request.timeout-ms"] / 1000,
                   opts["ssl"] or opts["ssl.ca-pem"] is not None, opts["ssl.ca-pem"], Kerberos.from_options(opts))

    def display(self, table: str) -> str:
        return f"hbase{'s' if self.ssl else ''}://{self.hosts[0]}:{self.port}/{table}"

    def host_for(self, index: int) -> str:
        return self.hosts[index % len(self.hosts)]

    def client(self, index: int = 0) -> Any:
        """This thread's client of gateway `index % len(hosts)`, connected on first use."""
        host = self.host_for(index)
        clients: dict[tuple[str, int], Any] = _local.__dict__.setdefault("clients", {})
        client = clients.get((host, self.port))
        if client is None:
            from thriftpy2.protocol import TCyBinaryProtocolFactory
            from thriftpy2.transport import TCyBufferedTransportFactory

            try:
                if self.kerberos is not None:
                    client = make_kerberos_client(thrift().THBaseService, host, self.port, self.kerberos,
                                                  self.timeout_s, _ssl_context(self.ca_pem) if self.ssl else None)
                elif self.ssl:
                    from thriftpy2.http import make_client as make_http_client

                    context = _ssl_context(self.ca_pem)
                    client = make_http_client(thrift().THBaseService, host, self.port, scheme="https",
                                              ssl_context_factory=lambda: context, keep_alive=True,
                                              timeout=int(self.timeout_s * 1000),
                                              proto_factory=TCyBinaryProtocolFactory())
                else:
                    from thriftpy2.rpc import make_client

                    client = make_client(thrift().THBaseService, host, self.port, timeout=int(self.timeout_s * 1000),
                                         proto_factory=TCyBinaryProtocolFactory(),
                                         trans_factory=TCyBufferedTransportFactory())
            except Exception as e:
                raise classify(e, self, 0) from None
            clients[(host, self.port)] = client
        return client

    def forget(self, index: int = 0) -> None:
        """Drop this thread's client of that gateway (after a transport failure: the next call reconnects)."""
        clients: dict[tuple[str, int], Any] = _local.__dict__.setdefault("clients", {})
        client = clients.pop((self.host_for(index), self.port), None)
        if client is not None:
            client.close()

    def call(self, method: str, *args: Any, index: int = 0, rows: int = 0) -> Any:
        """`method(*args)` on this thread's client of gateway `index`, as run() runs it."""
        return self.run(lambda client: getattr(client, method)(*args), index=index, rows=rows)

    def run(self, call: Callable[[Any], Any], *, index: int = 0, rows: int = 0) -> Any:
        """`call(client)` on this thread's client of gateway `index`, failures sorted. A link the gateway closed (it
        drops connections idle for hbase.thrift.server.socket.read.timeout, 60 s) or that broke is dropped, and the
        call tried once more on a new one."""
        for attempt in (0, 1):
            reused = (self.host_for(index), self.port) in _local.__dict__.get("clients", {})
            try:
                return call(self.client(index))
            except (RetryableError, SinkError):
                raise
            except Exception as e:  # sorted by classify
                error = classify(e, self, rows)
                # The gateway answered: the link is sound, and the same call would fail again.
                if isinstance(error, HBaseError | RecordError) or isinstance(e, thrift().TIOError |
                                                                             thrift().TIllegalArgument):
                    raise error from None
                self.forget(index)
                if attempt or not reused:
                    raise error from None
        raise AssertionError


_local = threading.local()


@cache
def _ssl_context(ca_pem: str | None) -> ssl.SSLContext:
    """One verifying context per CA and process (certificate and host name always checked)."""
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()


def classify(error: BaseException, conn: Connection, rows: int) -> Exception:
    """A Thrift or socket failure as a retry (RetryableError), a slow-down (ThrottledError), a write refused for what
    one of its `rows` holds (RecordError) or an HBaseError."""
    module = thrift()
    where = f"{conn.hosts[0]}:{conn.port}" if len(conn.hosts) == 1 else f"{list(conn.hosts)}:{conn.port}"
    if isinstance(error, module.TIOError | module.TIllegalArgument):
        text = str(getattr(error, "message", None) or error)
        if any(name in text for name in BUSY):
            return ThrottledError(f"HBase is busy ({_first_line(text)})")
        if any(name in text for name in PASSING):
            return RetryableError(f"HBase could not serve the call yet ({_first_line(text)})")
        return HBaseError(f"HBase refused the call through gateway {where}: {_first_line(text)}",
                          store="hbase", target=where, batch_records=rows or None)
    from thriftpy2.thrift import TApplicationException

    if isinstance(error, ssl.SSLError):
        # A certificate the client refuses is refused again on the next try: not retried.
        trusted = "the CA in ssl.ca-pem" if conn.ca_pem else "the system's trusted CAs (ssl.ca-pem not set)"
        return HBaseError(f"TLS to the HBase Thrift2 gateway at {where} failed ({_first_line(str(error))}): its "
                          f"certificate must be signed by {trusted} and name the host connected to. Set ssl.ca-pem "
                          "to the PEM text of the CA that signed the gateways' certificates.", store="hbase",
                          target=where, batch_records=rows or None)
    if isinstance(error, TApplicationException) and rows:
        # The gateway's own client refused the puts or deletes before sending them ("Internal error processing
        # putMultiple"): for what one of them holds (Put/Delete's checks: a cell over hbase.client.keyvalue.maxsize,
        # an empty row key or put), so the same call fails again and the engine finds the record in its batch.
        return RecordError(f"the HBase Thrift2 gateway at {where} refused a put or delete of a batch of {rows} "
                           f"({error}); its log names the cause (a cell over hbase.client.keyvalue.maxsize, 10 MiB "
                           "by default, or an empty row key or put)")
    if isinstance(error, TApplicationException):
        return HBaseError(f"the HBase Thrift2 gateway at {where} failed the call ({error}); its log names the cause "
                          "(a cell over hbase.client.keyvalue.maxsize, 10 MiB by default, or an empty row key or put)",
                          store="hbase", target=where, batch_records=rows or None)
    # The gateway is down, restarting or unreachable, or the link broke: a new connection may work.
    return RetryableError(f"no answer from the HBase Thrift2 gateway at {where}: {type(error).__name__}: "
                          f"{_first_line(str(error))}")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line[:500]


@dataclass(frozen=True)
class TableFacts:
    """What a write or read learns of the table once, on the driver."""

    families: frozenset[bytes]
    ttl_families: frozenset[bytes]  # families whose cells expire (a time to live)
    max_versions: dict[bytes, int]  # versions of a cell each family keeps (VERSIONS)


def describe(conn: Connection, table: str) -> TableFacts:
    """The table's column families (OptionError when the table does not exist)."""
    module = thrift()
    namespace, _, name = table.partition(":")
    table_name = module.TTableName(ns=namespace.encode(), qualifier=name.encode())
    if not conn.call("tableExists", table_name):
        raise OptionError(f"HBase table {table} does not exist. Create it first, e.g. in the HBase shell: "
                          f"create '{table}', 'd' (one column family d), with split points for a large table.")
    descriptor = conn.call("getTableDescriptor", table_name)
    families = frozenset(bytes(c.name) for c in descriptor.columns or ())
    forever = 2_147_483_647  # HConstants.FOREVER
    ttl = frozenset(bytes(c.name) for c in descriptor.columns or ()
                    if c.timeToLive is not None and 0 < c.timeToLive < forever)
    kept = {bytes(c.name): c.maxVersions or 1 for c in descriptor.columns or ()}
    return TableFacts(families, ttl, kept)


@dataclass(frozen=True)
class Region:
    """A region's key range [start, end) (b"" = open), and where it is served."""

    start: bytes
    end: bytes
    server: str


def regions(conn: Connection, table: str) -> list[Region]:
    """The table's regions in key order."""
    found = [Region(bytes(r.regionInfo.startKey or b""), bytes(r.regionInfo.endKey or b""),
                    f"{r.serverName.hostName}:{r.serverName.port}")
             for r in conn.call("getAllRegionLocations", table.encode())]
    return sorted(found, key=lambda r: r.start)
