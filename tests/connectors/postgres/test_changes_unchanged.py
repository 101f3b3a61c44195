"""Unchanged large values: an UPDATE that leaves a TOASTed column alone, without REPLICA IDENTITY FULL, reaches the
upsert sinks as `_unchanged` and they keep the stored value (upsert.unchanged-column), in Spark end to end.

50 updates, not 1,000: each one is the same path (a row naming `doc` unchanged); what the test must cover is a
micro-batch where the stored value is kept, one where an earlier change of the same key in the same batch set the
value the later ones keep, a new value after that, and a delete. More updates add rows, not cases."""

import psycopg
import pytest

from tests.connectors.postgres.test_changes import sql

pytestmark = pytest.mark.spark

KB100 = 100 * 1024


def doc(i: int, version: int) -> str:
    return (f"{i}:{version}:" * KB100)[:KB100]


@pytest.fixture
def docs(lpg):
    sql(lpg.url, "DROP TABLE IF EXISTS docs", "CREATE TABLE docs (id int PRIMARY KEY, n int NOT NULL, doc text)",
        "ALTER TABLE docs ALTER COLUMN doc SET STORAGE EXTERNAL")  # out of line, uncompressed: TOASTed
    with psycopg.connect(lpg.url, autocommit=True) as conn:
        for i in range(3):
            conn.execute("INSERT INTO docs VALUES (%s, 0, %s)", (i, doc(i, 0)))
    return "docs"


def updates(url: str, first: int, count: int) -> None:
    """`count` updates of n only, one transaction each, over the rows in turn: each leaves doc unchanged."""
    with psycopg.connect(url, autocommit=True) as conn:
        for k in range(first, first + count):
            conn.execute("UPDATE docs SET n = %s WHERE id = %s", (k, k % 3))


def source(url: str) -> list[tuple]:
    return sql(url, "SELECT id, n, doc FROM docs ORDER BY id")


def test_unchanged_toasted_values_are_kept_by_the_postgres_and_table_store_sinks(spark, lpg, docs, tmp_path):
    from deltalake import DeltaTable

    warehouse, meta = str(tmp_path / "wh"), str(tmp_path / "meta.db")
    for name in ("replica", "replica_staged", "replica_ignored"):
        sql(lpg.url, f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL, doc text)")
    keyed = {"primary-key": "id", "upsert.op-column": "_op"}
    kept = {**keyed, "upsert.unchanged-column": "_unchanged"}
    targets = {  # name -> (format, options, keeps the marker column)
        "replica": ("postgres", {"url": lpg.url, "table": "replica", **kept}, True),
        "replica_staged": ("postgres", {"url": lpg.url, "table": "replica_staged", **kept,
                                        "sink.mode": "global-ordered", "sink.transactional": "true"}, True),
        "store": ("tablestore", {"table": "docs", "warehouse": warehouse, "meta": meta, **kept}, True),
        # The negative control: the marker dropped, as a pipeline that ignores it would.
        "replica_ignored": ("postgres", {"url": lpg.url, "table": "replica_ignored", **keyed}, False),
    }

    def write_all(batch, epoch: int) -> None:
        """Each micro-batch into every target (one query: a streaming query per target costs seconds each)."""
        for fmt, options, marker in targets.values():
            rows = batch.select("id", "n", "doc", "_op", *(["_unchanged"] if marker else []))
            rows.write.format(fmt).options(**options, **{"write-id": f"unchanged-{epoch}"} if fmt == "tablestore"
                                           else {}).mode("append").save()

    def run_all() -> None:
        """One Trigger.AvailableNow run of the query."""
        query = (spark.readStream.format("postgres_changes").options(url=lpg.url, table=docs).load()
                 .writeStream.foreachBatch(write_all).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    def stored() -> dict[str, list[tuple]]:
        out = {name: sql(lpg.url, f"SELECT id, n, doc FROM {name} ORDER BY id")
               for name in ("replica", "replica_staged", "replica_ignored")}
        table = DeltaTable(f"{warehouse}/docs").to_pyarrow_table(columns=["id", "n", "doc"]).sort_by("id")
        out["store"] = [tuple(r.values()) for r in table.to_pylist()]
        return out

    run_all()  # the snapshot: every row whole
    updates(lpg.url, 1, 30)  # a micro-batch of updates that all leave doc unchanged: the stored value is kept
    run_all()
    got, want = stored(), source(lpg.url)
    assert [(r[0], r[1], len(r[2])) for r in want] == [(0, 30, KB100), (1, 28, KB100), (2, 29, KB100)]
    for name in ("replica", "replica_staged", "store"):
        assert got[name] == want, name
    # Within one micro-batch: a new doc, then updates that leave it unchanged (the value the batch set is kept),
    # a row deleted, and one inserted whose later update leaves doc unchanged.
    with psycopg.connect(lpg.url, autocommit=True) as conn:
        conn.execute("UPDATE docs SET doc = %s WHERE id = 1", (doc(1, 1),))
        conn.execute("DELETE FROM docs WHERE id = 2")
        conn.execute("INSERT INTO docs VALUES (3, 0, %s)", (doc(3, 0),))
    updates(lpg.url, 31, 19)
    sql(lpg.url, "UPDATE docs SET n = 99 WHERE id = 3")
    run_all()
    got, want = stored(), source(lpg.url)
    assert [(r[0], r[1], len(r[2])) for r in want] == [(0, 48, KB100), (1, 49, KB100), (3, 99, KB100)]
    for name in ("replica", "replica_staged", "store"):
        assert got[name] == want, name
    # The negative control: ignored, the marker's rows null the stored value.
    assert [(r[0], r[1], r[2] is None) for r in got["replica_ignored"]] == [(0, 48, True), (1, 49, True),
                                                                             (3, 99, True)]
