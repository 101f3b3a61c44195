"""format("clickhouse") with errors.tolerance=all: rows ClickHouse refuses (a CONSTRAINT ... CHECK) and values the
chunk checks refuse before sending (an Int8 of 300) go to a dead-letter table, the rest is written; negative
control: the default errors.tolerance=none fails the write as before."""

import json

import pytest

import sluice

pytestmark = pytest.mark.spark

LETTERS = ("record String, error_class String, error_message String, connector String, target String, "
           "write_id String, micro_batch Nullable(Int64), task Int32, failed_at DateTime64(6, 'UTC')")


def test_refused_rows_go_to_a_clickhouse_dead_letter_table_and_the_rest_is_written(spark, ch):
    table = ch.table("id Int64, v Int64, small Int8, CONSTRAINT v_positive CHECK v >= 0")
    letters = ch.table(LETTERS, "MergeTree ORDER BY tuple()")
    # 400 rows in 2 tasks: ids 7, 150 and 333 break the CHECK (ClickHouse refuses their INSERT: the engine splits the
    # batch until each is alone), ids 20 and 250 hold 300 in the Int8 column (refused before anything is sent).
    df = spark.range(0, 400, 1, 2).selectExpr(
        "id", "CASE WHEN id IN (7, 150, 333) THEN -id ELSE id END AS v",
        "CAST(CASE WHEN id IN (20, 250) THEN 300 ELSE id % 100 END AS INT) AS small")
    opts = {**ch.opts(table, **{"sink.batch.max-size": "64"}), "errors.tolerance": "all",
            "errors.deadletter.format": "clickhouse",
            **{f"errors.deadletter.{k}": v for k, v in ch.opts(letters).items()}}
    sluice.write(df, "clickhouse", opts)
    assert ch.rows(f"SELECT count(), countIf(id IN (7, 150, 333, 20, 250)) FROM {table}") == [["395", "0"]]
    got = {json.loads(r[0])["id"]: r for r in ch.rows(f"SELECT record, error_class, error_message, connector, "
                                                         f"target, micro_batch FROM {letters}")}
    assert sorted(got) == [7, 20, 150, 250, 333]
    assert json.loads(got[7][0]) == {"id": 7, "v": -7, "small": 7}, "the user's columns come back"
    assert got[7][1] == "RecordError" and "VIOLATED_CONSTRAINT" in got[7][2] and "v_positive" in got[7][2]
    assert got[20][1] == "RecordError" and "value 300 of column" in got[20][2]
    assert "outside the range of its ClickHouse type Int8" in got[20][2]
    assert {r[3] for r in got.values()} == {"clickhouse"} and table in got[7][4] and got[7][5] == "\\N"
    assert sluice.last_write_summary()["dead_letters"] == 5

    # With insert deduplication, a split half carries a token of its own rows: a re-run of the write (same write id,
    # same aligned batches, the same halves) is deduplicated whole, and no half was taken for its refused batch.
    dedup = ch.table("id Int64, v Int64, small Int8, CONSTRAINT v_positive CHECK v >= 0",
                     "MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000")
    once = {**opts, **ch.opts(dedup, **{"sink.batch.max-size": "64", "insert.deduplicate": "true",
                                        "sink.write-id": "dl-dedup"})}
    for _ in range(2):
        sluice.write(df, "clickhouse", once)
    assert ch.rows(f"SELECT count(), uniqExact(id) FROM {dedup}") == [["395", "395"]]

    # Negative control: without errors.tolerance=all the same rows fail the write, naming how to send them aside.
    again = ch.table("id Int64, v Int64, small Int8, CONSTRAINT v_positive CHECK v >= 0")
    with pytest.raises(Exception, match=r"VIOLATED_CONSTRAINT.*errors\.tolerance=all"):
        sluice.write(df.where("small < 200"), "clickhouse", ch.opts(again))
    with pytest.raises(Exception, match=r"value 300 of column 'small' is outside the range .*errors\.tolerance=all"):
        sluice.write(df.where("v >= 0"), "clickhouse", ch.opts(again))


def narrowed(ch):
    """A table whose column `n` a read's schema narrows to int: 'x' does not convert (the row of id 2)."""
    table = ch.table("id Int64, n String")
    ch.sql(f"INSERT INTO {table} VALUES (1, '10'), (2, 'x'), (3, '30')")
    return table


def read_letters(ch, letters):
    return {"errors.tolerance": "all", "errors.deadletter.format": "clickhouse",
            **{f"errors.deadletter.{k}": v for k, v in ch.opts(letters).items()}}


def check_the_letter(ch, letters, table):
    got = ch.rows(f"SELECT record, error_class, error_message, connector, target FROM {letters}")
    assert len(got) == 1
    record, error_class, message, connector, target = got[0]
    message = message.replace("\\'", "'")  # as TabSeparated escapes it
    assert json.loads(record) == {"id": 2, "n": "x"}, "the row as the server sent it"
    assert (error_class, connector, target) == ("ValueTypeError", "clickhouse", f"table `default`.`{table}`")
    assert f"clickhouse table `default`.`{table}`, split " in message
    assert "key (id=2): the value 'x' of column 'n' does not convert to int32" in message


def test_a_batch_read_sends_a_row_its_schema_cannot_type_aside_and_reads_the_others(spark, ch):
    table, letters = narrowed(ch), ch.table(LETTERS, "MergeTree ORDER BY tuple()")

    def read(**options):  # a new DataFrameReader each time: options() adds to the one it is called on
        return spark.read.format("clickhouse").schema("id long, n int").options(**ch.opts(table), **options).load()

    rows = read(**read_letters(ch, letters)).collect()
    assert sorted((r.id, r.n) for r in rows) == [(1, 10), (3, 30)]
    check_the_letter(ch, letters, table)

    # Negative control: without errors.tolerance=all the row fails the read, saying how to send it aside.
    with pytest.raises(Exception, match=r"(?s)column 'n' does not convert from string to int32.*'x'.*"
                                        r"errors\.tolerance=all"):
        read().collect()


@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_tracking_stream_sends_a_row_its_schema_cannot_type_aside_and_goes_on(spark, ch, tmp_path, tolerance):
    from pyspark.errors import StreamingQueryException

    table, letters = narrowed(ch), ch.table(LETTERS, "MergeTree ORDER BY tuple()")
    options = {"tracking.column": "id", "tracking.lag-window-ms": "0"}
    if tolerance == "all":
        options |= read_letters(ch, letters)
    query = spark.readStream.format("clickhouse").schema("id long, n int").options(**ch.opts(table, **options)) \
        .load().writeStream.format("memory").queryName(f"ch_tracked_{tolerance}").trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":
        with pytest.raises(StreamingQueryException, match=r"(?s)'x'.*errors\.tolerance=all"):
            query.awaitTermination(120)
        return
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((r.id, r.n) for r in spark.table(f"ch_tracked_{tolerance}").collect()) == [(1, 10), (3, 30)]
    check_the_letter(ch, letters, table)
