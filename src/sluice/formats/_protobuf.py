"""Protobuf payloads in Confluent's wire format (after the schema id: message indexes, then the message), in bulk.

Decode: the bodies' message indexes are stripped in bulk when they are the common single 0 byte (the file's first
message), per body otherwise; the messages are parsed by protobuf's upb runtime (C) with the reader schema's
message class, then turned into Arrow columns a field at a time (_protobuf_columns.py). Evolution is Protobuf's own:
fields are matched by number, fields the reader does not know are skipped, fields the writer did not write are
their defaults (null, for fields with presence).

Encode: the rows are cast at the Arrow level to what upb's constructors take (_protobuf_rows.py), then each row is
built and serialized by upb; a row that does not fit is named by index and column.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.formats._codec import PayloadError, RegisteredSchema
from sluice.formats._protobuf_columns import message_columns
from sluice.formats._protobuf_descriptors import (
    CompiledProto,
    ProtobufSchemaError,
    compile_proto,
    decode_indexes,
    encode_indexes,
)
from sluice.formats._protobuf_rows import map_fixer, prepare_struct
from sluice.formats._protobuf_types import message_type, proto_for

__all__ = ["ProtobufFormat", "ProtobufSchemaError"]


class ProtobufFormat:
    """The Protobuf format (the registry's schemaType PROTOBUF).

    `message`: the full name of the message the reader reads and the writer writes (default: the writer's record's
    own message when decoding, the file's first message otherwise). `dependencies`: the texts of the .proto files
    the registered schemas import, by import name (the registry's references); the well-known types
    (google/protobuf/*.proto) need none.
    """

    def __init__(self, message: str | None = None, dependencies: Mapping[str, str] | None = None) -> None:
        self.message = message
        self.dependencies = tuple(sorted((dependencies or {}).items()))

    def _compiled(self, schema: RegisteredSchema) -> CompiledProto:
        return compile_proto(schema.text, self.dependencies)

    def _message(self, compiled: CompiledProto, name: str | None) -> Any:
        if name is None:
            return compiled.first_message()
        try:
            return compiled.pool.FindMessageTypeByName(name)
        except KeyError:
            known = [m.full_name for m in compiled.file.message_types_by_name.values()]
            raise ProtobufSchemaError(f"the schema has no message {name!r} (its messages: {known})") from None

    def reader_type(self, reader: RegisteredSchema) -> pa.StructType:
        compiled = self._compiled(reader)
        result = message_type(self._message(compiled, self.message))
        assert isinstance(result, pa.StructType)
        return result

    def decode(self, bodies: pa.BinaryArray, writer: RegisteredSchema, reader: RegisteredSchema) -> pa.StructArray:
        from google.protobuf import message_factory
        from google.protobuf.message import DecodeError

        writer_proto, reader_proto = self._compiled(writer), self._compiled(reader)
        has_nulls = bodies.null_count > 0
        present = bodies.fill_null(b"\x00") if has_nulls else bodies
        first_bytes = pc.binary_slice(present, 0, 1)
        if pc.all(pc.equal(first_bytes, pa.scalar(b"\x00", pa.binary()))).as_py() is not False:
            # An explicit stop: pyarrow 26's binary_slice without one mis-sizes its output on some inputs.
            longest = pc.max(pc.binary_length(present)).as_py() or 1
            payloads = pc.binary_slice(present, 1, longest).to_pylist()
            indexes = [[0]]
            per_body = None
        else:
            payloads, per_body = [], []
            for i, body in enumerate(present.to_pylist()):
                try:
                    path, start = decode_indexes(body)
                except ValueError as e:
                    raise PayloadError(i, f"bad Protobuf message indexes: {e}") from None
                per_body.append(path)
                payloads.append(body[start:])
            indexes = [list(p) for p in {tuple(p) for p in per_body}]
        written = {}
        for path in indexes:
            try:
                written[tuple(path)] = writer_proto.message_at(path).full_name
            except ProtobufSchemaError as e:
                index = 0 if per_body is None else per_body.index(path)
                raise PayloadError(index, str(e)) from None
        wanted = self.message or (next(iter(written.values())) if len(written) == 1 else None)
        target = self._reader_message(reader_proto, wanted)
        mismatched = [p for p, name in written.items() if name != target.full_name]
        if mismatched:
            index = 0 if per_body is None else per_body.index(list(mismatched[0]))
            raise PayloadError(index, f"written as message {written[mismatched[0]]}, and the reader reads "
                               f"{target.full_name}")
        parse = message_factory.GetMessageClass(target).FromString
        try:
            messages = list(map(parse, payloads))
        except DecodeError:
            index, reason = _first_undecodable(parse, payloads)
            raise PayloadError(index, f"not a Protobuf {target.full_name}: {reason}") from None
        mask = bodies.is_null().to_numpy(zero_copy_only=False) if has_nulls else None
        return message_columns(messages, target, mask)

    def _reader_message(self, reader: CompiledProto, name: str | None) -> Any:
        """The reader's message of that name, or its first (a record's message may be renamed between versions)."""
        if name is not None:
            try:
                return reader.pool.FindMessageTypeByName(name)
            except KeyError:
                if self.message is not None:
                    raise
        return reader.first_message()

    def schema_from_arrow(self, arrow_type: pa.StructType, name: str) -> str:
        return proto_for(arrow_type, name)

    def encode(self, rows: pa.StructArray, writer: RegisteredSchema) -> pa.BinaryArray:
        from google.protobuf import message_factory

        compiled = self._compiled(writer)
        message = self._message(compiled, self.message)
        prefix = encode_indexes(compiled.indexes_of(message.full_name))
        prepared = prepare_struct(rows, message, "").to_pylist()
        fix = map_fixer(message)
        if fix is not None:
            prepared = [row if row is None else fix(row) for row in prepared]
        cls = message_factory.GetMessageClass(message)
        out: list[bytes | None] = []
        append = out.append
        for index, row in enumerate(prepared):
            if row is None:
                append(None)
                continue
            try:
                append(prefix + cls(**row).SerializeToString())
            except (TypeError, ValueError) as e:
                raise PayloadError(index, f"does not fit message {message.full_name}: {e}",
                                   column=_culprit(cls, row)) from None
        return pa.array(out, pa.binary())


def _first_undecodable(parse: Any, payloads: list[bytes]) -> tuple[int, str]:
    from google.protobuf.message import DecodeError

    for index, payload in enumerate(payloads):
        try:
            parse(payload)
        except DecodeError as e:
            return index, str(e)
    return 0, "undecodable"


def _culprit(cls: Any, row: dict[str, Any]) -> str | None:
    """The error path only: the first field whose value alone the constructor refuses."""
    for name, value in row.items():
        try:
            cls(**{name: value})
        except (TypeError, ValueError):
            return name
    return None
