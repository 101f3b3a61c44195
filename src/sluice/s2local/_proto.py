"""S2's protobuf messages, from S2's published s2.proto (_s2_descriptor.py), in a descriptor pool of their own.

The server speaks protobuf on the wire (AppendInput, AppendAck, ReadBatch, and the records in them). Its messages
come from the published description of the API, not from an SDK's generated module, and live in a private pool:
an SDK that registers the same `s2.v1` names in the default pool (s2-sdk does) can be imported beside it.

`python -m sluice.s2local._proto DESCRIPTOR_SET` rewrites _s2_descriptor.py from protoc's output (`make s2-proto`).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pool, message_factory

from sluice.s2local._s2_descriptor import SERIALIZED

_POOL = descriptor_pool.DescriptorPool()
_POOL.AddSerializedFile(SERIALIZED)


def _message(name: str) -> type[Any]:
    """A message class the pool builds at run time (protobuf ships no types: its fields and methods are Any)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"s2.v1.{name}"))


StreamPosition = _message("StreamPosition")
Header = _message("Header")
AppendRecord = _message("AppendRecord")
AppendInput = _message("AppendInput")
AppendAck = _message("AppendAck")
SequencedRecord = _message("SequencedRecord")
ReadBatch = _message("ReadBatch")


def _write_descriptor(descriptor_set: str) -> None:
    import base64
    import sys
    from pathlib import Path

    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(Path(descriptor_set).read_bytes()).file
    if [f.name for f in files] != ["s2.proto"]:
        sys.exit(f"{descriptor_set}: expected protoc's output for s2.proto alone, got {[f.name for f in files]}")
    text = base64.b64encode(files[0].SerializeToString()).decode()
    target = Path(__file__).with_name("_s2_descriptor.py")
    head = target.read_text().split("SERIALIZED = ")[0]  # the module's docstring and import stay
    body = "".join(f'    "{text[i:i + 100]}"\n' for i in range(0, len(text), 100))
    target.write_text(f"{head}SERIALIZED = base64.b64decode(\n{body})\n")


if __name__ == "__main__":
    import sys

    _write_descriptor(sys.argv[1])
