"""A change stream's offset: one micro-batch boundary as Spark checkpoints it (JSON), typed on this side.

Serialized form (version 1): {"v": 1, "lsn": "0/16B3748"}, plus while micro-batch 0's snapshot is read
"snapshot" and "channel" (the exported snapshot and its holder's notify channel), plus when
max-changes-per-trigger cuts the snapshot "splits" ([table, where, estimated rows] each, planned once) and
"done" (how many of them earlier batches read), plus "quiet": true on a batch without rows that moves past WAL
the publication did not write, plus "tables" (the tables streamed, so a restart finds the ones new to it) and
"backfill" (the snapshots on demand, _backfill.Backfill), plus "columns" (each table's columns by attribute number,
_columns.TableColumns: a restarted query finds the renamed ones). Offsets written before the version field are read as
version 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.connector import check_offset_version
from sluice.connectors.postgres._pgoutput import format_lsn, parse_lsn
from sluice.connectors.postgres._snapshot import SharedSnapshot
from sluice.connectors.postgres.changes._backfill import Backfill
from sluice.connectors.postgres.changes._columns import TableColumns

OFFSET_VERSION = 1


@dataclass(frozen=True)
class SnapshotSplit:
    """One split of the initial snapshot, as planned when max-changes-per-trigger cuts it."""

    table: str  # schema.name
    where: str  # the split's predicate, as format("postgres")'s reader cuts a table
    rows: int  # estimated from the table's statistics


@dataclass(frozen=True)
class ChangeOffset:
    lsn: int
    snapshot: str | None = None
    channel: str | None = None
    splits: tuple[SnapshotSplit, ...] | None = None
    done: int = 0
    quiet: bool = False
    tables: tuple[str, ...] | None = None  # the tables streamed; None in offsets written before they were recorded
    backfill: Backfill = field(default_factory=Backfill)
    columns: tuple[TableColumns, ...] | None = None  # as the query that wrote it streamed them; None: not recorded
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # as Spark handed it over

    @property
    def in_snapshot(self) -> bool:
        return self.snapshot is not None

    def shared_snapshot(self) -> SharedSnapshot:
        """The exported snapshot every split of micro-batch 0 reads, as of the slot's consistent point."""
        assert self.snapshot is not None and self.channel is not None, "not an offset inside the snapshot"
        return SharedSnapshot(self.snapshot, self.channel, format_lsn(self.lsn))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": OFFSET_VERSION, "lsn": format_lsn(self.lsn)}
        if self.snapshot is not None:
            out |= {"snapshot": self.snapshot, "channel": self.channel}
        if self.splits is not None:
            out |= {"splits": [[s.table, s.where, s.rows] for s in self.splits], "done": self.done}
        if self.quiet:
            out["quiet"] = True
        if self.tables is not None:
            out["tables"] = list(self.tables)
        if self.backfill != Backfill():
            out["backfill"] = self.backfill.to_json()
        if self.columns:
            out["columns"] = [t.to_json() for t in self.columns]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ChangeOffset:
        check_offset_version(raw, "postgres_changes", OFFSET_VERSION, start_over="a new checkpoint and slot")
        splits = raw.get("splits")
        return cls(parse_lsn(raw["lsn"]), raw.get("snapshot"), raw.get("channel"),
                   None if splits is None else tuple(SnapshotSplit(t, w, int(n)) for t, w, n in splits),
                   int(raw.get("done", 0)), bool(raw.get("quiet", False)),
                   None if raw.get("tables") is None else tuple(raw["tables"]),
                   Backfill.from_json(raw["backfill"]) if "backfill" in raw else Backfill(),
                   None if "columns" not in raw else tuple(TableColumns.from_json(t) for t in raw["columns"]), raw)

    def json_or(self, start: ChangeOffset) -> dict[str, Any]:
        """This offset as Spark gets it, or `start` exactly as Spark gave it when the position did not move: Spark
        runs a micro-batch for any offset that differs from the last one, fields included."""
        if self.lsn == start.lsn and self.backfill == start.backfill and start.raw is not None:
            return start.raw
        return self.to_json()
