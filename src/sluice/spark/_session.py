"""SparkSession set-up that avoids the usual traps (PYSPARK_PYTHON, console noise) without breaking clusters.

What is pinned depends on where the executors run:
- local masters (`local`, `local[N]`, `local[N,R]`, `local-cluster[...]`): executors are this machine, so
  Python workers use this interpreter, the driver listens on loopback only and Spark logs at WARN
  through sluice's log4j2 file;
- any other master (standalone, YARN, Kubernetes, or whatever `spark-submit --master` chose): the
  executors are other machines. Nothing about their interpreter or files is set here: the cluster's
  `spark.pyspark.python` / `PYSPARK_PYTHON` and its own logging apply (docs/deploy.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J = Path(__file__).with_name("log4j2.properties")
DEFAULT_LOCAL_MASTER = "local[2,4]"  # 4 attempts per task, as a cluster gives (spark.task.maxFailures)


def python_worker_env() -> None:
    """Point Spark's Python workers at this interpreter (else they run `python3` from PATH, outside the venv).

    Only right where the workers run on this machine (local masters).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def is_local_master(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def _submitted_master() -> str | None:
    """The master chosen by spark-submit / the pyspark shell (they start the JVM first), else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to the gateway spark-submit already started
    return SparkConf().get("spark.master")


def session(app_name: str = "sluice", master: str | None = None, **conf: str) -> SparkSession:
    """A SparkSession for sluice jobs; see the module docstring for what is set where.

    `master`: None keeps what spark-submit or the pyspark shell chose, else local[2,4] (2 cores; a failed task is
    retried up to 4 times in all, as on a cluster, so transient store faults are retried locally too).
    Extra Spark settings: `session("job", **{"spark.sql.shuffle.partitions": "4"})`; they win over sluice's.
    """
    from pyspark.sql import SparkSession

    from sluice.spark._registry import register

    chosen = master or _submitted_master()
    effective = chosen or DEFAULT_LOCAL_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master or not chosen:
        builder = builder.master(effective)
    settings = {
        # Lets sources push filters down (format("postgres") turns them into its WHERE clause).
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
    }
    if is_local_master(effective):
        if "spark.pyspark.python" not in conf:
            python_worker_env()
        java_opts = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
        settings.update({
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.driver.extraJavaOptions": java_opts,
            "spark.executor.extraJavaOptions": java_opts,
            "spark.ui.enabled": "false",
            # Nothing of a local job should be reachable from other machines.
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
        })
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
