import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True)


def test_formats_and_options_commands():
    assert "sluice_null" in run("formats").stdout.split()
    out = run("options").stdout
    assert "| `sink.batch.max-size` | int | 1000 |" in out


def test_unknown_format_is_a_clear_error():
    result = run("options", "nosuch")
    assert result.returncode == 2 and "'nosuch' is not a sluice format" in result.stderr
