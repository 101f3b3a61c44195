"""spark.readStream.format("postgres"): a table streamed by a tracking column (no logical replication), on a real
server. Most tests drive the stream reader as Spark's micro-batch loop does; the first runs the query in Spark."""

import psycopg
import pytest

from sluice import OptionError
from sluice.connectors.postgres import PostgresDataSource
from sluice.spark._compat import ReadMaxRows
from tests.tracking_stream import drain, run_stop_and_restart


def stream(pg, table, **options):
    source = PostgresDataSource(pg.opts(table, **options))
    schema = source.schema()
    return source.streamReader(schema), schema


def ids(table):
    return table.column("id").to_pylist()


def test_rows_written_while_the_query_runs_appear_and_a_restart_misses_and_repeats_nothing(spark, pg, tmp_path):
    t = pg.table("events")
    pg.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp(), v text)")
    pg.sql(f"CREATE INDEX ON {t} (at, id)")
    # 12 rows of one timestamp: micro-batches of 10 cut that group by the primary key, the tie-breaker.
    pg.sql(f"INSERT INTO {t} SELECT g, timestamptz '2026-01-01 00:00:00+00', 'x' FROM generate_series(1, 12) g")
    pg.sql(f"INSERT INTO {t} (id, v) SELECT g, 'x' FROM generate_series(13, 20) g")

    def frame():
        return (spark.readStream.format("postgres").options(**pg.opts(t)).option("tracking.column", "at")
                .option("tracking.lag-window-ms", "300").option("max-records-per-trigger", "10").load())

    sizes, got = run_stop_and_restart(
        spark, frame, tmp_path,
        while_running=lambda: pg.sql(f"INSERT INTO {t} (id, v) SELECT g, 'y' FROM generate_series(21, 30) g"),
        while_stopped=lambda: pg.sql(f"INSERT INTO {t} (id, v) SELECT g, 'z' FROM generate_series(31, 40) g"))
    assert sizes[0] == 10 and max(sizes) <= 10, sizes
    assert got == list(range(1, 41)), "no row missing and none twice across the restart"


def concurrent_writers(pg, t, window_ms):
    """Writer A takes its id first and commits last: its row shows up behind a greater id the stream has seen.
    The ids the stream read, in order."""
    reader, schema = stream(pg, t, **{"tracking.column": "id", "tracking.lag-window-ms": str(window_ms)})
    start, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: True)  # a query's first
    # planning waits one window; the writers start after it
    with psycopg.connect(pg.url) as a, psycopg.connect(pg.url) as b:
        late = a.execute(f"INSERT INTO {t} (v) VALUES ('a') RETURNING id").fetchone()[0]
        early = b.execute(f"INSERT INTO {t} (v) VALUES ('b') RETURNING id").fetchone()[0]
        b.commit()
        assert late < early
        # The stream sees B's row (and, with no window, reads past A's id) before A commits.
        start, first, _ = drain(reader, start, schema, until=lambda read: True)
        if window_ms == 0:
            assert ids(first) == [early]
        else:
            assert first.num_rows == 0, "held back: B's row is younger than the window"
        a.commit()
    last = pg.sql(f"INSERT INTO {t} (v) VALUES ('c') RETURNING id")[0][0]
    _, rest, _ = drain(reader, start, schema, until=lambda read: last in ids(read))
    reader.stop()
    return ids(first) + ids(rest), late, early, last


def test_a_row_committed_late_with_a_smaller_id_is_read_once_within_the_window_and_lost_without_it(pg):
    t = pg.table("late")
    pg.sql(f"CREATE TABLE {t} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")
    got, late, early, last = concurrent_writers(pg, t, 1500)
    assert got == [late, early, last], "every row exactly once, in tracking order"
    # Negative control: without a window the stream passes A's id before A commits, and never reads its row.
    t0 = pg.table("late")
    pg.sql(f"CREATE TABLE {t0} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text)")
    got, late, early, last = concurrent_writers(pg, t0, 0)
    assert got == [early, last] and late not in got, "the late row is lost without the window"


