"""SQLite storage for the local S2 server: WAL and synchronous=FULL, so an acknowledged append survives kill -9.

One writer connection (used by a single thread, or inline in-memory) and one reader connection for the
event loop; WAL gives readers a committed snapshot while the writer commits the next group.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS basins (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at TEXT NOT NULL, request_token TEXT);
CREATE TABLE IF NOT EXISTS streams (
    id INTEGER PRIMARY KEY, basin TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL,
    created_at TEXT NOT NULL, request_token TEXT,
    next_seq INTEGER NOT NULL DEFAULT 0, last_ts INTEGER NOT NULL DEFAULT 0,
    fencing_token TEXT NOT NULL DEFAULT '', trim_point INTEGER NOT NULL DEFAULT 0, cipher TEXT,
    UNIQUE (basin, name));
CREATE TABLE IF NOT EXISTS access_tokens (id TEXT PRIMARY KEY, info TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    stream_id INTEGER NOT NULL, seq INTEGER NOT NULL, ts INTEGER NOT NULL, metered INTEGER NOT NULL,
    framed BLOB NOT NULL, PRIMARY KEY (stream_id, seq)) WITHOUT ROWID;
"""


class Storage:
    def __init__(self, data_dir: Path | None) -> None:
        self.in_memory = data_dir is None
        if data_dir is None:
            self.writer = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            self.reader = self.writer
        else:
            data_dir.mkdir(parents=True, exist_ok=True)
            path = str(data_dir / "s2.sqlite3")
            self.writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.writer.execute("PRAGMA journal_mode=WAL")
            self.writer.execute("PRAGMA synchronous=FULL")  # fsync at every commit: acks are durable
            self.writer.executescript(SCHEMA)
            self._migrate()
            self.reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.reader.execute("PRAGMA query_only=1")
        if self.in_memory:
            self.writer.executescript(SCHEMA)

    def _migrate(self) -> None:
        """Bring a data directory written by an earlier version up to SCHEMA."""
        columns = {row[1] for row in self.writer.execute("PRAGMA table_info(streams)")}
        if "cipher" not in columns:
            # Streams now keep the cipher they were created with. Earlier versions sealed a stream's records with
            # its basin's current stream_cipher, which could not change once set: that is the best record of the
            # cipher such a stream was written with.
            self._tx([("ALTER TABLE streams ADD COLUMN cipher TEXT", ()),
                      ("UPDATE streams SET cipher = (SELECT json_extract(basins.config, '$.stream_cipher') "
                       "FROM basins WHERE basins.name = streams.basin)", ())])

    def close(self) -> None:
        self.writer.close()
        if self.reader is not self.writer:
            self.reader.close()

    # ---- loading
    def load(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        basins = self.reader.execute("SELECT name, config, created_at, request_token FROM basins").fetchall()
        streams = self.reader.execute(
            "SELECT id, basin, name, config, created_at, request_token, next_seq, last_ts, fencing_token, "
            "trim_point, cipher FROM streams").fetchall()
        return basins, streams

    def load_tokens(self) -> list[str]:
        return [row[0] for row in self.reader.execute("SELECT info FROM access_tokens ORDER BY id")]

    # ---- writes (called on the writer thread, or inline in memory)
    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        cur = self.writer.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                cur.execute(sql, params)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    def insert_basin(self, name: str, config: str, created_at: str, token: str | None) -> None:
        self._tx([("INSERT INTO basins VALUES (?, ?, ?, ?)", (name, config, created_at, token))])

    def update_basin(self, name: str, config: str) -> None:
        self._tx([("UPDATE basins SET config=? WHERE name=?", (config, name))])

    def delete_basin(self, name: str) -> None:
        self._tx([
            ("DELETE FROM records WHERE stream_id IN (SELECT id FROM streams WHERE basin=?)", (name,)),
            ("DELETE FROM streams WHERE basin=?", (name,)),
            ("DELETE FROM basins WHERE name=?", (name,)),
        ])

    def insert_token(self, token_id: str, info: str) -> None:
        self._tx([("INSERT INTO access_tokens VALUES (?, ?)", (token_id, info))])

    def delete_token(self, token_id: str) -> None:
        self._tx([("DELETE FROM access_tokens WHERE id=?", (token_id,))])

    def insert_stream(self, basin: str, name: str, config: str, created_at: str, token: str | None,
                      cipher: str | None) -> int:
        cur = self.writer.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute("INSERT INTO streams (basin, name, config, created_at, request_token, cipher) "
                        "VALUES (?, ?, ?, ?, ?, ?)", (basin, name, config, created_at, token, cipher))
            stream_id = cur.lastrowid
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        assert stream_id is not None
        return stream_id

    def update_stream(self, stream_id: int, config: str) -> None:
        self._tx([("UPDATE streams SET config=? WHERE id=?", (config, stream_id))])

    def delete_stream(self, stream_id: int) -> None:
        self._tx([("DELETE FROM records WHERE stream_id=?", (stream_id,)),
                  ("DELETE FROM streams WHERE id=?", (stream_id,))])

    def commit_appends(self, rows: list[tuple[int, int, int, int, bytes]],
                       states: list[tuple[int, int, str, int, int]]) -> None:
        """One transaction for a whole group of appends: the records, each stream's new state, trims."""
        cur = self.writer.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?)", rows)
            for next_seq, last_ts, token, trim_point, stream_id in states:
                cur.execute("UPDATE streams SET next_seq=?, last_ts=?, fencing_token=?, trim_point=? WHERE id=?",
                            (next_seq, last_ts, token, trim_point, stream_id))
                cur.execute("DELETE FROM records WHERE stream_id=? AND seq<?", (stream_id, trim_point))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise

    # ---- reads (event loop)
    def read(self, stream_id: int, start: int, end: int, count: int) -> list[tuple[int, int, int, bytes]]:
        return self.reader.execute(
            "SELECT seq, ts, metered, framed FROM records WHERE stream_id=? AND seq>=? AND seq<? ORDER BY seq LIMIT ?",
            (stream_id, start, end, count)).fetchall()

    def stored(self, stream_ids: list[int]) -> tuple[int, int]:
        """(records, metered bytes) stored for these streams."""
        if not stream_ids:
            return 0, 0
        marks = ",".join("?" * len(stream_ids))
        count, total = self.reader.execute(
            f"SELECT count(*), coalesce(sum(metered), 0) FROM records WHERE stream_id IN ({marks})", stream_ids
        ).fetchone()
        return count, total

    def first_seq_at(self, stream_id: int, timestamp: int, lo: int, hi: int) -> int:
        """First seq in [lo, hi) whose timestamp >= `timestamp` (timestamps are monotonic): binary search."""
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.reader.execute("SELECT ts FROM records WHERE stream_id=? AND seq>=? ORDER BY seq LIMIT 1",
                                      (stream_id, mid)).fetchone()
            if row is None or row[0] >= timestamp:
                hi = mid
            else:
                lo = mid + 1
        return lo
