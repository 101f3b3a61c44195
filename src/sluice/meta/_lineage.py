"""Which table feeds which through jobs, ever (kept when jobs end: vacuum and consistent reads need it)."""

from __future__ import annotations

from collections.abc import Iterable

from sluice.meta._backend import Transactions


class Lineage(Transactions):
    def _feeds(self) -> dict[str, set[str]]:
        """table -> the tables written from it by a job (one read of the edges)."""
        with self._tx() as cur:
            cur.execute("SELECT source, sink FROM sluice_lineage")
            pairs = cur.fetchall()
        feeds: dict[str, set[str]] = {}
        for source, sink in pairs:
            feeds.setdefault(source, set()).add(sink)
        return feeds

    @staticmethod
    def _reach(start: Iterable[str], step: dict[str, set[str]]) -> set[str]:
        out: set[str] = set()
        stack = list(start)
        while stack:
            for nxt in step.get(stack.pop(), ()):
                if nxt not in out:
                    out.add(nxt)
                    stack.append(nxt)
        return out

    def upstream(self, tables: Iterable[str]) -> set[str]:
        """The tables `tables` depend on through jobs (not including themselves unless in a cycle)."""
        fed_by: dict[str, set[str]] = {}
        for source, outs in self._feeds().items():
            for out in outs:
                fed_by.setdefault(out, set()).add(source)
        return self._reach(tables, fed_by)

    def downstream(self, tables: Iterable[str]) -> set[str]:
        """The tables written, through jobs, from `tables` (not including themselves unless in a cycle)."""
        return self._reach(tables, self._feeds())

