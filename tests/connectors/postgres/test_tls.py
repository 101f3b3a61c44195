"""format("postgres") over TLS with SCRAM passwords, against a server that takes TCP clients only over TLS
(LocalPostgres(tls=True): hostssl ... scram-sha-256, hostnossl ... reject). The CA travels as PEM text in the
options; the certificate and the host name are checked (sslmode=verify-full) and a failure names the host and what
failed, without a retry and without the password; nothing falls back to plaintext.

The same server signs in one user by client certificate only (cert_users: pg_hba's `cert` method, which implies
clientcert=verify-full): ssl.cert-pem and ssl.key-pem as PEM text; no certificate, one of another CA and an expired
one are refused naming the server and the reason, and the key is in no error, plan or repr."""

import os
import stat
from pathlib import Path
from urllib.parse import quote, unquote

import psycopg
import pytest

import sluice
from sluice.connector import OptionError
from sluice.connectors.postgres._options import READ_SPEC
from sluice.connectors.postgres._tls import ca_file
from sluice.testing import LocalPostgres
from sluice.testing._tls import TestCA

PASSWORD = "scram-Pw-7f3c9e1d"


@pytest.fixture(scope="module")
def secured():
    with LocalPostgres(tls=True, password=PASSWORD, settings={"wal_level": "logical", "synchronous_commit": "on"},
                       cert_users=(CERT_USER,)) as server:
        yield server


CERT_USER = "sluice_cert"


@pytest.fixture(scope="module")
def client(secured):
    return secured.client_ca.client_certificate(CERT_USER)


def cert_options(server, certificate, **more):
    """Signed in by the client certificate alone: no password."""
    return {"host": "127.0.0.1", "port": str(server.port), "user": CERT_USER, "dbname": server.dbname,
            "ssl.ca-pem": server.ca_pem, "ssl.cert-pem": certificate.cert_pem, "ssl.key-pem": certificate.key_pem,
            **more}


def as_cert_user(server, certificate, tmp_path):
    """A psycopg connection of the test's own, signed in by `certificate` (files of this machine)."""
    cert, key = certificate.write(tmp_path)
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname=server.dbname, user=CERT_USER,
                           sslmode="verify-full", sslrootcert=str(server.ca_path), sslcert=str(cert),
                           sslkey=str(key), autocommit=True)


def options(server, **more):
    return {"host": "127.0.0.1", "port": str(server.port), "user": server.user, "password": server.password,
            "dbname": server.dbname, "ssl.ca-pem": server.ca_pem, **more}


def _conn(opts):
    from sluice.connectors.postgres._client import Connection

    return Connection.from_options(READ_SPEC.parse({"table": "t", **opts}))


@pytest.mark.spark
def test_a_write_and_a_read_over_verified_tls(spark, secured, capsys):
    with psycopg.connect(secured.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE tls_rw (id bigint PRIMARY KEY, body text)")
    df = spark.range(0, 500, 1, 2).selectExpr("id", "concat('row ', id) AS body")
    sluice.write(df, "postgres", {**options(secured), "table": "tls_rw", "primary-key": "id"})
    read = spark.read.format("postgres").options(**options(secured, table="tls_rw")).load()
    assert sorted(r.id for r in read.collect()) == list(range(500))
    read.explain(True)
    assert PASSWORD not in capsys.readouterr().out
    # The server took these connections over TLS only (hostnossl ... reject): the negative control is plaintext.
    plaintext = {k: v for k, v in options(secured, table="tls_rw").items() if k != "ssl.ca-pem"}
    with pytest.raises(Exception, match="the server takes only TLS connections") as plain:
        spark.read.format("postgres").options(**plaintext).load().collect()
    assert PASSWORD not in str(plain.value)


@pytest.mark.spark
def test_a_wrong_ca_is_refused_naming_the_host_without_a_retry(spark, secured):
    wrong = options(secured, table="pg_class", **{"connect.retries": "5"}) | {"ssl.ca-pem": TestCA("other").pem}
    with pytest.raises(Exception, match=r"postgresql://sluice@127\.0\.0\.1:\d+/sluice: TLS \(verify-full\) refused "
                                        r"the server's certificate: .*certificate verify failed") as refused:
        spark.read.format("postgres").options(**wrong).load().collect()
    assert PASSWORD not in str(refused.value)
    assert "attempt(s)" not in str(refused.value)  # a certificate does not change between attempts


def test_a_host_name_the_certificate_does_not_list_is_refused(secured):
    # hostaddr: connect to 127.0.0.1 but check the certificate against the name the url gives.
    url = f"postgresql://{secured.user}@wrong-name.test:{secured.port}/{secured.dbname}?hostaddr=127.0.0.1"
    conn = _conn({"url": url, "password": PASSWORD, "ssl.ca-pem": secured.ca_pem})
    with pytest.raises(Exception, match=r"wrong-name\.test.*does not match host name \"wrong-name\.test\"") as e:
        conn.connect_psycopg()
    assert PASSWORD not in str(e.value)
    with conn.__class__(**{**conn.__dict__, "host": "127.0.0.1", "params": ()}).connect_psycopg() as ok:  # control
        assert ok.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)


