"""SparkSession set-up that avoids the usual traps (PYSPARK_PYTHON, console noise)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J = Path(__file__).with_name("log4j2.properties")


def python_worker_env() -> None:
    """Point Spark's Python workers at this interpreter (else they run `python3` from PATH, outside the venv)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def session(app_name: str = "sluice", master: str = "local[2]", **conf: str) -> SparkSession:
    """A SparkSession for sluice jobs: workers use this interpreter, logs at WARN, sluice formats registered.

    Extra Spark settings: `session("job", **{"spark.sql.shuffle.partitions": "4"})`.
    """
    from pyspark.sql import SparkSession

    from sluice.spark._registry import register

    python_worker_env()
    java_opts = f"-Dlog4j2.configurationFile=file:{_LOG4J}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # Lets sources push filters down (format("postgres") turns them into its WHERE clause).
        .config("spark.sql.python.filterPushdown.enabled", "true")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
