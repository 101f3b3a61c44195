"""Registered .proto texts -> Protobuf descriptors, and Confluent's message indexes.

The registry keeps a Protobuf schema as .proto text; Python's protobuf runtime has no .proto parser. protoc itself
does it: grpcio-tools ships it (with the well-known types' .proto files, so `import "google/protobuf/timestamp.proto"`
resolves), and it writes a FileDescriptorSet that protobuf's upb runtime loads into a pool. It runs as a
subprocess (`python -m grpc_tools.protoc`, about 60 ms once per schema text and process, then cached): protoc reports
errors on the process's stderr, which a subprocess captures without touching this process's file descriptors.
A pure-Python parser would be a second grammar to trust; the registry's `?format=serialized` is Confluent's and not
every registry serves it.

Confluent's Protobuf wire format puts message indexes before the message: a zigzag varint count, then that many
zigzag varints, the path of the record's message among the file's (nested) messages; the single byte 0 means [0].
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sluice._errors import SluiceError

MAIN_FILE = "sluice_registered.proto"


class ProtobufSchemaError(SluiceError):
    """A .proto text that does not compile, or a message sluice cannot map to columns."""


@dataclass(frozen=True)
class CompiledProto:
    """One .proto text compiled: its pool, its file, and its messages' full names in Confluent's index order."""

    pool: Any  # google.protobuf.descriptor_pool.DescriptorPool
    file: Any  # google.protobuf.descriptor.FileDescriptor

    def message_at(self, indexes: Sequence[int]) -> Any:
        """The message descriptor Confluent's indexes name (a path through the file's nested messages)."""
        types = list(self.file.message_types_by_name.values())
        message = None
        for depth, index in enumerate(indexes):
            if not 0 <= index < len(types):
                raise ProtobufSchemaError(f"message indexes {list(indexes)} name no message of the schema (level "
                                          f"{depth} has {len(types)} messages)")
            message = types[index]
            types = list(message.nested_types)
        if message is None:
            raise ProtobufSchemaError("empty message indexes")
        return message

    def indexes_of(self, full_name: str) -> list[int]:
        """Confluent's indexes of a message of this file."""
        message = self.pool.FindMessageTypeByName(full_name)
        path: list[int] = []
        while message is not None:
            siblings = (list(message.containing_type.nested_types) if message.containing_type is not None
                        else list(self.file.message_types_by_name.values()))
            path.append([s.full_name for s in siblings].index(message.full_name))
            message = message.containing_type
        return path[::-1]

    def first_message(self) -> Any:
        if not self.file.message_types_by_name:
            raise ProtobufSchemaError("the registered .proto defines no message")
        return next(iter(self.file.message_types_by_name.values()))


def _include_dir() -> str:
    """grpcio-tools' copy of the well-known types' .proto files."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise ProtobufSchemaError("Protobuf payloads need grpcio-tools (protoc): pip install grpcio-tools")
    return os.path.join(os.path.dirname(spec.origin), "_proto")


@lru_cache(maxsize=128)
def compile_proto(text: str, dependencies: tuple[tuple[str, str], ...] = ()) -> CompiledProto:
    """Compile a registered .proto (with the texts of the files it imports, by import name) into a pool."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    with tempfile.TemporaryDirectory(prefix="sluice-proto-") as tmp:
        for name, dep_text in (*dependencies, (MAIN_FILE, text)):
            path = os.path.join(tmp, name)
            if os.path.commonpath([tmp, os.path.abspath(path)]) != tmp:
                raise ProtobufSchemaError(f"import name {name!r} leaves the schema's directory")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(dep_text)
        out = os.path.join(tmp, "set.pb")
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{_include_dir()}", "--include_imports",
             f"--descriptor_set_out={out}", MAIN_FILE], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ProtobufSchemaError("the registered .proto does not compile (protoc): "
                                      + (result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}"))
        with open(out, "rb") as f:
            files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:  # protoc writes them dependencies first
        pool.Add(proto)
    return CompiledProto(pool, pool.FindFileByName(MAIN_FILE))


def _zigzag(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_indexes(indexes: Sequence[int]) -> bytes:
    if list(indexes) == [0]:
        return b"\x00"
    return _zigzag(len(indexes)) + b"".join(_zigzag(i) for i in indexes)


def decode_indexes(body: bytes) -> tuple[list[int], int]:
    """(indexes, the offset where the message starts). Raises ValueError on a truncated or absurd array."""
    position = 0

    def varint() -> int:
        nonlocal position
        value = shift = 0
        while True:
            if position >= len(body):
                raise ValueError("the message indexes are truncated")
            byte = body[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            if shift > 63:
                raise ValueError("a message index is longer than a varint")

    count = varint()
    if count == 0:
        return [0], position
    if not 0 < count <= 64:
        raise ValueError(f"message index count {count} is not a nesting depth")
    return [varint() for _ in range(count)], position
