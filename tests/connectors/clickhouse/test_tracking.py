"""spark.readStream.format("clickhouse"): a table streamed by a tracking column of the user's, on the ClickHouse
test server (conftest.py). Most tests drive the stream reader as Spark's micro-batch loop does; the first runs the
query in Spark."""

import pytest

from sluice import OptionError
from sluice.connectors.clickhouse import ClickHouseDataSource
from sluice.spark._compat import ReadMaxRows
from tests.tracking_stream import drain, run_stop_and_restart


def stream(ch, table, **options):
    source = ClickHouseDataSource(ch.opts(table, **options))
    schema = source.schema()
    return source.streamReader(schema), schema


def ids(table):
    return [int(i) for i in table.column("id").to_pylist()]


@pytest.mark.lines  # Spark 4.0/4.1: sluice's own caps and a one-micro-batch AvailableNow after the first window
def test_rows_inserted_while_the_query_runs_appear_and_a_restart_misses_and_repeats_nothing(spark, ch, tmp_path):
    t = ch.table("id UInt64, at DateTime64(6) DEFAULT now64(6), v String", "MergeTree() ORDER BY (at, id)")
    # 12 rows of one instant: micro-batches of 10 cut that group by the tie-breaker.
    ch.sql(f"INSERT INTO {t} SELECT number + 1, toDateTime64('2026-01-01 00:00:00', 6, 'UTC'), 'x' "
           "FROM numbers(12)")
    ch.sql(f"INSERT INTO {t} (id, v) SELECT number + 13, 'x' FROM numbers(8)")

    def frame():
        return (spark.readStream.format("clickhouse").options(**ch.opts(t)).option("tracking.column", "at")
                .option("tracking.tie-breaker", "id").option("tracking.lag-window-ms", "300")
                .option("max-records-per-trigger", "10").load())

    sizes, got = run_stop_and_restart(
        spark, frame, tmp_path,
        while_running=lambda: ch.sql(f"INSERT INTO {t} (id, v) SELECT number + 21, 'y' FROM numbers(10)"),
        while_stopped=lambda: ch.sql(f"INSERT INTO {t} (id, v) SELECT number + 31, 'z' FROM numbers(10)"))
    assert sizes[0] == 10 and max(sizes) <= 10, sizes
    assert [int(i) for i in got] == list(range(1, 41)), "no row missing and none twice across the restart"


def late_insert(ch, t, window_ms):
    """Writer B inserts a row of a greater tracking value first; writer A's row of a smaller one is inserted after
    the stream has seen B's (an event time taken before B's and sent after it). The ids the stream read."""
    reader, schema = stream(ch, t, **{"tracking.column": "ts", "tracking.lag-window-ms": str(window_ms)})
    start, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: True)  # a query's first
    # planning waits one window; the writers start after it
    ch.sql(f"INSERT INTO {t} VALUES (2, '2026-02-01 00:00:02.000000')")
    start, first, _ = drain(reader, start, schema, until=lambda read: True)
    assert ids(first) == ([2] if window_ms == 0 else []), "without a window B's row is read at once, else held"
    ch.sql(f"INSERT INTO {t} VALUES (1, '2026-02-01 00:00:01.000000')")
    ch.sql(f"INSERT INTO {t} VALUES (3, '2026-02-01 00:00:03.000000')")
    _, rest, _ = drain(reader, start, schema, until=lambda read: 3 in ids(read))
    return ids(first) + ids(rest)


def test_a_row_inserted_late_with_a_smaller_value_is_read_once_within_the_window_and_lost_without_it(ch):
    columns = "id UInt64, ts DateTime64(6, 'UTC')"
    assert late_insert(ch, ch.table(columns), 1500) == [1, 2, 3], "every row exactly once, in tracking order"
    # Negative control: without a window the stream passes A's value before A's row is there, and never reads it.
    assert late_insert(ch, ch.table(columns), 0) == [2, 3], "the late row is lost without the window"


def test_without_a_tie_breaker_a_micro_batch_takes_whole_groups_and_a_restarted_reader_goes_on(ch):
    t = ch.table("id UInt32, seq Int64")
    ch.sql(f"INSERT INTO {t} SELECT number, intDiv(number, 5) FROM numbers(20)")  # groups of 5 of one seq
    options = {"tracking.column": "seq", "tracking.lag-window-ms": "0"}
    reader, schema = stream(ch, t, **options)
    start = reader.initialOffset()
    middle, first, sizes = drain(reader, start, schema, until=lambda read: read.num_rows >= 10, limit=ReadMaxRows(3))
    assert sizes == [5, 5], "a cap of 3 never cuts a group of one tracking value"
    restarted, _ = stream(ch, t, **options)  # a new driver from the checkpoint's offset
    _, rest, _ = drain(restarted, middle, schema, until=lambda read: first.num_rows + read.num_rows >= 20)
    assert sorted(ids(first) + ids(rest)) == list(range(20)), "each row once across the restart"
    now, _ = stream(ch, t, **options, **{"tracking.start": "now"})
    at = now.initialOffset()
    ch.sql(f"INSERT INTO {t} VALUES (20, 4), (21, 9)")
    _, read, _ = drain(now, at, schema, until=lambda read: read.num_rows >= 2)
    assert ids(read) == [20, 21], "start now: the rows inserted after it"


def test_bad_tracking_columns_are_refused_before_the_query_starts_naming_the_column(spark, ch):
    t = ch.table("id UInt64, name String, at DateTime")
    # The first through Spark (load() asks the source's schema() on the driver), the others as load() would.
    load = spark.readStream.format("clickhouse").options(**ch.opts(t))
    with pytest.raises(Exception, match=r"tracking.column 'updated_at' is not a column of table"):
        load.option("tracking.column", "updated_at").load()
    with pytest.raises(OptionError, match=r"tracking.column 'name' has type String"):
        ClickHouseDataSource(ch.opts(t, **{"tracking.column": "name"})).schema()
    with pytest.raises(OptionError, match=r"tracking.tie-breaker 'key' is not a column"):
        ClickHouseDataSource(ch.opts(t, **{"tracking.column": "at", "tracking.tie-breaker": "key"})).schema()
    with pytest.raises(OptionError, match=r"needs option 'tracking.column'"):
        ClickHouseDataSource(ch.opts(t)).streamReader(None)
    with pytest.raises(OptionError, match=r"apply to spark.readStream.format\('clickhouse'\) only"):
        ClickHouseDataSource(ch.opts(t, **{"tracking.column": "at"})).reader(None)
    with pytest.raises(OptionError, match=r"option\(s\) \['partitions'\] apply to spark.read"):
        ClickHouseDataSource(ch.opts(t, **{"tracking.column": "at", "partitions": "2"})).streamReader(None)
