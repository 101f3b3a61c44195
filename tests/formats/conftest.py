import uuid

import pytest

from sluice.formats._registry import RegistryClient, RegistrySettings
from sluice.testing import LocalSchemaRegistry


@pytest.fixture(scope="package")
def registry():
    """One Apicurio Registry (plain HTTP, no authentication) for this package's tests, each on subjects of its own
    (`new_subject`); a test that stops it starts it again on the same data."""
    with LocalSchemaRegistry() as server:
        yield server


@pytest.fixture
def client(registry):
    """A client of `registry`'s Confluent API, with a short timeout (a stopped registry fails a test quickly)."""
    return RegistryClient(RegistrySettings(registry.ccompat_url, timeout_s=5))


@pytest.fixture
def new_subject():
    """A fresh subject name: `new_subject(prefix="s") -> name`."""
    return lambda prefix="s": f"{prefix}_{uuid.uuid4().hex[:10]}-value"
