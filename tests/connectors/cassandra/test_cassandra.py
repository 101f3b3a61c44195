"""format("cassandra") on a real Cassandra 5.0: upserts in one-partition batches, every CQL type with a Spark
counterpart both ways, deletes, write timestamps and TTLs, replays, token-range reads, and refused input."""

import datetime as dt
import time
import uuid
from decimal import Decimal

import pyarrow as pa
import pytest

import sluice
from sluice.connectors.cassandra._client import CassandraError, Connection
from sluice.connectors.cassandra._replay import KeyspaceReplayGuard
from tests.faults import replay_first_micro_batch

pytestmark = pytest.mark.spark

KEYED = "pk int, ck int, v text, amount double, PRIMARY KEY ((pk), ck)"


def keyed_rows(spark, partitions: int, per_partition: int):
    rows = [(p, c, f"v{p}-{c}", p * 1.5 + c) for p in range(partitions) for c in range(per_partition)]
    return spark.createDataFrame(rows, "pk int, ck int, v string, amount double"), rows


def stored(cass, table: str, columns: str = "pk, ck, v, amount") -> set[tuple]:
    return {tuple(r) for r in cass.cql(f"SELECT {columns} FROM sluice.{table}")}


def test_partition_grouping_sends_one_batch_per_partition_and_reads_back_in_token_ranges(spark, cass):
    table = cass.table(KEYED)
    df, rows = keyed_rows(spark, partitions=40, per_partition=5)
    sluice.write(df, "cassandra", cass.opts(table))
    summary = sluice.last_write_summary("cassandra")
    assert stored(cass, table) == set(rows)
    # Each partition's 5 small rows fit one batch, and no batch holds two partitions: 40 batches for 40 partitions.
    assert summary["records"] == 200 and summary["batches"] == 40, summary
    back = spark.read.format("cassandra").options(**cass.opts(table, partitions="4")).load()
    assert back.rdd.getNumPartitions() == 4
    assert back.schema.simpleString() == "struct<pk:int,ck:int,amount:double,v:string>"
    assert sorted((r.pk, r.ck, r.v, r.amount) for r in back.collect()) == sorted(rows)


def test_sluice_write_sorts_each_task_by_partition_so_scattered_rows_still_fill_one_batch_per_partition(spark, cass):
    """150 partitions' rows interleaved (every partition's first row, then every second row...), reaching the
    writer 16 rows per Arrow batch with room for 20 buffered and batches of 4 rows: only a partition's rows side by
    side in its task fill one batch each. The control writes the same repartitioned rows without the sort."""
    rows = [(p, c, f"v{p}-{c}", p * 1.5 + c) for c in range(4) for p in range(150)]
    df = spark.createDataFrame(rows, "pk int, ck int, v string, amount double")
    opts = {"sink.requests.max-buffered": "20", "sink.batch.max-size": "4"}
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "16")
    try:
        sorted_table, control_table = cass.table(KEYED), cass.table(KEYED)
        sluice.write(df, "cassandra", cass.opts(sorted_table, **opts))
        batches = sluice.last_write_summary("cassandra")["batches"]
        control_write = df.repartition(2, "pk").write.format("cassandra").mode("append")
        control_write.options(**cass.opts(control_table, **opts)).save()
        control = sluice.last_write_summary("cassandra")["batches"]
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert stored(cass, sorted_table) == stored(cass, control_table) == set(rows)
    assert batches == 150, f"{batches} batches for 150 partitions"
    assert control > 300, f"the unsorted control sent {control} batches: it no longer shows the sort's effect"


