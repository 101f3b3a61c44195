"""The connection to S2 (basin, endpoints, token, encryption key: options named as flink-connector-s2's README names
them), and what the SDK's errors mean for a write or read."""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from typing import Any

from sluice.connector import Option, OptionError, Options, SluiceError

CONNECTION_OPTIONS = (
    Option("s2.basin", "str", None, "Basin to write to (8-48 chars of a-z, 0-9, '-').", required=True),
    Option("s2.auth-token", "str", None, "Access token; default: the S2_ACCESS_TOKEN environment variable.",
           secret=True),
    Option("s2.encryption-key", "str", None,
           "Key of an encrypted basin's streams (base64 of 32 bytes), sent with every append and read; default: the "
           "S2_ENCRYPTION_KEY environment variable.", secret=True),
    Option("s2.endpoints.account", "str", None,
           "Account endpoint, e.g. http://127.0.0.1:4243; default: S2_ACCOUNT_ENDPOINT, else s2.dev."),
    Option("s2.endpoints.basin", "str", None,
           "Basin endpoint ({basin} allowed in the host); default: S2_BASIN_ENDPOINT, else s2.dev."),
    Option("s2.ssl.ca-pem", "str", None,
           "PEM text of the CA that signed an https:// endpoint's certificate (text, not a path), trusted besides "
           "the system's CAs; the certificate and host name are always checked."),
    Option("s2.append-retry-policy", "choice", "ALL",
           "SDK retries of appends: ALL (may duplicate) or NO_SIDE_EFFECTS.", choices=("ALL", "NO_SIDE_EFFECTS")),
    Option("s2.max-retries", "int", 3, "SDK retries of one request (attempts - 1).", minimum=0, maximum=100),
    Option("s2.retry-delay-ms", "int", 1000, "Longest SDK backoff between retries, in ms.", minimum=1),
    Option("s2.compression", "choice", "none", "Compress requests and responses.", choices=("none", "zstd", "gzip")),
)


@dataclass(frozen=True)
class Connection:
    """Everything needed to reach a basin; built on the driver, shipped to executors. repr hides the token."""

    basin: str
    token: str
    account_endpoint: str | None
    basin_endpoint: str | None
    retry_policy: str
    max_retries: int
    retry_delay_ms: int
    compression: str
    encryption_key: str | None = None
    ca_pem: str | None = None

    def __repr__(self) -> str:
        return f"Connection(basin={self.basin!r}, endpoint={self.account_endpoint or 's2.dev'}, token=<redacted>)"

    @classmethod
    def from_options(cls, opts: Options, exactly_once: bool = False) -> Connection:
        token = opts["s2.auth-token"] or os.environ.get("S2_ACCESS_TOKEN")
        if not token:
            raise OptionError(
                "no S2 access token: set .option('s2.auth-token', ...) or the S2_ACCESS_TOKEN environment variable "
                "(any non-empty value for a local server started without --token)."
            )
        account = opts["s2.endpoints.account"] or os.environ.get("S2_ACCOUNT_ENDPOINT")
        basin_endpoint = opts["s2.endpoints.basin"] or os.environ.get("S2_BASIN_ENDPOINT")
        if (account is None) != (basin_endpoint is None):
            raise OptionError("S2_ACCOUNT_ENDPOINT and S2_BASIN_ENDPOINT must be set together")
        for name, url in (("account", account), ("basin", basin_endpoint)):
            if url is not None and not url.startswith(("http://", "https://")):
                raise OptionError(f"s2.endpoints.{name} must start with http:// or https://, got {url!r}")
        basin = opts["s2.basin"]
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{6,46}[a-z0-9]", basin):
            raise OptionError(f"s2.basin {basin!r} is not a basin name: 8-48 characters of a-z, 0-9 and '-', "
                              "not starting or ending with '-'")
        policy = "NO_SIDE_EFFECTS" if exactly_once else opts["s2.append-retry-policy"]
        key = opts["s2.encryption-key"] or os.environ.get("S2_ENCRYPTION_KEY")
        if key is not None:
            try:
                valid = len(base64.b64decode(key, validate=True)) == 32
            except ValueError:
                valid = False
            if not valid:  # never echo the value: it is a key
                raise OptionError("s2.encryption-key must be the base64 of a 32-byte key (e.g. "
                                  "base64.b64encode(os.urandom(32))); the value given is not.")
        ca = opts["s2.ssl.ca-pem"]
        if ca is not None:
            if "-----BEGIN CERTIFICATE-----" not in ca:
                raise OptionError("s2.ssl.ca-pem must be the CA's certificate as PEM text (-----BEGIN CERTIFICATE-----"
                                  "...), not a path: executors cannot read the driver's files")
            if not (account or "https://").startswith("https://") or not (basin_endpoint or "https://").startswith(
                    "https://"):
                raise OptionError("s2.ssl.ca-pem is set but the endpoints are http:// (plaintext): use https:// "
                                  "endpoints, or remove s2.ssl.ca-pem")
        return cls(basin, token, account, basin_endpoint, policy, opts["s2.max-retries"], opts["s2.retry-delay-ms"],
                   opts["s2.compression"], key, ca)

    def stream(self, basin: Any, name: str) -> Any:
        """The SDK's handle of one stream of `basin`, carrying the encryption key when there is one."""
        return basin.stream(name, encryption_key=self.encryption_key)

    def client(self):  # -> s2_sdk.S2
        from datetime import timedelta

        import s2_sdk

        endpoints = None
        if self.account_endpoint and self.basin_endpoint:
            endpoints = s2_sdk.Endpoints(account=self.account_endpoint, basin=self.basin_endpoint)
        retry = s2_sdk.Retry(
            max_attempts=self.max_retries + 1,
            max_base_delay=timedelta(milliseconds=self.retry_delay_ms),
            min_base_delay=timedelta(milliseconds=min(100, self.retry_delay_ms)),
            append_retry_policy=s2_sdk.AppendRetryPolicy[self.retry_policy],
        )
        compression = s2_sdk.Compression[self.compression.upper()]
        client = s2_sdk.S2(self.token, endpoints=endpoints, retry=retry, compression=compression)
        if self.ca_pem:
            trust(client, self.ca_pem)
        return client


