"""A test-only stand-in for ClickHouse's HTTP interface, running statements on ClickHouse's own engine (chdb-core).

The connector's tests run on Debian's clickhouse-server, which is 18.16; this lets the same tests run on a modern
engine (26.9, embedded by PyPI's chdb-core) without a server binary:

    SLUICE_TEST_CLICKHOUSE=chdb python -m pytest tests/connectors/clickhouse

`python -m tests.clickhouse_chdb --port P --data DIR --password PW` serves it; `ChdbClickHouse()` starts that as a
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
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# ClickHouse's HTTP status of an error code (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp), by error name: the
# engine resolves the names to its codes when the server starts. Any other code is 500.
STATUS_OF_ERROR = {
    **dict.fromkeys(["REQUIRED_PASSWORD"], 401),
    **dict.fromkeys(["UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE",
                     "ACCESS_DENIED"], 403),
    **dict.fromkeys(["BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
                     "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME",
                     "CANNOT_PARSE_NUMBER", "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4",
                     "CANNOT_PARSE_IPV6", "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID",
                     "DUPLICATE_COLUMN", "ILLEGAL_COLUMN", "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE",
                     "THERE_IS_NO_COLUMN", "TOO_DEEP_AST", "TOO_BIG_AST", "UNEXPECTED_AST_STRUCTURE",
                     "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH", "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE"], 400),
    **dict.fromkeys(["UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
                     "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING",
                     "UNKNOWN_AGGREGATE_FUNCTION", "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE",
                     "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE"], 404),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    **dict.fromkeys(["SOCKET_TIMEOUT", "CANNOT_OPEN_FILE", "CANNOT_SCHEDULE_TASK"], 503),
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

# URL parameters that are not settings.
IGNORED_PARAMS = frozenset({"query_id", "quota_key", "buffer_size", "wait_end_of_query", "stacktrace"})
REFUSED_PARAMS = frozenset({"session_id", "session_timeout", "session_check", "compress", "decompress", "role"})
CHUNK = 4 << 20


class QueryError(Exception):
    """An error in ClickHouse's words: `text` is `Code: N. DB::Exception: ... (NAME)`."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


class Engine:
    """The data folder, the connection that keeps the engine up, and what the engine says about its errors."""

    def __init__(self, data: str, password: str) -> None:
        import chdb

        self.chdb, self.data, self.password = chdb, data, password
        self.keeper = chdb.connect(data)
        self.version = self.keeper.query("SELECT version()", "TabSeparated").bytes().decode().strip()
        names = self.keeper.query("SELECT number, errorCodeToName(number) FROM numbers(10000) WHERE "
                                  "errorCodeToName(number) != ''", "TabSeparated").bytes().decode()
        self.codes = {name: int(code) for code, name in (line.split("\t") for line in names.splitlines())}
        self.status = {self.codes[name]: status for name, status in STATUS_OF_ERROR.items() if name in self.codes}

    def error(self, name: str, message: str) -> QueryError:
        code = self.codes[name]
        return QueryError(code, f"Code: {code}. DB::Exception: {message}. ({name})")

    def translate(self, error: Exception) -> QueryError:
        """chdb's exception as ClickHouse's error (its text may sit behind a prefix of chdb's own)."""
        text = str(error)
        found = re.search(r"Code: (\d+)\.", text)
        if found is None:
            return self.error("STD_EXCEPTION", f"{type(error).__name__}: {text}")
        text = re.sub(r"\s*\(version [^)]*\)$", "", text[found.start():].rstrip())  # the server adds its own
        return QueryError(int(found.group(1)), text)

    def connect(self) -> Any:
        return self.chdb.connect(self.data)

    def close(self) -> None:
        self.keeper.close()


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


# ---------------------------------------------------------------------------------------------- statement text
_WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_HEREDOC = re.compile(rb"\$([A-Za-z0-9_]*)\$")


class Statement:
    """One request's statement: its SQL, and for an INSERT with inline data, the data and its format."""

    def __init__(self, sql: str, data: bytes | None = None, fmt: str | None = None) -> None:
        self.sql, self.data, self.fmt = sql, data, fmt


def _skip_quoted(text: bytes, i: int) -> int:
    """The position after the quoted string or identifier starting at text[i] (backslash escapes, doubled quotes)."""
    quote, i = text[i], i + 1
    while i < len(text):
        c = text[i]
        if c == 0x5C:  # backslash
            i += 2
            continue
        if c == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return i


def _skip_comment(text: bytes, i: int) -> int | None:
    """The position after the comment starting at text[i], or None if none starts there (/* */ nests)."""
    if text.startswith(b"--", i) or text.startswith(b"#", i):
        end = text.find(b"\n", i)
        return len(text) if end < 0 else end + 1
    if text.startswith(b"/*", i):
        depth, i = 1, i + 2
        while i < len(text) and depth:
            if text.startswith(b"/*", i):
                depth, i = depth + 1, i + 2
            elif text.startswith(b"*/", i):
                depth, i = depth - 1, i + 2
            else:
                i += 1
        return i
    return None


