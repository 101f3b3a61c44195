import pytest

from sluice.testing import LocalPostgres


@pytest.fixture(scope="module")
def lpg():
    """A server of each test module's own for change capture ($SLUICE_TEST_PG_VERSION picks its version)."""
    # synchronous_commit=on: a commit is flushed when it returns, so the stream sees it at once (change capture
    # reads up to the flushed WAL position).
    # Every test leaves its slot behind: room for more than the default 10.
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on",
                                 "max_replication_slots": "40"}) as server:
        yield server
