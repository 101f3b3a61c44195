"""The chdb stand-in for ClickHouse's HTTP interface (tests/clickhouse_chdb/) answers as ClickHouse does."""

import base64
import struct
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from tests.clickhouse_chdb import ChdbClickHouse


@pytest.fixture(scope="module")
def server():
    with ChdbClickHouse() as running:
        yield running


def call(server, sql: str | None = None, body: bytes | None = None, password: str | None = None, method: str = "POST",
         path: str = "/", **params: str) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; `sql` goes in the body unless `body` is given (then in the URL)."""
    if body is None and sql is not None:
        body = sql.encode()
    elif sql is not None:
        params = {"query": sql, **params}
    url = f"{server.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method)
    if password is not None or path != "/ping":
        token = base64.b64encode(f"default:{server.password if password is None else password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def native(columns: list[tuple[str, str, bytes]], rows: int) -> bytes:
    """A Native block: column and row counts, then each column's name, type and encoded values."""
    out = varint(len(columns)) + varint(rows)
    for name, kind, values in columns:
        out += varint(len(name)) + name.encode() + varint(len(kind)) + kind.encode() + values
    return out


def test_ping_answers_ok_without_credentials(server):
    assert call(server, path="/ping", method="GET")[::2] == (200, b"Ok.\n")


def test_a_query_answers_tab_separated_and_takes_database_and_settings_from_the_url(server):
    assert call(server, "SELECT 1, 'a\tb', version()")[::2] == (200, b"1\ta\\tb\t26.9.2.1\n")
    status, _, body = call(server, "SELECT currentDatabase(), getSetting('max_threads')", database="system",
                           max_threads="1")
    assert (status, body) == (200, b"system\t1\n")
    assert call(server, "SELECT currentDatabase()")[2] == b"default\n"  # settings do not outlive their request


def test_a_native_insert_keeps_a_body_with_blank_lines_byte_for_byte(server):
    table = f"t_{uuid.uuid4().hex[:10]}"
    assert call(server, f"CREATE TABLE {table} (id Int64, s String) ENGINE = MergeTree ORDER BY id")[0] == 200
    strings = [b"a\n\nb", b"\n\n", b"", b"\x00\xff\n\n\r\n;"]
    ids = [2570, 0x0A0A0A0A0A0A, -1, 10]  # little-endian bytes of 2570 are "\n\n"
    body = native([("id", "Int64", struct.pack("<4q", *ids)),
                   ("s", "String", b"".join(varint(len(v)) + v for v in strings))], 4)
    assert b"\n\n" in body
    status, _, answer = call(server, f"INSERT INTO {table} (id, s) FORMAT Native", body=body)
    assert (status, answer) == (200, b"")
    status, _, hexed = call(server, f"SELECT id, hex(s) FROM {table} ORDER BY id")
    assert status == 200
    got = [(int(i), bytes.fromhex(h)) for i, h in (line.split("\t") for line in hexed.decode().splitlines())]
    assert got == sorted(zip(ids, strings, strict=True))


def test_errors_carry_clickhouses_status_code_header_and_text(server):
    status, headers, body = call(server, "SELECT * FROM no_such_table")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "60")
    assert body.startswith(b"Code: 60. DB::Exception: ") and body.endswith(b"(UNKNOWN_TABLE) (version 26.9.2.1)\n")
    status, headers, body = call(server, "SELEC 1")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "62") and b"(SYNTAX_ERROR)" in body
    status, headers, _ = call(server, "SELECT 1", no_such_setting="1")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (404, "115")
    table = f"t_{uuid.uuid4().hex[:10]}"
    call(server, f"CREATE TABLE {table} (id Int64) ENGINE = MergeTree ORDER BY id")
    status, headers, body = call(server, f"INSERT INTO {table} FORMAT TSV", body=b"1\nx\n")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "27") and body.startswith(b"Code: 27. ")
    assert call(server, f"SELECT count() FROM {table}")[2] == b"0\n"  # a failed insert leaves nothing


def test_a_wrong_password_is_refused_with_403(server):
    status, headers, body = call(server, "SELECT 1", password="wrong")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516") and b"(AUTHENTICATION_FAILED)" in body
    assert call(server, "SELECT 1", password="")[0] == 403


def test_more_than_one_statement_is_refused_and_none_runs(server):
    table = f"t_{uuid.uuid4().hex[:10]}"
    status, headers, body = call(server, f"CREATE TABLE {table} (id Int64) ENGINE = Memory; SELECT 1")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (400, "62") and b"Multi-statements" in body
    assert call(server, f"EXISTS TABLE {table}")[2] == b"0\n"
    # A trailing semicolon and semicolons inside strings, identifiers and comments are one statement.
    assert call(server, "SELECT 'a;b' AS `c;d` /* ; */ -- ;\n;  ")[::2] == (200, b"a;b\n")


def test_get_is_read_only(server):
    status, headers, body = call(server, "CREATE TABLE t_get (id Int64) ENGINE = Memory", method="GET", body=b"")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (500, "164") and b"method GET implies readonly" in body
    assert call(server, "SELECT 2", method="GET", body=b"")[::2] == (200, b"2\n")
