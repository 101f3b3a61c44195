"""spark.readStream.format("cassandra"): a table streamed by a tracking column with a storage-attached index (SAI),
on the Cassandra 5.0 test server (conftest.py). Most tests drive the stream reader as Spark's micro-batch loop does;
the first runs the query in Spark. The node restart is last: it restarts the module's server."""

import contextlib

import pytest

from sluice import OptionError
from sluice.connectors.cassandra import CassandraDataSource
from sluice.connectors.cassandra._client import session_for
from sluice.spark._compat import ReadAllAvailable, ReadMaxRows
from tests.tracking_stream import drain, run_stop_and_restart


def stream(cass, table, **options):
    source = CassandraDataSource(cass.opts(table, **options))
    schema = source.schema()
    return source.streamReader(schema), schema


def ids(table):
    return [int(i) for i in table.column("id").to_pylist()]


def tracked(cass, columns="id int PRIMARY KEY, seq bigint, v text", column="seq"):
    t = cass.table(columns)
    cass.cql(f"CREATE INDEX ON sluice.{t} ({column}) USING 'sai'")
    return t


def insert(cass, t, rows, session=None):
    statement = (session or cass.session).prepare(f"INSERT INTO sluice.{t} (id, seq) VALUES (?, ?)")
    for row in rows:
        (session or cass.session).execute(statement, row)


@pytest.mark.lines  # Spark 4.0/4.1: sluice's own caps and a one-micro-batch AvailableNow after the first window
def test_rows_written_while_the_query_runs_appear_and_a_restart_misses_and_repeats_nothing(spark, cass, tmp_path):
    t = tracked(cass, "id int PRIMARY KEY, at timestamp, v text", "at")
    cass.cql(f"INSERT INTO sluice.{t} (id, at, v) VALUES (0, '2026-01-01 00:00:00+0000', 'x')")
    for i in range(1, 20):  # toTimestamp(now()): the coordinator's clock, milliseconds
        cass.cql(f"INSERT INTO sluice.{t} (id, at, v) VALUES ({i}, toTimestamp(now()), 'x')")

    def frame():
        return (spark.readStream.format("cassandra").options(**cass.opts(t)).option("tracking.column", "at")
                .option("tracking.lag-window-ms", "300").option("max-records-per-trigger", "10").load())

    def write(first, value):
        for i in range(first, first + 10):
            cass.cql(f"INSERT INTO sluice.{t} (id, at, v) VALUES ({i}, toTimestamp(now()), '{value}')")

    _, got = run_stop_and_restart(spark, frame, tmp_path, while_running=lambda: write(20, "y"),
                                  while_stopped=lambda: write(30, "z"))
    assert [int(i) for i in got] == list(range(40)), "no row missing and none twice across the restart"


def late_write(cass, t, window_ms):
    """Two writers of their own sessions: B writes a row of a greater tracking value first; A's row, of a value
    taken before B's, is written after the stream has seen B's. The ids the stream read."""
    a, b = cass.cluster.connect(), cass.cluster.connect()
    reader, schema = stream(cass, t, **{"tracking.column": "seq", "tracking.lag-window-ms": str(window_ms)})
    start, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: True)  # a query's first
    # planning waits one window; the writers start after it
    insert(cass, t, [(2, 20)], b)
    start, first, _ = drain(reader, start, schema, until=lambda read: True)
    assert ids(first) == ([2] if window_ms == 0 else []), "without a window B's row is read at once, else held"
    insert(cass, t, [(1, 10)], a)
    insert(cass, t, [(3, 30)], b)
    _, rest, _ = drain(reader, start, schema, until=lambda read: 3 in ids(read))
    a.shutdown(), b.shutdown()
    return ids(first) + ids(rest)


def test_a_row_written_late_with_a_smaller_value_is_read_once_within_the_window_and_lost_without_it(cass):
    assert late_write(cass, tracked(cass), 1500) == [1, 2, 3], "every row exactly once, in tracking order"
    # Negative control: without a window the stream passes A's value before A's row is there, and never reads it.
    assert late_write(cass, tracked(cass), 0) == [2, 3], "the late row is lost without the window"


