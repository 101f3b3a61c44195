"""S2: exactly-once micro-batches opened and never committed. sluice's exactly-once sink ends each micro-batch with a
commit fence on every stream it wrote (sluice.connectors.s2._commits); records after a stream's last commit fence
that an opening fence or a writer's stamp marks as a micro-batch in progress are what a killed or stopped query
left. Readers with s2.read-committed stop before them; S2 cannot delete a stream's newest records, so there is
nothing to remove: a restart of the query replays the micro-batch and commits it. Whose they are: the write whose
commit fence comes last before them (its token names the write by a digest of its id, matched to the MetaService's
jobs' query ids)."""

from __future__ import annotations

import asyncio

from sluice.connectors.s2 import READ_SPEC, Connection, commit_token, uncommitted
from sluice.doctor._model import S2_OPEN, Finding, Owner, Verdict
from sluice.doctor._owners import Owners
from sluice.meta import RUNNING


def connection(basin: str) -> Connection:
    """The basin reached as sluice's S2 connector reaches it from the environment: S2_ACCESS_TOKEN (never on the
    command line), S2_ACCOUNT_ENDPOINT and S2_BASIN_ENDPOINT (default s2.dev)."""
    return Connection.from_options(READ_SPEC.parse({"s2.basin": basin, "s2.streams": "-"}))


def examine(conn: Connection, owners: Owners, prefix: str = "") -> list[Finding]:
    return asyncio.run(_examine(conn, owners, prefix))


async def _examine(conn: Connection, owners: Owners, prefix: str) -> list[Finding]:
    by_digest = {commit_token(q, None).split()[1]: owner for q, owner in owners.by_query.items()}
    found = []
    async with conn.client() as client:
        basin = client.basin(conn.basin)
        names = [s.name async for s in basin.list_all_streams(prefix=prefix)]
        for name in names:
            end, tail, token = await uncommitted(conn.stream(basin, name))
            if end >= tail:
                continue
            owner = by_digest.get(token.split()[1]) if token else None
            found.append(Finding(S2_OPEN, f"s2 basin {conn.basin}", name,
                                 f"{tail - end:,} record(s) after the last commit fence (seq {end}) of a micro-batch "
                                 "never committed: readers with s2.read-committed stop before them", owner,
                                 _verdict(owner), {"uncommitted_records": float(tail - end)}, ()))
    return found


def _verdict(owner: Owner | None) -> Verdict:
    if owner is not None and owner.status != RUNNING:
        return Verdict(False, f"S2 cannot delete a stream's newest records, and its job {owner.status}: another "
                              "exactly-once write's commit fence on this stream would make them readable; restart "
                              "this job's query (it resumes the micro-batch and commits it) or write elsewhere")
    return Verdict(False, "S2 cannot delete a stream's newest records; the query that opened the micro-batch "
                          "resumes and commits it when it runs or is restarted")
