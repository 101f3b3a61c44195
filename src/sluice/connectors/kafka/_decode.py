"""Decoding a fetch's keys or values on the executors, in bulk: Confluent's framing split off every payload at once
(the wire module, vectorized), the payloads grouped by schema id, each group decoded by the format in one call, and
the decoded rows put back in the fetch's order with one `take`. A writer schema is fetched by id through the registry
client, which keeps it for the process's life (Python workers are reused across tasks; an id names one schema for
good), so a registry that goes away mid-read stops nothing whose schemas were seen. A tombstone (a null payload) is a
null row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sluice.connector import (
    PayloadError,
    PayloadFormat,
    RegisteredSchema,
    RegistryClient,
    RegistrySettings,
    SluiceError,
    split_payloads,
)
from sluice.connectors.kafka._format_options import PayloadSide, payload_format


class BadPayloadError(SluiceError):
    """Records whose key or value cannot be decoded, the first named by topic, partition and offset; `positions`:
    theirs in the fetch, `errors`: one BadPayloadError each, naming its own offset (the dead letters' reasons)."""

    def __init__(self, message: str, positions: list[int] | None = None,
                 errors: list[BadPayloadError] | None = None) -> None:
        super().__init__(message)
        self.positions = positions or []
        self.errors = errors or []


SCHEMA_NOT_FOUND = 40403  # Confluent's error_code: no schema with that id (the registry's errors carry it)
_STOPS = ("The query stops here; skip the record by starting after it (startingOffsets), read it with "
          "{side}.format=raw to look at its bytes, or set errors.tolerance=all and errors.deadletter.format to send "
          "such records aside.")


@dataclass(frozen=True)
class SideDecoder:
    """One side's decoding: the reader schema resolved on the driver, the format that decodes to its Arrow type."""

    side: PayloadSide
    registry: RegistrySettings

    @property
    def reader(self) -> RegisteredSchema:
        assert self.side.schema is not None, "the reader schema is resolved on the driver"
        return self.side.schema

    @property
    def format(self) -> PayloadFormat:
        return payload_format(self.side.format)

    def arrow_type(self) -> pa.StructType:
        return self.format.reader_type(self.reader)

    def decode(self, payloads: pa.Array, topic: str, partition: int, offsets: np.ndarray) -> pa.StructArray:
        """`payloads` (binary, null for tombstones) of the records at `offsets` as rows of `arrow_type()`."""
        fmt, reader = self.format, self.reader
        n = len(payloads)

        def why(index: int, reason: str) -> str:
            return (f"kafka: {topic} partition {partition} offset {int(offsets[index])}: the {self.side.side} cannot "
                    f"be decoded as {self.side.format}: {reason}.")

        def fail(indexes: list[int], reasons: list[str]) -> BadPayloadError:
            each = [BadPayloadError(why(i, r), [i]) for i, r in zip(indexes, reasons, strict=True)]
            return BadPayloadError(f"{why(indexes[0], reasons[0])} {_STOPS.format(side=self.side.side)}", indexes,
                                   each)

        framed = split_payloads(payloads)
        if len(framed.bad):
            bad = [int(i) for i in framed.bad]
            raise fail(bad, [bad_frame_reason(payloads, i) for i in bad])
        ids = framed.schema_ids
        present = np.flatnonzero(ids >= 0) if payloads.null_count else None  # tombstones: -1
        if present is not None:
            if not len(present):
                return pa.nulls(n, self.arrow_type())
            ids = ids[present]
        bodies = framed.bodies if present is None else framed.bodies.take(pa.array(present))
        unique, inverse = np.unique(ids, return_inverse=True)
        groups: list[tuple[int, np.ndarray | None]]
        if len(unique) == 1:  # the usual fetch: one writer schema, no reordering
            groups, order = [(int(unique[0]), None)], None
        else:
            order = np.argsort(inverse, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse))])
            groups = [(int(sid), order[bounds[g]:bounds[g + 1]]) for g, sid in enumerate(unique)]

        def record(index: int, rows: np.ndarray | None) -> int:
            """The fetch's position of a group's `index`th body."""
            at = index if rows is None else int(rows[index])
            return at if present is None else int(present[at])

        pieces = []
        for schema_id, rows in groups:
            try:
                writer = RegistryClient(self.registry).schema_by_id(schema_id)
            except Exception as error:
                if getattr(error, "error_code", None) != SCHEMA_NOT_FOUND:  # unreachable, refusing: not the record's
                    raise BadPayloadError(f"{why(record(0, rows), f'its schema id {schema_id}: {error}')} "
                                          f"{_STOPS.format(side=self.side.side)}") from error
                # an id the registry does not have: every record of it is unreadable
                count = len(ids) if rows is None else len(rows)
                raise fail([record(i, rows) for i in range(count)],
                           [f"its schema id {schema_id}: {error}"] * count) from error
            group = bodies if rows is None else bodies.take(pa.array(rows))
            try:
                pieces.append(fmt.decode(group, writer, reader))
            except PayloadError as error:
                raise fail([record(error.index, rows)], [error.reason]) from None
        decoded = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        if order is None and present is None:
            return decoded
        # Where each fetched record's row is in `decoded` (grouped by schema id), null for a tombstone: one take.
        where = np.arange(len(ids))
        if order is not None:
            where[order] = np.arange(len(ids))
        if present is None:
            return decoded.take(pa.array(where))
        index = np.zeros(n, np.int64)
        index[present] = where
        valid = np.zeros(n, bool)
        valid[present] = True
        return decoded.take(pa.array(index, mask=~valid))


def bad_frame_reason(payloads: pa.Array, index: int) -> str:
    """Why the payload at `index` is not in Confluent's wire format (the magic byte and a schema id first)."""
    value = payloads[index].as_py()
    if len(value) < 5:
        return f"a {len(value)}-byte value is shorter than Confluent's 5-byte header (magic byte and schema id)"
    return f"magic byte {value[0]} where Confluent's wire format has 0: not a schema registry payload"
