"""S2 records as columns: read sessions that keep the SDK's protobuf batch instead of one object per record.

s2-sdk 0.13 maps every record of a read session into a `SequencedRecord` dataclass (`read_batch_from_proto`):
~2 us a record, twice what the rest of sluice's read path costs, and the reason a Spark read trailed a raw
SDK session (bench/stores/s2_source.py). The read session looks that mapper up as a module global on every batch,
so sluice installs a mapper that keeps the protobuf records - but only while a context variable set by
`protobuf_records()` is on. Any other use of the SDK in the same process (no context variable) still gets
the SDK's own mapping. Retries, reconnects, heartbeats and limits stay the SDK's.

`RecordColumns.of()` reads either kind of record, so if an SDK release moves the mapper, reads fall back to
the SDK's objects (slower, same rows) and `fast_path_installed()` says so; a test checks it is installed.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

log = logging.getLogger("sluice.s2")

_KEEP_PROTOBUF = contextvars.ContextVar("sluice_s2_keep_protobuf", default=False)
_INSTALLED = False
_INSTALL_LOCK = threading.Lock()  # readers of several partitions may start at once in one worker
_FIELDS = attrgetter("seq_num", "timestamp", "body", "headers")


def _install() -> bool:
    """Wrap the SDK's read-session mapper once per process; False when this SDK has none to wrap."""
    with _INSTALL_LOCK:
        return _INSTALLED or _wrap_mapper()


def _wrap_mapper() -> bool:
    global _INSTALLED
    try:
        import s2_sdk._s2s._read_session as session_module
        from s2_sdk._types import ReadBatch, StreamPosition
    except ImportError:
        return False
    sdk_mapper = getattr(session_module, "read_batch_from_proto", None)
    if sdk_mapper is None:
        log.debug("s2-sdk has no read_batch_from_proto to wrap: reading through SDK record objects")
        return False

    def read_batch(batch: Any) -> Any:
        if not _KEEP_PROTOBUF.get():
            return sdk_mapper(batch)
        tail = StreamPosition(batch.tail.seq_num, batch.tail.timestamp) if batch.HasField("tail") else None
        # The session only needs len(), [-1].seq_num and (with a bytes limit) headers/body of records: the
        # protobuf records answer all of these.
        return ReadBatch(records=batch.records, tail=tail)

    read_batch.__wrapped__ = sdk_mapper  # type: ignore[attr-defined]
    session_module.read_batch_from_proto = read_batch
    _INSTALLED = True
    return True


def fast_path_installed() -> bool:
    return _install()


@contextmanager
def protobuf_records() -> Iterator[None]:
    """Read sessions started inside this block (their tasks copy the context) hand out protobuf records."""
    _install()
    token = _KEEP_PROTOBUF.set(True)
    try:
        yield
    finally:
        _KEEP_PROTOBUF.reset(token)


def _pair(header: Any) -> tuple[bytes, bytes]:
    return (header[0], header[1]) if isinstance(header, tuple) else (header.name, header.value)


@dataclass
class RecordColumns:
    """Records of one stream as columns. headers is None when no record has any (the common case)."""

    seq_nums: list[int]
    timestamps: list[int]
    bodies: list[bytes]
    headers: list[list[tuple[bytes, bytes]]] | None

    @classmethod
    def empty(cls) -> RecordColumns:
        return cls([], [], [], None)

    @classmethod
    def of(cls, records: Sequence[Any]) -> RecordColumns:
        """From protobuf SequencedRecords or SDK SequencedRecord objects, command records left out."""
        if not records:
            return cls.empty()
        seq_nums, timestamps, bodies, raw_headers = zip(*map(_FIELDS, records), strict=True)
        columns = cls(list(seq_nums), list(timestamps), list(bodies), None)
        if any(raw_headers):
            columns.headers = [[_pair(h) for h in hs] for hs in raw_headers]
            commands = [i for i, hs in enumerate(columns.headers) if len(hs) == 1 and hs[0][0] == b""]
            if commands:
                dropped = set(commands)
                columns = columns.take([i for i in range(len(seq_nums)) if i not in dropped])
        return columns

    def __len__(self) -> int:
        return len(self.seq_nums)

    def take(self, indices: Sequence[int]) -> RecordColumns:
        return RecordColumns([self.seq_nums[i] for i in indices], [self.timestamps[i] for i in indices],
                             [self.bodies[i] for i in indices],
                             None if self.headers is None else [self.headers[i] for i in indices])

    def head(self, n: int) -> RecordColumns:
        return RecordColumns(self.seq_nums[:n], self.timestamps[:n], self.bodies[:n],
                             None if self.headers is None else self.headers[:n])

    def extend(self, other: RecordColumns) -> None:
        if other.headers is not None and self.headers is None:
            self.headers = [[] for _ in self.seq_nums]
        self.seq_nums += other.seq_nums
        self.timestamps += other.timestamps
        self.bodies += other.bodies
        if self.headers is not None:
            self.headers += other.headers if other.headers is not None else [[] for _ in other.seq_nums]

    def header_dicts(self) -> list[dict[bytes, bytes]]:
        return [dict(h) for h in self.headers] if self.headers is not None else [{} for _ in self.seq_nums]
