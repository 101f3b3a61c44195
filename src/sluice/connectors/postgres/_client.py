"""Connection options of `format("postgres")`, identifier quoting, and what a failure means (retry or not).

The data path is ADBC (`adbc-driver-postgresql`): Arrow in and out over COPY BINARY, rows never become
Python objects. Passwords travel in `Connection` (resolved on the driver, PGPASSWORD included) and are
never part of a repr, a message or a log line.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from sluice.connector import (
    Option,
    OptionError,
    Options,
    RestartNeededError,
    RetryableError,
    SluiceError,
    ThrottledError,
)
from sluice.connectors.postgres._pool import POOL, Lease, PoolKey
from sluice.connectors.postgres._tls import TLS_OPTIONS, client_certificate, explain_failure, libpq_params, resolve

CONNECTION_OPTIONS = (
    Option("url", "str", None, "postgresql://user@host:port/dbname (a password in it is redacted everywhere); "
           "or use host/port/dbname/user.", secret=True),
    Option("host", "str", None, "Server host (when no url is given); default localhost."),
    Option("port", "int", 5432, "Server port (when no url is given).", minimum=1, maximum=65535),
    Option("dbname", "str", None, "Database (when no url is given); default: the user name."),
    Option("user", "str", None, "User name (when no url is given); default: PGUSER, else postgres."),
    Option("password", "str", None, "Password; default: the one in url, else the PGPASSWORD environment variable.",
           secret=True),
    Option("connect.timeout-s", "int", 10, "Seconds to wait for one connection attempt.", minimum=1, maximum=3600),
    Option("connect.retries", "int", 3, "Retries of a failed connection attempt (backoff 0.5 s, doubling).",
           minimum=0, maximum=20),
    *TLS_OPTIONS,
)


class PostgresError(SluiceError):
    """A PostgreSQL request failed; the message names the table and carries the server's SQLSTATE."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class SchemaChangedError(PostgresError, RestartNeededError):
    """What a change stream reads changed under it (a column added or renamed, a table joining the publication):
    the query's schema cannot carry it, and the same query restarted with the same checkpoint reads the new schema
    and goes on (`sluice.run` does that)."""


