"""MetaService (FLIP-276): jobs, their source and sink tables, and each table's completed barriers.

Lives in a real database: a SQLite file by default (`.sluice/meta.db`), PostgreSQL when jobs run on several
machines (_backend.py). Its parts, one concern each: jobs and the single-writer rule (_jobs.py), lineage
(_lineage.py), barriers and consistent versions (_barriers.py),
what jobs hold in other stores and their last signs of life (_holdings.py), where writes sent refused records
(_deadletters.py).
"""

from __future__ import annotations

from sluice.meta._barriers import BarrierLedger
from sluice.meta._deadletters import DeadLetterLedger
from sluice.meta._holdings import HoldingLedger
from sluice.meta._jobs import JobRegistry


class MetaService(JobRegistry, BarrierLedger, HoldingLedger, DeadLetterLedger):
    """Jobs, lineage, completed barriers and what jobs hold in other stores. `MetaService()` opens
    `.sluice/meta.db` (or $SLUICE_META)."""

    def __repr__(self) -> str:
        return f"MetaService({self._db.display})"
