"""The payload-format options of format("sluice_kafka"): which format the key and the value are in (raw bytes, or
Avro, Protobuf or JSON Schema in Confluent's wire format), the schema registry, and per side where its schema
comes from. Declared once here for both directions (parsing, did-you-mean, redaction and docs follow), checked
before any read or write, and typed into `Payloads` (one `PayloadSide` per side and the registry's settings).

The names are Flink's (`value.format`, `key.format`, `avro-confluent`; the `key.`/`value.` prefixes), except that
sluice keeps one set of registry options, `schema-registry.*`, where Flink repeats them per format and side
(`value.avro-confluent.url`, `key.avro-confluent.url`, ...): key and value are read from and written to one
registry in practice, and one set means a URL or a credential is given, checked and redacted once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.connector import (
    AvroFormat,
    JsonSchemaFormat,
    Option,
    OptionError,
    Options,
    PayloadFormat,
    ProtobufFormat,
    RegisteredSchema,
    RegistrySettings,
    check_http_endpoint,
)

RAW = "raw"
FORMATS = (RAW, "avro-confluent", "protobuf-confluent", "json-confluent")
STRATEGIES = ("topic", "record", "topic-record")
SIDES = ("key", "value")
REGISTRY = "schema-registry."
_FORMATS: dict[str, PayloadFormat] = {}
# Kafka record columns the sink writes as they are when the value has a format (every other column is the value's).
RECORD_COLUMNS = ("key", "topic", "partition", "headers")


def _side_options(side: str, sink: bool) -> tuple[Option, ...]:
    schema_meaning = ("the writer schema (instead of one derived from the DataFrame)" if sink
                      else "the reader schema records are resolved to (instead of the subject's latest)")
    options = [
        Option(f"{side}.format", "choice", RAW,
               f"The {side}'s format: raw (bytes, as Spark's Kafka connector), or in Confluent's wire format through "
               "schema-registry.url: avro-confluent, protobuf-confluent, json-confluent.", choices=FORMATS),
        Option(f"{side}.subject-name-strategy", "choice", "topic",
               f"The registry subject of the {side}'s schema: topic (<topic>-{side}), record (the record's full "
               f"name), topic-record (<topic>-<record full name>), Confluent's TopicNameStrategy, RecordNameStrategy "
               f"and TopicRecordNameStrategy.", choices=STRATEGIES),
        Option(f"{side}.subject", "str", None, f"The {side}'s subject, instead of {side}.subject-name-strategy's."),
        Option(f"{side}.schema", "str", None, f"Schema text of the {side}'s format: {schema_meaning}."),
        Option(f"{side}.schema-version", "int", None,
               f"A registered version of the subject to use instead of its latest"
               f"{' (writes with it; implies ' + side + '.auto-register=false)' if sink else ''}.", minimum=1),
    ]
    if sink:
        options.append(Option(
            f"{side}.auto-register", "bool", True,
            f"true: register the {side}'s schema ({side}.schema, or derived from the DataFrame) under the subject, "
            "the registry checking its compatibility; false: it must be registered already: "
            f"{side}.schema is looked up, else the subject's latest (or {side}.schema-version) is written with."))
    elif side == "value":
        options.append(Option(
            "value.fields", "choice", "columns",
            "columns: the value's fields become top-level columns beside key, topic, partition, offset, ...; "
            "struct: one column value of the value's struct type.", choices=("columns", "struct")))
    return tuple(options)


REGISTRY_OPTIONS = (
    Option("schema-registry.url", "str", None,
           "The schema registry's URL (Confluent's API: Confluent Schema Registry, Apicurio's /apis/ccompat/v7, "
           "Redpanda, Karapace), for every side whose format is not raw; one registry for key and value."),
    Option("schema-registry.basic-auth.user-info", "str", None,
           "user:password for HTTP basic authentication to the registry.", secret=True),
    Option("schema-registry.bearer-auth.token", "str", None,
           "A bearer token for the registry (instead of basic authentication).", secret=True),
    Option("schema-registry.ssl.ca-pem", "str", None,
           "The CA that signed the registry's certificate, as PEM text (executors are other machines: no path)."),
)

READ_FORMAT_OPTIONS = (*_side_options("key", sink=False), *_side_options("value", sink=False), *REGISTRY_OPTIONS)
WRITE_FORMAT_OPTIONS = (*_side_options("key", sink=True), *_side_options("value", sink=True), *REGISTRY_OPTIONS)


@dataclass(frozen=True)
class PayloadSide:
    """One side's (key's or value's) format options; `schema`: resolved on the driver before any task runs (the
    reader schema of a read, the writer schema of a write), so that no task asks the registry for it."""

    side: str
    format: str
    subject_name_strategy: str
    subject: str | None
    schema_text: str | None
    schema_version: int | None
    fields: str = "struct"
    auto_register: bool = False
    schema: RegisteredSchema | None = None

    @property
    def raw(self) -> bool:
        return self.format == RAW


@dataclass(frozen=True)
class Payloads:
    """Both sides' format options and the registry's settings (None when both sides are raw). The settings hide
    their credentials in every repr."""

    key: PayloadSide
    value: PayloadSide
    registry: RegistrySettings | None = field(default=None)

    @property
    def raw(self) -> bool:
        return self.key.raw and self.value.raw

    def typed(self) -> tuple[PayloadSide, ...]:
        """The sides that have a format, key first."""
        return tuple(s for s in (self.key, self.value) if not s.raw)


def payloads_of(opts: Options, sink: bool) -> Payloads:
    def side(name: str) -> PayloadSide:
        return PayloadSide(name, opts[f"{name}.format"], opts[f"{name}.subject-name-strategy"],
                           opts[f"{name}.subject"], opts[f"{name}.schema"], opts[f"{name}.schema-version"],
                           fields=opts.get(f"{name}.fields", "struct") if not sink else "struct",
                           auto_register=bool(opts.get(f"{name}.auto-register", False)) and
                           opts[f"{name}.schema-version"] is None)

    key, value = side("key"), side("value")
    registry = None
    if not (key.raw and value.raw):
        registry = RegistrySettings(url=opts["schema-registry.url"],
                                    user_info=opts["schema-registry.basic-auth.user-info"],
                                    bearer_token=opts["schema-registry.bearer-auth.token"],
                                    ca_pem=opts["schema-registry.ssl.ca-pem"], timeout_s=opts["timeout-ms"] / 1000)
    return Payloads(key, value, registry)


def check_formats(opts: Options) -> None:
    """Options that only apply with a format, refused without one; the registry's URL and credentials; the
    combinations that contradict each other. Which topics a subject needs is the direction's check."""
    typed = [s for s in SIDES if opts[f"{s}.format"] != RAW]
    for side in SIDES:
        if side in typed:
            continue
        stray = sorted(k for k in opts.explicit if k.startswith(f"{side}.") and k != f"{side}.format")
        if stray:
            raise OptionError(f"{', '.join(stray)} only apply with a {side} format; set .option('{side}.format', "
                              f"'avro-confluent') (or protobuf-confluent, json-confluent), or remove them "
                              f"({side}.format=raw reads and writes the {side} as bytes).")
    registry = sorted(k for k in opts.explicit if k.startswith(REGISTRY))
    if not typed:
        if registry:
            raise OptionError(f"{', '.join(registry)} only apply with key.format or value.format set to a "
                              "registry format (avro-confluent, protobuf-confluent, json-confluent); remove them.")
        return
    if not opts["schema-registry.url"]:
        formats = " and ".join(f"{side}.format={opts[side + '.format']}" for side in typed)
        raise OptionError(f"{formats} takes its schemas from a schema registry: set .option('schema-registry.url', "
                          "'http://registry:8081').")
    url = check_http_endpoint("schema-registry.url", opts["schema-registry.url"], "http://registry:8081",
                              "schema-registry.basic-auth.user-info or schema-registry.bearer-auth.token")
    user_info, token = opts["schema-registry.basic-auth.user-info"], opts["schema-registry.bearer-auth.token"]
    if user_info is not None and token is not None:
        raise OptionError("set schema-registry.basic-auth.user-info or schema-registry.bearer-auth.token, not both.")
    if user_info is not None and ":" not in user_info:
        raise OptionError("schema-registry.basic-auth.user-info must be user:password (the value is not shown).")
    pem = opts["schema-registry.ssl.ca-pem"]
    if pem is not None:
        if not url.startswith("https://"):
            raise OptionError(f"schema-registry.ssl.ca-pem applies to an https:// registry; schema-registry.url is "
                              f"{url}.")
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise OptionError("schema-registry.ssl.ca-pem must be the CA's certificate as PEM text (-----BEGIN "
                              "CERTIFICATE----- ...), not a path: executors do not have the driver's files.")
    for side in typed:
        if opts[f"{side}.schema"] is not None and opts[f"{side}.schema-version"] is not None:
            raise OptionError(f"set {side}.schema or {side}.schema-version, not both: each says which schema to use.")
        if opts.is_set(f"{side}.auto-register") and opts[f"{side}.auto-register"] and \
                opts[f"{side}.schema-version"] is not None:
            raise OptionError(f"{side}.schema-version writes with a registered version: remove "
                              f"{side}.auto-register=true (the version is looked up, nothing is registered).")