def test_a_cap_takes_whole_groups_a_restarted_reader_goes_on_and_starts_now_or_at_a_value(cass):
    t = tracked(cass)
    insert(cass, t, [(i, i // 5) for i in range(20)])  # groups of 5 of one seq
    options = {"tracking.column": "seq", "tracking.lag-window-ms": "0"}
    reader, schema = stream(cass, t, **options)
    middle, first, sizes = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10,
                                 limit=ReadMaxRows(3))
    assert sizes == [5, 5], "a cap of 3 never cuts a group of one tracking value"
    restarted, _ = stream(cass, t, **options)  # a new driver from the checkpoint's offset
    _, rest, _ = drain(restarted, middle, schema, until=lambda read: first.num_rows + read.num_rows >= 20)
    assert sorted(ids(first) + ids(rest)) == list(range(20)), "each row once across the restart"
    now, _ = stream(cass, t, **options, **{"tracking.start": "now"})
    at = now.initialOffset()
    insert(cass, t, [(20, 4), (21, 9)])
    _, read, _ = drain(now, at, schema, until=lambda read: read.num_rows >= 2)
    assert sorted(ids(read)) == [20, 21], "start now: the rows written after it"
    valued, _ = stream(cass, t, **options, **{"tracking.start": "3"})
    _, read, _ = drain(valued, valued.initialOffset(), schema, until=lambda read: read.num_rows >= 7)
    assert sorted(ids(read)) == [15, 16, 17, 18, 19, 20, 21], "start at 3: the rows of seq >= 3"
    ahead, _ = stream(cass, t, **options, **{"tracking.start": "100"})  # above every value yet
    at, read, _ = drain(ahead, ahead.initialOffset(), schema, until=lambda read: True)
    assert read.num_rows == 0 and at["splits"]["all"] == {"value": 100, "key": None}, "the start holds"
    insert(cass, t, [(22, 100), (23, 99)])
    _, read, _ = drain(ahead, at, schema, until=lambda read: read.num_rows >= 1)
    assert ids(read) == [22], "start at 100: seq 100 and not 99"


def test_a_capped_end_is_bisected_by_counts_and_a_micro_batch_is_read_in_token_slices(cass):
    t = tracked(cass)
    insert(cass, t, [(i, i * 1000) for i in range(100)])  # sparse values: the bisection halves wide gaps
    reader, _ = stream(cass, t, **{"tracking.column": "seq", "tracking.lag-window-ms": "0", "partitions": "3"})
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(40))
    parts = reader.partitions(start, end)
    read = [i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()]
    assert len(parts) == 3 and 20 <= len(read) <= 40, (len(parts), len(read))
    assert sorted(read) == list(range(len(read))), "the first rows by value, each once across the slices"
    assert reader.latestOffset(end, ReadMaxRows(1000))["splits"]["all"]["value"] == 99_000, "uncapped: the head"


@contextlib.contextmanager
def requests_of(session):
    """Counts what the driver's `session` sends: {"statements": executed, "prepares": prepare() calls}."""
    sent = {"statements": 0, "prepares": 0}
    prepare = session.prepare

    def counted(*args, **kwargs):
        sent["prepares"] += 1
        return prepare(*args, **kwargs)

    def executed(_future):
        sent["statements"] += 1

    session.prepare = counted
    session.add_request_init_listener(executed)
    try:
        yield sent
    finally:
        session.remove_request_init_listener(executed)
        del session.prepare


def test_planning_sends_the_same_statements_for_any_number_of_slices_and_prepares_each_once(cass):
    t = tracked(cass)
    per_planning = {}
    for slices in (1, 64):
        reader, _ = stream(cass, t, **{"tracking.column": "seq", "tracking.lag-window-ms": "0",
                                       "partitions": str(slices)})
        start, counts = reader.initialOffset(), []
        with requests_of(session_for(reader.enumerator.cql.conn)) as sent:
            for planning in range(4):
                insert(cass, t, [(slices * 100 + planning, slices * 100 + planning)])
                before = dict(sent)
                end = reader.latestOffset(start, ReadAllAvailable())
                assert len(reader.partitions(start, end)) == slices, "a task per slice"
                counts.append((sent["statements"] - before["statements"], sent["prepares"] - before["prepares"]))
                start = end
        per_planning[slices] = counts
        assert all(prepares == 0 for _, prepares in counts[2:]), f"prepared once per query, not per planning: {counts}"
    assert [s for s, _ in per_planning[1]] == [s for s, _ in per_planning[64]], f"not per slice: {per_planning}"


def test_bad_tracking_columns_are_refused_before_the_query_starts_naming_the_column(spark, cass):
    t = cass.table("id int, c int, name text, n int, at timestamp, legacy bigint, PRIMARY KEY (id, c)")
    cass.cql(f"CREATE INDEX ON sluice.{t} (name) USING 'sai'")
    cass.cql(f"CREATE INDEX ON sluice.{t} (legacy)")  # Cassandra's original secondary index: equality only
    # The first through Spark (load() asks the source's schema() on the driver), the others as load() would.
    load = spark.readStream.format("cassandra").options(**cass.opts(t))
    with pytest.raises(Exception, match=r"tracking.column 'updated_at' is not a column of"):
        load.option("tracking.column", "updated_at").load()
    with pytest.raises(OptionError, match=r"tracking.column 'name' has type text"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "name"})).schema()
    with pytest.raises(OptionError, match=r"tracking.column 'at' of .* has no storage-attached index.*"
                                          r"CREATE INDEX ON \"sluice\".\"t_\w+\" \(\"at\"\) USING 'sai'"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "at"})).schema()
    with pytest.raises(OptionError, match=r"tracking.column 'legacy' .* no storage-attached index \(its index is "
                                          r"legacy"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "legacy"})).schema()
    with pytest.raises(OptionError, match=r"tracking.column 'id' .* partition key"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "id"})).schema()
    cass.cql(f"CREATE INDEX ON sluice.{t} (n) USING 'sai'")
    with pytest.raises(OptionError, match=r"tracking.start 3000000000 is out of the range of tracking.column 'n'"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "n", "tracking.start": "3000000000"})).schema()
    with pytest.raises(OptionError, match=r"needs option 'tracking.column'"):
        CassandraDataSource(cass.opts(t)).streamReader(None)
    with pytest.raises(OptionError, match=r"apply to spark.readStream.format\('cassandra'\) only"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "n"})).reader(None)
    with pytest.raises(OptionError, match=r"option\(s\) \['read.split-size-mb'\] apply to spark.read"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "n", "read.split-size-mb": "2"})).streamReader(None)
    with pytest.raises(OptionError, match=r"'tracking.rows-per-task' does not apply to format\('cassandra'\)"):
        CassandraDataSource(cass.opts(t, **{"tracking.column": "n", "tracking.rows-per-task": "9"})).streamReader(None)


