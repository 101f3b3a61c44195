"""Change capture's pure logic without a server or Spark: LSN text, and ChangeDecoder on pgoutput (protocol 1)
messages built here as PostgreSQL sends them: transaction assembly, the commit range, typed values, key changes,
TOASTed values, TRUNCATE and relations that change under a running query."""

import datetime as dt
import struct

import pyarrow as pa
import pytest

from sluice.connectors.postgres._client import PostgresError
from sluice.connectors.postgres._pgoutput import (
    METADATA_FIELDS,
    ChangeDecoder,
    UnchangedToastError,
    format_lsn,
    parse_lsn,
)

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01, where pgoutput's timestamps count from
T0 = 1_767_225_600_000_000  # 2026-01-01 in Unix microseconds
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string()), *METADATA_FIELDS])
TYPES = {"id": "bigint", "name": "text"}
UNCHANGED = object()  # a TOASTed value the update did not touch ('u')


def begin(lsn: int, commit_us: int, xid: int) -> bytes:
    return b"B" + struct.pack("!qqi", lsn, commit_us - PG_EPOCH_US, xid)


def commit(lsn: int, commit_us: int) -> bytes:
    return b"C\0" + struct.pack("!qqq", lsn, lsn + 8, commit_us - PG_EPOCH_US)


def relation(relid: int, name: str, columns: list[str]) -> bytes:
    namespace, table = name.split(".")
    out = b"R" + struct.pack("!i", relid) + namespace.encode() + b"\0" + table.encode() + b"\0d"
    out += struct.pack("!h", len(columns))
    for column in columns:  # flags, name, type oid (text), typmod
        out += b"\0" + column.encode() + b"\0" + struct.pack("!ii", 25, -1)
    return out


def tuple_data(values: list) -> bytes:
    out = struct.pack("!h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is UNCHANGED:
            out += b"u"
        else:
            text = str(value).encode()
            out += b"t" + struct.pack("!i", len(text)) + text
    return out


def insert(relid: int, values: list) -> bytes:
    return b"I" + struct.pack("!i", relid) + b"N" + tuple_data(values)


def update(relid: int, values: list, old: list | None = None, old_kind: bytes = b"K") -> bytes:
    before = old_kind + tuple_data(old) if old is not None else b""
    return b"U" + struct.pack("!i", relid) + before + b"N" + tuple_data(values)


def delete(relid: int, old: list, kind: bytes = b"K") -> bytes:
    return b"D" + struct.pack("!i", relid) + kind + tuple_data(old)


def truncate(relids: list[int]) -> bytes:
    return b"T" + struct.pack("!i", len(relids)) + b"\0" + b"".join(struct.pack("!i", r) for r in relids)


def decoder(start: int = 0, end: int = 1 << 62, **more) -> ChangeDecoder:
    return ChangeDecoder(SCHEMA, TYPES, start, end, {"public.t": ["id", "name"]}, keys={"public.t": ["id"]}, **more)


def rows(dec: ChangeDecoder, *chunks: list[bytes]) -> list[tuple]:
    out = []
    for chunk in chunks:
        for batch in dec.feed(pa.array(chunk, pa.binary())):
            assert batch.schema == SCHEMA
            out += [(r["_op"], r["id"], r["name"], r["_lsn"], r["_xid"]) for r in batch.to_pylist()]
    return out


def test_lsn_text_is_pg_lsn_both_ways():
    assert parse_lsn("16/B374D848") == 0x16B374D848
    assert format_lsn(0x16B374D848) == "16/B374D848"
    assert format_lsn(parse_lsn("0/0")) == "0/0"
    assert parse_lsn(format_lsn(2**63 - 1)) == 2**63 - 1


def test_whole_transactions_in_the_commit_range_become_rows_with_their_commit():
    messages = [relation(1, "public.t", ["id", "name"]),
                begin(100, T0, 7), insert(1, [1, "a"]), insert(1, [2, None]), commit(100, T0),
                begin(200, T0 + 5, 8), update(1, [1, "b"]), delete(1, [2, None]), commit(200, T0 + 5),
                begin(300, T0 + 9, 9), insert(1, [3, "c"]), commit(300, T0 + 9)]
    dec = decoder(start=100, end=300)
    got = []
    for batch in dec.feed(pa.array(messages, pa.binary())):
        got += batch.to_pylist()
    assert [(r["_op"], r["id"], r["name"], r["_lsn"], r["_xid"], r["_table"]) for r in got] == [
        ("insert", 1, "a", 100, 7, "public.t"), ("insert", 2, None, 100, 7, "public.t"),
        ("update", 1, "b", 200, 8, "public.t"), ("delete", 2, None, 200, 8, "public.t")]  # 300 is the next batch's
    assert got[2]["_commit_time"] == dt.datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=dt.UTC)


def test_a_transaction_cut_across_chunks_keeps_its_commit():
    dec = decoder()
    first = [relation(1, "public.t", ["id", "name"]), begin(100, T0, 7), insert(1, [1, "a"])]
    second = [insert(1, [2, "b"]), commit(100, T0)]
    assert rows(dec, first, second) == [("insert", 1, "a", 100, 7), ("insert", 2, "b", 100, 7)]


