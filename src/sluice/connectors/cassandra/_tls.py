"""TLS to Cassandra's nodes: the driver's context (the CA of ssl.ca-pem or the system's, a client certificate from
ssl.cert-pem/ssl.key-pem), and what a failed connection over it means.

Over TLS 1.3 a client finishes its handshake before the node has checked the client's certificate; the driver then
sends its first request at once, and a node that refuses the certificate answers with its alert and closes a
connection holding that unread request: the close (a reset) can overtake the alert, and the driver sees only an
EOF. When a connection fails so, one more connection of sluice's own, which sends nothing after its handshake, reads
the node's alert (then nothing follows it), so the error names the real reason. A node that accepts the certificate
just waits on that connection for a request; the wait ends after a short timeout.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

from sluice.connector import ClientCertificate, refused_certificate, server_alert


class Connection(Protocol):
    """What the TLS context and the explanation of a refusal read of a connection's settings (_client.Connection)."""

    @property
    def port(self) -> int: ...
    @property
    def ca_pem(self) -> str | None: ...
    @property
    def certificate(self) -> ClientCertificate | None: ...

# How long the probe waits for a node's alert: it comes as soon as the node has read the handshake.
_PROBE_WAIT_S = 2.0


def ssl_context(conn: Connection) -> ssl.SSLContext:
    """Certificate and host name checked against ssl.ca-pem's CA (else the system's); presents the client
    certificate when one is given."""
    context = ssl.create_default_context(cadata=conn.ca_pem) if conn.ca_pem else ssl.create_default_context()
    if conn.certificate is not None:
        conn.certificate.load_into(context)
    return context


def explain(causes: dict[Any, BaseException], conn: Connection) -> str | None:
    """What a failed TLS connection means and what to set, or None when the driver's `causes` (per node endpoint)
    hold no TLS failure."""
    # The driver reports a failed handshake as an OSError whose text carries the ssl module's ("[SSL: ...]").
    failed = [e for e, c in causes.items() if isinstance(c, ssl.SSLError) or "[SSL" in str(c)]
    if not failed:
        return None
    detail = "; ".join(f"{type(c).__name__}: {c}" for c in causes.values())
    if any(isinstance(causes[e], ssl.SSLEOFError) for e in failed):  # an alert a reset may have overtaken
        detail = next((alert for alert in (_probe(e, conn) for e in failed) if alert), detail)
    refused = refused_certificate(detail)  # the node's TLS alert about the client's certificate
    if refused is None and conn.certificate is not None and "alert internal error" in detail.lower():
        # Cassandra's TLS is netty-tcnative's OpenSSL: a client certificate its Java truststore cannot verify other
        # than expired (one from a CA it does not hold) ends the handshake with this alert, not "unknown ca".
        refused = ("internal error", "the node could not verify it: most often a CA its truststore does not hold "
                   "signed it")
    if refused is not None:
        given = "ssl.cert-pem" if conn.certificate is not None else "ssl.cert-pem unset"
        return (f'TLS: the node refused the client certificate ({given}; TLS alert "{refused[0]}": {refused[1]}) '
                f"[{detail}]. Set ssl.cert-pem and ssl.key-pem to a certificate and key the nodes' truststore CA "
                "signed (client_encryption_options' require_client_auth; the key is not shown).")
    trusted = "the CA in ssl.ca-pem" if conn.ca_pem else "the system's trusted CAs (ssl.ca-pem not set)"
    return (f"TLS failed ({detail}): the node's certificate must be signed by {trusted} and name the host "
            "connected to. Set ssl.ca-pem to the PEM text of the CA that signed the nodes' certificates.")


def _probe(endpoint: Any, conn: Connection) -> str | None:
    """The TLS alert the node at `endpoint` (the driver's key of its error: "host:port", or an EndPoint) sends a
    connection that presents the same certificate and sends nothing (the SDK's server_alert)."""
    host, port = getattr(endpoint, "address", None), getattr(endpoint, "port", None)
    if host is None:
        named, _, number = str(endpoint).rpartition(":")
        host, port = (named.strip("[]"), int(number)) if named and number.isdigit() else (str(endpoint), None)
    port = port or conn.port
    return server_alert(host, port, ssl_context(conn), _PROBE_WAIT_S)
