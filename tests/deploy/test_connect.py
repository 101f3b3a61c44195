"""A Spark Connect server (pyspark's own) driven from a client process that is another machine in all that
matters: its own temp dir and SLUICE_STATS_DIR, so nothing the server's tasks write locally reaches it. The client
runs what Connect changes (every_format.CONNECT_STEPS); each format's own code runs on the server as in the plain
session of tests/deploy/test_installed.py, which writes and reads every format on the same line."""

import pytest

from tests.deploy.conftest import DEPLOY_TIMEOUT_S, SPARK_HOME, Process, free_port, run_every_format, spark_env
from tests.deploy.every_format import CONNECT_STEPS

pytestmark = [pytest.mark.spark, pytest.mark.lines, pytest.mark.timeout(DEPLOY_TIMEOUT_S)]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("connect-server")
    port = free_port()
    server = Process([str(SPARK_HOME / "bin" / "spark-submit"), "--master", "local[2]",
                      "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                      "--conf", f"spark.connect.grpc.binding.port={port}",
                      "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                      "--conf", "spark.ui.enabled=false", "spark-internal"],
                     spark_env(home, SPARK_HOME=str(SPARK_HOME)))
    try:
        server.wait_for(r"Spark Connect server started")
        yield {"url": f"sc://127.0.0.1:{port}", "home": home}
    finally:
        server.stop()


def test_a_spark_connect_client_writes_reads_and_streams_with_its_write_summaries(connect_server, stores, tmp_path,
                                                                                 capability):
    client = tmp_path / "client"
    cfg = {"session": "connect", "remote": connect_server["url"], "only": CONNECT_STEPS, **stores}
    result = run_every_format(spark_env(client)["PYSPARK_PYTHON"], cfg, spark_env(client))
    # last_write_summary() came from the server's machine: the client's own stats dir stays empty
    assert result["sluice_null"] == 100 and result["s2_summary"] == 100
    assert not (client / "stats").exists()
    assert (connect_server["home"] / "stats" / "s2.json").is_file()
    assert 1 <= result["one_call_tasks"] <= 4, result  # adaptive execution sized the shuffle, not 200 tasks
    assert result["s2"] is True and result["postgres_changes"] is True, result
    capability("spark connect", "yes")
