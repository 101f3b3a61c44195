"""Where a request's statement ends and an INSERT's data starts, found with a small scanner of SQL text."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.clickhouse_chdb._engine import Engine

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
