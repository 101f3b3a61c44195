"""A local S2-compatible server: the embedded default S2 endpoint for tests, the demo and development.

Speaks S2's v1 API to the official `s2-sdk` unchanged (HTTP/2 cleartext with prior knowledge, and
HTTP/1.1, on one port), stores data durably in SQLite (WAL, fsync per commit) or in memory.

    sluice s2 serve --port 4243 --data-dir .sluice/s2      # command line

    from sluice.s2local import LocalS2                       # Python: a child process on a free port
    with LocalS2() as s2:
        client = s2_sdk.S2(s2.access_token, endpoints=s2.endpoints)
"""

from sluice.s2local._server import LocalS2, run_server

__all__ = ["LocalS2", "run_server"]
