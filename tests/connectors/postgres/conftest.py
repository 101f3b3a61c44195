"""A real PostgreSQL server for the connector tests: started here (Debian's binaries), or SLUICE_TEST_PG_URL."""

import os
import uuid

import psycopg
import pytest

from sluice.testing import LocalPostgres


class PG:
    """The server under test: its URL, SQL helpers (psycopg, autocommit) and unique table names."""

    def __init__(self, url: str) -> None:
        self.url = url

    def sql(self, query: str, params=None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def table(self, prefix: str = "t") -> str:
        return f"{prefix}_{uuid.uuid4().hex[:10]}"

    def opts(self, table: str, **more: str) -> dict[str, str]:
        return {"url": self.url, "table": table, **more}


@pytest.fixture(scope="session")
def pg():
    url = os.environ.get("SLUICE_TEST_PG_URL")
    if url:
        yield PG(url)
        return
    with LocalPostgres() as server:
        yield PG(server.url)
