"""Kerberos to HBase's Thrift2 gateway: SPNEGO (RFC 4559's `Authorization: Negotiate`) on the gateway's HTTP mode.

A gateway of a secured HBase (hbase.security.authentication=kerberos with hbase.regionserver.thrift.http=true)
authenticates every HTTP request on its own: it keeps no session, so each request carries a fresh Kerberos token
for the gateway's SPNEGO principal (hbase.thrift.spnego.principal, `HTTP/<host>`), and answers 401 to one without.
The binary protocol's alternative, SASL GSSAPI framing, has no transport in thriftpy2 that sluice could verify here.

Credentials come as options: the principal and its keytab as base64 text, a secret (redacted in every repr, error and
plan). Spark's own `spark.kerberos.principal`/`spark.kerberos.keytab` are not used: Spark logs its JVM in with them
and hands executors Hadoop delegation tokens, which the Thrift gateway does not take, and the keytab never reaches a
Python worker. On each executor process the keytab is written to a file of a new private folder (0700, the file
0600), the principal signed in from it (MIT Kerberos through python-gssapi; the ticket in a MEMORY: credential cache
of the process, never a shared one), and the folder removed at once; a sign-in is redone from the keytab's bytes when
its ticket has less than REFRESH_S left, so a long streaming query outlives its tickets.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import hashlib
import http.client
import os
import re
import secrets
import shutil
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

from sluice.connector import Option, OptionError, Options, RetryableError, SinkError

KERBEROS_OPTIONS = (
    Option("kerberos.principal", "str", None, "Kerberos: sign in to the Thrift2 gateways as this principal (e.g. "
           "etl@EXAMPLE.COM), by SPNEGO on their HTTP mode (hbase.regionserver.thrift.http; with ssl, over HTTPS). "
           "Needs kerberos.keytab and python-gssapi on the driver and every executor (docs/security.md)."),
    Option("kerberos.keytab", "str", None, "Base64 of the principal's keytab file (base64 -w0 etl.keytab): text, not "
           "a path, since executors are other machines. A secret: redacted everywhere; each executor writes it to a "
           "private file only while it signs in.", secret=True),
    Option("kerberos.service", "str", "HTTP", "The gateways' SPNEGO service name: their principal is "
           "<service>/<host>@REALM (hbase.thrift.spnego.principal), <host> being the host name connected to."),
    Option("kerberos.krb5-conf", "str", None, "Text of a krb5.conf (the realm's KDCs) for the executors whose own "
           "/etc/krb5.conf does not name the realm; set as KRB5_CONFIG in the executor's Python process."),
)

REFRESH_S = 300  # sign in again when the ticket has less than this left
SPNEGO = "1.3.6.1.5.5.2"


class KerberosError(SinkError):
    """A Kerberos sign-in (or a gateway's check of it) failed, for good."""


@dataclass(frozen=True)
class Kerberos:
    """Who signs in to the gateways; pickled to tasks (the keytab's bytes never shown)."""

    principal: str
    keytab: bytes = field(repr=False)
    service: str = "HTTP"
    krb5_conf: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, opts: Options) -> Kerberos | None:
        principal, keytab = opts["kerberos.principal"], opts["kerberos.keytab"]
        if principal is None and keytab is None:
            return None
        if principal is None or keytab is None:
            raise OptionError("kerberos.principal and kerberos.keytab go together: set both (the principal, and "
                              "base64 of its keytab) to sign in to a Kerberos-secured HBase Thrift2 gateway")
        try:
            raw = base64.b64decode("".join(keytab.split()), validate=True)
        except (binascii.Error, ValueError):
            raise OptionError("kerberos.keytab must be base64 of a keytab file (e.g. base64 -w0 etl.keytab); "
                              "the value given is not base64") from None
        if not raw.startswith(b"\x05\x02"):  # MIT's keytab format, version 2
            raise OptionError("kerberos.keytab is base64, but not of a keytab file (MIT format version 2, as ktutil "
                              "and kadmin write it)")
        return cls(principal, raw, opts["kerberos.service"], opts["kerberos.krb5-conf"])

    def __repr__(self) -> str:
        return f"Kerberos(principal={self.principal!r}, keytab=<redacted>, service={self.service!r})"


