"""A driver's heartbeat for what its job holds in another store (see _holdings.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.meta._holdings import HEARTBEAT_S
from sluice.meta._service import MetaService


@dataclass
class HoldingHeartbeat:
    """A driver's record that its job holds something: `beat()` at the start (always written) and at every commit
    (written when HEARTBEAT_S passed), so a running job's holding stays fresh and a dead job's grows old."""

    meta: str | None  # the MetaService's database (None: $SLUICE_META, else .sluice/meta.db)
    job_id: str
    kind: str
    location: str
    name: str
    _last: float = 0.0

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= HEARTBEAT_S:
            MetaService(self.meta).record_holding(self.job_id, self.kind, self.location, self.name)
            self._last = now
