"""spark.readStream.format("hbase"): rows found by their cell timestamps, on the real HBase of conftest.py (puts
through its Thrift2 gateway, timestamps given by the region server unless a test gives its own). Most tests drive
the stream reader as Spark's micro-batch loop does; the first runs the query in Spark."""

from collections import Counter

import pytest

from sluice import OptionError
from sluice.connectors.hbase import HBaseDataSource
from sluice.connectors.hbase._client import _local
from sluice.spark._compat import ReadAllAvailable, ReadMaxRows
from tests.faults import poll_until
from tests.tracking_stream import drain, run_stop_and_restart

SCHEMA = "id string, v string, at timestamp"
SPLITS = (b"r0010", b"r0020")  # three regions


def opts(hbase, table, **more):
    return hbase.opts(table, rowkey="id", family="d", **{"tracking.column": "at", **more})


def stream(hbase, table, schema=SCHEMA, **more):
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    kinds = {"string": StringType(), "timestamp": TimestampType()}
    parsed = StructType([StructField(n, kinds[k]) for n, k in (c.split() for c in schema.split(","))])
    return HBaseDataSource(opts(hbase, table, **more)).streamReader(parsed), parsed


def put(hbase, table, rows, stamp=None, qualifier=b"v"):
    """Puts of (row key, value) into d:<qualifier>; `stamp`: the writer's own timestamp (ms), else the region
    server's clock."""
    t = hbase.t
    hbase.conn.call("putMultiple", table.encode(), [
        t.TPut(row=key.encode(), timestamp=stamp,
               columnValues=[t.TColumnValue(family=b"d", qualifier=qualifier, value=value.encode(), timestamp=stamp)])
        for key, value in rows])


def stamp_of(hbase, table, key):
    got = hbase.conn.call("get", table.encode(), hbase.t.TGet(row=key.encode()))
    return max(c.timestamp for c in got.columnValues)


def keys(n, start=0, value="x"):
    return [(f"r{i:04d}", value) for i in range(start, start + n)]


def ids(table):
    return table.column("id").to_pylist()


def test_puts_while_the_query_runs_appear_and_a_restart_misses_and_repeats_nothing(spark, hbase, tmp_path):
    t = hbase.table(splits=SPLITS)
    put(hbase, t, keys(20))

    def frame():
        return (spark.readStream.format("hbase").options(**opts(hbase, t, **{"tracking.lag-window-ms": "300",
                                                                             "max-records-per-trigger": "10"}))
                .schema(SCHEMA).load())

    sizes, got = run_stop_and_restart(spark, frame, tmp_path, while_running=lambda: put(hbase, t, keys(10, 20, "y")),
                                      while_stopped=lambda: put(hbase, t, keys(10, 30, "z")))
    assert sizes[0] == 10 and max(sizes) <= 10, sizes
    assert got == [k for k, _ in keys(40)], "no row missing and none twice across the restart"


def late_put(hbase, t, window_ms):
    """Writer B puts row b (the region server stamps it); writer A's put of row a carries an older timestamp of its
    own (B's minus 1 ms) and is applied after the stream saw B's. Then c. The rows the stream read, in order."""
    reader, schema = stream(hbase, t, **{"tracking.lag-window-ms": str(window_ms)})
    start, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: True)  # a query's first
    # planning waits one window; the writers start after it
    put(hbase, t, [("b", "B")])
    start, first, _ = drain(reader, start, schema, until=lambda read: True)
    assert ids(first) == (["b"] if window_ms == 0 else []), "without a window B's row is read at once, else held"
    put(hbase, t, [("a", "A")], stamp=stamp_of(hbase, t, "b") - 1)
    put(hbase, t, [("c", "C")])
    _, rest, _ = drain(reader, start, schema, until=lambda read: "c" in ids(read))
    return ids(first) + ids(rest)


def test_a_put_with_an_older_timestamp_is_read_once_within_the_window_and_lost_without_it(hbase):
    assert late_put(hbase, hbase.table(), 1500) == ["a", "b", "c"], "every row exactly once, in timestamp order"
    # Negative control: without a window the stream passes A's timestamp before A's put is there, and never reads it.
    assert late_put(hbase, hbase.table(), 0) == ["b", "c"], "the late put is lost without the window"


