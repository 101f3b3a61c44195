"""What a new Python worker pays before it does any work: loading a format's data source (which Spark unpickles in
every planning and task process) must not load pandas. pyarrow loads pandas, a second or more on 2 cores, the
first time it makes a scalar or converts Python values; a module that does so at import time makes every new worker
pay it, even one that only plans a micro-batch. Counted in a fresh interpreter, not timed."""

import subprocess
import sys

from sluice.spark._registry import BUILTIN_FORMATS

PROBE = """
import sys
from sluice.spark._registry import data_source_class
for name in sys.argv[1:]:
    data_source_class(name)
    if "pandas" in sys.modules:
        raise SystemExit(f"loading format {name!r} loaded pandas")
"""


def test_loading_every_formats_data_source_leaves_pandas_unloaded():
    done = subprocess.run([sys.executable, "-c", PROBE, *sorted(BUILTIN_FORMATS)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_probe_sees_pandas_when_a_module_loads_it():
    """Negative control: the same probe, after a pyarrow scalar is made at import time, finds pandas."""
    probe = "import pyarrow as pa; pa.scalar(b'')\n" + PROBE
    done = subprocess.run([sys.executable, "-c", probe, "sluice_null"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "loaded pandas" in done.stderr
