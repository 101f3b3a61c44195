"""format("tablestore") with errors.tolerance=all: rows without their primary key go aside, and a table-store table
is the dead-letter target, committed by the driver with the write (batch and streaming, a replayed micro-batch sending
nothing aside twice); negative control: the default errors.tolerance=none fails the write and commits nothing."""

import json

import pytest

from sluice.meta import MetaService

pytestmark = pytest.mark.spark


@pytest.fixture
def store(tmp_path):
    return {"warehouse": str(tmp_path / "wh"), "meta": str(tmp_path / "meta.db")}


def aside(store):
    return {"errors.tolerance": "all", "errors.deadletter.format": "tablestore",
            "errors.deadletter.table": "dead_letters", **{f"errors.deadletter.{k}": v for k, v in store.items()}}


def rows(spark, store, table):
    return spark.read.format("tablestore").option("table", table).options(**store).load().collect()


def test_rows_without_their_key_go_to_a_tablestore_dead_letter_table_from_a_batch_write(spark, store):
    opts = {**store, "table": "keyed", "primary-key": "id"}
    df = spark.createDataFrame([(1, 10), (None, 20), (3, 30), (None, 40), (5, 50)], "id long, v long").repartition(2)
    with pytest.raises(Exception, match=r"null primary-key column 'id'.*errors\.tolerance=all"):
        df.write.format("tablestore").options(**opts).mode("append").save()  # negative control: as before
    assert MetaService(store["meta"]).barriers("keyed") == []
    df.write.format("tablestore").options(**opts, **aside(store)).mode("append").save()
    assert sorted((r.id, r.v) for r in rows(spark, store, "keyed")) == [(1, 10), (3, 30), (5, 50)]
    letters = rows(spark, store, "dead_letters")
    assert sorted(json.loads(r.record)["v"] for r in letters) == [20, 40]
    assert json.loads(letters[0].record)["id"] is None
    assert {(r.error_class, r.connector, r.target, r.micro_batch) for r in letters} == {
        ("RecordError", "tablestore", "table keyed", None)}
    assert "null primary-key column 'id'" in letters[0].error_message


def test_a_streaming_query_sends_rows_aside_once_even_when_a_micro_batch_is_replayed(spark, store, tmp_path):
    src, ck = tmp_path / "in", tmp_path / "ck"
    for part in range(2):  # two micro-batches, each with one row without its key
        spark.createDataFrame([(part * 10 + 1, part), (None, part)], "id long, v long").coalesce(1) \
            .write.mode("append").parquet(str(src))

    def run():
        query = (spark.readStream.schema("id long, v long").option("maxFilesPerTrigger", 1).parquet(str(src))
                 .writeStream.format("tablestore").option("table", "keyed").option("primary-key", "id")
                 .options(**store, **aside(store)).option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run()
    meta = MetaService(store["meta"])
    letters = rows(spark, store, "dead_letters")
    assert sorted((json.loads(r.record)["v"], r.micro_batch) for r in letters) == [(0, 0), (1, 1)]
    before = meta.barriers("dead_letters")
    for name in ("1", ".1.crc"):  # Spark forgets that batch 1 was committed: it runs again
        (ck / "commits" / name).unlink(missing_ok=True)
    run()
    assert meta.barriers("dead_letters") == before, "the replay committed no new dead letters"
    assert len(rows(spark, store, "dead_letters")) == 2
    assert sorted(r.id for r in rows(spark, store, "keyed")) == [1, 11]