def test_filters_on_the_partition_key_and_first_clustering_column_are_read_by_cassandra(spark, cass):
    table = cass.table(KEYED)
    df, rows = keyed_rows(spark, partitions=20, per_partition=6)
    sluice.write(df, "cassandra", cass.opts(table))

    def check(where: str, want, pushdown: str = "true") -> int:
        read = spark.read.format("cassandra").options(**cass.opts(table, partitions="4", pushdown=pushdown)).load()
        got = read.where(where)
        assert sorted((r.pk, r.ck, r.v, r.amount) for r in got.collect()) == sorted(filter(want, rows)), where
        return got.rdd.getNumPartitions()

    # Without pushdown (the default) Spark filters after reading every token range: the same rows.
    assert check("pk = 3", lambda r: r[0] == 3, pushdown="false") == 4

    # The partition key fully given: the named partitions are read directly, one Spark partition, no token scan.
    assert check("pk = 3", lambda r: r[0] == 3) == 1
    assert check("pk IN (1, 7) AND ck >= 2 AND ck < 5", lambda r: r[0] in (1, 7) and 2 <= r[1] < 5) == 1
    # A clustering slice alone filters inside every token range; a filter on another column stays with Spark.
    assert check("ck > 3", lambda r: r[1] > 3) == 4
    assert check("v = 'v2-2'", lambda r: r[2] == "v2-2") == 4


def test_mixed_and_single_statement_groupings_write_the_same_rows_in_other_requests(spark, cass):
    df, rows = keyed_rows(spark, partitions=40, per_partition=5)
    batches = {}
    for grouping in ("mixed", "none"):
        table = cass.table(KEYED)
        sluice.write(df.coalesce(1), "cassandra", cass.opts(table, **{"batch.grouping": grouping}))
        assert stored(cass, table) == set(rows)
        batches[grouping] = sluice.last_write_summary("cassandra")["batches"]
    # Mixed batches fill up to sink.batch.max-size rows across partitions: far fewer requests than partitions.
    assert batches["mixed"] < 40, batches


TYPES = ("id int PRIMARY KEY, ti tinyint, si smallint, bi bigint, vi varint, de decimal, fl float, db double, "
         "bo boolean, bl blob, tx text, asci ascii, ts timestamp, da date, tm time, u uuid, tu timeuuid, ip inet, "
         "li list<int>, se set<text>, ma map<text, bigint>, tu2 tuple<int, text>, ad frozen<address>, "
         "fl2 frozen<list<int>>, nested map<text, frozen<list<text>>>")
SPARK = ("id int, ti byte, si short, bi long, vi decimal(38,0), de decimal(38,18), fl float, db double, bo boolean, "
         "bl binary, tx string, asci string, ts timestamp, da date, tm long, u string, tu string, ip string, "
         "li array<int>, se array<string>, ma map<string,bigint>, tu2 struct<_1:int,_2:string>, "
         "ad struct<street:string,zip:int>, fl2 array<int>, nested map<string,array<string>>")


def typed_rows(n: int) -> list[tuple]:
    return [(i, i % 100 - 50, i * 300 - 20000, -(2**62) + i, Decimal(10**30 + i), Decimal(f"{i}.{i:018d}"),
             float(i) / 4, i / 3, i % 2 == 0, bytes([i % 256, 7]), f"text ü {i}", f"ascii {i}",
             dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, milliseconds=i),
             dt.date(1950, 1, 1) + dt.timedelta(days=i * 97), i * 1_000_000_007 % 86_400_000_000_000,
             str(uuid.UUID(int=i * 7919 + 1)), str(uuid.uuid1(node=i + 1, clock_seq=i)), f"10.0.{i // 256}.{i % 256}",
             list(range(i % 4)), sorted({f"s{i % 3}", "a"}), {f"k{i % 2}": i}, (i, f"t{i}"),
             {"street": f"street {i}", "zip": 10000 + i}, [i, i + 1], {"x": [f"n{i}"]})
            for i in range(50)]


