"""The write options of format("sluice_kafka"): declared once (parsing, ranges, did-you-mean, redaction and docs
follow), and parsed once on the driver into the typed `WriteOptions` the rest of the sink reads.

Kafka client settings pass through with a `kafka.` prefix, as Spark's Kafka sink takes them, but they are
librdkafka's settings (its CONFIGURATION.md), not the Java client's: `kafka.sasl.username` and `kafka.sasl.password`
in place of `kafka.sasl.jaas.config`. The ones that carry a secret are declared (secret=True) so they are redacted
everywhere; the rest are collected into `ClientSettings`, whose repr redacts any key that looks like a secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.connector import SINK_SPEC, Option, OptionError, Options, TypedOptions

MiB = 1024 * 1024
CLIENT_PREFIX = "kafka."
PASSTHROUGH = "kafka.*"  # the docs' row for every other librdkafka setting; its parsed value is the settings

CLIENT_OPTIONS = (
    Option("kafka.bootstrap.servers", "str", None, "Brokers to connect to first, host:port[,host:port...].",
           required=True),
    Option("kafka.sasl.password", "str", None, "SASL password (with kafka.sasl.username, kafka.sasl.mechanism "
           "and kafka.security.protocol). Never logged.", secret=True),
    Option("kafka.sasl.oauthbearer.client.secret", "str", None, "OAUTHBEARER client secret. Never logged.",
           secret=True),
    Option("kafka.ssl.key.password", "str", None, "Password of the client's private key. Never logged.",
           secret=True),
    Option("kafka.ssl.key.pem", "str", None, "The client's private key (PEM text). Never logged.", secret=True),
    Option("kafka.ssl.keystore.password", "str", None, "Password of the client's PKCS#12 keystore. Never logged.",
           secret=True),
)

WRITE_OPTIONS = (
    Option("topic", "str", None,
           "Topic every row is written to; overrides the `topic` column (as Spark's Kafka sink). Without it, "
           "each row's `topic` column names its topic."),
    Option("timeout-ms", "int", 30_000,
           "How long the checks before the write (brokers reachable, topic exists), a task's transaction calls and "
           "its final flush wait; unreachable kafka.bootstrap.servers fail after this long, named.", minimum=100,
           maximum=3_600_000),
    Option("transactional-id-prefix", "str", None,
           "sink.transactional: prefix of the tasks' transactional.id (<prefix>-<task partition>), a pool bounded "
           "by the write's partitions. Default: from the query id (streaming) or sink.write-id / the write's id "
           "(batch). One prefix per concurrently running write: two writes sharing one fence each other."),
    Option("transaction.timeout-ms", "int", 60_000,
           "sink.transactional: the producer's transaction.timeout.ms. A transaction a killed task left open is "
           "aborted when the task's retry starts, at the latest after this long (the broker's timeout), so "
           "read_committed readers wait at most this long for it.", minimum=1000, maximum=900_000),
)

# librdkafka settings sluice sets itself: a user's value would break the mode's guarantee or the sink's accounting.
_OWNED = {
    "transactional.id": "set sink.transactional=true (and transactional-id-prefix); sluice gives each task its id",
    "enable.idempotence": "every mode uses the idempotent producer (retries never reorder or duplicate a record)",
    "transaction.timeout.ms": "use the option transaction.timeout-ms",
    "delivery.report.only.error": "the sink counts every delivery to know when a batch is stored",
    "sasl.jaas.config": "librdkafka takes kafka.sasl.username and kafka.sasl.password (and kafka.sasl.mechanism)",
    "key.serializer": "the key column is written as its bytes (string columns as UTF-8)",
    "value.serializer": "the value column is written as its bytes (string columns as UTF-8)",
}
_SECRET = re.compile(r"password|secret|key\.pem|private|token|credential|oauthbearer\.config", re.IGNORECASE)


@dataclass(frozen=True)
class ClientSettings:
    """librdkafka settings (without the `kafka.` prefix) as the user gave them; the repr redacts secrets."""

    settings: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if _SECRET.search(k) else v) for k, v in self.settings.items()}
        return f"ClientSettings({shown})"

    __str__ = __repr__

    @property
    def bootstrap_servers(self) -> str:
        return self.settings["bootstrap.servers"]

    def config(self, **overrides: Any) -> dict[str, Any]:
        """The client's configuration: the user's settings over `overrides` (sluice's defaults)."""
        return {**overrides, **self.settings}

    def scrub(self, text: str) -> str:
        """`text` without any secret value of these settings (librdkafka's messages may echo a setting)."""
        for key, value in self.settings.items():
            if _SECRET.search(key) and value:
                text = text.replace(value, "<redacted>")
        return text


def client_settings(raw: Mapping[str, str], declared: set[str]) -> tuple[dict[str, str], ClientSettings]:
    """Spark's raw options split into those the spec parses and the undeclared `kafka.*` client settings."""
    rest: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in raw.items():
        low = key.lower()
        if low.startswith(CLIENT_PREFIX) and low not in declared:
            name = key[len(CLIENT_PREFIX):]
            if name.lower() in _OWNED:
                raise OptionError(f"option '{key}' is not passed to the Kafka client: {_OWNED[name.lower()]}.")
            client[name] = str(value)
        else:
            rest[key] = value
    return rest, ClientSettings(client)


def with_declared(opts: Options, passed: ClientSettings) -> ClientSettings:
    """All client settings of a write: the declared `kafka.*` options that are set, and the passed-through ones."""
    declared = {o.name[len(CLIENT_PREFIX):]: opts[o.name] for o in CLIENT_OPTIONS if opts[o.name] is not None}
    return ClientSettings({**passed.settings, **declared})


PASSTHROUGH_OPTION = Option(
    PASSTHROUGH, "str", None,
    "Any other librdkafka producer setting, prefixed: kafka.compression.type=zstd, kafka.linger.ms=20, "
    "kafka.security.protocol=SASL_SSL, kafka.sasl.mechanism=SCRAM-SHA-512, kafka.sasl.username=... . Checked by "
    "librdkafka before the write. Settings whose name holds password, secret, token, key.pem or "
    "oauthbearer.config are redacted. sluice sets transactional.id and enable.idempotence itself.")


def _check_transactional(opts: Options) -> None:
    if not opts["sink.transactional"]:
        for key in ("transactional-id-prefix", "transaction.timeout-ms"):
            if opts.is_set(key):
                raise OptionError(f"{key} only applies to sink.transactional=true; remove it or set "
                                  ".option('sink.transactional', 'true') (with sink.mode=global-ordered).")


WRITE_SPEC = SINK_SPEC.extend(
    (*CLIENT_OPTIONS, PASSTHROUGH_OPTION, *WRITE_OPTIONS), (_check_transactional,),
    # librdkafka batches per partition itself (linger.ms); an engine batch is only the unit the sink tracks
    # acknowledgements by, so large ones cost nothing and save a Future per thousand records.
    sink_batch_max_size=10_000, sink_flush_buffer_size=16 * MiB, sink_requests_max_buffered=100_000,
    sink_flush_buffer_timeout=50,
).renamed("sluice_kafka")


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("sluice_kafka"), parsed and checked once; `client`: the librdkafka settings,
    declared and passed through (its repr hides secrets)."""

    declared = WRITE_OPTIONS

    topic: str | None
    timeout_ms: int
    transactional_id_prefix: str | None
    transaction_timeout_ms: int
    client: ClientSettings

    @classmethod
    def derived(cls, opts: Options) -> dict[str, Any]:
        return {"client": with_declared(opts, opts[PASSTHROUGH] or ClientSettings())}
