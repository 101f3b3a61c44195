"""Dead-letter targets with recent records, as writes' drivers noted them in the MetaService (errors.tolerance=all):
not leftovers to remove but records to look at. Listed when they received records within `since_s`."""

from __future__ import annotations

import time

from sluice.doctor._model import DEAD_LETTERS, Finding, Verdict
from sluice.meta import MetaService


def examine(meta: MetaService, since_s: float, now: float | None = None) -> list[Finding]:
    now = time.time() if now is None else now
    found = []
    for target in meta.dead_letter_targets(since=now - since_s):
        age = max(0.0, now - target.last_at)
        found.append(Finding(
            DEAD_LETTERS, target.target, f"records of {target.connector}",
            f"{target.records} records sent aside since {time.strftime('%Y-%m-%d %H:%M', time.gmtime(target.first_at))}"
            f" UTC, the last {age:.0f} s ago (write {target.last_write_id})", None,
            Verdict(False, "records the store refused, with their reasons: read them in the target, fix the cause, "
                           "write them again; nothing here is removed"),
            {"records": float(target.records), "age_s": age}))
    return found
