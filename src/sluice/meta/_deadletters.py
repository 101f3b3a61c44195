"""Where writes sent refused records (errors.tolerance=all), as their drivers record it: what `sluice doctor` lists as
dead-letter targets with recent records. One row per (target, connector), its count and times renewed per write."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.meta._backend import Transactions


@dataclass(frozen=True)
class DeadLetterTarget:
    target: str  # the dead-letter target: its format and where ("tablestore letters", "sluice_kafka orders-dlq")
    connector: str  # the format whose records were sent there
    records: int  # sent there so far, over every recorded write
    first_at: float  # unix seconds
    last_at: float
    last_write_id: str


class DeadLetterLedger(Transactions):
    def record_dead_letters(self, target: str, connector: str, records: int, write_id: str) -> None:
        """A write (or micro-batch) committed with `records` records sent to `target`."""
        now = time.time()
        with self._tx(write=True) as cur:
            cur.execute("INSERT INTO sluice_dead_letters (target, connector, records, first_at, last_at, write_id) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (target, connector) DO UPDATE SET "
                        "records = sluice_dead_letters.records + excluded.records, last_at = excluded.last_at, "
                        "write_id = excluded.write_id", (target, connector, records, now, now, write_id))

    def dead_letter_targets(self, since: float = 0.0) -> list[DeadLetterTarget]:
        """The targets that received records at or after `since` (unix seconds), the most recent first."""
        with self._tx() as cur:
            cur.execute("SELECT target, connector, records, first_at, last_at, write_id FROM sluice_dead_letters "
                        "WHERE last_at >= ? ORDER BY last_at DESC", (since,))
            return [DeadLetterTarget(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), r[5]) for r in cur.fetchall()]
