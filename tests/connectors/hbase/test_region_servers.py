"""`lookup.repartition-by-region` on three region servers (`LocalHBase(region_servers=3)`: three in the master's
JVM, a pre-split table's regions dealt over them): with the option each task's keys lie on one server, and every key
is looked up; without it (negative control) a task's keys span several servers. In make test's HBase job (its own
HBase of three servers starts in about 7 s)."""

import pyarrow as pa
import pytest

import sluice
from sluice.connectors.hbase._client import regions
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._regions import RegionMap
from sluice.testing import LocalHBase
from tests.connectors.hbase.conftest import HBase

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def three():
    with LocalHBase(region_servers=3) as server:
        yield HBase(server)


def test_each_task_asks_one_region_server(spark, three):
    from pyspark.sql.functions import spark_partition_id

    table = three.table(splits=((1 << 63 | 10).to_bytes(8, "big"), (1 << 63 | 20).to_bytes(8, "big")))
    region_map = RegionMap.of(regions(three.conn, table))
    assert len(region_map.starts) == 3 and len(region_map.servers) == 3, region_map  # a region on each server
    opts = three.opts(table, rowkey="id", family="d")
    sluice.write(spark.createDataFrame([(i, i * 10) for i in range(30)], "id long, value long"), "hbase", opts)
    keys = spark.createDataFrame([(i,) for i in range(0, 33, 2)], "id long").repartition(2)
    codec = KeyCodec(("id",), ("int64",))

    def servers_per_task(**more: str) -> dict[int, set[int]]:
        rows = sluice.lookup(keys, "hbase", {**opts, "schema": "id long, value long", **more}, on="id") \
            .withColumn("task", spark_partition_id()).collect()
        assert sorted((r.id, r.value) for r in rows) == [(i, i * 10 if i < 30 else None) for i in range(0, 33, 2)]
        at = region_map.region_of(codec.encoded(pa.record_batch({"id": pa.array([r.id for r in rows], pa.int64())})))
        tasks: dict[int, set[int]] = {}
        for row, region in zip(rows, at.tolist(), strict=True):
            tasks.setdefault(row.task, set()).add(region_map.server_of[region])
        return tasks

    placed = servers_per_task(**{"lookup.repartition-by-region": "true", "lookup.partitions-per-server": "1"})
    assert all(len(servers) == 1 for servers in placed.values()), placed
    assert sorted(s for servers in placed.values() for s in servers) == [0, 1, 2], placed
    unplaced = servers_per_task()
    assert len(unplaced) == 2 and all(len(servers) > 1 for servers in unplaced.values()), unplaced
