"""Every operation of S2's published OpenAPI description, fuzzed with schemathesis against the local server with
authentication: whatever the input, the answer is never a 5xx. A fixed seed keeps CI repeatable; run
`schemathesis run` by hand (command in docs/s2local.md) with other seeds to look further.

Budget: at most 25 generated cases per operation (--max-examples) in each of schemathesis 4's phases (examples,
coverage, fuzzing, stateful), each request at most 20 s (--request-timeout), unary read waits cut to 1 s
(SLUICE_S2_MAX_UNARY_WAIT_S). The whole test took 60 s on a busy 2-core machine; schemathesis gets 200 s
(SCHEMATHESIS_TIMEOUT_S, subprocess.TimeoutExpired past it) inside the test's own 240 s (pytest-timeout)."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import s2_sdk

from sluice.s2local import LocalS2

SPEC = Path(__file__).resolve().parents[3] / "shared" / "specs" / "s2" / "openapi.json"
TOKEN = "fuzz-admin-token"
SCHEMATHESIS_TIMEOUT_S = 200


@pytest.mark.timeout(240)
def test_no_input_gets_a_server_error(tmp_path, monkeypatch):
    assert SPEC.is_file(), f"S2's OpenAPI description is expected at {SPEC} (../shared beside the checkout)"
    monkeypatch.setenv("SLUICE_S2_MAX_UNARY_WAIT_S", "1")  # generated `wait` values would hold requests 60 s
    with LocalS2(tmp_path / "s2", token=TOKEN) as server:
        async def seed_data():
            async with s2_sdk.S2(TOKEN, endpoints=server.endpoints) as s2:
                await s2.create_basin("fuzz-basin-1")
                await s2.basin("fuzz-basin-1").create_stream("s")
                await s2.basin("fuzz-basin-1").stream("s").append(
                    s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"x")] * 3))

        asyncio.run(seed_data())
        done = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "run", str(SPEC), "--url", f"{server.url}/v1",
             "--checks", "not_a_server_error", "--max-examples", "25", "--seed", "20261123",
             "-H", f"Authorization: Bearer {TOKEN}", "-H", "s2-basin: fuzz-basin-1", "--request-timeout", "20"],
            capture_output=True, text=True, timeout=SCHEMATHESIS_TIMEOUT_S,
            cwd=tmp_path)  # schemathesis keeps its cache in ./.schemathesis: here, not in the checkout
    assert done.returncode == 0 and "Server error" not in done.stdout, done.stdout[-6000:]
