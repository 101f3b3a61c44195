"""Elasticsearch's and OpenSearch's REST API over urllib3: connection options, one pooled client per process, errors
classified (429 throttles, 5xx and lost connections pass, the rest is the server's reason) and scrubbed of secrets.

One HTTP client for both engines: the official Python clients check the product they talk to (elasticsearch-py 8
refuses OpenSearch), and the bulk, mapping and search endpoints sluice uses are the same in both.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sluice.connector import (
    ClientCertificate,
    Option,
    OptionError,
    Options,
    RetryableError,
    SinkError,
    ThrottledError,
    check_http_endpoint,
    client_certificate,
    refused_certificate,
    server_alert,
)

CONNECTION_OPTIONS = (
    Option("nodes", "list", (), "HTTP endpoints of the cluster, e.g. http://es1:9200,http://es2:9200 (https:// for "
           "TLS); requests go to them in turn.", required=True),
    Option("index", "str", None, "The index (or alias, or data stream) written or read.", required=True),
    Option("username", "str", None, "User for HTTP basic authentication."),
    Option("password", "str", None, "Password (else ELASTICSEARCH_PASSWORD on the driver). Never logged.", secret=True),
    Option("api-key", "str", None, "An API key, sent as 'Authorization: ApiKey <key>' (else ELASTICSEARCH_API_KEY). "
           "Never logged.", secret=True),
    Option("ssl.ca-pem", "str", None, "PEM text of the CA that signed the nodes' certificates (text, not a path: "
           "executors are other machines). Default: the system's trusted CAs."),
    Option("ssl.cert-pem", "str", None, "PEM text of this client's certificate, for https:// nodes that demand one "
           "(mutual TLS: OpenSearch's security plugin with clientauth_mode REQUIRE or OPTIONAL and its clientcert "
           "authentication, Elasticsearch's PKI realm); with ssl.key-pem."),
    Option("ssl.key-pem", "str", None, "PEM text of the client certificate's private key (unencrypted); with "
           "ssl.cert-pem. Never shown; each process loads it into its TLS context through a private temp file "
           "removed at once.", secret=True),
    Option("http.timeout-ms", "int", 60_000, "Timeout of one HTTP request.", minimum=100),
)


class ElasticsearchError(SinkError):
    """A request the cluster refused, or a document it could not take; never holds a secret."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message, store="elasticsearch")
        self.status = status


