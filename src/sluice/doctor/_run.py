"""One doctor's round: examine every store given, then (--fix) remove what is safe and ask about the rest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice._errors import SluiceError
from sluice.doctor import _deadletters, _kafka, _postgres, _reach, _s2, _tablestore
from sluice.doctor._model import KAFKA_TXN, PG_SLOT, PG_STAGED, TABLE_BARRIER, TABLE_CLAIM, Action, Finding, Verdict
from sluice.doctor._owners import Owners
from sluice.meta import MetaService


@dataclass(frozen=True)
class Stores:
    """Where to look besides the MetaService. The PostgreSQL URL carries no password (PGPASSWORD has it). The
    options files (paths on this machine) give a store's connection options as its jobs give them: TLS, a client
    certificate, SASL, a password (see _reach.py)."""

    postgres: str | None = None
    kafka: str | None = None  # bootstrap servers
    kafka_open_after_s: float = 60.0  # report transactions open at least this long
    s2_basin: str | None = None  # token and endpoints from S2_ACCESS_TOKEN, S2_ACCOUNT_ENDPOINT, S2_BASIN_ENDPOINT
    s2_prefix: str = ""  # the basin's streams with this prefix
    dead_letters_since_s: float = 86400.0  # list dead-letter targets that received records this recently
    postgres_options: str | None = None  # a JSON or properties file of format("postgres")'s connection options
    kafka_options: str | None = None  # ... of format("sluice_kafka")'s kafka.* options


class Doctor:
    def __init__(self, meta: str | None, stores: Stores, dead_after: float | None = None) -> None:
        self.meta = MetaService(meta)
        self.stores = stores
        self.dead_after = dead_after
        self._pg = (_reach.postgres_connection(stores.postgres, stores.postgres_options)
                    if stores.postgres or stores.postgres_options else None)
        self._kafka = (_reach.kafka_client(stores.kafka, stores.kafka_options)
                       if stores.kafka or stores.kafka_options else None)
        self._s2 = _s2.connection(stores.s2_basin) if stores.s2_basin else None

    def examine(self) -> list[Finding]:
        owners = Owners(self.meta, self.dead_after)
        found = _tablestore.examine(self.meta, owners)
        found += _deadletters.examine(self.meta, self.stores.dead_letters_since_s)
        if self._pg is not None:
            found += _postgres.examine(self._pg, self.meta, owners)
        if self._kafka is not None:
            found += _kafka.examine(self._kafka, owners, self.stores.kafka_open_after_s)
        if self._s2 is not None:
            found += _s2.examine(self._s2, owners, self.stores.s2_prefix)
        return found

    def fix(self, findings: list[Finding], ask: Callable[[str], bool], yes: bool = False) -> list[Action]:
        """Remove the safe findings (each asked about unless `yes`); ask about every removable other one, whatever
        `yes` says. A finding with nothing to remove (a Kafka partition: its transaction's producer is unknown) is
        left as it is."""
        actions = []
        for finding in findings:
            if not finding.handle:
                continue
            if finding.verdict.safe:
                go = yes or ask(f"remove {finding.kind} {finding.name} ({finding.verdict.why})?")
            else:
                go = ask(f"NOT SAFE: {finding.kind} {finding.name}: {finding.verdict.why}. Remove it anyway?")
            if not go:
                actions.append(Action(finding, False, "left as it is"))
                continue
            if finding.verdict.safe and not (now := self._still_safe(finding)).safe:
                actions.append(Action(finding, False, f"refused: not safe any more: {now.why}"))
                continue
            try:
                actions.append(Action(finding, True, self._remove(finding)))
            except SluiceError as e:
                actions.append(Action(finding, False, f"refused: {e}"))
        return actions

    def _still_safe(self, finding: Finding) -> Verdict:
        """The verdict again, from the MetaService as it is now: a question may have waited while the job was
        restarted (its query under a new job owns what the last run left, except the last run's claim)."""
        assert finding.owner is not None  # nothing without an owner is safe
        owners = Owners(self.meta, self.dead_after)
        return owners.verdict(owners.now_of(finding.owner, finding.kind not in (TABLE_CLAIM, TABLE_BARRIER)))

    def _remove(self, finding: Finding) -> str:
        if finding.kind in (PG_SLOT, PG_STAGED):
            assert self._pg is not None
            return _postgres.remove(self._pg, self.meta, finding)
        if finding.kind == KAFKA_TXN:
            assert self._kafka is not None
            return _kafka.remove(self._kafka, finding)
        return _tablestore.remove(self.meta, finding)