def trust(client: Any, ca_pem: str) -> None:
    """Add a CA to what an SDK client trusts. s2-sdk 0.13 has no parameter for it: its connection pool makes one
    ssl.create_default_context() (system CAs, certificate and host name checked, ALPN h2) and uses it for every
    https:// connection; the CA is added to that context before any connection is made. Another SDK version may
    keep it elsewhere: then this fails loudly instead of connecting without the CA."""
    import ssl

    context = getattr(getattr(client, "_pool", None), "_ssl_context", None)
    if not isinstance(context, ssl.SSLContext) or context.verify_mode != ssl.CERT_REQUIRED \
            or not context.check_hostname:
        raise SluiceError("s2.ssl.ca-pem: this s2-sdk version keeps its TLS settings where sluice does not find "
                          "them (sluice knows s2-sdk 0.13's); install the CA in every executor's system trust store "
                          "(or SSL_CERT_FILE) instead, and leave s2.ssl.ca-pem unset")
    context.load_verify_locations(cadata=ca_pem)


class S2AccessError(SluiceError):
    """S2 refused the access token for an operation (HTTP 401/403): a scope or token problem, never retried."""


def explain_sdk_error(error: BaseException, basin: str, stream: str | None, operation: str,
                 conn: Connection | None = None) -> SluiceError | None:
    """What to raise instead of an SDK error users hit often, naming the option involved: 401/403 (the operation,
    basin and stream), an endpoint that cannot be reached, a stream or basin that is not there. None otherwise."""
    status = getattr(error, "status_code", None)
    if conn is not None and _is_certificate_failure(error):
        return SluiceError(
            f"TLS: S2 at {conn.account_endpoint or 'https://aws.s2.dev (s2.dev)'} presented a certificate that was "
            f"refused for '{operation}' on basin '{basin}' ({error.__cause__ or error}). Check s2.ssl.ca-pem holds the "
            "CA that signed it and that the endpoint's host is a name the certificate lists.")
    if conn is not None and _is_unreachable(error):
        return SluiceError(
            f"cannot reach S2 at {conn.account_endpoint or 'https://aws.s2.dev (s2.dev)'} for '{operation}' on basin "
            f"'{basin}' ({error.__cause__ or error}). Check s2.endpoints.account / s2.endpoints.basin (or "
            "S2_ACCOUNT_ENDPOINT / S2_BASIN_ENDPOINT) and that the server runs and is reachable from every executor.")
    code = getattr(error, "code", None)
    if status == 404 and code in ("stream_not_found", "basin_not_found"):
        what = f"stream '{stream}' of basin '{basin}'" if code == "stream_not_found" else f"basin '{basin}'"
        option = "s2.streams (or s2.discovery-prefix)" if code == "stream_not_found" else "s2.basin"
        return SluiceError(f"{what} does not exist ('{operation}'). Check {option}.")
    if status not in (401, 403):
        return None
    where = f"basin '{basin}'" + (f", stream '{stream}'" if stream else "")
    why = "the token is missing, wrong, expired or revoked" if status == 401 else "the token's scope does not allow it"
    return S2AccessError(
        f"S2 refused '{operation}' on {where} (HTTP {status} {getattr(error, 'code', '')}: {why}; server said: "
        f"{getattr(error, 'message', error)}). Check s2.auth-token / S2_ACCESS_TOKEN and the token's scope: it needs "
        f"the '{operation}' operation (or its op group) for this basin and stream.")


def _is_certificate_failure(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:  # the SDK wraps the ssl error in ConnectError, then in S2ClientError
        if "CERTIFICATE_VERIFY_FAILED" in str(seen) or "certificate verify failed" in str(seen):
            return True
        seen = seen.__cause__
    return False


def _is_unreachable(error: BaseException) -> bool:
    """The SDK wraps transport failures (connection refused, DNS, TLS) in S2ClientError."""
    import s2_sdk

    cause = error.__cause__ if isinstance(error, s2_sdk.S2ClientError) else error
    return type(cause).__name__ in ("ConnectError", "ConnectionRefusedError", "gaierror")
