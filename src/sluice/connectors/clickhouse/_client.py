"""ClickHouse's HTTP interface: connection options, one pooled client, errors classified and scrubbed."""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import quote

from sluice.connector import (
    ClientCertificate,
    Option,
    OptionError,
    Options,
    RetryableError,
    SinkError,
    check_http_endpoint,
    client_certificate,
    refused_certificate,
)

if TYPE_CHECKING:
    import pyarrow as pa

CONNECTION_OPTIONS = (
    Option("url", "str", None, "ClickHouse's HTTP endpoint, e.g. http://host:8123 (https:// for TLS).", required=True),
    Option("user", "str", "default", "User name."),
    Option("password", "str", None, "Password (else CLICKHOUSE_PASSWORD on the driver). Never logged.", secret=True),
    Option("database", "str", "default", "Database of the table."),
    Option("table", "str", None, "Table name (plain name; quoted for you).", required=True),
    Option("http.timeout-ms", "int", 300_000, "Timeout of one HTTP request.", minimum=1000),
    Option("ssl.ca-pem", "str", None,
           "PEM text of the CA that signed an https:// url's certificate (text, not a path: executors cannot read "
           "the driver's files); default: the system's CAs. The certificate and host name are always checked."),
    Option("ssl.cert-pem", "str", None,
           "PEM text of this client's certificate, for an https:// server that demands one (mutual TLS); with "
           "ssl.key-pem."),
    Option("ssl.key-pem", "str", None,
           "PEM text of the client certificate's private key (unencrypted); with ssl.cert-pem. Never shown; each "
           "process loads it into its TLS context through a private temp file removed at once.", secret=True),
)


class ClickHouseError(SinkError):
    """A statement ClickHouse refused, or a request that failed; the message never holds the password."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class ClickHouseRetryableError(RetryableError):
    """A failure worth retrying: the server unreachable, overloaded or restarting."""


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ClickHouse error codes that mean "try again": the request did nothing that a retry would repeat wrongly, and the
# cause passes (TIMEOUT_EXCEEDED, TOO_SLOW, TOO_MANY_SIMULTANEOUS_QUERIES, NO_FREE_CONNECTION, SOCKET_TIMEOUT,
# NETWORK_ERROR, MEMORY_LIMIT_EXCEEDED, TABLE_IS_READ_ONLY (a replica that lost Keeper), TOO_MANY_PARTS,
# UNKNOWN_STATUS_OF_INSERT, SYSTEM_ERROR, KEEPER_EXCEPTION). READONLY (164) is a user's setting, not a passing state.
RETRYABLE_CODES = frozenset({159, 160, 202, 203, 209, 210, 241, 242, 252, 319, 425, 999})
# Error codes of an INSERT refused for what a row holds: the same row fails again, the others would not. Values
# that do not parse or fit (CANNOT_PARSE_TEXT 6, CANNOT_PARSE_ESCAPE_SEQUENCE 25, CANNOT_PARSE_QUOTED_STRING 26,
# CANNOT_PARSE_INPUT_ASSERTION_FAILED 27, CANNOT_PARSE_DATE 38, CANNOT_PARSE_DATETIME 41, CANNOT_PARSE_NUMBER 72,
# CANNOT_PARSE_UUID 376, CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING 441, CANNOT_PARSE_BOOL 467, CANNOT_PARSE_IPV4 675,
# CANNOT_PARSE_IPV6 676, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE 321, DECIMAL_OVERFLOW 407, UNKNOWN_ELEMENT_OF_ENUM 691,
# CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN 349), values over a limit (TOO_LARGE_STRING_SIZE 131, TOO_LARGE_ARRAY_SIZE
# 128) and a table's CONSTRAINT ... CHECK (VIOLATED_CONSTRAINT 469).
RECORD_CODES = frozenset({6, 25, 26, 27, 38, 41, 72, 128, 131, 321, 349, 376, 407, 441, 467, 469, 675, 676, 691})
AUTH_CODES = frozenset({192, 193, 194, 516})  # UNKNOWN_USER, WRONG_PASSWORD, REQUIRED_PASSWORD, AUTHENTICATION_FAILED
# Arrow as Spark takes it: strings as strings (not binary), LowCardinality as plain values, no compression.
class ArrowOutput(TypedDict):
    """The ClickHouse settings of an ArrowStream result, typed so they pass as Connection.request's **settings."""

    output_format_arrow_compression_method: str
    output_format_arrow_string_as_string: int
    output_format_arrow_low_cardinality_as_dictionary: int


