"""What a payload format is to sluice: the pieces the Kafka source and sink compose, and the errors they raise.

A format (Avro, Protobuf, JSON Schema) works on whole Arrow arrays, never one record at a time: the source decodes a
fetch's payloads of one writer schema in bulk, the sink encodes a batch's rows in bulk (per-record Python decoding is
what makes Python consumers slow). Confluent's wire format (a zero byte, a 4-byte schema id, then the body) is
_wire.py's; a format sees bodies only. Protobuf's bodies start with Confluent's message indexes, which are the
Protobuf format's to read and write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import pyarrow as pa

from sluice._errors import SluiceError

SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]  # the registry's schemaType names (Confluent's API)


@dataclass(frozen=True)
class SchemaReference:
    """A reference of a registered schema to another subject's version (Confluent's `references`)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it: its global id, type and text (and what it references)."""

    schema_id: int
    schema_type: SchemaType
    text: str
    references: tuple[SchemaReference, ...] = ()
    subject: str | None = None
    version: int | None = None


class PayloadError(SluiceError):
    """A payload that cannot be decoded (or a row that cannot be encoded): `index` is its position in the array
    given, for the caller to name it by topic, partition and offset (or by row key)."""

    def __init__(self, index: int, reason: str, column: str | None = None) -> None:
        self.index = index
        self.reason = reason
        self.column = column
        super().__init__(f"record {index}: {reason}" + (f" (column {column!r})" if column else ""))


class PayloadFormat(Protocol):
    """One format's bulk codec. Built from schema texts on the driver, pickled to the tasks; holds no client."""

    def reader_type(self, reader: RegisteredSchema) -> pa.StructType:
        """The Arrow type of a decoded record under the reader schema, in Spark's types (string, not large_string;
        timestamps in microseconds, UTC where the schema's are instants; decimal128)."""
        ...

    def decode(self, bodies: pa.BinaryArray, writer: RegisteredSchema, reader: RegisteredSchema) -> pa.StructArray:
        """Decode bodies all written with `writer` into `reader_type(reader)`, resolving writer to reader by the
        format's own evolution rules. Raises PayloadError naming the first body that fails."""
        ...

    def schema_from_arrow(self, arrow_type: pa.StructType, name: str) -> str:
        """A schema text for rows of this Arrow type (the sink's schema derived from a DataFrame)."""
        ...

    def encode(self, rows: pa.StructArray, writer: RegisteredSchema) -> pa.BinaryArray:
        """Encode rows under `writer`: one body per row. A row that does not fit raises PayloadError naming the row's
        index and the column."""
        ...