def test_an_update_that_changes_the_key_is_a_delete_of_the_old_key_then_an_insert():
    dec = decoder()
    got = rows(dec, [relation(1, "public.t", ["id", "name"]), begin(100, T0, 7),
                     update(1, [5, "x"], old=[1, None], old_kind=b"K"), update(1, [5, "y"]), commit(100, T0)])
    assert got == [("delete", 1, None, 100, 7), ("insert", 5, "x", 100, 7), ("update", 5, "y", 100, 7)]


def test_a_full_old_row_tells_a_key_change_and_fills_an_unchanged_toasted_value():
    dec = decoder()
    got = rows(dec, [relation(1, "public.t", ["id", "name"]), begin(100, T0, 7),
                     update(1, [1, UNCHANGED], old=[1, "long"], old_kind=b"O"),  # same key: an update
                     update(1, [2, UNCHANGED], old=[1, "long"], old_kind=b"O"),  # key 1 -> 2
                     commit(100, T0)])
    assert got == [("update", 1, "long", 100, 7), ("delete", 1, "long", 100, 7), ("insert", 2, "long", 100, 7)]


def test_an_unchanged_toasted_value_without_the_old_row_is_null_and_named_in_the_unchanged_column():
    dec = decoder()
    got = [b for b in dec.feed(pa.array([relation(1, "public.t", ["id", "name"]), begin(100, T0, 7),
                                         insert(1, [1, "long"]), update(1, [1, UNCHANGED]), update(1, [1, "x"]),
                                         commit(100, T0)], pa.binary()))]
    assert [(r["_op"], r["name"], r["_unchanged"]) for b in got for r in b.to_pylist()] == [
        ("insert", "long", []), ("update", None, ["name"]), ("update", "x", [])]
    # Empty lists, never null ones: Spark hands null lists to a Python writer about 5x slower (none_unchanged).
    assert all(b.column("_unchanged").null_count == 0 for b in got)
    only_changed = [b for b in dec.feed(pa.array([begin(200, T0, 8), insert(1, [2, "y"]), commit(200, T0)],
                                                 pa.binary()))]
    assert [b.column("_unchanged").null_count for b in only_changed] == [0]


def test_an_update_changing_the_key_with_an_unchanged_toasted_value_and_no_old_row_is_refused_naming_the_fix():
    dec = decoder()
    with pytest.raises(UnchangedToastError, match=r"public\.t .* LSN 0/64\).*primary key.*\['name'\].*REPLICA "
                                                  r"IDENTITY FULL"):
        rows(dec, [relation(1, "public.t", ["id", "name"]), begin(100, T0, 7),
                   update(1, [2, UNCHANGED], old=[1, None], old_kind=b"K"), commit(100, T0)])


def test_other_tables_of_the_publication_are_left_out_unless_the_stream_is_the_whole_publication():
    messages = [relation(1, "public.t", ["id", "name"]), relation(2, "public.other", ["id"]),
                begin(100, T0, 7), insert(2, [9]), insert(1, [1, "a"]), commit(100, T0)]
    assert rows(decoder(), messages) == [("insert", 1, "a", 100, 7)]
    with pytest.raises(PostgresError, match=r"table public\.other joined publication 'pub' after the query started"):
        rows(decoder(whole_publication="pub"), messages)


def test_a_column_added_under_a_running_query_stops_it_and_a_dropped_one_is_left_out():
    added = [relation(1, "public.t", ["id", "name", "extra"]), begin(100, T0, 7), insert(1, [1, "a", "e"]),
             commit(100, T0)]
    with pytest.raises(PostgresError, match=r"column\(s\) \['extra'\] that the stream's schema does not.*restart"):
        rows(decoder(), added)
    gone = decoder(gone_columns=lambda table, names: names)  # the table no longer has them: dropped since
    assert rows(gone, added) == [("insert", 1, "a", 100, 7)]


def test_truncate_is_one_event_per_streamed_table_in_its_place_or_refused_with_truncate_fail():
    tables = {"public.t": ["id", "name"], "public.u": ["id", "name"]}
    base = [relation(1, "public.t", ["id", "name"]), relation(2, "public.other", ["id"]),
            relation(3, "public.u", ["id", "name"]), begin(100, T0, 7), insert(1, [1, "a"])]
    after = [insert(1, [2, "b"]), commit(100, T0)]
    emit = ChangeDecoder(SCHEMA, TYPES, 0, 1 << 62, tables, emit_truncates=True)
    # One statement over three tables (as a CASCADE lists them too): an event for each streamed one, in its place.
    assert rows(emit, [*base, truncate([1, 2, 3]), *after]) == [
        ("insert", 1, "a", 100, 7), ("truncate", None, None, 100, 7), ("truncate", None, None, 100, 7),
        ("insert", 2, "b", 100, 7)]
    emit = ChangeDecoder(SCHEMA, TYPES, 0, 1 << 62, tables, emit_truncates=True)
    tables_of = [r["_table"] for b in emit.feed(pa.array([*base, truncate([3, 1]), *after], pa.binary()))
                 for r in b.to_pylist() if r["_op"] == "truncate"]
    assert tables_of == ["public.u", "public.t"]
    assert rows(decoder(), [*base[:4], truncate([2]), commit(100, T0)]) == []  # another table's: nothing
    with pytest.raises(PostgresError, match=r"TRUNCATE of \['public\.t'\] .*truncate=fail.*Set truncate=emit"):
        rows(decoder(), [*base, truncate([1]), *after])
    assert rows(decoder(start=200), [*base, truncate([1]), *after]) == []  # outside the batch's range