def test_a_row_is_read_again_with_its_values_as_of_the_range_when_any_read_cell_changes(hbase):
    t = hbase.table()  # one region: one task, whose rows are in (timestamp, row key) order
    put(hbase, t, [("r0", "v0"), ("r2", "v2")])
    put(hbase, t, [("r0", "w0")], qualifier=b"w")
    reader, schema = stream(hbase, t, schema="id string, v string, w string, at timestamp",
                            **{"tracking.lag-window-ms": "0"})
    start, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 2)
    assert first.select(["id", "v", "w"]).to_pylist() == [
        {"id": "r2", "v": "v2", "w": None}, {"id": "r0", "v": "v0", "w": "w0"}], "ordered by newest cell, then key"
    put(hbase, t, [("r0", "w1")], qualifier=b"w")  # one cell of r0 changes: the row again, v from before the range
    _, again, _ = drain(reader, start, schema, until=lambda read: read.num_rows >= 1)
    assert again.select(["id", "v", "w"]).to_pylist() == [{"id": "r0", "v": "v0", "w": "w1"}]
    assert again.column("at")[0].as_py().timestamp() * 1000 == pytest.approx(stamp_of(hbase, t, "r0"))


def test_caps_and_tasks_per_region_and_a_restarted_reader_goes_on_from_the_committed_offset(hbase):
    t = hbase.table(splits=SPLITS)
    stamp = 1_767_225_600_000  # one millisecond for all 30 rows: the cap cuts that group by row key
    put(hbase, t, keys(30), stamp=stamp)
    options = {"tracking.lag-window-ms": "0", "tracking.rows-per-task": "4"}
    reader, schema = stream(hbase, t, **options)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    assert end["splits"]["all"] == {"value": stamp * 1000, "key": [b"r0009".hex()]}
    tasks = reader.partitions(start, end)
    assert len(tasks) == 9, "cut every 4 rows (3 ranges), each read in one task per region (3)"
    middle, first, sizes = drain(reader, start, schema, until=lambda read: read.num_rows >= 10, limit=ReadMaxRows(10))
    assert sizes == [10] and ids(first) == [k for k, _ in keys(10)], "a cap cuts a millisecond's rows by row key"
    restarted, _ = stream(hbase, t, **options)  # a new driver from the checkpoint's offset
    _, rest, _ = drain(restarted, middle, schema, until=lambda read: first.num_rows + read.num_rows >= 30)
    assert sorted(ids(first) + ids(rest)) == [k for k, _ in keys(30)], "each row once across the restart"
    now, _ = stream(hbase, t, **options, **{"tracking.start": "now"})
    at = now.initialOffset()
    put(hbase, t, keys(2, 30))
    _, read, _ = drain(now, at, schema, until=lambda read: read.num_rows >= 2)
    assert sorted(ids(read)) == ["r0030", "r0031"], "start now: the puts after it"
    since, _ = stream(hbase, t, **options, **{"tracking.start": "2026-01-01T00:00:00.001"})
    _, read, _ = drain(since, since.initialOffset(), schema, until=lambda read: read.num_rows >= 2)
    assert sorted(ids(read)) == ["r0030", "r0031"], "start at a value after the 30 rows' timestamp"


class Counting:
    """A gateway connection that counts the calls sent through it (`sent`), by method."""

    def __init__(self, conn):
        self.conn, self.sent = conn, Counter()

    def call(self, method, *args, **kwargs):
        self.sent[method] += 1
        return self.conn.call(method, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_planning_sends_as_many_calls_at_eight_regions_as_at_one(hbase):
    sent = {}
    for regions in (1, 8):
        t = hbase.table(splits=[f"r{i * 10:04d}".encode() for i in range(1, regions)])
        put(hbase, t, keys(3))
        reader, _ = stream(hbase, t, **{"tracking.lag-window-ms": "0"})
        scans = reader.enumerator.scans
        scans.conn = Counting(scans.conn)  # the driver's calls (the stream's reads would go elsewhere)
        start, counts = reader.initialOffset(), []
        # The backlog, an idle planning, a row in the last region, three rows there read under a cap of two.
        for new, limit in (([], ReadAllAvailable()), ([], ReadAllAvailable()), (keys(1, 75), ReadAllAvailable()),
                           (keys(3, 76), ReadMaxRows(2))):
            put(hbase, t, new)
            before = Counter(scans.conn.sent)
            end = reader.latestOffset(start, limit)
            assert len(reader.partitions(start, end)) == (regions if end != start else 0), "a task per region"
            counts.append(sum((scans.conn.sent - before).values()))
            start = end
        sent[regions] = counts
    assert sent[1] == sent[8], f"calls per planning at 1 and 8 regions: {sent}"


def test_a_gateway_restart_between_micro_batches_loses_and_repeats_nothing(hbase):
    t = hbase.table(splits=SPLITS)
    put(hbase, t, keys(10))
    reader, schema = stream(hbase, t, **{"tracking.lag-window-ms": "0"})
    middle, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10)
    put(hbase, t, keys(10, 10))
    planning = _local.clients[(hbase.server.host, hbase.server.port)]
    hbase.server.restart_gateway()  # the driver's client's connection dies with it
    _, rest, _ = drain(reader, middle, schema, until=lambda read: read.num_rows >= 10)
    assert sorted(ids(first) + ids(rest)) == [k for k, _ in keys(20)], "each row once"
    assert _local.clients[(hbase.server.host, hbase.server.port)] is not planning, \
        "planning met the dead connection and opened a new one"
    reader.stop()


