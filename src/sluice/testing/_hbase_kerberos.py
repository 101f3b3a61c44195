"""LocalHBase secured by a LocalKdc: HBase's own RPC (master, region server, the gateway's client of them) by SASL
GSSAPI, and the Thrift2 gateway in its HTTP mode requiring SPNEGO from every request.

One service principal `hbase/localhost` serves the master, the region server and the gateway's sign-in to them
(standalone mode runs master and region server in one JVM), `HTTP/localhost` is the gateway's SPNEGO principal; both
keys are in one keytab in the server's conf/ folder (0600). `localhost`, not the address: clients ask for a ticket of
<service>/<the host they connect to>, and HBase's RPC client names a server by its address's canonical host name,
which for 127.0.0.1 is localhost. ZooKeeper stays without SASL (it holds no data in standalone mode). A client
principal `sluice-test` with its own keytab is what LocalHBase.client() and the tests sign in as.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.testing._kdc import LocalKdc
from sluice.testing._site_xml import site_xml

SERVICE_HOST = "localhost"


@dataclass(frozen=True)
class SecuredHBase:
    """What a secured LocalHBase's clients need: the host name to connect to, and a principal with its keytab."""

    host: str
    client_principal: str
    client_keytab: bytes
    krb5_conf: str


def kerberos_settings(kdc: LocalKdc, conf: Path) -> tuple[dict[str, Any], list[str], SecuredHBase]:
    """hbase-site.xml properties and JVM flags securing the server and its gateway by `kdc`, and the client's side."""
    service = kdc.add_principal(f"hbase/{SERVICE_HOST}")
    spnego = kdc.add_principal(f"HTTP/{SERVICE_HOST}")
    keytab = conf / "hbase.keytab"
    keytab.write_bytes(kdc.keytab(service, spnego).read_bytes())
    keytab.chmod(0o600)
    client = kdc.add_principal("sluice-test")
    properties: dict[str, Any] = {
        "hadoop.security.authentication": "kerberos",
        "hbase.security.authentication": "kerberos",
        **{f"hbase.{role}.kerberos.principal": service for role in ("master", "regionserver", "thrift")},
        **{f"hbase.{role}.keytab.file": str(keytab) for role in ("master", "regionserver", "thrift")},
        "hbase.regionserver.thrift.http": True,
        "hbase.thrift.spnego.principal": spnego,
        "hbase.thrift.spnego.keytab.file": str(keytab),
    }
    # Hadoop's UserGroupInformation reads core-site.xml (not hbase-site.xml) before HBase hands it its settings: without
    # this file the processes stay unauthenticated (auth:SIMPLE) and never sign in from the keytab.
    (conf / "core-site.xml").write_text(site_xml({"hadoop.security.authentication": "kerberos"}))
    flags = [f"-Djava.security.krb5.conf={kdc.krb5_conf}", "-Dzookeeper.sasl.client=false"]
    return properties, flags, SecuredHBase(SERVICE_HOST, client, kdc.keytab(client).read_bytes(),
                                           kdc.krb5_conf.read_text())
