"""The schemas of a read or a write, resolved once on the driver and carried to the tasks in their typed options:
the reader schema of each typed side of a read (the subject's latest, a registered version, or the text given), and
the writer schema of each typed side of a write (given or derived from the DataFrame, registered or looked up), with
the DataFrame's columns checked against it. No task asks the registry for these.

Which columns make a side on the sink: the key is the `key` column (a struct); the value is the `value` column when
it is a struct, else every column that is not one of Kafka's record columns (key, topic, partition, headers).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.types import StructType

from sluice.connector import (
    OptionError,
    RegisteredSchema,
    RegistryClient,
    SchemaType,
    subject_name,
    to_arrow_schema,
)
from sluice.connectors.kafka._fit import check_fit
from sluice.connectors.kafka._format_options import RECORD_COLUMNS, Payloads, PayloadSide, payload_format

SCHEMA_TYPES: dict[str, SchemaType] = {"avro-confluent": "AVRO", "protobuf-confluent": "PROTOBUF",
                                       "json-confluent": "JSON"}
GIVEN = -1  # the schema id of a reader schema given as text (it need not be registered)


def record_name(schema_type: SchemaType, text: str) -> str | None:
    """The full name of a schema's record, as Confluent's RecordNameStrategy takes it: Avro's namespace.name, the
    Protobuf file's package and its first message, JSON Schema's title. None: the schema names none."""
    if schema_type == "PROTOBUF":
        package = re.search(r"^\s*package\s+([\w.]+)\s*;", text, re.MULTILINE)
        message = re.search(r"^\s*message\s+(\w+)", text, re.MULTILINE)
        if message is None:
            return None
        return f"{package.group(1)}.{message.group(1)}" if package else message.group(1)
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise OptionError(f"the schema is not JSON ({error}); an {schema_type} schema's text is") from None
    if not isinstance(parsed, dict):
        return None
    if schema_type == "JSON":
        return parsed.get("title")
    name, namespace = parsed.get("name"), parsed.get("namespace")
    if not name:
        return None
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _subject(side: PayloadSide, topic: str | None, text: str | None) -> str:
    if side.subject is not None:
        return side.subject
    name = record_name(SCHEMA_TYPES[side.format], text) if text is not None else None
    # check_subject_topics made sure that a strategy naming the topic has one
    return subject_name(side.subject_name_strategy, topic or "", is_key=side.side == "key", record_name=name)


def resolve_reads(payloads: Payloads, topic: str | None) -> Payloads:
    """Each typed side with its reader schema: the text given (not looked up), a registered version, or the
    subject's latest. `topic`: the one topic read, when the read names one (the subject's topic)."""
    if payloads.raw:
        return payloads
    assert payloads.registry is not None
    client = RegistryClient(payloads.registry)
    resolved: dict[str, PayloadSide] = {}
    for side in payloads.typed():
        schema_type = SCHEMA_TYPES[side.format]
        if side.schema_text is not None:
            schema = RegisteredSchema(GIVEN, schema_type, side.schema_text)
        else:
            subject = _subject(side, topic, None)
            schema = (client.version(subject, side.schema_version) if side.schema_version is not None
                      else client.latest(subject))
            if schema.schema_type != schema_type:
                raise OptionError(f"{side.side}.format={side.format}, but subject {subject}'s schema is "
                                  f"{schema.schema_type}; set {side.side}.format to its format.")
        payload_format(side.format).reader_type(schema)  # a reader schema the format cannot read fails here
        resolved[side.side] = replace(side, schema=schema)
    return replace(payloads, key=resolved.get("key", payloads.key), value=resolved.get("value", payloads.value))


@dataclass(frozen=True)
class SideColumns:
    """Which DataFrame columns make one typed side on the sink: `struct_column` (key, or value when it is a
    struct), else `columns` (the value's fields, in the DataFrame's order)."""

    struct_column: str | None
    columns: tuple[str, ...]


def side_columns(schema: StructType, side: str) -> SideColumns:
    names = schema.fieldNames()
    if side == "key":
        if "key" not in names:
            raise OptionError("key.format is set, but the DataFrame has no 'key' column: add one (a struct of the "
                              "key's fields), or remove key.format.")
        return SideColumns("key", ())
    if "value" in names and isinstance(schema["value"].dataType, StructType):
        return SideColumns("value", ())
    columns = tuple(n for n in names if n not in RECORD_COLUMNS)
    if not columns:
        raise OptionError(f"value.format is set, but the DataFrame has no columns for the value: it has only "
                          f"{names}. Add a struct column 'value', or the value's fields as columns.")
    return SideColumns(None, columns)


def arrow_side(schema: StructType, columns: SideColumns) -> pa.StructType:
    arrow = to_arrow_schema(schema)
    if columns.struct_column is not None:  # a struct: check_columns refused anything else
        return arrow.field(columns.struct_column).type
    return pa.struct([arrow.field(n) for n in columns.columns])


def derived_name(topic: str | None, side: str) -> str:
    """The record name of a schema derived from the DataFrame: the topic's, made a valid Avro/Protobuf name."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", topic or "record")
    return f"{'_' if base[0].isdigit() else ''}{base}_{side}"


def resolve_writes(payloads: Payloads, schema: StructType,
                   topic: str | None) -> tuple[Payloads, dict[str, SideColumns]]:
    """Each typed side with its writer schema, registered (auto-register) or looked up, the DataFrame's columns
    checked against it; and the columns each side is made of."""
    if payloads.raw:
        return payloads, {}
    assert payloads.registry is not None
    client = RegistryClient(payloads.registry)
    resolved: dict[str, PayloadSide] = {}
    made_of: dict[str, SideColumns] = {}
    for side in payloads.typed():
        fmt, schema_type = payload_format(side.format), SCHEMA_TYPES[side.format]
        columns = side_columns(schema, side.side)
        have = arrow_side(schema, columns)
        text = side.schema_text
        if text is None and side.auto_register:
            text = fmt.schema_from_arrow(have, derived_name(topic, side.side))
        subject = _subject(side, topic, text)
        if side.schema_version is not None:
            writer = client.version(subject, side.schema_version)
        elif text is None:
            writer = client.latest(subject)
        elif side.auto_register:
            writer = client.register(subject, schema_type, text)
        else:
            writer = client.lookup(subject, schema_type, text)
        if writer.schema_type != schema_type:
            raise OptionError(f"{side.side}.format={side.format}, but subject {subject}'s schema is "
                              f"{writer.schema_type}; set {side.side}.format to its format.")
        check_fit(have, fmt.reader_type(writer), side.side, subject)
        resolved[side.side] = replace(side, schema=writer)
        made_of[side.side] = columns
    return replace(payloads, key=resolved.get("key", payloads.key),
                   value=resolved.get("value", payloads.value)), made_of