def test_every_cql_type_with_a_spark_counterpart_round_trips(spark, cass):
    cass.cql("CREATE TYPE IF NOT EXISTS sluice.address (street text, zip int)")
    table = cass.table(TYPES)
    df = spark.createDataFrame(typed_rows(50), SPARK)
    sluice.write(df, "cassandra", cass.opts(table))
    # Stored as Cassandra itself reads it, not only as sluice reads it back.
    row = cass.cql(f"SELECT vi, de, ts, da, tm, u, ip, se, tu2, ad FROM sluice.{table} WHERE id = 7")[0]
    assert row.vi == 10**30 + 7 and row.de == Decimal("7.000000000000000007")
    assert row.ts == dt.datetime(2026, 1, 1, 0, 0, 7, 7000)
    assert str(row.da) == "1951-11-11" and row.tm.nanosecond_time == 7 * 1_000_000_007 % 86_400_000_000_000
    assert row.u == uuid.UUID(int=7 * 7919 + 1) and row.ip == "10.0.0.7" and set(row.se) == {"a", "s1"}
    assert row.tu2 == (7, "t7") and (row.ad.street, row.ad.zip) == ("street 7", 10007)
    back = spark.read.format("cassandra").options(**cass.opts(table)).load().select(*df.columns)
    assert back.schema.simpleString() == df.schema.simpleString().replace("bigint", "bigint")
    got = {r.id: r.asDict(recursive=True) for r in back.collect()}
    for want in df.collect():
        expected = want.asDict(recursive=True)
        expected["li"] = expected["li"] or None  # an empty non-frozen collection is no cells: Cassandra reads null
        assert got[want.id] == expected, {k: (got[want.id][k], v) for k, v in expected.items()
                                          if got[want.id][k] != v}


def test_a_column_a_row_leaves_unchanged_is_left_unset_so_the_stored_cell_stays(spark, cass):
    table = cass.table(KEYED)
    df, _ = keyed_rows(spark, partitions=1, per_partition=2)
    sluice.write(df, "cassandra", cass.opts(table))
    changes = spark.createDataFrame([(0, 0, None, 9.0, ["v"]), (0, 1, "new", 8.0, None)],
                                    "pk int, ck int, v string, amount double, _unchanged array<string>")
    sluice.write(changes, "cassandra", cass.opts(table, **{"upsert.unchanged-column": "_unchanged"}))
    assert stored(cass, table) == {(0, 0, "v0-0", 9.0), (0, 1, "new", 8.0)}
    # The negative control: the marker dropped, the row's null deletes the stored cell.
    sluice.write(changes.drop("_unchanged"), "cassandra", cass.opts(table))
    assert stored(cass, table) == {(0, 0, None, 9.0), (0, 1, "new", 8.0)}


def test_deletes_ttls_timestamps_and_ignored_nulls(spark, cass):
    table = cass.table(KEYED)
    df, _ = keyed_rows(spark, partitions=3, per_partition=3)
    sluice.write(df, "cassandra", cass.opts(table))
    changes = spark.createDataFrame([(0, 0, None, None, "d"), (1, 1, None, 9.0, "u"), (2, 2, "new", None, "u")],
                                    "pk int, ck int, v string, amount double, op string")
    sluice.write(changes, "cassandra", cass.opts(table, **{"upsert.op-column": "op", "write.ignore-nulls": "true"}))
    got = {(r[0], r[1]): (r[2], r[3]) for r in stored(cass, table)}
    assert (0, 0) not in got and len(got) == 8
    assert got[(1, 1)] == ("v1-1", 9.0)  # the null v left the stored value alone
    assert got[(2, 2)] == ("new", 5.0)
    # A null without write.ignore-nulls deletes the cell, as CQL's INSERT of null does.
    nulls = spark.createDataFrame([(1, 2, None, 1.0)], "pk int, ck int, v string, amount double")
    sluice.write(nulls, "cassandra", cass.opts(table))
    assert cass.cql(f"SELECT v FROM sluice.{table} WHERE pk = 1 AND ck = 2")[0].v is None

    timed = spark.createDataFrame([(5, 0, "t", 1.0, 1_700_000_000_000_123, 3600)],
                                  "pk int, ck int, v string, amount double, at long, ttl int")
    sluice.write(timed, "cassandra", cass.opts(table, **{"write.timestamp-column": "at", "write.ttl-column": "ttl"}))
    row = cass.cql(f"SELECT WRITETIME(v) AS w, TTL(v) AS t FROM sluice.{table} WHERE pk = 5 AND ck = 0")[0]
    assert row.w == 1_700_000_000_000_123 and 3500 < row.t <= 3600
    # An older timestamp than the stored cell's loses: the data's own timestamps decide, not arrival order.
    older = spark.createDataFrame([(5, 0, "older", 1.0, 1_700_000_000_000_000)],
                                  "pk int, ck int, v string, amount double, at long")
    sluice.write(older, "cassandra", cass.opts(table, **{"write.timestamp-column": "at"}))
    assert cass.cql(f"SELECT v FROM sluice.{table} WHERE pk = 5 AND ck = 0")[0].v == "t"