def reason(body: Any) -> str:
    """The server's reason out of an error body: `type: reason` of the root cause, else the body itself."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        text = f"{error.get('type')}: {error.get('reason')}"
        caused = error.get("caused_by")
        if isinstance(caused, dict) and caused.get("reason"):
            text += f" (caused by {caused.get('type')}: {caused.get('reason')})"
        return text
    return str(error if error is not None else body)[:500]


@dataclass(frozen=True)
class Connection:
    """Resolved on the driver (secrets from options or the driver's environment), pickled to tasks."""

    nodes: tuple[str, ...]
    index: str
    timeout_s: float
    username: str | None = None
    ca_pem: str | None = None
    password: str | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    certificate: ClientCertificate | None = field(default=None, repr=False)  # mutual TLS; its repr hides the key

    @classmethod
    def from_options(cls, opts: Options) -> Connection:
        nodes = tuple(check_http_endpoint("nodes", n, "http://host:9200", "the options username and password (or "
                                          "ELASTICSEARCH_PASSWORD), or api-key") for n in opts["nodes"])
        if not nodes:
            raise OptionError("nodes is empty: give the cluster's HTTP endpoints, e.g. http://localhost:9200.")
        password = opts["password"] if opts["password"] is not None else os.environ.get("ELASTICSEARCH_PASSWORD")
        api_key = opts["api-key"] if opts["api-key"] is not None else os.environ.get("ELASTICSEARCH_API_KEY")
        if api_key and opts["username"]:
            raise OptionError("api-key and username both authenticate; keep one.")
        certificate = client_certificate(opts)
        if certificate is not None and not all(n.startswith("https://") for n in nodes):
            raise OptionError("ssl.cert-pem is set but nodes lists a plain http:// endpoint: use https://, or remove "
                              "the client certificate")
        return cls(nodes, opts["index"], opts["http.timeout-ms"] / 1000, opts["username"], opts["ssl.ca-pem"],
                   password, api_key, certificate)

    @property
    def display(self) -> str:
        return f"{self.nodes[0]}/{self.index}"

    def scrub(self, text: str) -> str:
        for secret in (self.password, self.api_key, self.certificate.key_pem.strip() if self.certificate else None):
            if secret:
                text = text.replace(secret, "<redacted>")
        return text

    def _headers(self, ndjson: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/x-ndjson" if ndjson else "application/json"}
        if self.api_key:
            headers["Authorization"] = f"ApiKey {self.api_key}"
        elif self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def request(self, method: str, path: str, body: Any = None, *, ndjson: bool = False, ok: tuple[int, ...] = (),
                node: int = 0, **params: Any) -> tuple[int, Any]:
        """One request to `nodes[node % len]`; returns (status, parsed JSON body). Raises ThrottledError on 429,
        RetryableError when the node is unreachable or answers 502-504, ElasticsearchError for any other status
        not below 300 and not in `ok`."""
        base = self.nodes[node % len(self.nodes)]
        query = "&".join(f"{k}={quote(str(v))}" for k, v in params.items() if v is not None)
        url = f"{base}{path}" + (f"?{query}" if query else "")
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        try:
            response = _pool(self.ca_pem, self.certificate).request(
                method, url, body=data, headers=self._headers(ndjson), timeout=self.timeout_s, retries=False)
        except Exception as e:  # urllib3's connection and timeout errors: the node is down, restarting or slow
            said = str(e)
            if any(cut in said for cut in _CUT_OFF):  # perhaps a refusal whose alert a reset overtook
                said = node_alert(base, self.ca_pem, self.certificate) or said
            refused = refused_certificate(said)
            if refused:  # the node's TLS alert about the client's certificate: no attempt changes it
                raise ElasticsearchError(f"TLS: {base} refused the client certificate (ssl.cert-pem"
                                         f"{'' if self.certificate else ' unset'}; TLS alert \"{refused[0]}\": "
                                         f"{refused[1]}) [{self.scrub(said)}]. Set ssl.cert-pem and ssl.key-pem to a "
                                         "certificate and key the node's client CA signed (the key is not shown).") \
                    from None
            if "CERTIFICATE_VERIFY_FAILED" in str(e):  # a certificate does not change between attempts
                raise ElasticsearchError(f"TLS: {base} presented a certificate that was refused ({self.scrub(str(e))})."
                                         " Check ssl.ca-pem holds the CA that signed it and that the node's host is a "
                                         "name the certificate lists.") from None
            raise RetryableError(f"{base} is unreachable or did not answer in time: {self.scrub(str(e))}") from None
        text = response.data
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors="replace")
        status = response.status
        if status < 300 or status in ok:
            return status, parsed
        said = self.scrub(reason(parsed))
        if status == 429:
            raise ThrottledError(f"{base} is overloaded (429): {said}")
        if status in (502, 503, 504):
            raise RetryableError(f"{base} answered {status}: {said}")
        if status == 401:
            who = "the api-key" if self.api_key else (f"user '{self.username}'" if self.username else
                                                      "a request without credentials")
            raise ElasticsearchError(f"{base} refused {who} (401): set username and password (or "
                                     "ELASTICSEARCH_PASSWORD), or api-key, to credentials the cluster accepts.",
                                     status)
        if status == 403:
            raise ElasticsearchError(f"{base}: {method} {path} is forbidden to this user (403): {said}. Grant the "
                                     f"user the privileges it needs on index '{self.index}'.", status)
        if status == 413:
            raise ElasticsearchError(f"{base} refused a request of {len(data or b'')} bytes as too large (413, the "
                                     "node's http.max_content_length): lower sink.flush-buffer.size.", status)
        raise ElasticsearchError(f"{base}: {method} {path} failed ({status}): {said}", status)


_POOLS: dict[tuple[str | None, ClientCertificate | None], Any] = {}
# How a connection cut off during or right after its TLS handshake reads (urllib3 and the ssl module).
_CUT_OFF = ("EOF occurred in violation of protocol", "Connection reset by peer", "ConnectionResetError")


def _context(ca_pem: str | None, certificate: ClientCertificate | None) -> ssl.SSLContext:
    """Certificate and host name checked against `ca_pem` (else the system's CAs); presents `certificate`."""
    context = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
    if certificate is not None:
        certificate.load_into(context)
    return context


def _pool(ca_pem: str | None, certificate: ClientCertificate | None = None) -> Any:
    """One connection pool per process, CA and client certificate (the tasks of one Python worker share it);
    thread-safe."""
    pool = _POOLS.get((ca_pem, certificate))
    if pool is None:
        import urllib3

        context = _context(ca_pem, certificate)
        pool = _POOLS[(ca_pem, certificate)] = urllib3.PoolManager(maxsize=32, block=False, ssl_context=context)
    return pool


def node_alert(base: str, ca_pem: str | None, certificate: ClientCertificate | None) -> str | None:
    """The TLS alert the https:// node `base` sends a connection presenting `certificate` that sends nothing after
    its handshake: over TLS 1.3 a request sent at once can make a refusing node's close (a reset) overtake its
    alert, which this connection reads whole. None when no alert comes (the node accepted it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(base)
    if parts.scheme != "https" or parts.hostname is None:
        return None
    return server_alert(parts.hostname, parts.port or 443, _context(ca_pem, certificate))


@dataclass(frozen=True)
class Cluster:
    """What GET / says: the engine (elasticsearch or opensearch) and its version."""

    engine: str
    version: tuple[int, ...]

    @classmethod
    def of(cls, conn: Connection) -> Cluster:
        _, body = conn.request("GET", "/")
        version = body.get("version", {}) if isinstance(body, dict) else {}
        engine = "opensearch" if version.get("distribution") == "opensearch" else "elasticsearch"
        number = tuple(int(p) for p in str(version.get("number", "0")).split("-")[0].split(".") if p.isdigit())
        return cls(engine, number)
