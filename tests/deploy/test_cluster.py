"""A Spark standalone cluster (pyspark's own master and two workers on loopback, each its own work and temp
dirs): every format written and read by a driver that made its session with sluice.session(master=...)."""

import stat
import sys

import pytest

from tests.deploy.conftest import DEPLOY_TIMEOUT_S, SPARK_HOME, STORED, Process, free_port, run_every_format, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.lines, pytest.mark.timeout(DEPLOY_TIMEOUT_S)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("cluster")
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    started = []
    try:
        master = Process([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(port), "--webui-port", str(free_port())],
                         spark_env(base / "master", SPARK_HOME=str(SPARK_HOME)))
        started.append(master)
        master.wait_for(r"I have been elected leader")
        for i in range(2):
            home = base / f"worker{i}"
            worker = Process([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                              "--cores", "1", "--memory", "1g", "--work-dir", str(home / "work"),
                              "--webui-port", str(free_port()), url],
                             spark_env(home, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_DIRS=str(home / "local")))
            started.append(worker)
        for worker in started[1:]:
            worker.wait_for(r"Successfully registered with master")
        yield url
    finally:
        for process in reversed(started):
            process.stop()


def test_every_format_on_a_standalone_cluster_with_the_clusters_own_python(cluster, stores, tmp_path, capability):
    # The cluster's interpreter (as a cluster's spark-env.sh sets it): a wrapper that labels its tasks.
    # sluice.session() must leave it alone on a non-local master (it used to pin the driver's interpreter).
    cluster_python = tmp_path / "cluster-python"
    cluster_python.write_text(f'#!/bin/sh\nexport SLUICE_TEST_PYTHON_LABEL=cluster\nexec "{sys.executable}" "$@"\n')
    cluster_python.chmod(cluster_python.stat().st_mode | stat.S_IEXEC)
    cfg = {"session": "sluice", "master": cluster, "conf": {"spark.executor.memory": "512m", "spark.cores.max": "2"},
           **stores}
    env = spark_env(tmp_path / "driver", PYSPARK_PYTHON=str(cluster_python))
    result = run_every_format(str(cluster_python), cfg, env)
    assert result["tasks_python"] == "cluster", result
    assert result["one_call_tasks"] == 4, result  # the input's 4 partitions, not spark.sql.shuffle.partitions
    assert result["sluice_null"] == 100 and result["s2_summary"] == 100
    assert {k: result[k] for k in STORED} == dict.fromkeys(STORED, True), result
    capability("standalone cluster", "yes")
