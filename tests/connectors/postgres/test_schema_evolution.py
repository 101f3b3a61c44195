"""A column added to a captured table, carried to the targets without a person: the running postgres_changes query
stops at the change asking for a restart (RestartNeededError), `sluice.run` starts it again with the same checkpoint,
the restarted query reads the new schema, and the sinks with schema.evolution=add-columns add the column before the
first rows that carry it: the postgres sink (committed before the rows, and in the commit's transaction when
transactional) and the table store (in the Delta version of those rows, by merge and by append).

One query writes every target from foreachBatch (a streaming query per target costs seconds each)."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from deltalake import DeltaTable

import sluice
from tests.connectors.postgres.test_changes import sql

pytestmark = pytest.mark.spark

DEADLINE_S = 120  # the wait for a target to show the changes (a hang fails the test; nothing is timed)


def test_an_added_column_reaches_postgres_and_the_table_store_through_sluice_run(spark, lpg, tmp_path):
    sql(lpg.url, "DROP TABLE IF EXISTS evolving", "CREATE TABLE evolving (id int PRIMARY KEY, v text)",
        "INSERT INTO evolving VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    warehouse, meta = str(tmp_path / "wh"), str(tmp_path / "meta.db")
    add = {"schema.evolution": "add-columns"}
    keyed = {"primary-key": "id", "upsert.op-column": "_op", **add}
    targets = {  # name -> (format, options, columns besides the table's)
        "replica": ("postgres", {"url": lpg.url, "table": "replica", "create-table": "true", **keyed}, ["_op"]),
        "replica_staged": ("postgres", {"url": lpg.url, "table": "replica_staged", "create-table": "true", **keyed,
                                        "sink.mode": "global-ordered", "sink.transactional": "true"}, ["_op"]),
        "store": ("tablestore", {"table": "store", "warehouse": warehouse, "meta": meta, **keyed}, ["_op"]),
        # Every change appended once (no key): a change lost or doubled shows.
        "changelog": ("tablestore", {"table": "changelog", "warehouse": warehouse, "meta": meta, **add},
                      ["_op", "_lsn"]),
    }
    starts, queries = [], []

    def write_all(batch, epoch: int) -> None:
        data = [c for c in batch.columns if not c.startswith("_")]  # the table's columns, as the query read them
        for fmt, options, extra in targets.values():
            once = {"write-id": f"{options['table']}-{epoch}"} if fmt == "tablestore" else {}
            batch.select(*data, *extra).write.format(fmt).options(**options, **once).mode("append").save()

    def start():
        starts.append(len(starts))
        query = (spark.readStream.format("postgres_changes").options(url=lpg.url, table="evolving").load()
                 .writeStream.foreachBatch(write_all).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="200 milliseconds").start())
        queries.append(query)
        return query

    def wait_for(what, check) -> None:
        """Until `check()` holds; the query's own error if it ends first."""
        deadline, pause = time.monotonic() + DEADLINE_S, threading.Event()
        while not check():
            if ran.done():
                ran.result()
                raise AssertionError(f"the query ended before {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {DEADLINE_S} s")
            pause.wait(0.2)

    with ThreadPoolExecutor(1) as pool:
        ran = pool.submit(sluice.run, start, max_restarts=2)
        try:
            wait_for("the snapshot", lambda: stored(lpg, "replica_staged", "true") == 3)
            # Under the running query: a change before the ALTER, the ALTER, changes that carry the new column.
            sql(lpg.url, "INSERT INTO evolving VALUES (4, 'd')", "ALTER TABLE evolving ADD COLUMN extra int",
                "INSERT INTO evolving VALUES (5, 'e', 50)", "UPDATE evolving SET extra = 10 WHERE id = 1")
            # The last target each micro-batch writes: when it has them, so have the others.
            wait_for("the changes after the ALTER", lambda: carried(f"{warehouse}/changelog") == 2)
        finally:
            queries[-1].stop()
        assert ran.result() is queries[-1]
    assert len(starts) == 2, "one restart: at the ALTER"

    want = [(1, "a", 10), (2, "b", None), (3, "c", None), (4, "d", None), (5, "e", 50)]
    for name in ("replica", "replica_staged"):
        assert sql(lpg.url, f"SELECT id, v, extra FROM {name} ORDER BY id") == want, name
        assert sql(lpg.url, f"SELECT data_type FROM information_schema.columns WHERE table_name = '{name}' AND "
                            "column_name = 'extra'") == [("integer",)], name
    store = DeltaTable(f"{warehouse}/store")
    assert sorted(tuple(r.values()) for r in store.to_pyarrow_table(columns=["id", "v", "extra"]).to_pylist()) == want
    changes = spark.read.format("tablestore").options(table="changelog", warehouse=warehouse, meta=meta).load()
    assert sorted((r.id, r._op, r.extra) for r in changes.collect()) == [
        (1, "insert", None), (1, "update", 10), (2, "insert", None), (3, "insert", None), (4, "insert", None),
        (5, "insert", 50)]
    for name in ("store", "changelog"):  # by merge and by append
        table = DeltaTable(f"{warehouse}/{name}")
        first = min(v for v in range(table.version() + 1) if "extra" in _at(table, v).schema().to_arrow().names)
        values = _at(table, first).to_pyarrow_table(columns=["extra"]).column("extra").drop_null()
        assert len(values) > 0, f"{name}: the schema change came in version {first} with rows that carry it"