def _skip_space(text: bytes, i: int) -> int:
    while i < len(text):
        if text[i] in b" \t\r\n\f\v":
            i += 1
            continue
        after = _skip_comment(text, i)
        if after is None:
            return i
        i = after
    return i


def parse(text: bytes, engine: Engine) -> Statement:
    """Find where the statement ends, as ClickHouse's parser does: an INSERT's data starts after `FORMAT name` (after
    the spaces and the first line break that follow) or after `VALUES`; a second statement after `;` is refused."""
    first: bytes | None = None
    depth, selecting = 0, False
    i = _skip_space(text, 0)
    if i == len(text):
        raise engine.error("SYNTAX_ERROR", "Empty query")
    while True:
        i = _skip_space(text, i)
        if i >= len(text):
            return Statement(text.decode(errors="replace"))
        c = text[i]
        if c in b"'\"`":
            i = _skip_quoted(text, i)
        elif c == ord("$") and (heredoc := _HEREDOC.match(text, i)):
            end = text.find(heredoc.group(0), heredoc.end())
            i = len(text) if end < 0 else end + len(heredoc.group(0))
        elif c in b"([{":
            depth, i = depth + 1, i + 1
        elif c in b")]}":
            depth, i = depth - 1, i + 1
        elif c == ord(";"):
            rest = _skip_space(text, i + 1)
            if rest < len(text):
                near = text[i:i + 40].decode(errors="replace")
                raise engine.error("SYNTAX_ERROR", "Syntax error (Multi-statements are not allowed): failed at "
                                                   f"position {i + 1} (end of query): {near}")
            return Statement(text[:i].decode(errors="replace"))
        elif word := _WORD.match(text, i):
            keyword = word.group(0).upper()
            first = first or keyword
            if first == b"INSERT" and depth == 0:
                if keyword == b"VALUES" and not selecting:
                    return Statement(text[:i].decode(errors="replace"), text[word.end():].lstrip(), "Values")
                if keyword == b"FORMAT":  # also INSERT ... SELECT ... FROM input(...) FORMAT name
                    return _insert_with_format(text, i, word.end(), engine)
                selecting = selecting or keyword in (b"SELECT", b"WITH")  # values(...) is then a table function
            i = word.end()
        else:
            i += 1


def _insert_with_format(text: bytes, start: int, after_keyword: int, engine: Engine) -> Statement:
    name = _WORD.match(text, _skip_space(text, after_keyword))
    if name is None:
        raise engine.error("SYNTAX_ERROR", "Syntax error: expected a format name after FORMAT")
    i = name.end()
    while i < len(text) and text[i] in b" \t\f":
        i += 1
    if i < len(text) and text[i] == ord(";"):
        raise engine.error("SYNTAX_ERROR", "You have excessive ';' symbol before data for INSERT")
    if text.startswith(b"\r", i):
        i += 1
    if text.startswith(b"\n", i):
        i += 1
    return Statement(text[:start].decode(errors="replace"), text[i:], name.group(0).decode())


