import os
import sys

import pytest


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
