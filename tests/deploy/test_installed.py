"""sluice as users install it: the wheel in a fresh virtualenv, formats found by Spark without register().

Two ways in: from the checkout (the main suite), the wheel is built and put into a new virtualenv; on an older Spark
line (`make test-spark-4.0` and friends), this interpreter's environment is that fresh virtualenv: the line's pyspark
from PyPI, the wheel named by $SLUICE_TEST_WHEEL installed next to it, and no checkout on the path.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark
import pytest

from tests.deploy.conftest import DEPLOY_TIMEOUT_S, STORED, run_every_format, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.lines, pytest.mark.timeout(DEPLOY_TIMEOUT_S)]
ROOT = Path(__file__).resolve().parents[2]


def wheel_in_a_fresh_virtualenv(tmp_path: Path) -> tuple[str, Path, Path]:
    """(python, its site-packages, the wheel) of an environment holding the wheel and nothing of the checkout."""
    given = os.environ.get("SLUICE_TEST_WHEEL")
    if given:
        assert not (ROOT / "src" / "sluice").exists(), "an installed-wheel run must not see the checkout's sluice"
        return sys.executable, Path(sysconfig.get_paths()["purelib"]), Path(given)
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
    return python, site, wheel


def pip_would_install(python: str, requirement: str, tmp_path: Path) -> dict[str, str]:
    """{name: version} that `pip install requirement` would install or replace in `python`'s environment."""
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}  # as a user runs pip: no pins of ours
    subprocess.run([python, "-m", "pip", "install", "--dry-run", "-q", "--report", str(report), requirement],
                   check=True, env=env)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"]
            for item in json.loads(report.read_text())["install"]}


def test_the_wheel_in_a_fresh_virtualenv_writes_and_reads_every_format_without_register(tmp_path, stores, capability):
    python, site, wheel = wheel_in_a_fresh_virtualenv(tmp_path)
    # pip leaves the environment's pyspark alone, with and without the `spark` extra (pyspark>=4.0).
    for requirement in (str(wheel), f"{wheel}[spark]"):
        assert "pyspark" not in pip_would_install(python, requirement, tmp_path), requirement
    capability("install next to this pyspark", "yes")

    assert (site / "sluice" / "spark" / "log4j2.properties").is_file(), "package data missing from the wheel"
    result = run_every_format(python, {"session": "plain", "master": "local[2]", "sql": True, **stores},
                              spark_env(tmp_path / "run", PYSPARK_PYTHON=python))
    assert result["pyspark"] == pyspark.__version__, result
    assert result["tasks_sluice"].startswith(str(site)), result  # the installed copy, not the checkout
    assert result["sluice_imported"] is False  # the driver's Python never imported sluice
    assert result["sluice_null"] == 100 and result["s2_summary"] == 100
    capability("zero-registration", "yes")
    stored = (*STORED, "sql")
    assert {k: result[k] for k in stored} == dict.fromkeys(stored, True), result
    capability("batch every format", "yes")
    capability("sql views", "yes")
    capability("change capture with restart", "yes")