def test_tls_is_asked_explicitly_and_libpq_prefer_is_refused(secured):
    assert _conn(options(secured)).sslmode == "verify-full"  # a CA given: verified
    assert _conn({"url": "postgresql://u@db.example/d?sslmode=verify-full"}).uri().count("sslrootcert=system") == 1
    assert "sslmode=disable" in _conn({"url": "postgresql://u@localhost/d"}).uri()  # said, never libpq's prefer
    # Off this machine, verification is the default (the system's CAs); plaintext only when asked.
    assert "sslmode=verify-full" in _conn({"url": "postgresql://u@db.example/d"}).uri()
    assert _conn({"host": "10.0.0.7"}).uri().count("sslrootcert=system") == 1
    assert "sslmode=disable" in _conn({"url": "postgresql://u@db.example/d?sslmode=disable"}).uri()
    for url, message in [("postgresql://u@h/d?sslmode=prefer", "falls back to plaintext"),
                         ("postgresql://u@h/d?sslmode=allow", "falls back to plaintext"),
                         ("postgresql://u@h/d?sslrootcert=/etc/ca.pem", "a file on the driver"),
                         ("postgresql://u@h/d?sslmode=require", None)]:
        if message is None:
            assert _conn({"url": url}).sslmode == "require"
            continue
        with pytest.raises(OptionError, match=message):
            _conn({"url": url})
    with pytest.raises(OptionError, match="not a path"):
        _conn({"host": "h", "ssl.ca-pem": "/etc/ssl/ca.pem"})
    with pytest.raises(OptionError, match="TLS or plaintext"):
        _conn({"host": "h", "ssl.ca-pem": secured.ca_pem, "sslmode": "disable"})


def test_the_ca_file_is_this_machines_own_and_named_by_its_content(secured):
    path = ca_file(secured.ca_pem)
    assert path.read_text() == secured.ca_pem and ca_file(secured.ca_pem) == path
    assert ca_file(TestCA().pem) != path
    assert "sslrootcert=" + quote(str(path), safe="") in _conn(options(secured)).uri()


