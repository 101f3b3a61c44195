"""How many PostgreSQL connections a write and a read hold at once (docs/deploy.md), enforced by the server.

The writes and reads run as a role whose CONNECTION LIMIT is the documented bound for this session's
2 task slots: PostgreSQL refuses the connection past it, so the job fails if sluice ever holds more.
"""

import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

import sluice

pytestmark = pytest.mark.spark

SLOTS = 2  # local[2,2]
CONNECTIONS_PER_TASK = 2  # the default of connections-per-task


def limited_role(pg, limit: int) -> str:
    role = f"fan_{uuid.uuid4().hex[:8]}"
    pg.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT {limit}")
    pg.sql(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
    url = urlsplit(pg.url)
    return urlunsplit(url._replace(netloc=f"{role}:pw@{url.hostname}:{url.port}"))


def test_a_write_and_a_read_stay_within_the_documented_connection_bound(spark, pg):
    url = limited_role(pg, SLOTS * CONNECTIONS_PER_TASK)
    table = pg.table()
    # 16 input partitions, all with rows: tasks queue for the 2 slots and never hold more than 2 x 2.
    df = spark.range(0, 40_000, 1, 16).selectExpr("id", "repeat('x', 50) AS body")
    opts = {"url": url, "table": table, "create-table": "true", "sink.batch.max-size": "500"}
    sluice.write(df, "postgres", opts)
    sluice.write(df, "postgres", {**opts, "primary-key": "id"} | {"table": table + "_u"}, num_partitions=8)
    read = spark.read.format("postgres").option("url", url).option("table", table).option("num-partitions", "8")
    assert read.load().count() == 40_000
    assert pg.sql(f'SELECT count(*) FROM "{table}_u"') == [(40_000,)]


def test_the_connection_limit_is_really_enforced(spark, pg):
    """Negative control: a consistent read holds its snapshot with 2 connections at once; a limit of 1 refuses it."""
    table = pg.table()
    pg.sql(f'CREATE TABLE "{table}" (id bigint)')
    url = limited_role(pg, 1)
    pg.sql(f'GRANT SELECT ON "{table}" TO {urlsplit(url).username}')
    with pytest.raises(Exception, match="too many connections for role"):
        spark.read.format("postgres").option("url", url).option("table", table).load().count()