_lock = threading.Lock()
_signed_in: dict[tuple[str, bytes, str | None], Any] = {}  # (principal, keytab digest, krb5.conf) -> Credentials
_krb5_conf: dict[str, str] = {}  # krb5.conf text -> its file


def _gssapi() -> Any:
    try:
        import gssapi
    except ImportError:
        raise OptionError("kerberos.principal needs python-gssapi on the driver and every executor: pip install "
                          "'sluice[kerberos]' (it builds against MIT Kerberos: apt-get install -y libkrb5-dev gcc, "
                          "or install a wheel built once for your executors' image; docs/security.md)") from None
    return gssapi


def credentials(kerberos: Kerberos) -> Any:
    """This process's gssapi.Credentials of the principal, signing in (again) from the keytab when there are none or
    their ticket ends within REFRESH_S."""
    gssapi = _gssapi()

    key = (kerberos.principal, hashlib.sha256(kerberos.keytab).digest(), kerberos.krb5_conf)
    with _lock:
        creds = _signed_in.get(key)
        if creds is not None:
            try:
                if creds.lifetime > REFRESH_S:
                    return creds
            except gssapi.exceptions.GSSError:
                pass  # expired: sign in again below
        creds = _sign_in(kerberos)
        _signed_in[key] = creds
        return creds


def _sign_in(kerberos: Kerberos) -> Any:
    gssapi = _gssapi()

    if kerberos.krb5_conf is not None:
        _use_krb5_conf(kerberos.krb5_conf)
    folder = tempfile.mkdtemp(prefix="sluice-krb5-")  # mode 0700
    try:
        path = os.path.join(folder, "keytab")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(kerberos.keytab)
        store: dict[bytes | str, bytes | str] = {
            b"client_keytab": path.encode(), b"ccache": f"MEMORY:sluice-{secrets.token_hex(8)}".encode()}
        name = gssapi.Name(kerberos.principal, gssapi.NameType.kerberos_principal)
        try:
            creds = gssapi.Credentials(name=name, usage="initiate", store=store)
            creds.lifetime  # noqa: B018  (the ticket is fetched now, while the keytab's file exists)
        except gssapi.exceptions.GSSError as e:
            raise _sign_in_error(kerberos, e) from None
        return creds
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _use_krb5_conf(text: str) -> None:
    path = _krb5_conf.get(text)
    if path is None:
        folder = tempfile.mkdtemp(prefix="sluice-krb5-conf-")
        atexit.register(shutil.rmtree, folder, True)  # (not a secret; Spark may end a worker without atexit)
        path = os.path.join(folder, "krb5.conf")
        with open(path, "w") as f:
            f.write(text)
        _krb5_conf[text] = path
    os.environ["KRB5_CONFIG"] = path


def _reason(error: Exception) -> str:
    text = " ".join(str(error).split())
    minor = re.search(r"Minor \(\d+\): (.*)", text)
    return (minor.group(1) if minor else text)[:300]


def _sign_in_error(kerberos: Kerberos, error: Exception) -> Exception:
    reason = _reason(error)
    if "Cannot contact any KDC" in reason or "Cannot find KDC" in reason:
        return RetryableError(f"Kerberos sign-in for HBase as {kerberos.principal}: no KDC answered ({reason}); "
                              "the realm's KDCs come from the executor's krb5.conf (or kerberos.krb5-conf)")
    return KerberosError(f"Kerberos sign-in for HBase as {kerberos.principal} was refused: {reason}. Check that "
                         "kerberos.keytab holds this principal's current keys (a key changed since the keytab was "
                         "exported refuses it) and that the principal has not expired.", store="hbase")


