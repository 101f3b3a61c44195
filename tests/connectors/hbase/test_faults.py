"""format("hbase") when the gateway fails: killed mid-write and started again on the same port, the write retries
through the outage and the table ends up equal to the input; without retries the same outage fails the write
loudly (the negative control), and a re-run converges. A cell the gateway refuses as too large fails the write
with its cause named, and a re-run without it converges."""

import threading
import time

import pytest

import sluice
from tests.faults import Striker, held_at, wait_for_a_client

pytestmark = pytest.mark.spark

ROWS = 3000


def write_held(spark, hold, options: dict[str, str]) -> None:
    """Write ids 0..2999 padded to ~1 KB in one task, whose input stops at id 1500 while `hold` exists. Through
    df.write, not sluice.write: its repartition by row key would hold the whole input back in the shuffle."""
    df = spark.range(0, ROWS, 1, 1).selectExpr("id", "repeat('x', 1000) AS pad") \
        .mapInArrow(held_at(1500, str(hold), 50, 0.02), "id long, pad string")
    df.write.format("hbase").options(**options).mode("append").save()


def strike_gateway(hbase, table: str, hold, restart: bool) -> Striker:
    """In the background: once 300 rows are stored, kill the gateway, let the held input go on (into the outage),
    then (if `restart`) wait until the write reaches the gateway's port during the outage and start the gateway
    again on it."""

    def strike() -> None:
        try:
            deadline = time.monotonic() + 120
            while len(hbase.rows(table)) < 300:
                assert time.monotonic() < deadline, "the write never stored 300 rows"
                threading.Event().wait(0.05)  # polling the store for the event: the rows are there
            hbase.server.kill_gateway()
        finally:
            hold.unlink()
        if restart:
            wait_for_a_client(hbase.server.host, hbase.server.port)
            hbase.server.start_gateway()

    striker = Striker(strike)
    striker.start()
    return striker


def test_a_gateway_killed_and_restarted_mid_write_loses_nothing(spark, hbase, small_arrow_batches, tmp_path):
    table = hbase.table(splits=(b"\x80\x00\x00\x00\x00\x00\x05\xdc",))  # two regions, split at id 1500
    hold = tmp_path / "hold"
    hold.touch()
    striker = strike_gateway(hbase, table, hold, restart=True)
    # Retries enough to ride out the gateway's start (the outage lasts until a request has met it).
    write_held(spark, hold, hbase.opts(table, rowkey="id", family="d",
                                       **{"sink.max-retries": "30", "sink.retry-delay-ms": "200"}))
    striker.join()
    summary = sluice.last_write_summary("hbase")
    assert summary["retries"] >= 1, f"the write never met the outage: {summary}"
    rows = hbase.rows(table)
    assert len(rows) == ROWS and all(r["d:pad"] == b"x" * 1000 for r in rows.values())


def test_without_retries_the_same_outage_fails_the_write_and_a_rerun_converges(spark, hbase, small_arrow_batches,
                                                                              tmp_path):
    table = hbase.table()
    hold = tmp_path / "hold"
    hold.touch()
    striker = strike_gateway(hbase, table, hold, restart=False)
    try:
        with pytest.raises(Exception, match=r"no answer from the HBase Thrift2 gateway at 127\.0\.0\.1:\d+"):
            write_held(spark, hold, hbase.opts(table, rowkey="id", family="d", **{"sink.max-retries": "0"}))
    finally:
        striker.join()
        hbase.server.start_gateway()
    assert 300 <= len(hbase.rows(table)) < ROWS
    rerun = spark.range(0, ROWS, 1, 2).selectExpr("id", "repeat('x', 1000) AS pad")
    sluice.write(rerun, "hbase", hbase.opts(table, rowkey="id", family="d"))
    assert len(hbase.rows(table)) == ROWS


def test_a_cell_the_gateway_refuses_as_too_large_fails_the_write_naming_the_limit(spark, hbase):
    """write.max-cell-bytes raised over the gateway's own limit (hbase.client.keyvalue.maxsize, 10 MiB): the
    gateway refuses the put, the write fails saying so, and the same rows without that cell then go in."""
    table = hbase.table()
    df = spark.createDataFrame([(i, "x" * (12 << 20) if i == 3 else "small") for i in range(5)], "id int, v string")
    opts = hbase.opts(table, rowkey="id", family="d", **{"write.max-cell-bytes": str(20 << 20)})
    with pytest.raises(Exception, match=r"hbase\.client\.keyvalue\.maxsize"):
        sluice.write(df.coalesce(1), "hbase", opts)
    sluice.write(df.where("id != 3"), "hbase", opts)
    assert sorted(hbase.rows(table)) == sorted((i ^ (1 << 31)).to_bytes(4, "big") for i in (0, 1, 2, 4))
