"""Options of the S2 formats (names from flink-connector-s2's README), and the connection they describe."""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from sluice.connector import PARTITION_ORDERED, SINK_SPEC, Option, OptionError, Options, SluiceError, TypedOptions
from sluice.connectors.s2._kinds import RecordKind

MIB = 1024 * 1024
_TEMPLATE_FIELD = re.compile(r"\{([^{}]+)\}")

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
    Option("s2.append-retry-policy", "choice", "ALL",
           "SDK retries of appends: ALL (may duplicate) or NO_SIDE_EFFECTS.", choices=("ALL", "NO_SIDE_EFFECTS")),
    Option("s2.max-retries", "int", 3, "SDK retries of one request (attempts - 1).", minimum=0, maximum=100),
    Option("s2.retry-delay-ms", "int", 1000, "Longest SDK backoff between retries, in ms.", minimum=1),
    Option("s2.compression", "choice", "none", "Compress requests and responses.", choices=("none", "zstd", "gzip")),
)

SINK_ONLY_OPTIONS = (
    Option("s2.stream", "str", None,
           "Stream to write to; a template over columns routes rows, e.g. orders/{region}.", required=True),
    Option("s2.create-streams", "bool", False, "Create streams that do not exist yet."),
    Option("s2.create-basin", "bool", False, "Create the basin if it does not exist yet."),
    Option("s2.max-append-sessions", "int", 200,
           "Append sessions one task keeps open (one per target stream, up to this many); appends to further "
           "streams go as single requests. Keeps a task within S2's concurrent-stream limit per connection.",
           minimum=0, maximum=900),
    Option("s2.stamp-writer", "bool", False,
           "Add @writer (write/epoch/partition) and @wseq headers so readers can rebuild per-writer order."),
)

APPEND_OPTIONS = (
    Option("format", "choice", "json",
           "Record body: json (one object per row) or raw (a string/binary column, or the column 'body').",
           choices=("json", "raw")),
)

UPSERT_OPTIONS = (
    Option("primary-key", "list", (), "Key columns of the changelog (@key header).", required=True),
    Option("upsert.op-column", "str", None, "Column whose value d, delete, D or -D makes the row a delete."),
    Option("upsert.reduce", "bool", True,
           "Keep only the last change per key within each Arrow batch (as flink-connector-s2 does per request)."),
)


def _check_endpoints(opts: Options) -> None:
    account, basin = opts["s2.endpoints.account"], opts["s2.endpoints.basin"]
    if (account is None) != (basin is None):
        raise OptionError("set both s2.endpoints.account and s2.endpoints.basin, or neither")


def _check_exactly_once(opts: Options) -> None:
    if opts["sink.transactional"] and opts["s2.append-retry-policy"] == "ALL" and opts.is_set("s2.append-retry-policy"):
        raise OptionError(
            "sink.transactional=true with s2.append-retry-policy=ALL: ALL lets the SDK resend appends that may have "
            "landed, which exactly-once cannot allow. Remove s2.append-retry-policy (exactly-once uses "
            "NO_SIDE_EFFECTS) or set it to NO_SIDE_EFFECTS."
        )


def template_columns(template: str) -> list[str]:
    return _TEMPLATE_FIELD.findall(template)


APPEND_SPEC = SINK_SPEC.extend((*CONNECTION_OPTIONS, *SINK_ONLY_OPTIONS, *APPEND_OPTIONS),
                               (_check_endpoints, _check_exactly_once)).renamed("s2")
UPSERT_SPEC = SINK_SPEC.extend((*CONNECTION_OPTIONS, *SINK_ONLY_OPTIONS, *UPSERT_OPTIONS),
                               (_check_endpoints, _check_exactly_once),
                               sink_mode=PARTITION_ORDERED).renamed("s2_upsert")


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options both formats have (SINK_ONLY_OPTIONS), parsed and checked once, one field per option; each
    format's own are in its subclass, whose `declared` every field and option must match."""

    kind: ClassVar[RecordKind]
    declared = SINK_ONLY_OPTIONS

    s2_stream: str
    s2_create_streams: bool
    s2_create_basin: bool
    s2_max_append_sessions: int
    s2_stamp_writer: bool


@dataclass(frozen=True)
class AppendWriteOptions(WriteOptions):
    """format("s2") (APPEND_SPEC): one record per row."""

    kind = RecordKind.APPEND
    declared = (*SINK_ONLY_OPTIONS, *APPEND_OPTIONS)

    format: str


@dataclass(frozen=True)
class UpsertWriteOptions(WriteOptions):
    """format("s2_upsert") (UPSERT_SPEC): the upsert changelog."""

    kind = RecordKind.UPSERT
    declared = (*SINK_ONLY_OPTIONS, *UPSERT_OPTIONS)

    primary_key: tuple[str, ...]
    upsert_op_column: str | None
    upsert_reduce: bool


FormatWriteOptions = AppendWriteOptions | UpsertWriteOptions  # what a write plan carries: one format's options


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
        return cls(basin, token, account, basin_endpoint, policy, opts["s2.max-retries"], opts["s2.retry-delay-ms"],
                   opts["s2.compression"], key)

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
        return s2_sdk.S2(self.token, endpoints=endpoints, retry=retry, compression=compression)


class S2AccessError(SluiceError):
    """S2 refused the access token for an operation (HTTP 401/403): a scope or token problem, never retried."""


def explain_sdk_error(error: BaseException, basin: str, stream: str | None, operation: str,
                 conn: Connection | None = None) -> SluiceError | None:
    """What to raise instead of an SDK error users hit often, naming the option involved: 401/403 (the operation,
    basin and stream), an endpoint that cannot be reached, a stream or basin that is not there. None otherwise."""
    status = getattr(error, "status_code", None)
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


def _is_unreachable(error: BaseException) -> bool:
    """The SDK wraps transport failures (connection refused, DNS, TLS) in S2ClientError."""
    import s2_sdk

    cause = error.__cause__ if isinstance(error, s2_sdk.S2ClientError) else error
    return type(cause).__name__ in ("ConnectError", "ConnectionRefusedError", "gaierror")
