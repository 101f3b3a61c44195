import uuid

import pytest

from sluice.testing import LocalSchemaRegistry


@pytest.fixture
def new_topic(kafka):
    """Make a topic with a fresh name on `kafka` (tests/conftest.py):
    `new_topic(partitions=1, config=None, prefix="t") -> name`."""
    def make(partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        kafka.create_topic(name, partitions, config)
        return name

    return make


@pytest.fixture(scope="package")
def registry():
    """One schema registry (Apicurio, Confluent's API at `.ccompat_url`) for the modules that need one, started
    with the first test that asks; each test on subjects of its own topics."""
    with LocalSchemaRegistry() as server:
        yield server