def test_change_capture_over_tls_snapshot_and_stream(secured):
    """postgres_changes: its replication connection, the snapshot holder (a process of its own) and the reads all
    connect with the CA of the options (the server takes nothing else)."""
    from sluice.connectors.postgres import PostgresChangesDataSource
    from tests.connectors.postgres.test_changes import batch

    with psycopg.connect(secured.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE tls_cdc (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO tls_cdc SELECT g, 'before' FROM generate_series(1, 50) g")
    source = PostgresChangesDataSource({**options(secured), "table": "tls_cdc"})
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    end, first = batch(reader, start)
    assert sorted(first.column("id").to_pylist()) == list(range(1, 51))  # the snapshot
    reader.commit(end)
    with psycopg.connect(secured.url, autocommit=True) as conn:
        conn.execute("UPDATE tls_cdc SET v = 'after' WHERE id <= 5")
    end2, changes = batch(reader, end)
    assert sorted((r["_op"], r["id"], r["v"]) for r in changes.to_pylist()) == [("update", i, "after")
                                                                                for i in range(1, 6)]
    reader.commit(end2)
    reader.stop()


def test_tls_asked_of_a_server_without_it_is_refused_never_downgraded(pg):
    conn = _conn({"url": pg.url, "sslmode": "verify-full"})
    with pytest.raises(Exception, match=r"127\.0\.0\.1:\d+/\w+: sslmode=verify-full asks for TLS, but the server does "
                                        "not offer it; sluice does not fall back to plaintext"):
        conn.connect_psycopg()
    with _conn({"url": pg.url}).connect_psycopg() as plain:  # the control: the same server, plaintext asked
        assert plain.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.spark
def test_a_client_certificate_signs_in_to_write_and_read(spark, secured, client, capsys):
    with psycopg.connect(secured.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE mtls_rw (id bigint PRIMARY KEY, body text); GRANT ALL ON mtls_rw TO {CERT_USER}")
    df = spark.range(0, 100, 1, 2).selectExpr("id", "concat('row ', id) AS body")
    sluice.write(df, "postgres", {**cert_options(secured, client), "table": "mtls_rw", "primary-key": "id"})
    read = spark.read.format("postgres").options(**cert_options(secured, client, table="mtls_rw")).load()
    assert sorted(r.id for r in read.collect()) == list(range(100))
    read.explain(True)
    assert client.key_pem.strip() not in capsys.readouterr().out
    conn = _conn(cert_options(secured, client))
    assert client.key_pem.strip() not in repr(conn) + repr(READ_SPEC.parse({"table": "t", **cert_options(secured,
                                                                                                         client)}))
    with psycopg.connect(secured.url) as check:  # the server saw the certificate: CN = the user
        assert check.execute("SELECT count(*) FROM mtls_rw").fetchone() == (100,)


@pytest.mark.spark
@pytest.mark.parametrize("case", ["no certificate", "another CA", "expired"])
def test_a_missing_foreign_or_expired_certificate_is_refused_by_name(spark, secured, client, case):
    """The negative controls: the same options as the write above, but for the certificate."""
    opts = cert_options(secured, client, table="pg_class", **{"connect.retries": "5"})
    if case == "no certificate":
        del opts["ssl.cert-pem"], opts["ssl.key-pem"]
        reason = r"the server requires a client certificate .*connection requires a valid client certificate"
        key = client.key_pem
    else:
        other = (TestCA("other client CA").client_certificate(CERT_USER) if case == "another CA"
                 else secured.client_ca.client_certificate(CERT_USER, expired=True))
        opts |= {"ssl.cert-pem": other.cert_pem, "ssl.key-pem": other.key_pem}
        refused = r"TLS \(verify-full\): the server refused the client certificate \(ssl\.cert-pem\): "
        reason = refused + {"another CA": r"the server does not trust the CA that signed it.*alert unknown ca",
                            "expired": r"it has expired: renew it.*alert certificate expired"}[case]
        key = other.key_pem
    with pytest.raises(Exception, match=r"cannot connect to postgresql://sluice_cert@127\.0\.0\.1:\d+/sluice: "
                                        + reason) as refused:
        spark.read.format("postgres").options(**opts).load().collect()
    assert key.strip() not in str(refused.value)
    assert "attempt(s)" not in str(refused.value)  # a certificate does not change between attempts


def test_the_key_is_a_file_only_this_user_reads_in_a_folder_of_its_own(secured, client):
    uri = _conn(cert_options(secured, client)).uri()
    assert client.key_pem.strip() not in uri and "sslcert=" in uri
    key = next(v for k, v in (p.split("=", 1) for p in uri.split("?", 1)[1].split("&")) if k == "sslkey")
    path = Path(unquote(key))
    assert path.read_text() == client.key_pem
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.parent.stat().st_uid == os.geteuid()
    with pytest.raises(OptionError, match=r"without 'ssl\.key-pem'"):
        _conn({"host": "h", "ssl.cert-pem": client.cert_pem})
    with pytest.raises(OptionError, match="not a path") as as_path:
        _conn({"host": "h", "ssl.cert-pem": client.cert_pem, "ssl.key-pem": "/etc/ssl/private/client.key"})
    assert "/etc/ssl/private/client.key" not in str(as_path.value)  # the key option's value is never echoed
    with pytest.raises(OptionError, match="needs TLS"):
        _conn({"host": "h", "sslmode": "disable", "ssl.cert-pem": client.cert_pem, "ssl.key-pem": client.key_pem})


def test_change_capture_signed_in_by_certificate(secured, client, tmp_path):
    """postgres_changes with the certificate alone: the replication connection, the snapshot holder (a process of
    its own, given the key's file path, never the key) and the reads."""
    from sluice.connectors.postgres import PostgresChangesDataSource
    from tests.connectors.postgres.test_changes import batch

    with as_cert_user(secured, client, tmp_path) as conn:  # the owner of its table (publications need one)
        conn.execute("CREATE TABLE mtls_cdc (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO mtls_cdc SELECT g, 'before' FROM generate_series(1, 20) g")
    source = PostgresChangesDataSource({**cert_options(secured, client), "table": "mtls_cdc"})
    reader = source.streamReader(source.schema())
    end, first = batch(reader, reader.initialOffset())
    assert sorted(first.column("id").to_pylist()) == list(range(1, 21))  # the snapshot
    reader.commit(end)
    with as_cert_user(secured, client, tmp_path) as conn:
        conn.execute("UPDATE mtls_cdc SET v = 'after' WHERE id <= 3")
    end2, changes = batch(reader, end)
    assert sorted((r["_op"], r["id"]) for r in changes.to_pylist()) == [("update", i) for i in range(1, 4)]
    reader.commit(end2)
    reader.stop()