def test_a_server_crash_and_restart_between_micro_batches_loses_and_repeats_nothing():
    """The whole standalone HBase (master, region server and gateway) killed and started again on its data: the
    puts acknowledged before the crash come back from the WAL with their timestamps, and the stream goes on."""
    from sluice.connector import RetryableError
    from sluice.testing import LocalHBase
    from tests.connectors.hbase.conftest import HBase

    def readable(own, table):
        try:
            return own.rows(table) is not None
        except RetryableError:
            return False  # the regions are still opening (NotServingRegionException)

    with LocalHBase() as server:
        own = HBase(server)
        t = own.table(splits=SPLITS)
        put(own, t, keys(10))
        reader, schema = stream(own, t, **{"tracking.lag-window-ms": "0"})
        middle, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10)
        put(own, t, keys(10, 10))  # acknowledged before the crash, not read yet
        server.kill()
        server.start()
        poll_until(lambda: readable(own, t), 120, "the table's regions served again", 0.2)
        put(own, t, keys(10, 20))
        _, rest, _ = drain(reader, middle, schema, until=lambda read: read.num_rows >= 20)
        assert sorted(ids(first) + ids(rest)) == [k for k, _ in keys(30)], "each row once across the crash"
        reader.stop()


def test_bad_input_is_refused_before_the_query_starts_naming_it(spark, hbase):
    t = hbase.table()
    # The first through Spark: the query fails before its first micro-batch, with the error naming the column.
    with pytest.raises(Exception, match=r"tracking.column 'updated' is not a column of the read's schema"):
        query = (spark.readStream.format("hbase").options(**opts(hbase, t, **{"tracking.column": "updated"}))
                 .schema(SCHEMA).load().writeStream.format("noop").start())
        query.awaitTermination(120)
    with pytest.raises(OptionError, match=r"tracking.column 'updated' is not a column of the read's schema"):
        stream(hbase, t, **{"tracking.column": "updated"})
    with pytest.raises(OptionError, match=r"tracking.column 'v' is string"):
        stream(hbase, t, **{"tracking.column": "v"})
    with pytest.raises(OptionError, match=r"tracking.column 'id' is a rowkey column"):
        stream(hbase, t, **{"tracking.column": "id"})
    with pytest.raises(OptionError, match=r"has no column family \['e'\]"):
        stream(hbase, t, **{"columns": "v=e:v"})
    with pytest.raises(OptionError, match=r"HBase table default:nope does not exist"):
        stream(hbase, "default:nope")
    with pytest.raises(OptionError, match=r"option 'tracking.start' must be beginning, now or an ISO 8601"):
        stream(hbase, t, **{"tracking.start": "yesterday"})
    with pytest.raises(OptionError, match=r"\['read.versions'\] apply to spark.read.format\('hbase'\)"):
        stream(hbase, t, **{"read.versions": "2"})
    with pytest.raises(OptionError, match=r"apply to spark.readStream.format\('hbase'\) only"):
        HBaseDataSource(opts(hbase, t)).reader(None)
    with pytest.raises(OptionError, match=r"needs option 'tracking.column'"):
        HBaseDataSource(hbase.opts(t, rowkey="id", family="d")).streamReader(None)


def test_a_stream_reports_time_behind_by_the_clock_and_the_fetch_event_time_lag(hbase):
    import time

    import sluice.metrics

    t = hbase.table()
    now_ms = int(time.time() * 1000)
    for i in range(30):  # one row a second over the last 30 s, stamped by the writer
        put(hbase, t, keys(1, i), stamp=now_ms - (30 - i) * 1000)
    with sluice.metrics.serve() as server:
        reader, schema = stream(hbase, t, **{"tracking.lag-window-ms": "0"})
        end, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10,
                          limit=ReadMaxRows(10))
        reader.commit(end)  # as Spark does once the micro-batch is written
        report = [r for r in server.sources.snapshot() if r.format == "hbase"][-1]
        # Row 10 is 21 s old; the head is the clock at the last planning. Records behind: not counted (a scan).
        assert report.pending_records is None and report.splits == ()
        assert 21_000 <= report.time_behind_ms < 60_000, report
        assert report.position.endswith(f"key ['{b'r0009'.hex()}']")
        assert server.reads.wait_for(lambda snapshot: snapshot.get("hbase", {}).get("records") == 10, 30), \
            "the read task's report did not come within 30 s"
        assert server.reads.snapshot()["hbase"]["event_lag_ms"] >= 21_000
        reader.stop()
