"""A split source's offset: one micro-batch boundary as Spark checkpoints it (JSON), typed on this side.

Serialized form (version 2): {"v": 2, "splits": {split id: next position}, "runs": {name: [[first, [positions]]]}}:
split ids "<name>:<n>" (a Kafka topic's partitions) are kept as runs of consecutive numbers, each position once, so
that an offset of thousands of partitions holds little more than their positions (Spark keeps a checkpoint's last
100 offsets); other ids stay in "splits". Version 1 ({"v": 1, "splits": {...}}, or without "v", written before the
version field) is still read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from sluice._errors import SluiceError  # not sluice.connector, which imports sluice.source

OFFSET_VERSION = 2
_NUMBERED = re.compile(r"(.*):(0|[1-9][0-9]*)")  # "<name>:<n>", n as str(int) writes it


def check_offset_version(raw: Mapping[str, Any], what: str, current: int, *, error: type[SluiceError] = SluiceError,
                         start_over: str = "a new checkpoint") -> None:
    """Refuse a checkpointed offset of another version than `current` (one without "v", written before offsets had
    versions, is version 1): another sluice wrote it, and reading it as this one's could skip or repeat data."""
    version = raw.get("v", 1)
    if version != current:
        raise error(f"the checkpoint holds a {what} offset of version {version}, written by another sluice; this one "
                    f"reads version {current} ({dict(raw)}). Run the query with the sluice that wrote the checkpoint, "
                    f"or start over with {start_over}")


class SparkOffset:
    """An offset Spark hands over as a dict (kept in `raw`) and takes back from `to_json()`."""

    raw: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def json_or(self, start: Self) -> dict[str, Any]:
        """This offset as Spark gets it, or `start` exactly as Spark gave it when nothing moved: Spark runs a
        micro-batch for any offset that differs from the last one, fields included (a "v" added since, too)."""
        if self == start and start.raw is not None:
            return start.raw
        return self.to_json()


@dataclass(frozen=True)
class SplitOffset(SparkOffset):
    """Where a streaming read stands in each split it knows: the position after the last one read."""

    positions: Mapping[str, int]  # split id -> next position (a copy)
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # as Spark handed it over

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", dict(self.positions))

    def to_json(self) -> dict[str, Any]:
        splits: dict[str, int] = {}
        numbered: dict[str, dict[int, int]] = {}
        for sid, at in self.positions.items():
            if match := _NUMBERED.fullmatch(sid):
                numbered.setdefault(match[1], {})[int(match[2])] = at
            else:
                splits[sid] = at
        runs: dict[str, list[list[Any]]] = {}
        for name, by_number in numbered.items():
            name_runs = runs[name] = []
            for n in sorted(by_number):
                if not name_runs or name_runs[-1][0] + len(name_runs[-1][1]) != n:
                    name_runs.append([n, []])
                name_runs[-1][1].append(by_number[n])
        return {"v": OFFSET_VERSION, "splits": splits, "runs": runs}

    @classmethod
    def from_json(cls, raw: dict[str, Any], source: str | None = None) -> SplitOffset:
        """`source`: the format reading it, named when the offset is refused."""
        if raw.get("v", 1) != 1:  # version 1 has "splits" only
            check_offset_version(raw, source or "split source", OFFSET_VERSION)
        positions = {str(sid): int(at) for sid, at in raw.get("splits", {}).items()}
        for name, name_runs in raw.get("runs", {}).items():
            for first, run in name_runs:
                positions.update((f"{name}:{first + i}", int(at)) for i, at in enumerate(run))
        return cls(positions, raw)
