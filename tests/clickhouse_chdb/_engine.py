"""The engine: chdb's data folder and connections, and its errors in ClickHouse's words and HTTP statuses."""

from __future__ import annotations

import re
from typing import Any

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
