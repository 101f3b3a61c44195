"""format("cassandra") with errors.tolerance=all on a real Cassandra 5.0: rows Cassandra cannot take go to a dead-letter
table with their reason, the others are stored; with errors.tolerance=none (the default) the same rows fail the write,
naming what is wrong."""

import json

import pytest

import sluice

pytestmark = pytest.mark.spark

TABLE = "pk text, ck int, v text, PRIMARY KEY ((pk), ck)"
ROWS = 300
NULL_KEYS = (17, 150, 299)  # a null clustering key: the encoder refuses these before anything is sent
EMPTY_KEYS = (40, 41)  # an empty partition key: the server refuses these ("Key may not be empty")


def rows(spark):
    data = [("" if i in EMPTY_KEYS else f"p{i % 30}", None if i in NULL_KEYS else i, f"v{i}") for i in range(ROWS)]
    return spark.createDataFrame(data, "pk string, ck int, v string").repartition(2)


def letters(tmp_path) -> dict[str, str]:
    return {"errors.tolerance": "all", "errors.deadletter.format": "tablestore", "errors.deadletter.table": "refused",
            "errors.deadletter.warehouse": str(tmp_path / "warehouse"),
            "errors.deadletter.meta": str(tmp_path / "meta.db")}


@pytest.mark.parametrize("grouping", ["partition", "none"])
def test_refused_rows_go_to_the_dead_letter_table_and_the_others_are_stored(spark, cass, tmp_path, grouping):
    """partition: a one-partition batch refused as a whole is split until the row is alone; none: the statement that
    failed is known (RefusedRecords), its neighbours count as stored."""
    table = cass.table(TABLE)
    sluice.write(rows(spark), "cassandra", cass.opts(table, **{"batch.grouping": grouping}, **letters(tmp_path)))
    good = {i for i in range(ROWS) if i not in NULL_KEYS + EMPTY_KEYS}
    assert {r.ck for r in cass.cql(f"SELECT ck FROM sluice.{table}")} == good
    summary = sluice.last_write_summary("cassandra")
    assert summary["dead_letters"] == 5 and summary["records"] == len(good), summary
    # Only a batch refused as a whole is split to find the row.
    assert ("split" in summary["flush_reasons"]) == (grouping == "partition"), summary

    dead = spark.read.format("tablestore").options(table="refused", warehouse=str(tmp_path / "warehouse"),
                                                    meta=str(tmp_path / "meta.db")).load().collect()
    by_v = {json.loads(d.record)["v"]: d for d in dead}
    assert sorted(by_v) == sorted(f"v{i}" for i in NULL_KEYS + EMPTY_KEYS)
    for i in NULL_KEYS:  # the user's columns, as they were
        assert json.loads(by_v[f"v{i}"].record) == {"pk": f"p{i % 30}", "ck": None, "v": f"v{i}"}
        assert "primary key column 'ck' is null" in by_v[f"v{i}"].error_message
    for i in EMPTY_KEYS:
        assert json.loads(by_v[f"v{i}"].record) == {"pk": "", "ck": i, "v": f"v{i}"}
        assert "Key may not be empty" in by_v[f"v{i}"].error_message
    assert {(d.connector, d.error_class) for d in dead} == {("cassandra", "RecordError")}
    assert all(table in d.target for d in dead)


def test_without_tolerance_the_same_rows_fail_the_write_naming_them(spark, cass):
    """The negative control: errors.tolerance=none, as by default."""
    table = cass.table(TABLE)
    with pytest.raises(Exception, match=r"primary key column 'ck' is null .*'pk': 'p\d+'.*errors\.tolerance=all"):
        sluice.write(rows(spark), "cassandra", cass.opts(table))
    no_null_keys = rows(spark).where("ck IS NOT NULL")
    with pytest.raises(Exception, match=r"Key may not be empty.*errors\.tolerance=all"):
        sluice.write(no_null_keys, "cassandra", cass.opts(table))


# Reads: a varint of 41 digits has no form in Spark's decimal(38,0) (the row of id 2); its letter goes to a Cassandra
# table (a read's tasks commit their own dead letters: the target must be one they write themselves).
BIG = 10**40
LETTERS = ("record text, error_class text, error_message text, connector text, target text, write_id text, "
           "micro_batch bigint, task int, failed_at timestamp, PRIMARY KEY ((record), failed_at)")


def unreadable(cass):
    table = cass.table("id int PRIMARY KEY, seq bigint, n varint")
    cass.cql(f"CREATE INDEX ON sluice.{table} (seq) USING 'sai'")  # a tracking stream's column
    for i, n in ((1, 10), (2, BIG), (3, 30)):
        cass.cql(f"INSERT INTO sluice.{table} (id, seq, n) VALUES (%s, %s, %s)", (i, i, n))
    return table


def read_letters(cass, letters):
    return {"errors.tolerance": "all", "errors.deadletter.format": "cassandra",
            **{f"errors.deadletter.{k}": v for k, v in cass.opts(letters).items()}}


def check_the_letter(cass, letters, table):
    got = cass.cql(f"SELECT record, error_class, error_message, connector, target FROM sluice.{letters}")
    assert len(got) == 1
    record, error_class, message, connector, target = got[0]
    assert json.loads(record) == {"id": 2, "seq": 2, "n": BIG}, "the row as the driver read it"
    assert (error_class, connector, target) == ("ValueTypeError", "cassandra", f'table "sluice"."{table}"')
    assert f'cassandra table "sluice"."{table}", split ' in message
    assert f"key (id=2): the value {BIG} of column 'n' (CQL varint) does not convert to decimal128(38, 0)" in message


def test_a_batch_read_sends_a_row_it_cannot_type_aside_and_reads_the_others(spark, cass):
    table, letters = unreadable(cass), cass.table(LETTERS)
    rows = spark.read.format("cassandra").options(**cass.opts(table), **read_letters(cass, letters)).load().collect()
    assert sorted((r.id, int(r.n)) for r in rows) == [(1, 10), (3, 30)]
    check_the_letter(cass, letters, table)

    # Negative control: without errors.tolerance=all the row fails the read, named, saying how to send it aside.
    with pytest.raises(Exception, match=rf"(?s)key \(id=2\): the value {BIG} of column 'n'.*errors\.tolerance=all"):
        spark.read.format("cassandra").options(**cass.opts(table)).load().collect()


@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_tracking_stream_sends_a_row_it_cannot_type_aside_and_goes_on(spark, cass, tmp_path, tolerance):
    from pyspark.errors import StreamingQueryException

    table, letters = unreadable(cass), cass.table(LETTERS)
    options = {"tracking.column": "seq", "tracking.lag-window-ms": "0"}
    if tolerance == "all":
        options |= read_letters(cass, letters)
    query = spark.readStream.format("cassandra").options(**cass.opts(table, **options)).load() \
        .writeStream.format("memory").queryName(f"cass_tracked_{tolerance}").trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":
        with pytest.raises(StreamingQueryException, match=rf"(?s)the value {BIG} of column 'n'.*errors\.tolerance=all"):
            query.awaitTermination(120)
        return
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((r.id, int(r.n)) for r in spark.table(f"cass_tracked_{tolerance}").collect()) == [(1, 10), (3, 30)]
    check_the_letter(cass, letters, table)

