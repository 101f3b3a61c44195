import uuid

import pytest

from sluice.connectors.hbase._client import Connection, thrift
from sluice.testing import LocalHBase


class HBase:
    """The server under test, Thrift2 helpers and unique table names."""

    def __init__(self, server: LocalHBase) -> None:
        self.server = server
        self.conn = Connection((server.host,), server.port, 60.0)
        self.t = thrift()

    def table(self, families=("d",), splits=(), ttl: int | None = None, versions: int | None = None) -> str:
        """A new table `default:t_<random>` with these families (keeping `versions` versions of a cell), pre-split at
        `splits` (row keys)."""
        name = f"t_{uuid.uuid4().hex[:10]}"
        columns = [self.t.TColumnFamilyDescriptor(name=f.encode(), timeToLive=ttl, maxVersions=versions)
                   for f in families]
        descriptor = self.t.TTableDescriptor(tableName=self.t.TTableName(ns=b"default", qualifier=name.encode()),
                                             columns=columns)
        self.conn.call("createTable", descriptor, list(splits) or None)
        return f"default:{name}"

    def rows(self, table: str) -> dict[bytes, dict[str, bytes]]:
        """Every row of `table`: row key -> {"family:qualifier": value} (newest versions)."""
        scanner = self.conn.call("openScanner", table.encode(), self.t.TScan(caching=1000))
        out: dict[bytes, dict[str, bytes]] = {}
        try:
            while results := self.conn.call("getScannerRows", scanner, 1000):
                for r in results:
                    out[bytes(r.row)] = {f"{c.family.decode()}:{c.qualifier.decode()}": bytes(c.value)
                                         for c in r.columnValues}
        finally:
            self.conn.call("closeScanner", scanner)
        return out

    def opts(self, table: str, **more: str) -> dict[str, str]:
        return {"host": self.server.host, "port": str(self.server.port), "table": table, **more}


@pytest.fixture(scope="session")
def hbase():
    """One HBase (standalone, with its Thrift2 gateway) for the connector's tests, each on tables of its own (the
    fault tests start the gateway again after killing it): its JVMs stop with the session."""
    with LocalHBase() as server:
        yield HBase(server)