# ---------------------------------------------------------------------------------------------- HTTP
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the connector's urllib3 pool reuses connections
    server_version = "sluice-chdb-stand-in"
    server: Server

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request on stderr would drown the server's log

    def _dispatch(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        body = self._body()
        route = ROUTES.get((self.command, url.path))
        if route is None and url.path == "/" and self.command == "GET" and "query" not in params:
            route = Handler.ok
        engine = self.server.engine
        try:
            (route or Handler.query)(self, params, body)
        except Exception as e:
            error = e if isinstance(e, QueryError) else engine.translate(e)
            self._answer(engine.status.get(error.code, 500), f"{error.text} (version {engine.version})\n".encode(),
                         {"X-ClickHouse-Exception-Code": str(error.code)})

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers, then the empty line
                pass
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def ok(self, params: dict[str, str], body: bytes) -> None:
        self._answer(200, b"Ok.\n")

    def _login(self, params: dict[str, str]) -> None:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
            except ValueError:
                user, password = "", ""
        elif "X-ClickHouse-User" in self.headers or "X-ClickHouse-Key" in self.headers:
            user, password = self.headers.get("X-ClickHouse-User", "default"), self.headers.get("X-ClickHouse-Key", "")
        else:
            user, password = params.get("user", "default"), params.get("password", "")
        if user != "default" or password != self.server.engine.password:
            raise self.server.engine.error("AUTHENTICATION_FAILED", f"{user}: Authentication failed: password is "
                                           "incorrect, or there is no user with such name")

    def query(self, params: dict[str, str], body: bytes) -> None:
        engine = self.server.engine
        self._login(params)
        refused = sorted(k for k in params if k in REFUSED_PARAMS)
        if refused or self.headers.get("Content-Encoding", "identity") != "identity":
            what = ", ".join(refused) or f"Content-Encoding: {self.headers['Content-Encoding']}"
            raise engine.error("NOT_IMPLEMENTED", f"{what} is not supported by the chdb stand-in")
        text = params.get("query", "").encode()
        text = text + b"\n" + body if text and body else text or body
        statement = parse(text, engine)
        settings = {k: v for k, v in params.items() if k not in {"query", "database", "user", "password",
                                                                  "default_format", *IGNORED_PARAMS}
                    and not k.startswith("param_")}
        if self.command == "GET" and "readonly" not in settings:
            settings = {"readonly": "2", **settings}  # as ClickHouse: GET may read and set, not write
        conn = engine.connect()
        try:
            try:
                if params.get("database"):
                    conn.query(f"USE {quote_ident(params['database'])}", "TabSeparated")
                for name, value in settings.items():
                    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                        raise engine.error("UNKNOWN_SETTING", f"Unknown setting '{name}'")
                    conn.query(f"SET {name} = {quote_literal(value)}", "TabSeparated")
                if statement.data is not None:
                    out = self._insert(conn, statement)
                else:
                    query_params = {k[len("param_"):]: v for k, v in params.items() if k.startswith("param_")}
                    out = conn.query(statement.sql, params.get("default_format") or "TabSeparated",
                                     params=query_params or None).bytes()
            except QueryError:
                raise
            except Exception as e:
                error = engine.translate(e)
                if error.code == engine.codes["READONLY"] and self.command == "GET":
                    head, _, name = error.text.rpartition(" (")
                    error.text = (f"{head} For queries over HTTP, method GET implies readonly. You should use "
                                  f"method POST for modifying queries. ({name}")
                raise error from None
        finally:
            conn.close()
        self._answer(200, out)

    @staticmethod
    def _insert(conn: Any, statement: Statement) -> bytes:
        """Data goes through chdb's streaming insert: passed inline in the SQL, chdb would split binary data at
        blank lines as if they separated statements."""
        insert = conn.send_insert(statement.sql, statement.fmt)
        try:
            data = memoryview(statement.data)
            for start in range(0, len(data), CHUNK):
                insert.append(bytes(data[start:start + CHUNK]))
            insert.finish()
        except BaseException:
            with contextlib.suppress(Exception):  # a failed insert may have nothing left to cancel
                insert.cancel()
            raise
        return b""


ROUTES = {("GET", "/ping"): Handler.ok}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, Handler)
        self.engine = engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data", required=True, help="the engine's data folder (one server per folder)")
    parser.add_argument("--password", default="", help="the password of the user default")
    args = parser.parse_args(argv)
    engine = Engine(str(Path(args.data).resolve()), args.password)
    server = Server((args.host, args.port), engine)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"chdb stand-in for ClickHouse {engine.version} on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        engine.close()


# ---------------------------------------------------------------------------------------------- test helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChdbClickHouse:
    """Context manager: the stand-in in a subprocess of its own; `.url` is its HTTP endpoint, `.password` the
    default user's (the surface of sluice.testing.LocalClickHouse)."""

    def __init__(self, *, password: str = "sluice-test-pw") -> None:
        self.password = password
        self.port = 0
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ChdbClickHouse:
        self._dir = Path(tempfile.mkdtemp(prefix="sluice-chdb-"))
        self.port = free_port()
        log = self._dir / "server.log"
        with log.open("wb") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "tests.clickhouse_chdb", "--port", str(self.port), "--data",
                 str(self._dir / "data"), "--password", self.password],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
                    "PYTHONPATH")]))}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as response:
                    if response.read() == b"Ok.\n":
                        return self
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                output = log.read_text(errors="replace")[-3000:]
                self.__exit__(None, None, None)
                raise RuntimeError(f"the chdb stand-in did not start: {output}")
            time.sleep(0.05)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def sql(self, query: str, body: bytes | None = None) -> str:
        """Run one statement as the default user; returns the response text (errors raise with the server's)."""
        url = f"{self.url}/?query={urllib.parse.quote(query)}" if body is not None else f"{self.url}/"
        request = urllib.request.Request(url, data=body if body is not None else query.encode(), method="POST")
        token = base64.b64encode(f"default:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"ClickHouse: {e.read().decode()[:2000]}") from None

    def rows(self, query: str) -> list[list[Any]]:
        """Tab-separated result rows as lists of strings."""
        text = self.sql(query + " FORMAT TabSeparated")
        return [line.split("\t") for line in text.splitlines()]


def clickhouse_server() -> Any:
    """The ClickHouse the tests run on: Debian's clickhouse-server (default), or this stand-in on ClickHouse 26's
    engine with SLUICE_TEST_CLICKHOUSE=chdb."""
    choice = os.environ.get("SLUICE_TEST_CLICKHOUSE", "server")
    if choice == "chdb":
        return ChdbClickHouse()
    if choice == "server":
        from sluice.testing import LocalClickHouse

        return LocalClickHouse()
    raise ValueError(f"SLUICE_TEST_CLICKHOUSE={choice!r}: use 'server' (clickhouse-server, the default) or 'chdb'")


if __name__ == "__main__":
    main()
