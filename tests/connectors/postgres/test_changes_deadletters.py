"""format("postgres_changes") with errors.tolerance=all: a change with a value Spark cannot hold goes to the
dead-letter target with its reason and the stream goes on; without it the stream fails naming the value."""

import json

import psycopg
import pytest

from sluice.connectors.postgres import PostgresChangesDataSource


def sql(url, *statements):
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def slot_before(url, table, slot):
    """The slot made now (its query's changes start here), and released for the query to take."""
    source = PostgresChangesDataSource({"url": url, "table": table, "slot": slot, "snapshot": "false"})
    reader = source.streamReader(source.schema())
    reader.initialOffset()
    reader.stop()


@pytest.mark.spark
@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_change_spark_cannot_type_goes_to_the_dead_letters_and_the_stream_goes_on(spark, lpg, tmp_path, tolerance):
    from deltalake import DeltaTable
    from pyspark.errors import StreamingQueryException

    table, slot = f"priced_{tolerance}", f"sluice_dl_{tolerance}"
    sql(lpg.url, f"CREATE TABLE {table} (id int PRIMARY KEY, price numeric(10,2))")
    slot_before(lpg.url, table, slot)
    # NaN is a numeric PostgreSQL holds and a Spark decimal does not: the second transaction's change.
    sql(lpg.url, f"INSERT INTO {table} VALUES (1, 1.50)", f"INSERT INTO {table} VALUES (2, 'NaN')",
        f"INSERT INTO {table} VALUES (3, 2.50)")
    warehouse, meta = str(tmp_path / "wh"), str(tmp_path / "meta.db")
    options = {"errors.tolerance": tolerance}
    if tolerance == "all":
        options |= {"errors.deadletter.format": "tablestore", "errors.deadletter.table": "letters",
                    "errors.deadletter.warehouse": warehouse, "errors.deadletter.meta": meta}
    query = spark.readStream.format("postgres_changes").options(url=lpg.url, table=table, slot=slot, snapshot="false",
                                                                **options) \
        .load().select("id", "price").writeStream.format("memory").queryName(f"changes_{tolerance}") \
        .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)
        message = str(failed.value)
        assert f"table public.{table}, the insert committed at LSN " in message
        assert "value 'NaN' of column 'price' (numeric(10,2))" in message and "errors.tolerance" in message
        return
    query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.table(f"changes_{tolerance}").collect()
    assert sorted((r.id, str(r.price)) for r in rows) == [(1, "1.50"), (3, "2.50")]
    letters = DeltaTable(f"{warehouse}/letters").to_pyarrow_table().to_pylist()
    assert len(letters) == 1
    letter = letters[0]
    record = json.loads(letter["record"])
    assert (record["table"], record["op"], record["key"], record["values"]) == \
        (f"public.{table}", "insert", {"id": "2"}, {"id": "2", "price": "NaN"})
    assert letter["error_class"] == "UntypedValueError" and letter["connector"] == "postgres_changes"
    assert f"LSN {record['lsn']}: value 'NaN' of column 'price'" in letter["error_message"]
    assert letter["target"] == f"public.{table}" and letter["micro_batch"] == 0
    assert letter["write_id"] == str(query.id)


@pytest.mark.spark
@pytest.mark.parametrize("tolerance", ["all", "none"])
def test_a_tracking_stream_sends_a_row_it_cannot_type_aside_and_goes_on(spark, pg, tmp_path, tolerance):
    """readStream.format("postgres") by a tracking column: a row with a numeric NaN (no Spark decimal) goes to a
    PostgreSQL dead-letter table; the batch read and change capture's snapshot type rows the same way."""
    from pyspark.errors import StreamingQueryException

    t = pg.table("tracked")
    pg.sql(f"CREATE TABLE {t} (id bigint PRIMARY KEY, price numeric(10,2))")
    pg.sql(f"INSERT INTO {t} VALUES (1, 1.50), (2, 'NaN'), (3, 2.50)")
    options = {"tracking.column": "id", "tracking.lag-window-ms": "0"}
    if tolerance == "all":
        options |= {"errors.tolerance": "all", "errors.deadletter.format": "postgres",
                    "errors.deadletter.url": pg.url, "errors.deadletter.table": f"{t}_letters",
                    "errors.deadletter.create-table": "true"}
    query = spark.readStream.format("postgres").options(**pg.opts(t, **options)).load() \
        .writeStream.format("memory").queryName(f"tracked_{tolerance}").trigger(availableNow=True) \
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    if tolerance == "none":
        with pytest.raises(StreamingQueryException, match=r"column 'price' does not convert .*NaN"):
            query.awaitTermination(120)
        return
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted((r.id, str(r.price)) for r in spark.table(f"tracked_{tolerance}").collect()) == \
        [(1, "1.50"), (3, "2.50")]
    letters = pg.sql(f"SELECT record, error_class, error_message, connector, target FROM {t}_letters")
    assert len(letters) == 1
    record, error_class, message, connector, target = letters[0]
    assert json.loads(record) == {"id": 2, "price": "NaN"}
    assert (error_class, connector, target) == ("ValueTypeError", "postgres", f"table {t}")
    assert f"table {t}, " in message and "the value 'NaN' of column 'price' does not convert" in message
