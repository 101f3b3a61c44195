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
