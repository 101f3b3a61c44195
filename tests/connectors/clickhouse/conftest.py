import uuid

import pytest

from sluice.testing import LocalClickHouse
from tests.clickhouse_chdb import ChdbClickHouse, clickhouse_server


class CH:
    """The server under test, SQL helpers and unique table names."""

    def __init__(self, server: LocalClickHouse | ChdbClickHouse) -> None:
        self.server = server
        self.url = server.url
        self.password = server.password

    def sql(self, query: str) -> str:
        return self.server.sql(query)

    def rows(self, query: str) -> list[list[str]]:
        return self.server.rows(query)

    def table(self, columns: str, engine: str = "MergeTree() ORDER BY id") -> str:
        name = f"t_{uuid.uuid4().hex[:10]}"
        self.sql(f"CREATE TABLE {name} ({columns}) ENGINE = {engine}")
        return name

    def opts(self, table: str, **more: str) -> dict[str, str]:
        return {"url": self.url, "table": table, "password": self.password, **more}


@pytest.fixture(scope="session")
def ch():
    """Debian's clickhouse-server, or the chdb stand-in (ClickHouse 26) with SLUICE_TEST_CLICKHOUSE=chdb."""
    with clickhouse_server() as server:
        yield CH(server)
