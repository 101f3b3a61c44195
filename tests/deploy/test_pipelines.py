"""Spark Declarative Pipelines: a project run with `spark-pipelines run` whose flows read an S2 stream and
write it through dp.create_sink into a sluice format of each kind: a stream (S2), a database table (PostgreSQL) and
the table store (Spark names each flow's query: option queryName). Each flow is a streaming query of its own, run one
after another; the other formats' streaming writes are tested outside a pipeline."""

import json
import uuid

import pytest

import sluice
from sluice.spark import _compat
from tests.deploy.conftest import DEPLOY_TIMEOUT_S, SPARK_HOME, Process, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.lines, pytest.mark.timeout(DEPLOY_TIMEOUT_S)]

FLOWS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession

spark = SparkSession.active()  # Spark 4.2+ also puts `spark` into a definitions file; 4.1 does not

S2 = {s2}
STORES = {stores}
TAG = "{tag}"


def source():
    return (spark.readStream.format("s2").options(**S2).option("s2.streams", "src").option("format", "json")
            .schema("id long, name string").load())


SINKS = {{
    "s2_sink": ("s2", {{**S2, "s2.stream": "copy", "s2.create-streams": "true"}}),
    "pg_sink": ("postgres", {{"url": STORES["pg"], "table": "pl_" + TAG, "create-table": "true"}}),
    "table_sink": ("tablestore", {{"table": "pl_" + TAG, "warehouse": STORES["warehouse"], "meta": STORES["meta"]}}),
}}

for name, (fmt, options) in SINKS.items():
    dp.create_sink(name, fmt, options)

    @dp.append_flow(target=name, name="to_" + name)
    def flow():
        return source()
'''


def test_a_pipeline_reads_s2_and_writes_a_stream_a_table_and_the_table_store(spark, stores, tmp_path, capability):
    if not _compat.HAS_PIPELINES:  # Spark 4.0 has neither pyspark.pipelines nor the spark-pipelines command
        assert not (SPARK_HOME / "bin" / "spark-pipelines").exists()
        since = _compat.since("declarative pipelines")
        capability("declarative pipelines", f"not in Spark {_compat.SPARK_LINE} (Spark {since}+)")
        return
    tag = uuid.uuid4().hex[:8]
    s2 = {"s2.basin": f"pipeline-{tag}", "s2.endpoints.account": stores["s2"],
          "s2.endpoints.basin": stores["s2"], "s2.auth-token": "local"}
    rows = spark.range(0, 100, 1, 2).selectExpr("id", "concat('n', id) AS name")
    sluice.write(rows, "s2", {**s2, "s2.stream": "src", "s2.create-basin": "true", "s2.create-streams": "true"})

    project = tmp_path / "project"
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(
        f"name: sluice_pipeline\nstorage: file://{tmp_path / 'storage'}\n"
        # One flow at a time. Concurrent flows failed on Spark 4.1 under make test's load in two ways: Python
        # workers spawned at once missed the 10 s they have to connect back to the JVM (PythonWorkerFactory, not
        # configurable), and, with 2 or 5 flows, a task failed to serialize ("Illegal size 4 of collection,
        # expected 5": a collection shared by the flows changed while one was serialized). Sequential flows took
        # as long here (158 s against 140-198 s).
        "configuration:\n  spark.sql.pipelines.execution.maxConcurrentFlows: '1'\n"
        "libraries:\n  - glob:\n      include: transformations/**\n")
    (project / "transformations" / "flows.py").write_text(
        FLOWS.format(s2=json.dumps(s2), stores=json.dumps(stores), tag=tag))
    run = Process([str(SPARK_HOME / "bin" / "spark-pipelines"), "run"],
                  spark_env(tmp_path / "run", SPARK_HOME=str(SPARK_HOME)), cwd=project)
    try:
        assert run.proc.wait(DEPLOY_TIMEOUT_S - 60) == 0, run.explain()
    finally:
        run.stop()
    assert "Run is COMPLETED" in run.output, run.explain()

    expected = list(range(100))
    copy = spark.read.format("s2").options(**s2).option("s2.streams", "copy").option("format", "json") \
        .schema("id long, name string").load()
    assert sorted(r.id for r in copy.collect()) == expected
    pg_rows = spark.read.format("postgres").option("url", stores["pg"]).option("table", f"pl_{tag}").load()
    assert sorted(r.id for r in pg_rows.collect()) == expected
    table = spark.read.format("tablestore").options(table=f"pl_{tag}", warehouse=stores["warehouse"],
                                                    meta=stores["meta"]).load()
    assert sorted(r.id for r in table.collect()) == expected
    capability("declarative pipelines", "yes")
