"""The HTTP side: the request handler, the server, and `main()` (`python -m tests.clickhouse_chdb`)."""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import re
import signal
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.clickhouse_chdb._engine import Engine, QueryError
from tests.clickhouse_chdb._quoting import quote_ident, quote_literal
from tests.clickhouse_chdb._statements import Statement, parse

# URL parameters that are not settings.
IGNORED_PARAMS = frozenset({"query_id", "quota_key", "buffer_size", "wait_end_of_query", "stacktrace"})
REFUSED_PARAMS = frozenset({"session_id", "session_timeout", "session_check", "compress", "decompress", "role"})
CHUNK = 4 << 20
# The default user's password comes from the environment, never the command line: `ps` shows command lines to
# every user of the machine.
PASSWORD_VARIABLE = "SLUICE_CHDB_PASSWORD"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the connector's urllib3 pool reuses connections
    server_version = "sluice-chdb-stand-in"
    server: Server

    def setup(self) -> None:
        """Over TLS, the handshake first: one refused (mutual TLS, a client certificate missing or not trusted) ends
        the connection as a TLS server does, its alert readable by the client."""
        import socket
        import ssl

        # Headers and body go out in two writes: with Nagle's algorithm on, the body waits for the client's delayed
        # ACK of the headers (~40 ms a request), a cost clickhouse-server, which sets TCP_NODELAY, does not have.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if isinstance(self.request, ssl.SSLSocket):
            try:
                self.request.do_handshake()
            except (ssl.SSLError, OSError):
                # Under TLS 1.3 the client's request is already on its way when its certificate is judged: closed
                # with it unread, the connection is reset, which can overtake the alert. Read it (raw), then close.
                self.request.settimeout(0.5)
                with contextlib.suppress(OSError):
                    while socket.socket.recv(self.request, 65536):
                        pass
                raise
        super().setup()

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
        blank lines as if they separated statements. A table with a CONSTRAINT takes it from a file instead."""
        if _has_constraints(conn, statement.sql):
            return _insert_from_file(conn, statement)
        insert = conn.send_insert(statement.sql, statement.fmt)
        try:
            data = memoryview(statement.data)
            for start in range(0, len(data), CHUNK):
                insert.append(bytes(data[start:start + CHUNK]))
            insert.finish()
        except Exception:
            with contextlib.suppress(Exception):  # a failed insert may have nothing left to cancel; its error wins
                insert.cancel()
            raise
        return b""


_NAME = r"(?:`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_]*)"
_INTO = re.compile(rf"\s*INSERT\s+INTO\s+(?:TABLE\s+)?({_NAME}(?:\.{_NAME})?)", re.IGNORECASE)


def _has_constraints(conn: Any, sql: str) -> bool:
    """Whether an INSERT's table has a CONSTRAINT: chdb's streaming insert (chdb 26.9) drops a block that breaks a
    CHECK without an error, where ClickHouse refuses the INSERT with VIOLATED_CONSTRAINT."""
    found = _INTO.match(sql)
    if found is None:
        return False
    try:
        create = conn.query(f"SHOW CREATE TABLE {found.group(1)}", "TabSeparated").bytes().decode()
    except Exception:
        return False  # a table function or a missing table: the streaming insert says what is wrong
    return "CONSTRAINT" in create


def _insert_from_file(conn: Any, statement: Statement) -> bytes:
    """INSERT ... SELECT from the data in a file, which checks the table's constraints as ClickHouse's INSERT does."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".data") as data:
        data.write(statement.data or b"")
        data.flush()
        source = f"file({quote_literal(data.name)}, {quote_literal(statement.fmt or '')})"
        conn.query(f"{statement.sql} SELECT * FROM {source}", "TabSeparated")
    return b""


ROUTES = {("GET", "/ping"): Handler.ok}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], engine: Engine) -> None:
        super().__init__(address, Handler)
        self.engine = engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.clickhouse_chdb",
        description="A test-only stand-in for ClickHouse's HTTP interface, running statements on ClickHouse's own "
                    "engine (chdb-core).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--data", required=True, help="the engine's data folder (one server per folder)")
    parser.add_argument("--certfile", help="serve HTTPS with this certificate chain (PEM; with --keyfile)")
    parser.add_argument("--keyfile", help="the private key of --certfile (PEM)")
    parser.add_argument("--client-cafile", help="demand a client certificate this CA signed (PEM; with --certfile)")
    parser.epilog = f"The password of the user default is ${PASSWORD_VARIABLE} (empty when unset)."
    args = parser.parse_args(argv)
    engine = Engine(str(Path(args.data).resolve()), os.environ.get(PASSWORD_VARIABLE, ""))
    server = Server((args.host, args.port), engine)
    scheme = "http"
    if args.certfile:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.certfile, args.keyfile)
        if args.client_cafile:  # mutual TLS: a handshake without a certificate this CA signed fails
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(args.client_cafile)
        # the handshake happens in the request's thread (its first read), not in the accepting one
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https"
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"chdb stand-in for ClickHouse {engine.version} on {scheme}://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        engine.close()
