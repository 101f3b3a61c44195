"""The test HBase server (sluice.testing.LocalHBase): a pre-split table made, written and read through the Thrift2
gateway, the gateway killed and started again on the same port, the server killed and started again on the same
data, and its folder removed by stop(). One server for the module (a start takes ~10 s)."""

import os

import pytest

from sluice.testing import LocalHBase
from sluice.testing._hbase import thrift

SPLITS = [b"g", b"n", b"t"]
ROWS = {f"{prefix}{i:03d}".encode(): f"v{prefix}{i}".encode() for prefix in "abhpu" for i in range(20)}


@pytest.fixture(scope="module")
def server():
    with LocalHBase() as hbase:
        yield hbase


def put_rows(client, table: bytes, rows: dict[bytes, bytes]) -> None:
    m = thrift()
    client.putMultiple(table, [m.TPut(row=k, columnValues=[m.TColumnValue(family=b"f", qualifier=b"q", value=v)])
                               for k, v in rows.items()])


def scan(client, table: bytes, **options) -> dict[bytes, bytes]:
    m = thrift()
    scanner = client.openScanner(table, m.TScan(caching=50, **options))
    rows: dict[bytes, bytes] = {}
    try:
        while batch := client.getScannerRows(scanner, 30):
            rows.update((r.row, r.columnValues[0].value) for r in batch)
    finally:
        client.closeScanner(scanner)
    return rows


@pytest.fixture(scope="module")
def table(server):
    m = thrift()
    client = server.client()
    try:
        name = m.TTableName(ns=b"default", qualifier=b"kv")
        client.createTable(m.TTableDescriptor(tableName=name, columns=[m.TColumnFamilyDescriptor(name=b"f")]),
                           SPLITS)
        put_rows(client, b"kv", ROWS)
    finally:
        client.close()
    return b"kv"


def test_pre_split_table(server, table):
    assert server.host == "127.0.0.1" and server.port and server.pid and server.gateway.pid
    client = server.client()
    try:
        regions = client.getAllRegionLocations(table)
        assert [(r.regionInfo.startKey, r.regionInfo.endKey) for r in regions] == list(
            zip([b"", *SPLITS], [*SPLITS, b""], strict=True))
        assert {(r.serverName.hostName, r.serverName.port) for r in regions} == {("127.0.0.1",
                                                                                    server.regionserver_port)}
        assert scan(client, table) == ROWS
        assert scan(client, table, startRow=b"h", stopRow=b"p") == {k: v for k, v in ROWS.items() if k[:1] == b"h"}
        m = thrift()
        assert client.deleteMultiple(table, [m.TDelete(row=b"a000"), m.TDelete(row=b"u019")]) == []
        assert client.get(table, m.TGet(row=b"a000")).columnValues == []
        put_rows(client, table, {b"a000": ROWS[b"a000"], b"u019": ROWS[b"u019"]})
    finally:
        client.close()


def test_gateway_restart(server, table):
    from thriftpy2.transport import TTransportException

    before = server.client()
    pid, port, master = server.gateway.pid, server.port, server.pid
    server.restart_gateway()
    assert server.port == port and server.gateway.pid not in (None, pid) and server.pid == master
    with pytest.raises((TTransportException, ConnectionError)):  # the old connection died with the gateway
        before.tableExists(thrift().TTableName(ns=b"default", qualifier=b"kv"))
    before.close()
    client = server.client()
    try:
        assert scan(client, table) == ROWS
    finally:
        client.close()
    server.kill_gateway()
    assert server.gateway.pid is None and server.pid == master
    server.start_gateway()
    client = server.client()
    try:
        assert scan(client, table) == ROWS
    finally:
        client.close()


def test_kill_and_restart_keeps_rows(server, table):
    client = server.client()
    try:
        put_rows(client, table, {b"z000": b"last"})  # acknowledged, then the server is killed at once
    finally:
        client.close()
    pids = server.pid, server.gateway.pid
    server.kill()
    assert server.pid is None and server.gateway.pid is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    server.start()  # same folder and ports: the WAL is replayed
    client = server.client()
    try:
        assert scan(client, table) == {**ROWS, b"z000": b"last"}
    finally:
        client.close()


def test_stop_removes_the_folder(server):
    folder, pids = server.folder, (server.pid, server.gateway.pid)
    assert folder is not None and folder.is_dir()
    server.stop()
    assert server.folder is None and not folder.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_missing_server_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_HBASE_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="make check-hbase"):
        LocalHBase().start()
