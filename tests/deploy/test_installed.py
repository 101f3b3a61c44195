"""sluice as users install it: the wheel in a fresh virtualenv, formats found by Spark without register()."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.deploy.conftest import run_every_format, spark_env

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_in_a_fresh_virtualenv_writes_and_reads_every_format_without_register(tmp_path, stores):
    source = tmp_path / "source"  # a clean copy: an in-tree build/ folder would hide files the wheel misses
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__",
                                                                "spark-warehouse", "metastore_db"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("sluice-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # sluice's dependencies come from the suite's own (pinned) environment, after the venv's own packages;
    # a path line in a .pth does not run that environment's .pth files, so the checkout is not on sys.path.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)

    assert (site / "sluice" / "spark" / "log4j2.properties").is_file(), "package data missing from the wheel"
    result = run_every_format(python, {"session": "plain", "master": "local[2]", "sql": True, **stores},
                              spark_env(tmp_path / "run", PYSPARK_PYTHON=python))
    assert result["tasks_sluice"].startswith(str(site)), result  # the installed copy, not the checkout
    assert result["sluice_imported"] is False  # the driver's Python never imported sluice
    assert result["sluice_null"] == 100 and result["s2_summary"] == 100
    stored = ("s2", "s2_upsert", "postgres", "postgres_changes", "clickhouse", "tablestore", "sql")
    assert {k: result[k] for k in stored} == dict.fromkeys(stored, True), result