def test_a_replayed_micro_batch_never_overwrites_a_later_one(spark, cass, tmp_path):
    """A micro-batch whose write reached Cassandra but not the checkpoint's commit log (the driver was killed) is
    replayed from a copy of that checkpoint after a later batch changed the same rows. With
    write.timestamp=micro-batch the replay's cells carry batch 0's timestamps and lose to batch 1's; with the
    executor's clock (the negative control) the replay is newer and overwrites batch 1."""

    def replay(timestamps: str) -> set[str]:
        table = cass.table(KEYED)

        def batch(n: int) -> pa.Table:
            return pa.table({"pk": pa.array([1] * 5, pa.int32()), "ck": pa.array(range(5), pa.int32()),
                             "v": [f"batch {n}"] * 5, "amount": [float(n)] * 5})

        after_batch_1, replayed = replay_first_micro_batch(
            spark, tmp_path / timestamps, "pk int, ck int, v string, amount double", batch, "cassandra",
            cass.opts(table, **{"write.timestamp": timestamps, "write.replay-guard": "false"}),
            lambda: {r[2] for r in stored(cass, table)})
        assert after_batch_1 == {"batch 1"}
        return replayed

    assert replay("micro-batch") == {"batch 1"}
    assert replay("client") == {"batch 0"}


def test_a_replay_after_compaction_purged_the_tombstones_brings_no_deleted_row_back(spark, cass, tmp_path):
    """The same replay of micro-batch 0 after micro-batch 1 deleted half its rows, into a table that keeps
    tombstones for no time (gc_grace_seconds=0; 10 days by default only delays this), flushed and compacted so that
    the tombstones are purged. The replay guard's marker says micro-batch 1 was committed, so the replay writes
    nothing; without the guard (the negative control) the deleted rows come back, micro-batch timestamps and all."""

    def replay(guard: str) -> tuple[set[int], set[int]]:
        table = cass.table("id int PRIMARY KEY, v text")
        cass.cql(f"ALTER TABLE sluice.{table} WITH gc_grace_seconds = 0")
        purged = []

        def batch(n: int) -> pa.Table:
            ids = range(10) if n == 0 else range(0, 10, 2)
            return pa.table({"id": pa.array(ids, pa.int32()), "v": ["x"] * len(ids),
                             "op": ["u" if n == 0 else "d"] * len(ids)})

        def stored_ids() -> set[int]:
            if not purged:  # after micro-batch 1: its tombstones purged
                cass.server.nodetool("flush", "sluice", table)
                # A tombstone is purged once its deletion time (in seconds) is before the compaction's now minus
                # gc_grace_seconds: the compaction starts in a later second than the deletes.
                later = int(time.time()) + 1
                while time.time() < later:
                    time.sleep(0.05)
                cass.server.nodetool("compact", "sluice", table)
                purged.append(table)
            return {r[0] for r in cass.cql(f"SELECT id FROM sluice.{table}")}

        return replay_first_micro_batch(
            spark, tmp_path / guard, "id int, v string, op string", batch, "cassandra",
            cass.opts(table, **{"write.timestamp": "micro-batch", "upsert.op-column": "op",
                                "write.replay-guard": guard}), stored_ids)

    odd = set(range(1, 10, 2))
    assert replay("true") == (odd, odd)
    summary = sluice.last_write_summary("cassandra")
    assert summary["replays_skipped"] >= 1 and summary["records"] == 0, summary
    assert replay("false") == (odd, set(range(10)))


def test_a_guard_table_of_other_columns_is_an_error_naming_the_option(cass):
    """The tasks' read of the marker (as a streaming task makes it) from a table that is not a guard table."""
    other = cass.table("id int PRIMARY KEY, v text")
    conn = Connection((cass.server.host,), cass.server.port, "sluice", cass.table("id int PRIMARY KEY"), None, 10.0)
    with pytest.raises(CassandraError, match=r"write\.replay-guard-table.*query text, target text, micro_batch"):
        KeyspaceReplayGuard(conn, other).last_committed("a-query")
    assert KeyspaceReplayGuard(conn, "t_missing").last_committed("a-query") is None  # made at the first commit