def test_without_add_columns_the_restarted_query_fails_naming_the_column_and_the_option(spark, lpg, tmp_path):
    """The negative control: the same change into a postgres sink with schema.evolution=none (the default)."""
    sql(lpg.url, "DROP TABLE IF EXISTS fixed", "CREATE TABLE fixed (id int PRIMARY KEY, v text)",
        "INSERT INTO fixed VALUES (1, 'a')")
    starts = []

    def start():
        starts.append(len(starts))
        return (spark.readStream.format("postgres_changes").options(url=lpg.url, table="fixed").load()
                .writeStream.foreachBatch(lambda batch, epoch: batch.drop("_table", "_lsn", "_xid", "_commit_time",
                                                                           "_unchanged")
                                          .write.format("postgres").options(url=lpg.url, table="fixed_copy",
                                                                            **{"create-table": "true",
                                                                               "primary-key": "id",
                                                                               "upsert.op-column": "_op"})
                                          .mode("append").save())
                .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())

    sluice.run(start)  # the snapshot
    sql(lpg.url, "ALTER TABLE fixed ADD COLUMN extra int", "INSERT INTO fixed VALUES (2, 'b', 20)")
    with pytest.raises(Exception, match=r"column 'extra' of the DataFrame is not in table public\.fixed_copy.*set "
                                        r"schema\.evolution=add-columns") as refused:
        sluice.run(start)
    assert not sluice.spark._run.needs_restart(refused.value), "not a restart: raised as it came"
    assert len(starts) == 2
    assert sql(lpg.url, "SELECT id, v FROM fixed_copy ORDER BY id") == [(1, "a")]