def check_subject_topics(opts: Options, topics: tuple[str, ...] | None, sink: bool) -> None:
    """A subject a strategy derives needs what it is derived from, known before any task runs: one topic (topic,
    topic-record; `topics` None: not known before the read, a pattern), a record name (record, topic-record: from the
    side's schema text, or on the sink the schema derived from the DataFrame). A read given its reader schema needs
    no subject (writer schemas come by id)."""
    for side in SIDES:
        if opts[f"{side}.format"] == RAW or opts[f"{side}.subject"] is not None:
            continue
        given = opts[f"{side}.schema"] is not None
        if not sink and given:
            continue
        strategy = opts[f"{side}.subject-name-strategy"]
        if strategy in ("topic", "topic-record") and (topics is None or len(topics) != 1):
            have = "a pattern" if topics is None else f"{len(topics)} topics" if topics else "a topic column"
            where = "write (the topic option)" if sink else "read"
            raise OptionError(
                f"{side}.subject-name-strategy={strategy} names the subject after the topic, which needs one topic "
                f"known before the {where} ({have} here): set .option('{side}.subject', ...) (one schema for every "
                "topic), or read or write each topic on its own.")
        derived = sink and opts[f"{side}.auto-register"] and opts[f"{side}.schema-version"] is None
        if strategy in ("record", "topic-record") and not (given or derived):
            raise OptionError(
                f"{side}.subject-name-strategy={strategy} names the subject after the record, known only from "
                f"{side}.schema{' (or a schema derived with auto-register)' if sink else ''}: set it, or set "
                f"{side}.subject.")


def payload_format(name: str) -> PayloadFormat:
    """The codec of a format name (avro-confluent, ...), one per process: it caches what it derives from schemas."""
    found = _FORMATS.get(name)
    if found is None:
        made = {"avro-confluent": AvroFormat, "protobuf-confluent": ProtobufFormat, "json-confluent": JsonSchemaFormat}
        found = _FORMATS[name] = made[name]()
    return found