def test_a_stream_reports_records_and_time_behind_and_the_fetch_event_time_lag(cass):
    import datetime as dt

    import sluice.metrics

    t = tracked(cass, "id int PRIMARY KEY, at timestamp", "at")
    insert_at = cass.session.prepare(f"INSERT INTO sluice.{t} (id, at) VALUES (?, ?)")
    for i in range(1, 31):  # a second apart, the last 30 s after the first
        cass.session.execute(insert_at, (i, dt.datetime(2026, 1, 1) + dt.timedelta(seconds=i)))
    with sluice.metrics.serve() as server:
        reader, schema = stream(cass, t, **{"tracking.column": "at", "tracking.lag-window-ms": "0"})
        end, read, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows > 0,
                             limit=ReadMaxRows(10))
        n = read.num_rows
        assert 5 <= n <= 10 and sorted(ids(read)) == list(range(1, n + 1)), "a capped end: at least half the cap"
        reader.commit(end)  # as Spark does once the micro-batch is written
        report = [r for r in server.sources.snapshot() if r.format == "cassandra"][-1]
        assert (report.pending_records, report.time_behind_ms) == (30 - n, (30 - n) * 1000.0)
        assert [(s.split, s.pending_records) for s in report.splits] == [("all", 30 - n)]
        assert server.reads.wait_for(lambda snapshot: snapshot.get("cassandra", {}).get("records") == n, 30), \
            "the read task's report did not come within 30 s"
        assert server.reads.snapshot()["cassandra"]["event_lag_ms"] >= 30_000, "now minus 2026-01-01 and more"
        reader.stop()


def test_a_node_restart_between_micro_batches_loses_and_repeats_nothing(cass):
    t = tracked(cass)
    insert(cass, t, [(i, i) for i in range(10)])
    cass.server.nodetool("flush", "sluice", t)  # on disk and in the commit log: the restarted node has it
    reader, schema = stream(cass, t, **{"tracking.column": "seq", "tracking.lag-window-ms": "0"})
    middle, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10)
    cass.server.kill()  # SIGKILL: the driver's and the stream's sessions lose their connections
    cass.server.start()  # returns once the node answers CQL
    fresh = cass.server.cluster()  # the test's own session reconnects in the background
    insert(cass, t, [(i, i) for i in range(10, 20)], fresh.connect())
    _, rest, _ = drain(reader, middle, schema, until=lambda read: read.num_rows >= 10, timeout=60)
    assert sorted(ids(first)) == list(range(10)) and sorted(ids(rest)) == list(range(10, 20))
    reader.stop()
    fresh.shutdown()
