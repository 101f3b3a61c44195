"""A test-only stand-in for ClickHouse's HTTP interface, running statements on ClickHouse's own engine (chdb-core).

sluice needs ClickHouse 23.3 or newer, and the only server binary the registries offer is Debian's 18.16; this
serves ClickHouse 26.9's engine (embedded by PyPI's chdb-core) over HTTP, and the connector's tests run on it:

    python -m pytest tests/connectors/clickhouse          # SLUICE_TEST_CLICKHOUSE=server: a clickhouse on PATH

`SLUICE_CHDB_PASSWORD=PW python -m tests.clickhouse_chdb --port P --data DIR` serves it (the password through the
environment: command lines are visible to every user); `ChdbClickHouse()` starts that as a
subprocess on a free loopback port (the same surface as `sluice.testing.LocalClickHouse`), and `clickhouse_server()`
picks one of the two for a fixture. chdb opens one data folder per process and no other process can open it, so
each server is its own process with its own folder. One connection stays open for the process's lifetime (it keeps
the engine up); every request gets a fresh connection of its own, so `USE` and `SET` never leak between requests.

What it serves, as ClickHouse does: `GET /ping` and `GET /` -> `Ok.`; a statement as the POST body, or in the
`query` URL parameter followed by a line break and the body (an INSERT's data after `FORMAT name`, or after
`VALUES`); `database` and settings as URL parameters; `param_*` query parameters; HTTP Basic auth,
X-ClickHouse-User/Key headers or user/password parameters for the user `default`; GET runs with readonly=2;
errors as `Code: N. DB::Exception: ...` with ClickHouse's HTTP status for the code and the
X-ClickHouse-Exception-Code header; more than one statement in a request is refused.

Where it deliberately differs:
- The whole result is buffered before the answer (as with wait_end_of_query=1), so an error never arrives after
  a 200 status line; results are sent with Content-Length, never streamed.
- Only the `default` user exists; any failed login is 516 AUTHENTICATION_FAILED (403), also without credentials.
- No sessions (session_id), no compression (compress, decompress, Content-Encoding), no roles, no external
  tables: refused with 501 NOT_IMPLEMENTED rather than ignored.
- query_id, quota_key, buffer_size, wait_end_of_query and stacktrace are accepted and ignored.
- Responses carry no X-ClickHouse-Summary / Query-Id / Format / Timezone headers; Content-Type is text/plain.

The modules, one concern each (the server process imports only the standard library and chdb):
- `_launcher`: the tests' side: `ChdbClickHouse` runs the server in a subprocess; `clickhouse_server()` chooses.
- `_http`: the request handler and the HTTP server; `main()` is `python -m tests.clickhouse_chdb`.
- `_statements`: where a request's statement ends and an INSERT's data starts (a small scanner of SQL text).
- `_quoting`: identifiers and literals written into the SQL the server sends itself (USE, SET).
- `_engine`: chdb's data folder and connections, and its errors in ClickHouse's words and HTTP statuses.
"""

from tests.clickhouse_chdb._launcher import ChdbClickHouse, clickhouse_server

__all__ = ["ChdbClickHouse", "clickhouse_server"]