def test_bad_input_is_refused_naming_what_to_change(spark, cass):
    table = cass.table(KEYED)
    opts = cass.opts(table)
    df, _ = keyed_rows(spark, partitions=2, per_partition=2)
    with pytest.raises(Exception, match=r"unknown option 'batch\.grouppig'.*batch\.grouping"):
        sluice.write(df, "cassandra", {**opts, "batch.grouppig": "none"})
    with pytest.raises(Exception, match=r"table 't_nope' does not exist in keyspace 'sluice'"):
        sluice.write(df, "cassandra", cass.opts("t_nope"))
    with pytest.raises(Exception, match=r"keyspace 'Sluice' does not exist.*did you mean 'sluice'"):
        sluice.write(df, "cassandra", {**opts, "keyspace": "Sluice"})
    with pytest.raises(Exception, match=r"column 'amount' is CQL double and cannot take Spark string"):
        sluice.write(df.selectExpr("pk", "ck", "v", "'x' AS amount"), "cassandra", opts)
    with pytest.raises(Exception, match=r"no column \['ck'\] of .*primary key"):
        sluice.write(df.drop("ck"), "cassandra", opts)
    nulls = spark.createDataFrame([(1, None, "x", 1.0)], "pk int, ck int, v string, amount double")
    with pytest.raises(Exception, match=r"primary key column 'ck' is null .*'pk': 1"):
        sluice.write(nulls, "cassandra", opts)
    counters = cass.table("id int PRIMARY KEY, hits counter")
    with pytest.raises(Exception, match=r"column 'hits' is CQL counter"):
        sluice.write(spark.createDataFrame([(1, 2)], "id int, hits long"), "cassandra", cass.opts(counters))
    with pytest.raises(Exception, match=r"batch\.grouping=partition .* sink\.mode=partition-ordered"):
        sluice.write(df, "cassandra", {**opts, "sink.mode": "unordered"})
    assert stored(cass, table) == set()


def test_a_mixed_batch_over_the_servers_fail_threshold_is_an_error_naming_the_options(spark, cass):
    """Cassandra refuses a batch over 50 KiB (batch_size_fail_threshold) when it spans partitions; a batch of one
    partition is one mutation, which the threshold does not limit (CASSANDRA-10876)."""
    table = cass.table(KEYED)
    big = spark.createDataFrame([(p, 0, "x" * 2000, 0.0) for p in range(40)], "pk int, ck int, v string, amount double")
    large = {"sink.flush-buffer.size": "1000000", "sink.flush-buffer.timeout": "60000"}
    with pytest.raises(Exception, match=r"batch_size_fail_threshold.*Lower sink\.flush-buffer\.size"):
        sluice.write(big.coalesce(1), "cassandra", cass.opts(table, **{"batch.grouping": "mixed"}, **large))
    sluice.write(big, "cassandra", cass.opts(table, **large))  # the same bytes, as one-partition batches
    assert len(stored(cass, table)) == 40
    one_partition = spark.createDataFrame([(100, c, "x" * 2000, 0.0) for c in range(40)],
                                          "pk int, ck int, v string, amount double")
    sluice.write(one_partition, "cassandra", cass.opts(table, **large))
    assert sluice.last_write_summary("cassandra")["batches"] == 1  # one 80 KB batch, taken as one mutation
    assert len(stored(cass, table)) == 80


def test_the_password_stays_out_of_errors_and_plans(spark, cass):
    opts = cass.opts("t_nope", username="sluice", password="s3cret-never-shown")
    df, _ = keyed_rows(spark, partitions=1, per_partition=1)
    with pytest.raises(Exception) as refused:
        sluice.write(df, "cassandra", opts)
    assert "s3cret-never-shown" not in str(refused.value)
    reader = spark.read.format("cassandra").options(**opts)
    with pytest.raises(Exception) as on_read:
        reader.load().explain()
    assert "s3cret-never-shown" not in str(on_read.value)