def negotiate(kerberos: Kerberos, host: str) -> str:
    """An `Authorization` header's value for one request to the gateway on `host`: a fresh SPNEGO token for
    <service>@<host> (the gateway's acceptor refuses a token it has seen)."""
    gssapi = _gssapi()

    creds = credentials(kerberos)
    target = gssapi.Name(f"{kerberos.service}@{host}", gssapi.NameType.hostbased_service)
    try:
        context = gssapi.SecurityContext(name=target, creds=creds, usage="initiate",
                                         mech=gssapi.OID.from_int_seq(SPNEGO))
        token = context.step()
    except gssapi.exceptions.GSSError as e:
        raise KerberosError(f"Kerberos: no ticket for the HBase Thrift2 gateway's principal {kerberos.service}/"
                            f"{host} as {kerberos.principal}: {_reason(e)}. The gateway's SPNEGO principal "
                            "(hbase.thrift.spnego.principal) must be <kerberos.service>/<the host connected to>.",
                            store="hbase") from None
    return "Negotiate " + base64.b64encode(token or b"").decode()


class NegotiatingHttp:
    """A thriftpy2 transport: each flush is one HTTP POST to the gateway with a fresh Negotiate token, on one kept-
    alive connection (opened again, with a new token, when the gateway closed it). A 401 raises KerberosError."""

    def __init__(self, host: str, port: int, kerberos: Kerberos, timeout_s: float,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.host, self.port, self.kerberos, self.timeout_s, self.ssl_context = host, port, kerberos, timeout_s, \
            ssl_context
        self._http: http.client.HTTPConnection | None = None
        self._out: list[bytes] = []
        self._in = b""
        self._at = 0

    def is_open(self) -> bool:
        return self._http is not None

    def open(self) -> None:
        if self.ssl_context is not None:
            self._http = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                                     context=self.ssl_context)
        else:
            self._http = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        self._http = None

    def write(self, data: bytes) -> None:
        self._out.append(bytes(data))

    def read(self, size: int) -> bytes:
        chunk = self._in[self._at:self._at + size]
        self._at += len(chunk)
        return chunk

    def flush(self) -> None:
        body = b"".join(self._out)
        self._out = []
        if not body:
            return
        for attempt in (0, 1):
            if self._http is None:
                self.open()
            assert self._http is not None
            try:
                self._http.request("POST", "/", body, {
                    "Content-Type": "application/x-thrift", "Authorization": negotiate(self.kerberos, self.host)})
                response = self._http.getresponse()
                data = response.read()
                break
            except (http.client.RemoteDisconnected, http.client.CannotSendRequest, BrokenPipeError,
                    ConnectionResetError):
                self.close()  # the gateway closed an idle kept-alive connection: once more on a new one
                if attempt:
                    raise
        if response.status == 401:
            self.close()
            said = re.search(rb"Authentication Error: ([^<\n]*)", data)
            detail = said.group(1).decode(errors="replace").strip()[:300] if said else "no reason given"
            raise KerberosError(f"the HBase Thrift2 gateway at {self.host}:{self.port} refused the Kerberos sign-in "
                                f"of {self.kerberos.principal} (HTTP 401: {detail})", store="hbase")
        if response.status != 200:
            self.close()
            raise http.client.HTTPException(f"HTTP {response.status} {response.reason} from the HBase Thrift2 "
                                            f"gateway at {self.host}:{self.port}")
        self._in, self._at = data, 0


def make_client(service: Any, host: str, port: int, kerberos: Kerberos, timeout_s: float,
                ssl_context: ssl.SSLContext | None) -> Any:
    """A thriftpy2 client of `service` over NegotiatingHttp."""
    from thriftpy2.protocol import TCyBinaryProtocolFactory
    from thriftpy2.thrift import TClient
    from thriftpy2.transport import TBufferedTransport

    transport = TBufferedTransport(NegotiatingHttp(host, port, kerberos, timeout_s, ssl_context))
    return TClient(service, TCyBinaryProtocolFactory().get_protocol(transport))