def test_caps_cut_groups_by_the_key_and_a_restarted_reader_goes_on_from_the_committed_offset(pg):
    t = pg.table("capped")
    pg.sql(f"CREATE TABLE {t} (k text, n int, at timestamp(3) NOT NULL, PRIMARY KEY (k, n))")
    pg.sql(f"INSERT INTO {t} SELECT 'k' || (g % 3), g, timestamp '2026-03-01 12:00' + (g / 10) * interval '1 ms' "
           "FROM generate_series(1, 40) g")
    options = {"tracking.column": "at", "tracking.lag-window-ms": "0"}
    reader, schema = stream(pg, t, **options)
    start = reader.initialOffset()
    middle, first, sizes = drain(reader, start, schema, until=lambda read: read.num_rows >= 20, limit=ReadMaxRows(6))
    assert set(sizes) <= {6, 2} and first.num_rows in (20, 22, 24)
    reader.stop()
    restarted, _ = stream(pg, t, **options)  # a new driver from the checkpoint's offset
    _, rest, _ = drain(restarted, middle, schema, until=lambda read: first.num_rows + read.num_rows >= 40)
    rows = first.column("n").to_pylist() + rest.column("n").to_pylist()
    assert sorted(rows) == list(range(1, 41)), "each row once across the restart"
    replayed, _ = stream(pg, t, **options)  # a micro-batch replayed from its offsets reads the same rows
    again = [b for p in replayed.partitions(start, middle) for b in replayed.read(p)]
    assert sum(b.num_rows for b in again) == first.num_rows


def test_start_positions_now_and_a_value(pg):
    t = pg.table("starts")
    pg.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, at timestamptz NOT NULL)")
    pg.sql(f"INSERT INTO {t} SELECT g, timestamptz '2026-05-01 00:00+00' + g * interval '1 hour' "
           "FROM generate_series(1, 10) g")
    reader, schema = stream(pg, t, **{"tracking.column": "at", "tracking.lag-window-ms": "0",
                                      "tracking.start": "2026-05-01T07:00:00+00:00"})
    _, read, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 4)
    assert ids(read) == [7, 8, 9, 10]
    now, _ = stream(pg, t, **{"tracking.column": "at", "tracking.lag-window-ms": "0", "tracking.start": "now"})
    start = now.initialOffset()
    pg.sql(f"INSERT INTO {t} VALUES (11, timestamptz '2026-06-01 00:00+00')")
    _, read, _ = drain(now, start, schema, until=lambda read: read.num_rows >= 1)
    assert ids(read) == [11]
    assert start["v"] == 1 and start["column"] == "at" and start["kind"] == "timestamp"
    other, _ = stream(pg, t, **{"tracking.column": "id"})
    with pytest.raises(OptionError, match="the checkpoint's offset tracks column 'at'"):
        other.latestOffset(start, other.getDefaultReadLimit())


def test_bad_tracking_columns_are_refused_before_the_query_starts_naming_the_column(spark, pg):
    t = pg.table("bad")
    pg.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, name text, at timestamptz)")
    # The first through Spark (load() asks the source's schema() on the driver), the others as load() would.
    load = spark.readStream.format("postgres").options(**pg.opts(t))
    with pytest.raises(Exception, match=r"tracking.column 'updated_at' is not a column of table"):
        load.option("tracking.column", "updated_at").load()
    with pytest.raises(OptionError, match=r"tracking.column 'name' has type text"):
        PostgresDataSource(pg.opts(t, **{"tracking.column": "name"})).schema()
    with pytest.raises(OptionError, match=r"tracking.column 'At' .*the source has 'at'"):
        PostgresDataSource(pg.opts(t, **{"tracking.column": "At"})).schema()
    with pytest.raises(OptionError, match=r"option 'tracking.start' must be beginning, now or an ISO 8601"):
        PostgresDataSource(pg.opts(t, **{"tracking.column": "at", "tracking.start": "yesterday"})).schema()
    with pytest.raises(OptionError, match=r"needs option 'tracking.column'"):
        PostgresDataSource(pg.opts(t)).streamReader(None)
    with pytest.raises(OptionError, match=r"apply to spark.readStream.format\('postgres'\) only"):
        PostgresDataSource(pg.opts(t, **{"tracking.column": "at"})).reader(None)
    with pytest.raises(OptionError, match=r"Did you mean 'tracking.column'"):
        PostgresDataSource(pg.opts(t, **{"tracking.colum": "at"})).schema()


