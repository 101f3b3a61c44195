"""`sluice doctor` through the jobs' own secured settings: a PostgreSQL that takes TCP clients over TLS only and signs
one user in by client certificate alone (LocalPostgres(tls=True, cert_users=...): pg_hba's `cert` method), reached
from a --postgres-options file of format("postgres")'s own options (the CA, the certificate and its key as PEM
text). The doctor finds and removes what a stopped job left there; without the certificate it fails naming the
server and the reason, no traceback. The key's text is in no output. The options file's checks (the format's own
declarations: did-you-mean, secrets unshown; the Kafka connector's `kafka.*` too) need no server."""

import json
import uuid

import pytest

from sluice import OptionError
from sluice.cli import main as cli
from sluice.doctor import Doctor, Stores
from sluice.doctor._reach import kafka_client, parse_properties, postgres_connection, read_options_file
from sluice.meta import MetaService
from sluice.testing import LocalPostgres
from sluice.testing._tls import TestCA
from tests.connectors.postgres.test_changes import sql
from tests.doctor.test_postgres import stage

CERT_USER = "sluice_cert"


@pytest.fixture(scope="module")
def secured():
    with LocalPostgres(tls=True, settings={"wal_level": "logical"}, cert_users=(CERT_USER,)) as server:
        yield server


@pytest.fixture(scope="module")
def client(secured):
    return secured.client_ca.client_certificate(CERT_USER)


def properties(values):
    """A Java properties file of `values`, each PEM's lines escaped (\\n) and continued (a backslash at line end)."""
    return "# the doctor's options\n" + "".join(
        f"{key} = " + value.strip().replace("\n", "\\n\\\n    ") + "\n" for key, value in values.items())


def cert_options(server, certificate):
    """format("postgres")'s options of a job signed in by its certificate alone (no password), and one option the
    doctor leaves aside (a job's own file serves)."""
    return {"host": "127.0.0.1", "port": str(server.port), "user": CERT_USER, "dbname": server.dbname,
            "ssl.ca-pem": server.ca_pem, "ssl.cert-pem": certificate.cert_pem, "ssl.key-pem": certificate.key_pem,
            "table": "public.orders"}


