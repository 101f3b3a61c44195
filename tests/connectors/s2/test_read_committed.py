"""Read committed on exactly-once S2 streams (sluice/connectors/s2/_commits.py), on the local S2 server through the
official SDK: a micro-batch larger than one append is never seen in part, by plans and by Spark reads.

The soak found the failure this prevents: a micro-batch of 2,315 changes went out in three appends and a
reader planned between two of them, so a table-store barrier held half a transfer."""

import asyncio
import json

import pytest
import s2_sdk

from sluice.connector import Batch, Split, WriteContext
from sluice.connectors.s2._client import Connection
from sluice.connectors.s2._options import READ_SPEC, ReadOptions
from sluice.connectors.s2._sink import S2Committer
from sluice.connectors.s2._source import S2Enumerator
from sluice.connectors.s2._store import S2Store
from tests.connectors.s2.conftest import read_stream

STREAM = "bank"


def reading(s2_opts, **options) -> dict:
    """s2_opts (a write's) as a read of STREAM's."""
    connection = ("s2.basin", "s2.endpoints.account", "s2.endpoints.basin", "s2.auth-token")
    return {**{k: s2_opts[k] for k in connection}, "s2.streams": STREAM, **options}


def task(s2_opts, epoch: int, ids: range, *, exactly_once: bool = True, commit: bool = True) -> S2Store:
    """One task of micro-batch `epoch` appending `ids` (as sluice's encoder stamps them), then, with `commit`, the
    driver's commit. Returns the task's store, still open when not committed (a micro-batch in progress)."""
    conn = Connection.from_options(READ_SPEC.parse(reading(s2_opts)), exactly_once)
    store = S2Store(conn, STREAM, create_streams=True, create_basin=True, exactly_once=exactly_once)
    context = WriteContext(write_id="query-1", epoch=epoch, partition_id=0)
    store.open(context)
    writer = f"query-1/{epoch}/0".encode()
    records = [(STREAM, s2_sdk.Record(body=json.dumps({"id": i}).encode(),
                                      headers=[(b"@writer", writer), (b"@wseq", str(n).encode())]))
               for n, i in enumerate(ids)]
    for start in range(0, len(records), 1000):  # S2's most records per append: a large micro-batch is several
        chunk = records[start:start + 1000]
        store.submit(Batch(chunk, 0, len(chunk), sizes=[0] * len(chunk))).result(30)
    if commit:
        S2Committer(conn if exactly_once else None).commit([store.pre_commit()], context)
        store.close()
    return store


def planned_end(s2_opts, floor: int = 0, **options) -> int:
    opts = READ_SPEC.parse(reading(s2_opts, **options))
    enumerator = S2Enumerator(Connection.from_options(opts), ReadOptions.of(opts), batch=False)
    try:
        return enumerator.end_positions([Split(STREAM)], {STREAM: floor})[STREAM]
    finally:
        enumerator.close()


def ids_read(spark, s2_opts, **options) -> list[int]:
    rows = spark.read.format("s2").options(**reading(s2_opts, **options)).load() \
        .selectExpr("cast(body as string) as body").collect()
    return [json.loads(r.body)["id"] for r in rows]


def tail(s2_local, s2_opts) -> int:
    return len(read_stream(s2_local, s2_opts["s2.basin"], STREAM, include_commands=True))


def test_a_micro_batch_in_progress_is_not_planned_until_its_commit(s2_local, s2_opts):
    task(s2_opts, 0, range(0, 2500))  # three appends and a commit fence
    committed = tail(s2_local, s2_opts)
    in_progress = task(s2_opts, 1, range(2500, 4000), commit=False)  # two appends, no commit yet
    try:
        assert tail(s2_local, s2_opts) > committed
        assert planned_end(s2_opts) == committed, "a plan stops at the last commit fence"
        assert planned_end(s2_opts, floor=committed) == committed, "nothing new is committed past the floor"
        # Negative control: without read-committed the plan takes the tail, half of micro-batch 1.
        assert planned_end(s2_opts, **{"s2.read-committed": "false"}) == tail(s2_local, s2_opts)
        S2Committer(in_progress.conn).commit([in_progress.pre_commit()], WriteContext("query-1", 1))
    finally:
        in_progress.close()
    assert planned_end(s2_opts, floor=committed) == tail(s2_local, s2_opts), "committed: read to the tail"


@pytest.mark.spark
def test_a_spark_read_sees_whole_micro_batches_only(spark, s2_local, s2_opts):
    task(s2_opts, 0, range(0, 1200))
    in_progress = task(s2_opts, 1, range(1200, 3500), commit=False)
    try:
        assert ids_read(spark, s2_opts) == list(range(1200))
        assert ids_read(spark, s2_opts, **{"s2.read-committed": "false"}) == list(range(3500))  # negative control
    finally:
        in_progress.close()


def test_a_straggling_task_of_a_committed_micro_batch_is_fenced_out(s2_local, s2_opts):
    straggler = task(s2_opts, 0, range(0, 10), commit=False)
    try:
        S2Committer(straggler.conn).commit([straggler.pre_commit()], WriteContext("query-1", 0))
        late = [(STREAM, s2_sdk.Record(body=b'{"id": 10}', headers=[(b"@writer", b"query-1/0/0"),
                                                                      (b"@wseq", b"10")]))]
        with pytest.raises(s2_sdk.FencingTokenMismatchError):
            straggler.submit(Batch(late, 0, 1, sizes=[0])).result(30)
    finally:
        straggler.close()
    assert [json.loads(r.body)["id"] for r in read_stream(s2_local, s2_opts["s2.basin"], STREAM)] == list(range(10))


@pytest.mark.parametrize("stamped", [False, True], ids=["plain", "stamped at-least-once"])
def test_streams_not_written_exactly_once_are_read_to_their_tail(s2_local, s2_opts, stamped):
    if stamped:
        task(s2_opts, 0, range(0, 1500), exactly_once=False)  # @writer headers, no fences
    else:
        async def plain():
            async with s2_sdk.S2("local", endpoints=s2_local.endpoints) as client:
                await client.create_basin(s2_opts["s2.basin"])
                stream = client.basin(s2_opts["s2.basin"]).stream(STREAM)
                await client.basin(s2_opts["s2.basin"]).create_stream(STREAM)
                await stream.append(s2_sdk.AppendInput(records=[s2_sdk.Record(body=b'{"id": 0}')] * 5))

        asyncio.run(plain())
    assert planned_end(s2_opts) == tail(s2_local, s2_opts)