def test_full_renames_drops_and_widens_the_postgres_targets_as_the_source_did(spark, lpg, tmp_path):
    """schema.evolution=full: a rename (with a change from before it, read by the query started after it), a drop and
    a widened type, carried by the sink from the source's column marks. The negative control: the same target fed the
    columns without their marks sees a new column where the source renamed one, and keeps the dropped one."""
    from pyspark.sql import functions as F

    sql(lpg.url, "DROP TABLE IF EXISTS reshaped", "CREATE TABLE reshaped (id int PRIMARY KEY, v text, extra int, "
        "gone text, small int)", "INSERT INTO reshaped VALUES (1, 'a', 5, 'x', 1), (2, 'b', 6, 'y', 2)")
    full = {"create-table": "true", "primary-key": "id", "upsert.op-column": "_op", "schema.evolution": "full"}
    staged = {**full, "sink.mode": "global-ordered", "sink.transactional": "true"}
    targets = {"full_direct": full, "full_staged": staged, "full_unmarked": full}
    starts = []

    def write_all(batch, epoch: int) -> None:
        data = [c for c in batch.columns if not c.startswith("_")]
        for name, options in targets.items():
            cols = ([F.col(c).alias(c, metadata={}) for c in data] if name == "full_unmarked" else data)
            batch.select(*cols, "_op").write.format("postgres").options(url=lpg.url, table=name, **options) \
                .mode("append").save()

    def start():
        starts.append(len(starts))
        return (spark.readStream.format("postgres_changes").options(url=lpg.url, table="reshaped").load()
                .writeStream.foreachBatch(write_all).option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True).start())

    sluice.run(start)  # the snapshot
    sql(lpg.url, "UPDATE reshaped SET extra = 7 WHERE id = 1", "ALTER TABLE reshaped RENAME COLUMN extra TO extra2",
        "ALTER TABLE reshaped DROP COLUMN gone", "ALTER TABLE reshaped ALTER COLUMN small TYPE bigint",
        "INSERT INTO reshaped VALUES (3, 'c', 8, 1099511627776)", "UPDATE reshaped SET extra2 = 9 WHERE id = 2")
    sluice.run(start)  # started after the changes: its schema is the new one; its first batch has the old changes

    want = [(1, "a", 7, 1), (2, "b", 9, 2), (3, "c", 8, 1099511627776)]
    assert sql(lpg.url, "SELECT id, v, extra2, small FROM reshaped ORDER BY id") == want
    for name in ("full_direct", "full_staged"):
        assert sql(lpg.url, f"SELECT id, v, extra2, small FROM {name} ORDER BY id") == want, name
        assert columns(lpg, name) == [("id", "integer"), ("v", "text"), ("extra2", "integer"), ("small", "bigint")]
    # Negative control: without the marks, extra2 is a new column (null where no change since carried it) and the
    # old ones stay; the type is widened all the same (it needs no mark).
    assert columns(lpg, "full_unmarked") == [("id", "integer"), ("v", "text"), ("extra", "integer"),
                                             ("gone", "text"), ("small", "bigint"), ("extra2", "integer")]
    assert sql(lpg.url, "SELECT id, extra, extra2 FROM full_unmarked ORDER BY id") == [(1, 5, 7), (2, 6, 9),
                                                                                        (3, None, 8)]


def columns(lpg, table: str) -> list[tuple[str, str]]:
    return sql(lpg.url, "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                        f"'{table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum")


def stored(lpg, table: str, where: str) -> int:
    """Rows of `table` where `where` holds; 0 while the table, or a column `where` reads, is not there yet."""
    columns = {c for (c,) in sql(lpg.url, f"SELECT column_name::text FROM information_schema.columns WHERE "
                                          f"table_name = '{table}'")}
    if not columns or ("extra" in where and "extra" not in columns):
        return 0
    return sql(lpg.url, f"SELECT count(*) FROM {table} WHERE {where}")[0][0]


def carried(uri: str) -> int:
    """Rows of the table-store table at `uri` with a value in the added column (0 before it is added)."""
    if not DeltaTable.is_deltatable(uri):
        return 0
    table = DeltaTable(uri).to_pyarrow_table()
    return len(table.column("extra").drop_null()) if "extra" in table.column_names else 0


def _at(table: DeltaTable, version: int) -> DeltaTable:
    return DeltaTable(table.table_uri, version=version)


def test_widening_is_only_to_a_type_that_holds_every_value():
    from sluice.connectors.postgres._evolve import widens

    assert widens("smallint", "bigint") and widens("real", "double precision")
    assert widens("numeric(10,2)", "numeric(12,3)") and not widens("numeric(10,2)", "numeric(10,3)")
    assert not widens("bigint", "integer") and not widens("integer", "integer") and not widens("integer", "text")