ARROW_OUTPUT = ArrowOutput(output_format_arrow_compression_method="none", output_format_arrow_string_as_string=1,
                           output_format_arrow_low_cardinality_as_dictionary=0)
_CODE = re.compile(r"Code: (\d+)")


@dataclass(frozen=True)
class Connection:
    """Resolved on the driver (password from the option or the driver's CLICKHOUSE_PASSWORD), pickled to tasks."""

    url: str
    user: str
    database: str
    table: str
    timeout_s: float
    password: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    cert_pem: str | None = field(default=None, repr=False)  # a client certificate (mutual TLS) and its key
    key_pem: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(cls, opts: Options) -> Connection:
        url = check_http_endpoint("url", opts["url"], "http://host:8123",
                                  "the options user and password (or CLICKHOUSE_PASSWORD)")
        password = opts["password"] if opts["password"] is not None else os.environ.get("CLICKHOUSE_PASSWORD")
        ca = opts["ssl.ca-pem"]
        if ca is not None:
            if "-----BEGIN CERTIFICATE-----" not in ca:
                raise OptionError("ssl.ca-pem must be the CA's certificate as PEM text (-----BEGIN CERTIFICATE-----"
                                  "...), not a path: executors cannot read the driver's files")
            if not url.startswith("https://"):
                raise OptionError(f"ssl.ca-pem is set but url {url} is plain http://: use https://, or remove "
                                  "ssl.ca-pem")
        cert, key = _client_certificate(opts, url)
        return cls(url, opts["user"], opts["database"], opts["table"], opts["http.timeout-ms"] / 1000, password, ca,
                   cert, key)

    @property
    def target(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(self.table)}"

    @property
    def display(self) -> str:
        return f"{self.url} {self.database}.{self.table}"

    def scrub(self, text: str) -> str:
        if self.key_pem:
            text = text.replace(self.key_pem.strip(), "<redacted>")
        return text.replace(self.password, "<redacted>") if self.password else text

    def _headers(self) -> dict[str, str]:
        token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def request(self, sql: str, body: bytes | None = None, *, stream: bool = False, **settings: Any) -> Any:
        """POST one statement (with `body` as its data, e.g. an INSERT's rows); returns the urllib3 response."""
        params = "&".join(f"{k}={quote(str(v))}" for k, v in {"database": self.database, **settings}.items())
        if body is None:
            url, data = f"{self.url}/?{params}", sql.encode()
        else:
            url, data = f"{self.url}/?query={quote(sql)}&{params}", body
        pool = _pool(self.ca_pem, self.cert_pem, self.key_pem)  # a key that does not load fails here, once
        try:
            response = pool.request(
                "POST", url, body=data, headers=self._headers(), preload_content=not stream, timeout=self.timeout_s,
                retries=False)
        except Exception as e:  # urllib3's connection errors: the server is down or restarting
            refused = refused_certificate(str(e))
            if refused:  # the server's TLS alert about our certificate: no attempt changes it
                raise ClickHouseError(f"TLS: ClickHouse at {self.url} refused the client certificate (ssl.cert-pem): "
                                      f"{refused[1]} ({self.scrub(str(e))}).") from None
            if "CERTIFICATE_VERIFY_FAILED" in str(e):  # a certificate does not change between attempts
                raise ClickHouseError(f"TLS: ClickHouse at {self.url} presented a certificate that was refused "
                                      f"({self.scrub(str(e))}). Check ssl.ca-pem holds the CA that signed it and that "
                                      "the url's host is a name the certificate lists.") from None
            raise ClickHouseRetryableError(f"ClickHouse at {self.url} is unreachable: {self.scrub(str(e))}") from None
        if response.status != 200:
            text = self.scrub(response.data.decode(errors="replace") if not stream else response.read().decode(
                errors="replace")).strip()
            match = _CODE.search(text)
            code = int(match.group(1)) if match else None
            # The code decides, whatever the status it came with (TIMEOUT_EXCEEDED is answered with 408).
            if code in RETRYABLE_CODES or (code is None and response.status >= 500) or response.status == 503:
                raise ClickHouseRetryableError(f"ClickHouse at {self.url} answered {response.status}: {text[:500]}")
            if code in AUTH_CODES:
                raise ClickHouseError(f"ClickHouse at {self.url} refused user '{self.user}': wrong user or password. "
                                      "Check the options user and password (or CLICKHOUSE_PASSWORD on the driver). "
                                      f"Server said: {text[:300]}", code)
            raise ClickHouseError(f"ClickHouse refused a statement on {self.database}.{self.table}: {text[:1000]}",
                                  code)
        return response

    def query(self, sql: str, **settings: Any) -> str:
        return self.request(sql, **settings).data.decode()

    def rows(self, sql: str) -> list[list[str]]:
        """A query's rows as lists of (unescaped) strings, through TabSeparated."""
        text = self.query(sql + " FORMAT TabSeparated")
        return [[_unescape(v) for v in line.split("\t")] for line in text.splitlines()]

    def arrow_batches(self, sql: str, **params: str) -> Iterator[pa.RecordBatch]:
        """A query's result as Arrow record batches, streamed (`FORMAT ArrowStream`, uncompressed on loopback-fast
        networks and decoded by pyarrow's C++ reader; strings as Arrow strings, never dictionaries); `params`: its
        query parameters (`param_name`, the value in ClickHouse's text form), parsed by the server."""
        import pyarrow as pa

        settings: dict[str, Any] = {**ARROW_OUTPUT, **params}
        response = self.request(f"{sql} FORMAT ArrowStream", stream=True, **settings)
        try:
            try:
                yield from pa.ipc.open_stream(response)
            except pa.ArrowInvalid as e:
                # The server had started answering (200) when the query failed: its error ends the body.
                tail = self.scrub(response.read(1 << 16).decode(errors="replace"))
                found = _CODE.search(tail)
                said = tail[found.start():].strip()[:1000] if found else f"{e} (the connection broke off?)"
                raise ClickHouseError(f"a read of {self.database}.{self.table} failed mid-answer: {said}",
                                      int(found.group(1)) if found else None) from None
        finally:
            response.release_conn()


