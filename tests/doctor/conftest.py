import pytest

from sluice.testing import LocalKafka, LocalPostgres


@pytest.fixture(scope="module")
def lpg():
    """A server of the module's own with wal_level=logical (change capture leaves replication slots on it)."""
    with LocalPostgres(settings={"wal_level": "logical", "synchronous_commit": "on"}) as server:
        yield server


@pytest.fixture(scope="module")
def kafka():
    """A broker of the module's own, not the suite's (tests/conftest.py): the doctor lists and fences every open
    transaction it finds, and the connector's tests leave topics and transactions of their own on that one."""
    with LocalKafka() as server:
        yield server


@pytest.fixture(scope="module")
def s2():
    from sluice.s2local import LocalS2

    with LocalS2() as server:
        yield server
