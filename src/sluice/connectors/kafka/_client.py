"""Kafka's client settings, one declaration for writes and reads: `kafka.`-prefixed options pass through to
librdkafka (its CONFIGURATION.md, not the Java client's settings: `kafka.sasl.username` and `kafka.sasl.password` in
place of `kafka.sasl.jaas.config`), collected by the prefix option `kafka.*` into `ClientSettings`, whose repr hides
every setting that names a secret. Each direction names the settings it owns (a user's value would break its
guarantees) and what to do instead."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sluice.connector import Option, OptionError, Options, PrefixSettings, refused_certificate

CLIENT = "kafka.*"

BOOTSTRAP_SERVERS = Option("kafka.bootstrap.servers", "str", None,
                           "Brokers to connect to first, host:port[,host:port...].", required=True)


def client_option(role: str, examples: str) -> Option:
    """The `kafka.*` row of a direction: its librdkafka `role` (producer, consumer) and a few `examples`."""
    return Option(CLIENT, "prefix", None,
                  f"Any librdkafka {role} setting, prefixed: {examples}, kafka.security.protocol=SASL_SSL, "
                  "kafka.sasl.mechanism=SCRAM-SHA-512, kafka.sasl.username=..., kafka.sasl.password=... . Checked by "
                  "librdkafka before any task starts. Settings whose name holds password, secret, token, key.pem or "
                  "oauthbearer.config are never shown.")


class ClientSettings(PrefixSettings):
    """librdkafka settings (without the `kafka.` prefix) as the user gave them; the repr hides secrets."""

    @property
    def bootstrap_servers(self) -> str:
        return self["bootstrap.servers"]

    def config(self, **overrides: Any) -> dict[str, Any]:
        """The client's configuration: the user's settings over `overrides` (sluice's defaults)."""
        return {**overrides, **self}


def client_of(opts: Options) -> ClientSettings:
    return ClientSettings(opts[CLIENT])


def refuse_owned(owned: Mapping[str, str]) -> Callable[[Options], None]:
    """A check refusing the settings of `owned` (name -> what to do instead): sluice sets them itself."""

    def check(opts: Options) -> None:
        for name in opts[CLIENT]:
            if name.lower() in owned:
                raise OptionError(f"option 'kafka.{name}' is not passed to the Kafka client: {owned[name.lower()]}.")

    return check


def client_certificate_refused(text: str) -> str | None:
    """What a broker's TLS alert about the client's certificate in librdkafka's `text` means and what to check, or
    None when there is no such alert."""
    refused = refused_certificate(text)  # librdkafka reports the broker's alert as a transport failure
    if refused is None:
        return None
    return (f'the broker refused the client certificate (TLS alert "{refused[0]}": {refused[1]}); check '
            "kafka.ssl.certificate.pem and kafka.ssl.key.pem (the key is not shown)")