def quote_ident(name: str) -> str:
    """An identifier as SQL: always double-quoted, embedded quotes doubled (never spliced raw)."""
    if not name or "\x00" in name:
        raise OptionError(f"{name!r} is not a valid PostgreSQL identifier (empty or containing NUL)")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    if "\x00" in value:
        raise OptionError("a PostgreSQL string literal cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


_PART = re.compile(r'\s*(?:"((?:[^"]|"")*)"|([^."\s]+))\s*')


def split_qualified(name: str, option: str = "table") -> tuple[str, str]:
    """'schema.table' / '"My Schema"."odd.name"' / 'table' -> (schema, table); default schema: public.

    Unquoted parts fold to lower case as in SQL; quoted parts are kept exactly.
    """
    parts: list[str] = []
    pos = 0
    while True:
        m = _PART.match(name, pos)
        if not m or m.end() == pos:
            raise OptionError(f"option '{option}': cannot parse {name!r} as [schema.]table; quote names with "
                              'odd characters as "Name"')
        parts.append(m.group(1).replace('""', '"') if m.group(1) is not None else m.group(2).lower())
        pos = m.end()
        if pos == len(name):
            break
        if name[pos] != ".":
            raise OptionError(f"option '{option}': unexpected {name[pos]!r} in {name!r}")
        pos += 1
    if len(parts) > 2:
        raise OptionError(f"option '{option}': {name!r} has {len(parts)} parts; use [schema.]table")
    return (parts[0], parts[1]) if len(parts) == 2 else ("public", parts[0])


def qualified(schema: str, table: str) -> str:
    return f"{quote_ident(schema)}.{quote_ident(table)}"


@dataclass(frozen=True)
class Connection:
    """Where the server is and who we are; built on the driver, shipped to executors. repr hides the password."""

    host: str
    port: int
    dbname: str
    user: str
    password: str | None
    connect_timeout_s: int = 10
    connect_retries: int = 3
    params: tuple[tuple[str, str], ...] = ()
    sslmode: str = "disable"
    ca_pem: str | None = None
    cert_pem: str | None = None  # a client certificate (mutual TLS), and its key (a secret: in no repr or message)
    key_pem: str | None = None

    def __repr__(self) -> str:
        return f"Connection({self.describe()}, password=<redacted>)"

    def describe(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    def same_database(self, other: Connection) -> bool:
        """Whether `other` reaches the same database as the same user: one transaction may then hold both's work."""
        return (self.host, self.port, self.dbname, self.user) == (other.host, other.port, other.dbname, other.user)

    @classmethod
    def from_options(cls, opts: Options) -> Connection:
        url = opts["url"]
        params: dict[str, str] = {}
        if url:
            for key in ("host", "dbname", "user"):
                if opts.is_set(key):
                    raise OptionError(f"set either url or {key}, not both (url already names the {key})")
            parts = urlsplit(url)
            if parts.scheme not in ("postgresql", "postgres"):
                raise OptionError("option 'url' must start with postgresql:// (e.g. postgresql://user@host:5432/db)")
            try:
                port = parts.port or 5432
            except ValueError:
                raise OptionError("option 'url' has a port that is not a number") from None
            host = parts.hostname or "localhost"
            user = unquote(parts.username) if parts.username else (os.environ.get("PGUSER") or "postgres")
            dbname = unquote(parts.path.lstrip("/")) or user
            url_password = unquote(parts.password) if parts.password else None
            for item in filter(None, parts.query.split("&")):
                key, _, value = item.partition("=")
                params[unquote(key)] = unquote(value)
        else:
            host = opts["host"] or "localhost"
            port = opts["port"]
            user = opts["user"] or os.environ.get("PGUSER") or "postgres"
            dbname = opts["dbname"] or user
            url_password = None
        password = opts["password"] or url_password or os.environ.get("PGPASSWORD")
        params.pop("password", None)
        sslmode, ca_pem = resolve(opts, params, host)
        cert_pem, key_pem = client_certificate(opts, sslmode)
        return cls(host, port, dbname, user, password, opts["connect.timeout-s"], opts["connect.retries"],
                   tuple(sorted(params.items())), sslmode, ca_pem, cert_pem, key_pem)

    def uri(self) -> str:
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + quote(self.password, safe="")
        query = dict(self.params)
        query.setdefault("connect_timeout", str(self.connect_timeout_s))
        query.setdefault("application_name", "sluice")
        # always explicit: never libpq's sslmode=prefer
        query.update(libpq_params(self.sslmode, self.ca_pem, self.cert_pem, self.key_pem))
        qs = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query.items())
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"postgresql://{auth}@{host}:{self.port}/{quote(self.dbname, safe='')}?{qs}"

    def connect(self, *, autocommit: bool = True) -> Any:
        """An ADBC DB-API connection (the Arrow data path), retried with backoff when the server is unreachable."""
        import adbc_driver_postgresql.dbapi as adbc

        return self._retrying(lambda: adbc.connect(self.uri(), autocommit=autocommit))

    def connect_psycopg(self, *, autocommit: bool = True) -> Any:
        """A psycopg connection: COPY ... FROM STDIN in CSV (the fastest append measured) and plain SQL.

        It connects in ~6 ms where ADBC takes ~50 ms (35 ms of CPU: the driver loads the type catalog), so
        everything that needs no Arrow result uses it.
        """
        import psycopg

        return self._retrying(lambda: psycopg.connect(self.uri(), autocommit=autocommit))

    @contextmanager
    def reading(self, what: str, *, autocommit: bool = True) -> Iterator[tuple[Any, Any]]:
        """A new ADBC connection and its cursor for reading `what` (a split, a range), both closed after; a failure
        becomes a PostgresError naming `what` and the server (the server's words, scrubbed)."""
        conn = self.connect(autocommit=autocommit)
        cur = conn.cursor()
        try:
            yield conn, cur
        except PostgresError:
            raise
        except Exception as e:
            raise PostgresError(f"reading {what} from {self.describe()} failed: {self.scrub(e)}") from None
        finally:
            cur.close()
            conn.close()

    def pool_key(self, driver: str = "psycopg", *, autocommit: bool = True, session: tuple[str, ...] = ()) -> PoolKey:
        """The key of this server's connections in the process's pool (_pool.py): driver "adbc" or "psycopg"."""
        return PoolKey(driver, self.uri(), autocommit, session)

    def pooled(self, driver: str = "psycopg", *, autocommit: bool = True, session: tuple[str, ...] = (),
               pooled: bool = True) -> AbstractContextManager[Any]:
        """A connection for a block, from the process's pool when `pooled` (given back when the block ends cleanly,
        closed if it raises), else a new one closed with the block."""
        key = self.pool_key(driver, autocommit=autocommit, session=session)
        return POOL.connection(key, lambda: self.open(key), pooled)

    def lease(self, key: PoolKey, *, pooled: bool = True) -> Lease:
        """A connection for a user that outlives a block (from the pool when `pooled`): lease.release(clean)."""
        return POOL.lease(key, lambda: self.open(key), pooled)

    def open(self, key: PoolKey) -> Any:
        """A new connection as `key` describes it (its session statements are the pool's to run)."""
        if key.driver == "adbc":
            return self.connect(autocommit=key.autocommit)
        return self.connect_psycopg(autocommit=key.autocommit)

    def _retrying(self, connect: Any) -> Any:
        delay = 0.5
        for attempt in range(self.connect_retries + 1):
            try:
                return connect()
            except Exception as e:
                last = e
                tls = explain_failure(self.scrub(e), self.sslmode)
                if tls:  # a certificate does not change between attempts
                    raise PostgresError(f"cannot connect to {self.describe()}: {tls}",
                                        sqlstate=sqlstate_of(e)) from None
                if attempt == self.connect_retries or not is_connection_error(e):
                    break
                time.sleep(delay)
                delay *= 2
        raise PostgresError(
            f"cannot connect to {self.describe()} after {attempt + 1} attempt(s): {self.scrub(last)}. Check that the "
            "server runs and the host, port, dbname, user and password (option 'password' or PGPASSWORD) are right.",
            sqlstate=sqlstate_of(last),
        )

    def scrub(self, error: BaseException) -> str:
        """An error's text with the password and URI removed (drivers sometimes echo their connection string)."""
        text = server_words(error) or str(error).strip()
        if self.key_pem:  # no driver is known to echo it; a key must never reach a message all the same
            text = text.replace(self.key_pem.strip(), "<redacted>")
        if self.password:
            text = text.replace(self.password, "<redacted>").replace(quote(self.password, safe=""), "<redacted>")
        # Keep the server's own words (ERROR and DETAIL lines), not the driver's echo of the statement.
        found = [m.group(1).strip() for m in re.finditer(r"(?:^|\s)((?:ERROR|DETAIL|FATAL):\s+[^\n]*)", text)]
        if found:
            return " ".join(" ".join(part.split()) for part in found)
        return text.splitlines()[0] if text else type(error).__name__


def server_words(error: BaseException) -> str | None:
    """The server's report of a failed statement, from the driver's structured fields: 'ERROR: <message> DETAIL:
    <detail>'. Both drivers' texts lose a part of it: psycopg's has the message without its ERROR: label (only the
    DETAIL line is labelled), ADBC's wraps it in its own words."""
    diag = getattr(error, "diag", None)  # psycopg.Error
    if diag is not None:
        primary, detail, severity = diag.message_primary, diag.message_detail, diag.severity_nonlocalized
    else:  # adbc_driver_manager.Error: (PG_DIAG_* name, value) pairs
        fields: dict[str, str] = {}
        for key, value in getattr(error, "details", None) or ():
            name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            fields[name] = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        primary, detail = fields.get("PG_DIAG_MESSAGE_PRIMARY"), fields.get("PG_DIAG_MESSAGE_DETAIL")
        severity = fields.get("PG_DIAG_SEVERITY_NONLOCALIZED")
    if not primary:
        return None
    label = "FATAL" if severity in ("FATAL", "PANIC") else "ERROR"
    return f"{label}: {primary}" + (f"\nDETAIL: {detail}" if detail else "")


# SQLSTATE classes worth a retry: connection (08), serialization/deadlock (40001, 40P01), shutdown (57P0x),
# out of resources (53xxx; too many connections counts as a throttle).
def sqlstate_of(error: BaseException) -> str | None:
    state = getattr(error, "sqlstate", None)
    if state:
        return str(state)
    m = re.search(r"SQLSTATE: ([0-9A-Z]{5})", str(error))
    return m.group(1) if m else None


def is_connection_error(error: BaseException) -> bool:
    state = sqlstate_of(error) or ""
    if state.startswith("08") or state.startswith("57P"):
        return True
    text = str(error).lower()
    return any(s in text for s in ("could not connect", "connection refused", "server closed the connection",
                                   "connection to server", "no connection to the server", "timeout expired"))


def refuses_record(error: BaseException) -> bool:
    """A failure caused by what a row holds (SQLSTATE class 22, data exception: a value out of range or malformed;
    class 23, integrity constraint violation: CHECK, NOT NULL, UNIQUE, FOREIGN KEY): the same row fails again."""
    state = sqlstate_of(error) or ""
    return state.startswith("22") or state.startswith("23")


def classify(error: BaseException) -> BaseException:
    """Wrap a driver error as RetryableError/ThrottledError when retrying can help, else return it."""
    state = sqlstate_of(error) or ""
    if state == "53300":
        return ThrottledError(f"too many connections (SQLSTATE {state})")
    if state in ("40001", "40P01") or state.startswith("53") or is_connection_error(error):
        return RetryableError(f"{type(error).__name__} (SQLSTATE {state or '-'})")
    return error
