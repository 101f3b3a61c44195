"""How the doctor reaches PostgreSQL and Kafka as the jobs do: with a store's connection options, the very options a
job passes to `.option(...)` (a CA as PEM text, a client certificate and its key, SASL), from a JSON or Java-properties
file on the doctor's own machine (a file, not the command line, where `ps` shows every argument to every user), parsed
by the format's own option declarations (an unknown name gets a did-you-mean, a secret's value is in no message) and
made into the connector's own client: PostgreSQL's `Connection` (libpq's sslmode, sslrootcert, sslcert and sslkey) and
Kafka's librdkafka settings (security.protocol, ssl.*, sasl.*), checked by librdkafka before a broker is asked.

The other options of the format's jobs (table, subscribe, sink.mode, ...) are read and left aside: a job's own options
file serves as it is; `timeout-ms`, the source's, bounds each of the doctor's Kafka requests. The environment gives
what it gives the jobs: PGPASSWORD and PGUSER (Connection reads them); the Kafka connector reads no environment
variable, so Kafka's secrets come from the file alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sluice.connector import Option, OptionError, OptionSpec
from sluice.connectors.kafka._checks import validate_client
from sluice.connectors.kafka._client import BOOTSTRAP_SERVERS, ClientSettings, client_of
from sluice.connectors.kafka._options import CONSUMER_SETTINGS, READ_SPEC
from sluice.connectors.kafka._txn import connection_settings
from sluice.connectors.postgres import Connection
from sluice.connectors.postgres._client import CONNECTION_OPTIONS

POSTGRES_FORMATS = ("postgres", "postgres_changes")
KAFKA_FORMATS = ("sluice_kafka",)
# How long the doctor's Kafka requests wait: the source's own `timeout-ms` option, with a shorter default (a doctor
# that waits on an unreachable broker only delays its report).
KAFKA_TIMEOUT = replace(READ_SPEC.get("timeout-ms"), default=15_000)


@dataclass(frozen=True)
class KafkaReach:
    """The brokers as the doctor reaches them: librdkafka's connection settings (the repr hides secrets) and how long
    each request may wait (timeout-ms)."""

    client: ClientSettings
    timeout_ms: int

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000.0


def postgres_connection(url: str | None, options_file: str | None) -> Connection:
    """The PostgreSQL `url` names (no password: PGPASSWORD has it) with the connection options of
    `options_file`, as format("postgres") reaches it."""
    raw = read_options_file(options_file, "PostgreSQL") if options_file else {}
    if url:
        if urlsplit(url).password:
            raise OptionError("the PostgreSQL URL given carries a password, which ps shows to every user of this "
                              "machine; put it in PGPASSWORD or in the options file (option 'password') instead")
        _refuse_both(raw, "url", "the PostgreSQL URL given", options_file)
        raw["url"] = url
    opts = _parse(_spec("postgres", CONNECTION_OPTIONS, POSTGRES_FORMATS), raw, options_file, "PostgreSQL")
    return Connection.from_options(opts)


def kafka_client(bootstrap: str | None, options_file: str | None) -> KafkaReach:
    """The librdkafka settings that reach the brokers (the connection's: bootstrap.servers, security.*, ssl.*,
    sasl.*, ...) from `bootstrap` and the `kafka.*` options of `options_file`, checked by librdkafka, and the
    file's timeout-ms."""
    raw = read_options_file(options_file, "Kafka") if options_file else {}
    if bootstrap:
        _refuse_both(raw, BOOTSTRAP_SERVERS.name, "the Kafka bootstrap servers given", options_file)
        raw[BOOTSTRAP_SERVERS.name] = bootstrap
    opts = _parse(_spec("sluice_kafka", (BOOTSTRAP_SERVERS, CONSUMER_SETTINGS, KAFKA_TIMEOUT), KAFKA_FORMATS), raw,
                  options_file, "Kafka")
    client = ClientSettings(connection_settings(client_of(opts)))
    try:
        validate_client(dict(client))
    except OptionError as e:
        raise OptionError(client.scrub(str(e))) from None  # librdkafka may echo a value it refuses
    return KafkaReach(client, opts[KAFKA_TIMEOUT.name])


def read_options_file(path: str, store: str) -> dict[str, str]:
    """The options in the file at `path` on this machine: a JSON object (its first character `{`) or a Java
    properties file; every value as the text a job would pass to `.option(...)`. Errors name the `store`'s file."""
    label = f"the {store} options file {path}"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path):
        raise OptionError(f"{label}: the doctor reads its options files from this machine's file system only; "
                          "copy it here (keep it readable by you alone: it holds secrets)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise OptionError(f"{label}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not text.lstrip().startswith("{"):
        return parse_properties(text)
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:  # its message names the place, never the text there
        raise OptionError(f"{label}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(values, dict):
        raise OptionError(f"{label}: a JSON object of option names and values is expected")
    return {key: _text(key, value, label) for key, value in values.items()}


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties file as java.util.Properties.load reads one: `key=value`, `key: value` or `key value`;
    `#` and `!` comment lines; a line ending in an odd number of backslashes continues on the next (its leading
    blanks dropped); escapes \\n \\t \\r \\f \\uXXXX, and a backslash before any other character keeps it. A PEM
    value: `ssl.key-pem=-----BEGIN PRIVATE KEY-----\\n...\\n-----END PRIVATE KEY-----`, or a line each ending
    in `\\n\\`."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        logical = line.lstrip(" \t\f")
        if not logical or logical[0] in "#!":
            continue
        while _continues(logical):
            logical = logical[:-1] + next(lines, "").lstrip(" \t\f")
        key, value = _split_property(logical)
        values[_unescape(key)] = _unescape(value)
    return values


def _continues(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line) and line[i] not in "=: \t\f":
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) == 5
                  else _ESCAPES.get(m.group(1), m.group(1)), text)


def _text(key: str, value: Any, label: str) -> str:
    """An option's JSON value as the text `.option(key, value)` passes: strings as they are, numbers and booleans
    as Spark writes them; nothing nested (the value is not shown: it may be a secret)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise OptionError(f"{label}: option '{key}' must be a string, a number or a boolean, as .option() takes")


def _refuse_both(raw: Mapping[str, str], option: str, given: str, path: str | None) -> None:
    if any(key.lower() == option.lower() for key in raw):
        raise OptionError(f"{given} and option '{option}' of the options file {path} both name the server: give one")


def _spec(format_name: str, connection: tuple[Option, ...], formats: tuple[str, ...]) -> OptionSpec:
    """The connection options as `format_name` declares them; the other options of `formats`' jobs pass."""
    from sluice.spark._registry import data_source_class

    mine = {o.name.lower() for o in connection}
    jobs = set()
    for name in formats:
        source = data_source_class(name)
        for spec in (source.read_spec, source.write_spec, getattr(source, "lookup_spec", None)):
            jobs |= {o.name.lower() for o in spec.options} if spec is not None else set()
    base = OptionSpec(format_name, connection)
    return OptionSpec(format_name, connection, passthrough=base.passthrough | frozenset(jobs - mine))


def _parse(spec: OptionSpec, raw: dict[str, str], path: str | None, store: str) -> Any:
    try:
        return spec.parse(raw)
    except OptionError as e:  # its message names options, never a secret's value
        raise OptionError(f"the {store} options file {path}: {e}" if path else str(e)) from None