def staging_table(server, table):
    """The staging table a transactional write into `table` makes (as in test_postgres), by the server's owner."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from sluice.connectors.postgres import Connection
    from sluice.connectors.postgres._options import WRITE_SPEC, WriteOptions
    from sluice.connectors.postgres._table import prepare_target
    from sluice.spark._compat import to_arrow_schema

    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    opts = WRITE_SPEC.parse({"host": "127.0.0.1", "port": str(server.port), "user": server.user,
                             "password": server.password, "dbname": server.dbname, "ssl.ca-pem": server.ca_pem,
                             "table": table, "create-table": "true", "sink.mode": "global-ordered",
                             "sink.transactional": "true"})
    return prepare_target(Connection.from_options(opts), WriteOptions.of(opts), schema, to_arrow_schema(schema),
                          overwrite=False, staged=True).stage_table


def test_the_doctor_signs_in_by_certificate_finds_and_removes_a_stopped_jobs_leftovers(secured, client, tmp_path,
                                                                                      capsys):
    meta_url = str(tmp_path / "meta.db")
    meta = MetaService(meta_url)
    suffix = uuid.uuid4().hex[:8]
    query = str(uuid.uuid4())
    job = meta.register_job("to-pg", sources=[], sinks=["orders_copy"], query_id=query)
    meta.finish_job(job.job_id)
    staging = staging_table(secured, f"orders_copy_{suffix}")
    stage(secured.url, staging, query, 3)
    slot = f"sluice_doctor_{suffix}"
    sql(secured.url, f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')",
        f"GRANT SELECT, DELETE ON {staging} TO {CERT_USER}")
    options = tmp_path / "pg.properties"
    options.write_text(properties(cert_options(secured, client)))
    try:
        assert cli(["doctor", "--meta", meta_url, "--postgres-options", str(options), "--fix", "--yes"]) == 0
        captured = capsys.readouterr()
        where = f"in postgresql://{CERT_USER}@127.0.0.1:{secured.port}/{secured.dbname}"
        assert f"postgres-slot  {slot}  {where}" in captured.out
        assert f"postgres-staged-rows  public.{staging} write {query}  {where}" in captured.out
        assert f"owner: job {job.job_id} (to-pg), finished" in captured.out
        assert f"done: postgres-staged-rows public.{staging} write {query}: deleted 3 staged row(s)" in captured.out
        assert f"not done: postgres-slot {slot}: left as it is" in captured.out, "no job owns it: asked, no terminal"
        assert client.key_pem.strip() not in captured.out + captured.err
        assert sql(secured.url, f"SELECT count(*) FROM {staging}") == [(0,)]
        # The session was the certificate's: the server saw CN = the user, over TLS.
        doctor = Doctor(meta_url, Stores(postgres_options=str(options)))
        with doctor._pg.connect_psycopg() as pg:
            assert pg.execute("SELECT current_user, ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) "
                              "WHERE pid = pg_backend_pid()").fetchone() == (CERT_USER, True)
        assert client.key_pem.strip() not in repr(doctor._pg)
    finally:
        sql(secured.url, f"SELECT pg_drop_replication_slot('{slot}')")


def test_without_the_certificate_the_doctor_names_the_server_and_the_reason(secured, client, tmp_path, capsys):
    """The negative control: the same options, as JSON, but for the certificate and its key."""
    opts = {k: v for k, v in cert_options(secured, client).items() if k not in ("ssl.cert-pem", "ssl.key-pem")}
    options = tmp_path / "pg.json"
    options.write_text(json.dumps(opts))
    assert cli(["doctor", "--meta", str(tmp_path / "meta.db"), "--postgres-options", str(options)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"sluice: cannot connect to postgresql://{CERT_USER}@127.0.0.1:{secured.port}/"
                                   f"{secured.dbname}: the server requires a client certificate (")
    assert "Traceback" not in captured.err and not captured.out
    # Another CA's certificate: refused by the server's TLS alert, named, its key in no message.
    other = TestCA("another client CA").client_certificate(CERT_USER)
    options.write_text(json.dumps({**opts, "ssl.cert-pem": other.cert_pem, "ssl.key-pem": other.key_pem}))
    assert cli(["doctor", "--meta", str(tmp_path / "meta.db"), "--postgres-options", str(options)]) == 2
    captured = capsys.readouterr()
    assert "the server refused the client certificate (ssl.cert-pem): the server does not trust the CA" \
        in captured.err
    assert other.key_pem.strip() not in captured.err + captured.out


def test_the_options_file_is_checked_by_the_formats_own_declarations(client, tmp_path):
    key = client.key_pem
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"host": "db.example", "ssl.cert-pem": client.cert_pem, "ssl.key-pen": key}))
    with pytest.raises(OptionError, match=rf"the PostgreSQL options file {typo}: unknown option 'ssl.key-pen' for "
                                          r"format 'postgres'. Did you mean 'ssl.key-pem'\?") as refused:
        postgres_connection(None, str(typo))
    assert key.strip() not in str(refused.value)
    not_pem = tmp_path / "path.json"
    not_pem.write_text(json.dumps({"host": "db.example", "ssl.cert-pem": client.cert_pem, "ssl.key-pem": "/k/x.key"}))
    with pytest.raises(OptionError, match="must be the private key as PEM text") as refused:
        postgres_connection(None, str(not_pem))
    assert "/k/x.key" not in str(refused.value)
    with pytest.raises(OptionError, match="from this machine's file system only"):
        read_options_file("s3://bucket/pg.json", "PostgreSQL")
    with pytest.raises(OptionError, match="the PostgreSQL URL given carries a password"):
        postgres_connection("postgresql://app:hunter2@db/app", None)
    with pytest.raises(OptionError, match=r"the PostgreSQL URL given and option 'url' of the options file .* both "
                                          "name the server"):
        both = tmp_path / "url.json"
        both.write_text(json.dumps({"url": "postgresql://app@db/app"}))
        postgres_connection("postgresql://app@db/app", str(both))
    # The control: the same file with the right name gives the certificate's connection, its key unshown.
    typo.write_text(json.dumps({"host": "db.example", "ssl.cert-pem": client.cert_pem, "ssl.key-pem": key,
                                "sink.mode": "global-ordered", "slot": "s"}))
    conn = postgres_connection(None, str(typo))
    assert (conn.host, conn.sslmode, conn.key_pem) == ("db.example", "verify-full", key)
    assert key.strip() not in repr(conn)

    # Kafka: kafka.* is librdkafka's, checked by librdkafka as the jobs' are (no broker asked).
    kafka = tmp_path / "kafka.properties"
    kafka.write_text(properties({"kafka.bootstrap.servers": "broker:9093", "kafka.security.protocol": "SSL",
                                 "kafka.ssl.certificate.pem": client.cert_pem, "kafka.ssl.key.pem": key,
                                 "kafka.ssl.ca.pen": client.cert_pem, "subscribe": "orders"}))
    with pytest.raises(OptionError, match=r"the Kafka client refuses the kafka.\* settings: .*ssl.ca.pen") as refused:
        kafka_client(None, str(kafka))
    assert key.strip() not in str(refused.value)
    kafka.write_text(kafka.read_text().replace("kafka.ssl.ca.pen", "kafka.ssl.ca.pem"))
    reach = kafka_client(None, str(kafka))
    settings = reach.client
    assert settings["ssl.key.pem"] == key.strip() and settings.bootstrap_servers == "broker:9093"
    assert "subscribe" not in settings and key.strip() not in repr(reach)
    assert reach.timeout_ms == 15_000 and kafka_client("broker:9093", None).timeout_ms == 15_000
    kafka.write_text("kafka.bootstrap.servers=broker:9093\ntimeout-ms=2000\n")
    assert kafka_client(None, str(kafka)).timeout_ms == 2000, "the source's timeout-ms bounds the doctor's requests"
    with pytest.raises(OptionError, match=r"unknown option 'bootstrap.servers' for format 'sluice_kafka'. Did you "
                                          r"mean 'kafka.bootstrap.servers'\?"):
        kafka.write_text("bootstrap.servers=broker:9093\n")
        kafka_client(None, str(kafka))


def test_a_properties_file_reads_as_java_reads_it():
    text = ("# comment\n! another\n  a = 1\nb:2\nc 3\nd=x\\\n   y\ne=\\u0041\\n\\\\\nf=\\=:\\#\n\n"
            "pem=-----BEGIN-----\\n\\\n    QUJD\\n\\\n    -----END-----\n")
    assert parse_properties(text) == {"a": "1", "b": "2", "c": "3", "d": "xy", "e": "A\n\\", "f": "=:#",
                                      "pem": "-----BEGIN-----\nQUJD\n-----END-----"}
