"""The S2 read path that keeps the SDK's protobuf records: same rows as the SDK's objects, and no leak to other
SDK users in the same process (local S2 server, official SDK, no Spark)."""

import asyncio
import uuid

import pyarrow as pa
import s2_sdk
from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType, TimestampType

from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._options import READ_SPEC, ReadOptions
from sluice.connectors.s2._reader import S2Reader
from sluice.connectors.s2._records import RecordColumns, fast_path_installed, protobuf_records
from sluice.source import Split
from tests.connectors.s2.conftest import read_stream

SCHEMA = StructType([
    StructField("stream", StringType()), StructField("seq_num", LongType()), StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([StructField("name", BinaryType()),
                                                 StructField("value", BinaryType())]))),
    StructField("body", BinaryType()),
])


def fill(server, basin, stream):
    """2,500 records: headers on some, empty bodies on some, and command records (trim to 0) in between."""

    async def go():
        async with s2_sdk.S2("local", endpoints=server.endpoints) as client:
            await client.ensure_basin(basin)
            await client.basin(basin).ensure_stream(stream)
            target = client.basin(basin).stream(stream)
            for chunk in range(5):
                records = [s2_sdk.Record(body=b"" if i % 97 == 0 else f"r{chunk}-{i}".encode(),
                                         headers=[(b"k", f"{i}".encode()), (b"k2", b"")] if i % 7 == 0
                                         else []) for i in range(500)]
                await target.append(s2_sdk.AppendInput(records=records))
                await target.append(s2_sdk.AppendInput(records=[s2_sdk.CommandRecord.trim(0)]))

    asyncio.run(go())


def reader(server, basin, stream):
    opts = READ_SPEC.parse({"s2.basin": basin, "s2.streams": stream, "s2.endpoints.account": server.url,
                            "s2.endpoints.basin": server.url, "s2.auth-token": "local"})
    return S2Reader(Connection.from_options(opts), SCHEMA, ReadOptions.of(opts))


def test_protobuf_read_path_gives_the_sdks_records(s2_local):
    basin = f"rec-{uuid.uuid4().hex[:12]}"
    fill(s2_local, basin, "s")
    assert fast_path_installed()
    expected = read_stream(s2_local, basin, "s")  # SDK objects, command records left out
    assert len(expected) == 2500 and any(r.headers for r in expected)
    table = pa.Table.from_batches(list(reader(s2_local, basin, "s").read(Split("s"), 0, 2505)))
    assert table.column("seq_num").to_pylist() == [r.seq_num for r in expected]
    assert table.column("body").to_pylist() == [r.body for r in expected]
    assert [[(h["name"], h["value"]) for h in hs] for hs in table.column("headers").to_pylist()] == \
        [list(r.headers) for r in expected]
    assert [int(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()] == \
        [r.timestamp for r in expected]
    assert set(table.column("stream").to_pylist()) == {"s"}
    # A range that starts and ends inside server batches is cut exactly.
    middle = pa.Table.from_batches(list(reader(s2_local, basin, "s").read(Split("s"), 777, 1999)))
    assert middle.column("seq_num").to_pylist() == [r.seq_num for r in expected if 777 <= r.seq_num < 1999]


def test_other_sdk_users_in_the_process_keep_sdk_objects(s2_local):
    basin = f"rec-{uuid.uuid4().hex[:12]}"
    fill(s2_local, basin, "s")

    async def first_batch(client, fast):
        stream = client.basin(basin).stream("s")
        if fast:
            with protobuf_records():
                session = stream.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=600))
                session.__aiter__()
        else:
            session = stream.read_session(start=s2_sdk.SeqNum(0), limit=s2_sdk.ReadLimit(count=600))
        async with session:
            return [type(r) async for batch in session for r in batch.records]

    async def both():
        async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as client:
            return await asyncio.gather(first_batch(client, True), first_batch(client, False))

    fast, plain = asyncio.run(both())
    assert s2_sdk.SequencedRecord not in set(fast) and len(fast) == 600
    assert set(plain) == {s2_sdk.SequencedRecord} and len(plain) == 600


def test_record_columns_from_sdk_objects_leave_command_records_out():
    records = [s2_sdk.SequencedRecord(seq_num=0, body=b"a", headers=[], timestamp=1),
               s2_sdk.SequencedRecord(seq_num=1, body=b"\x00", headers=[(b"", b"trim")], timestamp=2),
               s2_sdk.SequencedRecord(seq_num=2, body=b"c", headers=[(b"h", b"v")], timestamp=3)]
    columns = RecordColumns.of(records)
    assert columns.seq_nums == [0, 2] and columns.bodies == [b"a", b"c"]
    assert columns.headers == [[], [(b"h", b"v")]] and columns.timestamps == [1, 3]
