"""A table-store stream's offset: one micro-batch boundary as Spark checkpoints it (JSON), typed on this side.

Serialized form (version 1): {"v": 1, "barrier": B, "version": V}, V being the Delta version that completed
barrier B (0 and 0 before the first). Offsets written before the version field are read as version 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.connector import SparkOffset, check_offset_version
from sluice.tablestore._table import TableStoreError

OFFSET_VERSION = 1


@dataclass(frozen=True)
class BarrierOffset(SparkOffset):
    """The barrier a table-store stream has read up to, and the Delta version that completed it."""

    barrier: int
    version: int
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # as Spark handed it over

    def to_json(self) -> dict[str, Any]:
        return {"v": OFFSET_VERSION, "barrier": self.barrier, "version": self.version}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BarrierOffset:
        check_offset_version(raw, "tablestore", OFFSET_VERSION, error=TableStoreError)
        return cls(int(raw["barrier"]), int(raw["version"]), raw)