_ESCAPES = {"\\t": "\t", "\\n": "\n", "\\\\": "\\", "\\'": "'", "\\0": "\0", "\\b": "\b", "\\f": "\f", "\\r": "\r"}


def _unescape(value: str) -> str:
    return re.sub(r"\\[tn\\'0bfr]", lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def _client_certificate(opts: Options, url: str) -> tuple[str | None, str | None]:
    """(certificate PEM, key PEM), both or neither (the SDK's check), for an https:// url."""
    given = client_certificate(opts)
    if given is None:
        return None, None
    if not url.startswith("https://"):
        raise OptionError(f"ssl.cert-pem is set but url {url} is plain http://: use https://, or remove the client "
                          "certificate")
    return given.cert_pem, given.key_pem


_POOLS: dict[tuple[str | None, str | None, str | None], Any] = {}
_POOLS_LOCK = threading.Lock()


def _pool(ca_pem: str | None, cert_pem: str | None = None, key_pem: str | None = None) -> Any:
    """One connection pool per process, CA and client certificate (tasks of one Python worker share it);
    thread-safe. Its TLS context checks the certificate and the host name (ssl.create_default_context), against the
    CA given or the system's, and presents the client certificate when one is given."""
    key = (ca_pem, cert_pem, key_pem)
    pool = _POOLS.get(key)
    if pool is None:
        import ssl

        import urllib3

        with _POOLS_LOCK:
            pool = _POOLS.get(key)
            if pool is None:
                context = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
                if cert_pem and key_pem:
                    ClientCertificate(cert_pem, key_pem).load_into(context)
                pool = _POOLS[key] = urllib3.PoolManager(maxsize=16, block=False, ssl_context=context)
    return pool
