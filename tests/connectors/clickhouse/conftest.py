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
    """The chdb stand-in on ClickHouse 26's engine (the default), or with SLUICE_TEST_CLICKHOUSE=server the
    clickhouse-server binary on the machine (23.3 or newer: sluice refuses older ones, e.g. Debian's 18.16)."""
    with clickhouse_server() as server:
        yield CH(server)
