"""format("hbase") signed in by Kerberos: HBase and its Thrift2 gateway secured by a real MIT KDC (LocalKdc), the
gateway in its HTTP mode requiring SPNEGO from every request. Written and read back through Spark with the principal
and its keytab given as options (base64, a secret); refused, naming HBase, the principal and the KDC's reason, for a
keytab whose key was changed since and for a principal that has expired; a ticket near its end replaced by signing in
again from the keytab; the keytab in no error, log or plan, and on no path once the sign-in is done. The negative
control: a request without a Kerberos token is refused by the gateway (401), so the tests' sign-in is what lets the
writes through."""

import base64
import http.client
import logging
import os
import tempfile

import pytest

import sluice
from sluice.connectors.hbase._client import Connection
from sluice.connectors.hbase._kerberos import Kerberos, credentials
from sluice.testing import LocalHBase, LocalKdc
from tests.connectors.hbase.conftest import HBase

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def secured():
    with LocalKdc() as kdc, LocalHBase(kdc=kdc) as server:
        k = server.kerberos
        helper = HBase(server)
        # The helper's own calls (tables, reading back) sign in too, as the test principal.
        object.__setattr__(helper, "conn", Connection((k.host,), server.port, 60.0,
                                                      kerberos=Kerberos(k.client_principal, k.client_keytab,
                                                                        krb5_conf=k.krb5_conf)))
        yield kdc, helper


def options(helper: HBase, table: str, principal: str, keytab: bytes) -> dict[str, str]:
    k = helper.server.kerberos
    return {"host": k.host, "port": str(helper.server.port), "table": table, "rowkey": "id", "family": "d",
            "kerberos.principal": principal, "kerberos.keytab": base64.b64encode(keytab).decode(),
            "kerberos.krb5-conf": k.krb5_conf}


def test_a_write_and_a_read_signed_in_by_a_keytab_given_as_an_option(spark, secured, caplog):
    kdc, helper = secured
    etl = kdc.add_principal("etl")
    keytab = kdc.keytab(etl).read_bytes()
    table = helper.table()
    opts = options(helper, table, etl, keytab)
    df = spark.createDataFrame([(i, f"v{i}") for i in range(100)], "id long, note string")
    # sluice's own logs (py4j's DEBUG log echoes every command sent to the JVM, options included, as for any secret).
    with caplog.at_level(logging.DEBUG, logger="sluice"):
        sluice.write(df, "hbase", opts)
        assert len(helper.rows(table)) == 100
        read = spark.read.format("hbase").options(**opts).schema("id long, note string").load()
        assert sorted(tuple(r) for r in read.collect()) == [(i, f"v{i}") for i in range(100)]
        plan = read._jdf.queryExecution().toString()
    secret = opts["kerberos.keytab"]
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("sluice"))
    assert secret not in plan and secret[:24] not in plan and secret not in logged
    assert "keytab=<redacted>" in repr(helper.conn) and str(keytab) not in repr(helper.conn)


def test_a_keytab_whose_key_changed_is_refused_naming_hbase_and_the_reason(spark, secured):
    kdc, helper = secured
    rotated = kdc.add_principal("rotated")
    old = kdc.keytab(rotated).read_bytes()
    kdc.kadmin(f"cpw -randkey {rotated}")  # the keytab no longer holds the principal's key
    table = helper.table()
    df = spark.createDataFrame([(1, "x")], "id long, note string")
    opts = options(helper, table, rotated, old)
    with pytest.raises(Exception, match=rf"Kerberos sign-in for HBase as {rotated} was refused: .*(Preauthentication "
                                        r"failed|Password incorrect|integrity).*kerberos.keytab") as refused:
        sluice.write(df, "hbase", opts)
    assert opts["kerberos.keytab"] not in str(refused.value)
    assert helper.rows(table) == {}


def test_an_expired_principal_is_refused_naming_hbase_and_the_reason(spark, secured):
    kdc, helper = secured
    gone = kdc.add_principal("gone")
    keytab = kdc.keytab(gone).read_bytes()
    kdc.kadmin(f'modprinc -expire "2020-01-01 00:00:00 UTC" {gone}')
    table = helper.table()
    df = spark.createDataFrame([(1, "x")], "id long, note string")
    opts = options(helper, table, gone, keytab)
    with pytest.raises(Exception, match=rf"Kerberos sign-in for HBase as {gone} was refused: .*expired") as refused:
        sluice.write(df, "hbase", opts)
    assert opts["kerberos.keytab"] not in str(refused.value)
    assert helper.rows(table) == {}


def test_the_keytab_is_on_no_path_once_signed_in(secured):
    kdc, helper = secured
    principal = kdc.add_principal("private")
    keytab = kdc.keytab(principal).read_bytes()
    folder = tempfile.gettempdir()
    before = {n for n in os.listdir(folder) if n.startswith("sluice-krb5-")}
    creds = credentials(Kerberos(principal, keytab, krb5_conf=helper.server.kerberos.krb5_conf))
    assert str(creds.name) == principal and creds.lifetime > 0
    assert {n for n in os.listdir(folder) if n.startswith("sluice-krb5-") and n not in before} <= {
        n for n in os.listdir(folder) if n.startswith("sluice-krb5-conf-")}  # only the krb5.conf's folder stays


def test_a_ticket_near_its_end_is_replaced_by_signing_in_again_from_the_keytab(secured):
    """A ticket with under REFRESH_S left is not used: the process signs in again from the keytab's bytes (the file is
    long gone), and the gateway takes the new ticket. The control: a principal whose tickets last an hour keeps its
    first sign-in."""
    kdc, helper = secured
    conf = helper.server.kerberos.krb5_conf
    short = kdc.add_principal("short")
    kdc.kadmin(f'modprinc -maxlife "2 minutes" {short}')  # under REFRESH_S (5 min) from the start
    brief = Kerberos(short, kdc.keytab(short).read_bytes(), krb5_conf=conf)
    first = credentials(brief)
    assert first.lifetime <= 120 and credentials(brief) is not first
    client = Connection((helper.server.kerberos.host,), helper.server.port, 30.0, kerberos=brief)
    assert {d.name for d in client.call("listNamespaceDescriptors")} >= {"default", "hbase"}
    long = kdc.add_principal("long")
    lasting = Kerberos(long, kdc.keytab(long).read_bytes(), krb5_conf=conf)
    assert credentials(lasting) is credentials(lasting)


def test_without_a_kerberos_token_the_gateway_refuses(secured):
    """The negative control: the same request without an Authorization header is refused (401, Negotiate asked)."""
    _, helper = secured
    link = http.client.HTTPConnection(helper.server.kerberos.host, helper.server.port, timeout=30)
    try:
        link.request("POST", "/", b"\x80\x01\x00\x01", {"Content-Type": "application/x-thrift"})
        answer = link.getresponse()
        answer.read()
    finally:
        link.close()
    assert answer.status == 401 and answer.getheader("WWW-Authenticate") == "Negotiate"