def test_a_stream_reports_records_and_time_behind_and_the_fetch_event_time_lag(pg):
    import sluice.metrics

    t = pg.table("metered")
    pg.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, at timestamptz NOT NULL)")
    pg.sql(f"INSERT INTO {t} SELECT g, now() - (30 - g) * interval '1 second' FROM generate_series(1, 30) g")
    with sluice.metrics.serve() as server:
        reader, schema = stream(pg, t, **{"tracking.column": "at", "tracking.lag-window-ms": "0"})
        end, _, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10,
                             limit=ReadMaxRows(10))
        reader.commit(end)  # as Spark does once the micro-batch is written
        report = [r for r in server.sources.snapshot() if r.format == "postgres"][-1]
        assert (report.pending_records, report.time_behind_ms) == (20, 20_000.0)
        assert report.position.endswith("key ['10']") and report.head.endswith("key ['30']")
        assert [(s.split, s.pending_records) for s in report.splits] == [("all", 20)]
        assert server.reads.wait_for(lambda snapshot: snapshot.get("postgres", {}).get("records") == 10, 30), \
            "the read task's report did not come within 30 s"
        # currentFetchEventTimeLag: now minus the newest tracking time fetched (row 10: 20 s before the insert)
        assert server.reads.snapshot()["postgres"]["event_lag_ms"] >= 20_000
        reader.stop()


def test_a_server_restart_between_micro_batches_loses_and_repeats_nothing():
    from sluice.testing import LocalPostgres
    from tests.conftest import PG

    with LocalPostgres() as server:
        own = PG(server.url)
        t = own.table("restarted")
        own.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY)")
        own.sql(f"INSERT INTO {t} SELECT generate_series(1, 10)")
        reader, schema = stream(own, t, **{"tracking.column": "id", "tracking.lag-window-ms": "0"})
        middle, first, _ = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 10)
        planning = reader.enumerator._conn
        server.restart(crash=True)  # the driver's planning connection dies with it
        own.sql(f"INSERT INTO {t} SELECT generate_series(11, 20)")
        _, rest, _ = drain(reader, middle, schema, until=lambda read: read.num_rows >= 10)
        assert ids(first) + ids(rest) == list(range(1, 21))
        assert reader.enumerator._conn is not planning, "planning met the dead connection and opened a new one"
        reader.stop()


def test_a_query_streams_without_a_tie_breaker_in_whole_groups_of_one_value(pg):
    t = pg.table("queried")
    pg.sql(f"CREATE TABLE {t} (id int, seq bigint)")
    pg.sql(f"INSERT INTO {t} SELECT g, g / 4 FROM generate_series(0, 11) g")  # groups of 4 of one seq
    source = PostgresDataSource({"url": pg.url, "query": f"SELECT id, seq FROM {t} WHERE id <> 5",
                                 "tracking.column": "seq", "tracking.lag-window-ms": "0"})
    schema = source.schema()
    reader = source.streamReader(schema)
    _, read, sizes = drain(reader, reader.initialOffset(), schema, until=lambda read: read.num_rows >= 11,
                           limit=ReadMaxRows(2))
    assert sizes == [4, 3, 4], "a cap of 2 never cuts a group of one tracking value (no key to cut by)"
    assert sorted(ids(read)) == [i for i in range(12) if i != 5]


def test_a_micro_batch_is_read_by_tasks_of_rows_per_task_cut_at_rows_positions(pg):
    t = pg.table("tasks")
    pg.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, n int NOT NULL)")
    pg.sql(f"INSERT INTO {t} SELECT g, g / 4 FROM generate_series(1, 10) g")  # groups of one n, cut by the key
    reader, _ = stream(pg, t, **{"tracking.column": "n", "tracking.lag-window-ms": "0",
                                 "tracking.rows-per-task": "3"})
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    parts = reader.partitions(start, end)
    read = [[i for b in reader.read(p) for i in b.column("id").to_pylist()] for p in parts]
    assert read == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]], "tasks of 3 rows in (n, id) order, each row once"
    whole, _ = stream(pg, t, **{"tracking.column": "n", "tracking.lag-window-ms": "0", "tracking.rows-per-task": "0"})
    assert len(whole.partitions(start, end)) == 1
