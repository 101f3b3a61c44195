"""The test schema registry (sluice.testing.LocalSchemaRegistry, Apicurio Registry): it listens on loopback only,
its restart keeps schemas, ids and compatibility levels (Apicurio's defaults, the negative controls, listen on every
interface and keep nothing), and the Java >= 21 it needs is found beside Spark's 17, or named as missing."""

import json
import os
from pathlib import Path

import pytest

import sluice.testing._registry as registry_module
from sluice.formats._registry import RegistryClient, RegistrySettings, SubjectNotFound, forget_cached_schemas
from sluice.testing import LocalSchemaRegistry

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]})


def listening(pid: int) -> set[str]:
    """The IPv4 addresses (dotted) the process's TCP sockets listen on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            packed = bytes.fromhex(fields[1].split(":")[0])[::-1]
            addresses.add(".".join(str(b) for b in packed))
    return addresses


def client_of(server: LocalSchemaRegistry) -> RegistryClient:
    return RegistryClient(RegistrySettings(server.ccompat_url, timeout_s=5))


@pytest.fixture(scope="module")
def server():
    with LocalSchemaRegistry() as registry:
        yield registry


@pytest.fixture(scope="module")
def apicurio_defaults():
    """Apicurio's own defaults where LocalSchemaRegistry changes them: the management interface on every interface
    (its port still a free one: nothing is sent to it from outside) and storage in memory."""
    with LocalSchemaRegistry(settings={"quarkus.management.host": "0.0.0.0",
                                       "apicurio.datasource.url": "jdbc:h2:mem:registry"}) as server:
        yield server


def test_it_listens_on_loopback_only(server, apicurio_defaults):
    assert server.pid and listening(server.pid) == {"127.0.0.1"}
    assert apicurio_defaults.pid and "0.0.0.0" in listening(apicurio_defaults.pid)  # negative control


def test_a_restart_keeps_schemas_ids_and_compatibility(server, apicurio_defaults):
    client = client_of(server)
    registered = client.register("r-value", "AVRO", SCHEMA)
    client.set_compatibility("r-value", "FULL")
    port = server.port
    server.restart()
    forget_cached_schemas()
    assert server.port == port
    assert client.latest("r-value").schema_id == registered.schema_id
    assert client.schema_by_id(registered.schema_id).schema_type == "AVRO"
    assert client.compatibility("r-value") == "FULL"

    client = client_of(apicurio_defaults)  # negative control: in-memory storage forgets the subject
    client.register("r-value", "AVRO", SCHEMA)
    apicurio_defaults.restart()
    with pytest.raises(SubjectNotFound):
        client.latest("r-value")


def fake_jdk(root: Path, name: str, version: str) -> Path:
    java = root / name / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    (root / name / "release").write_text(f'JAVA_VERSION="{version}"\n')
    return java


def test_java_21_or_newer_is_found_beside_17_or_named_as_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("SLUICE_REGISTRY_JAVA", raising=False)
    monkeypatch.setenv("PATH", str(fake_jdk(tmp_path, "java-17", "17.0.15").parent))  # Spark's java on PATH
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(registry_module, "JVM_ROOT", tmp_path)
    with pytest.raises(RuntimeError, match="needs Java 21 or newer, and none was found") as missing:
        registry_module.find_java()
    assert "SLUICE_REGISTRY_JAVA" in str(missing.value)

    newer = fake_jdk(tmp_path, "temurin-25", "25.0.3")
    fake_jdk(tmp_path, "jdk-21", "21.0.9")
    assert registry_module.find_java() == str(newer)  # the newest under the JVM folder, not PATH's 17
    monkeypatch.setenv("SLUICE_REGISTRY_JAVA", str(tmp_path / "nowhere" / "java"))
    with pytest.raises(RuntimeError, match=r"SLUICE_REGISTRY_JAVA=.* is not a file"):
        registry_module.find_java()
