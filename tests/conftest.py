import os
import sys
import uuid

import psycopg
import pytest

from sluice.testing import LocalPostgres

# Every Spark JVM the tests start (the suite's session, spark-submit, Spark Connect servers, standalone clusters,
# pipelines) inherits this: C1-only JIT and the serial GC, as the test servers of sluice.testing already run. Those
# JVMs live for seconds to minutes on two saturated cores, where C2's compile threads and the parallel GC's cost more
# CPU than they save (the Spark Connect test: 80 -> 65 CPU-s; PostgreSQL's sink and source tests: 138 -> 119).
# The `java` launcher alone reads JDK_JAVA_OPTIONS; benchmarks (bench/) never set it. An existing value wins.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local SparkSession for the suite: 2 cores, and 2 attempts per task so task retries can be tested."""
    os.environ["SLUICE_STATS_DIR"] = str(tmp_path_factory.mktemp("stats"))
    import sluice
    import sluice.testing

    session = sluice.session(
        "sluice-tests",
        master="local[2,2]",
        **{"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    sluice.testing.register(session)
    assert session.conf.get("spark.pyspark.python") == sys.executable
    yield session
    session.stop()


@pytest.fixture
def small_arrow_batches(spark):
    """The writer receives rows in Arrow batches of this size: small, so it writes while upstream still runs.

    (The JVM -> Python stream is also buffered, 64 KB by default: the test's rows are padded to ~1 KB so
    that batches reach the writer before its input ends.)
    """
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    yield
    spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


class PG:
    """The server under test: its URL, SQL helpers (psycopg, autocommit) and unique table names."""

    def __init__(self, url: str) -> None:
        self.url = url

    def sql(self, query: str, params=None) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def table(self, prefix: str = "t") -> str:
        return f"{prefix}_{uuid.uuid4().hex[:10]}"

    def opts(self, table: str, **more: str) -> dict[str, str]:
        return {"url": self.url, "table": table, **more}


@pytest.fixture(scope="session")
def pg():
    url = os.environ.get("SLUICE_TEST_PG_URL")
    if url:
        yield PG(url)
        return
    # wal_level=logical: the deploy tests stream change capture from it too (a superset of the default, replica).
    with LocalPostgres(settings={"wal_level": "logical"}) as server:
        yield PG(server.url)


@pytest.fixture(scope="session")
def kafka():
    """One single-node Kafka (plaintext) for the suite's modules that need no broker of their own (the connector's,
    sluice doctor's), each test on topics of its own."""
    from sluice.testing import LocalKafka

    with LocalKafka() as server:
        yield server


@pytest.fixture(scope="session")
def secured_kafka():
    """One Kafka that demands SASL (SCRAM-SHA-512) on TLS and a client certificate (ssl.client.auth=required), for
    the connector's and sluice doctor's tests of those settings."""
    from sluice.testing import LocalKafka

    with LocalKafka(sasl="SCRAM-SHA-512", tls=True, client_auth=True, heap_mb=256) as server:
        yield server


@pytest.fixture(scope="session")
def _kafka_cluster_running():
    from sluice.testing import LocalKafkaCluster

    with LocalKafkaCluster(brokers=3) as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster(_kafka_cluster_running):
    """Three Kafka brokers (LocalKafkaCluster) for the tests that kill one, shared (a cluster takes ~20 s to start):
    a broker a test killed is started again after it, so the next test finds all three."""
    yield _kafka_cluster_running
    for broker in _kafka_cluster_running.brokers:
        if broker.pid is None:
            broker.start()


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server process (moto's standalone server) with one bucket, for the whole suite."""
    from sluice.testing import LocalS3

    with LocalS3() as server:
        yield server


# ------------------------------------------------------------------ the capability table of docs/deploy.md
# A test that shows a capability on the running Spark line calls `capability(name, how)`; what passing tests noted
# is written to $SLUICE_TEST_RESULTS, and tools/lines_table.py renders the feature x line table from those files.
_NOTED: dict[str, set[str]] = {}


@pytest.fixture
def capability(request):
    def note(name: str, how: str) -> None:
        request.node.user_properties.append(("capability", (name, how)))

    return note


def pytest_collection_modifyitems(items):
    """The deployment tests (tests/deploy) last, in their order: each starts Spark processes of its own (a cluster, a
    Connect server, a pipeline run), the heaviest minutes of the suite; `make test` runs the older Spark lines' own
    deployment tests beside the main suite's first part, not beside these."""
    items.sort(key=lambda item: item.nodeid.startswith("tests/deploy/"))


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "capability":
                _NOTED.setdefault(value[0], set()).add(value[1])


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SLUICE_TEST_RESULTS")
    if not path:
        return
    import json

    import pyspark

    with open(path, "w") as out:
        json.dump({"pyspark": pyspark.__version__, "exit": int(exitstatus),
                   "capabilities": {name: sorted(how) for name, how in sorted(_NOTED.items())}}, out, indent=1)
