import re
import subprocess
import sys
from pathlib import Path


def run(*args):
    """`python -m sluice ...`: what the `sluice` script runs."""
    return subprocess.run([sys.executable, "-m", "sluice", *args], capture_output=True, text=True)


def test_formats_and_options_commands():
    assert "sluice_null" in run("formats").stdout.split()
    out = run("options").stdout
    assert "| `sink.batch.max-size` | int | 1000 |" in out
    read_only = run("options", "postgres_changes").stdout
    assert read_only.startswith("Read only.") and "Writing:" not in read_only and "| `slot` |" in read_only
    assert "Lookup joins" not in read_only
    lookups = run("options", "postgres").stdout.split("Lookup joins (sluice.lookup):")[1]
    assert "| `lookup.partial-cache.max-rows` | int | 10000 |" in lookups and "| `table` |" in lookups


def test_unknown_format_is_a_clear_error():
    result = run("options", "nosuch")
    assert result.returncode == 2 and "'nosuch' is not a sluice format" in result.stderr


def test_s2_serve_reads_its_token_from_a_file_and_keeps_it_out_of_the_process_list(tmp_path):
    import asyncio

    import s2_sdk

    token = "file-token-not-for-ps"
    (tmp_path / "token").write_text(token + "\n")
    server = subprocess.Popen([sys.executable, "-m", "sluice.cli", "s2", "serve", "--in-memory", "--port", "0",
                               "--token-file", str(tmp_path / "token")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()  # "... listening on http://127.0.0.1:PORT ...", once the port is bound
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        assert token.encode() not in Path(f"/proc/{server.pid}/cmdline").read_bytes()
        endpoints = s2_sdk.Endpoints(account=url, basin=url)

        async def list_with(given):
            async with s2_sdk.S2(given, endpoints=endpoints, retry=s2_sdk.Retry(max_attempts=1)) as s2:
                return await s2.list_basins()

        asyncio.run(list_with(token))
        try:
            asyncio.run(list_with("wrong"))
        except s2_sdk.S2ServerError as error:
            assert error.status_code == 401
        else:
            raise AssertionError("a wrong token was accepted")
    finally:
        server.terminate()
        server.wait(10)
