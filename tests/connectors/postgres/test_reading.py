"""Connection.reading(): the connection and cursor of one read, closed however the read ends, and a failure named
with what was read and the server, the password scrubbed. A stand-in driver: no server."""

from collections.abc import Iterator
from typing import Any

import pytest

from sluice.connectors.postgres._client import Connection, PostgresError


class Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeConnection(Closable):
    def __init__(self) -> None:
        super().__init__()
        self.cur = Closable()

    def cursor(self) -> Closable:
        return self.cur


class Offline(Connection):
    """A Connection whose driver is the stand-in: `opened` holds each connection it made."""

    def connect(self, *, autocommit: bool = True) -> Any:
        conn = FakeConnection()
        self.__dict__.setdefault("opened", []).append(conn)
        return conn


def server() -> Offline:
    return Offline("db.example", 5432, "app", "reader", "s3cret")


def test_a_read_that_ends_or_stops_early_closes_its_cursor_and_connection():
    pg = server()
    with pg.reading("split 0") as (conn, cur):
        assert cur is conn.cur and not conn.closed
    assert conn.closed and cur.closed

    def batches() -> Iterator[int]:
        with pg.reading("split 1") as (_, _cur):
            yield from range(10)

    read = batches()
    assert next(read) == 0
    read.close()  # Spark stops consuming: GeneratorExit passes through, unwrapped, and both are closed
    assert pg.opened[-1].closed and pg.opened[-1].cur.closed


def test_a_failure_names_what_was_read_and_the_server_without_the_password():
    pg = server()
    with pytest.raises(PostgresError) as failed, pg.reading("split 2 (1 - 9)"):
        raise RuntimeError("ERROR:  relation does not exist (password s3cret)")
    assert str(failed.value) == ("reading split 2 (1 - 9) from postgresql://reader@db.example:5432/app failed: "
                                 "ERROR: relation does not exist (password <redacted>)")
    assert pg.opened[-1].closed and pg.opened[-1].cur.closed
    with pytest.raises(PostgresError, match=r"^already explained$"), pg.reading("split 3"):
        raise PostgresError("already explained")  # a PostgresError of the read's own goes through as it is
