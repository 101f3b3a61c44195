"""Kafka client settings, shared by the sink's and the source's options: `kafka.`-prefixed options pass through to
librdkafka (its CONFIGURATION.md, not the Java client's settings: `kafka.sasl.username` and `kafka.sasl.password` in
place of `kafka.sasl.jaas.config`). The ones that carry a secret are declared (secret=True) so they are redacted
everywhere; the rest are collected into `ClientSettings`, whose repr redacts any key that looks like a secret.
Each side names the settings it owns (a user's value would break its guarantees)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.connector import Option, OptionError, Options

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


def client_settings(raw: Mapping[str, str], declared: set[str], owned: Mapping[str, str]
                    ) -> tuple[dict[str, str], ClientSettings]:
    """Spark's raw options split into those the spec parses and the undeclared `kafka.*` client settings; a
    setting of `owned` (name -> what to do instead) is refused."""
    rest: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in raw.items():
        low = key.lower()
        if low.startswith(CLIENT_PREFIX) and low not in declared:
            name = key[len(CLIENT_PREFIX):]
            if name.lower() in owned:
                raise OptionError(f"option '{key}' is not passed to the Kafka client: {owned[name.lower()]}.")
            client[name] = str(value)
        else:
            rest[key] = value
    return rest, ClientSettings(client)


def with_declared(opts: Options, passed: ClientSettings) -> ClientSettings:
    """All client settings: the declared `kafka.*` options that are set, and the passed-through ones."""
    declared = {o.name[len(CLIENT_PREFIX):]: opts[o.name] for o in CLIENT_OPTIONS if opts[o.name] is not None}
    return ClientSettings({**passed.settings, **declared})
