"""An appended file's column stats in the Delta log (_stats.py): every column bounded (timestamps to the
millisecond, long strings cut) so that deltalake's filtered reads skip files and lose no row, or none at all."""

import datetime
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sluice.meta import MetaService
from sluice.tablestore import StoreTable
from sluice.tablestore._commit import BarrierCommit
from sluice.tablestore._stats import FileStats
from sluice.tablestore._table import StagedFile

UTC = datetime.UTC
STAMP = datetime.datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)


def committed(tmp_path, data: pa.Table, stats: str) -> StoreTable:
    """A table of one file holding `data`, committed with `stats`."""
    table = StoreTable("t", str(tmp_path / "wh"))
    table.create(data.schema, ())
    (table.root / "data").mkdir()
    pq.write_table(data, table.root / "data" / "f.parquet")
    size = (table.root / "data" / "f.parquet").stat().st_size
    table.commit([StagedFile("data/f.parquet", size, data.num_rows, stats)], BarrierCommit("job", 1),
                 MetaService(str(tmp_path / "meta.db")))
    return table


def rows(table: StoreTable, where) -> int:
    return table.delta().to_pyarrow_dataset().to_table(filter=where).num_rows


def test_every_column_is_bounded_and_a_filtered_read_skips_only_what_cannot_match(tmp_path):
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "s": ["a" * 40, "b"], "x": [1.0, None],
                     "ts": pa.array([STAMP, datetime.datetime(2023, 1, 1, tzinfo=UTC)], pa.timestamp("us", "UTC"))})
    stats = FileStats()
    stats.add(data)
    written = json.loads(stats.json())
    assert written["maxValues"]["ts"] == "2024-01-01T00:00:00.124Z" and written["minValues"]["s"] == "a" * 32
    table = committed(tmp_path, data, stats.json())
    assert rows(table, pc.field("id") == 2) == 1 and rows(table, pc.field("s") == "a" * 40) == 1
    assert rows(table, pc.field("ts") == pa.scalar(STAMP, pa.timestamp("us", "UTC"))) == 1
    assert rows(table, pc.field("id") == 3) == 0
    fragments = list(table.delta().to_pyarrow_dataset().get_fragments(filter=pc.field("id") == 3))
    assert fragments == [], "the file's bounds exclude id 3: it is not opened"


def test_a_column_without_bounds_leaves_the_file_with_its_row_count_alone(tmp_path):
    """A list column has no bounds, so neither does any other column. Negative control: bounds for `id` alone make
    deltalake's dataset drop the file from a filter on `s`, which it holds."""
    data = pa.table({"id": pa.array([1], pa.int64()), "s": ["apple"], "tags": [[1, 2]]})
    stats = FileStats()
    stats.add(data)
    assert json.loads(stats.json()) == {"numRecords": 1}
    assert rows(committed(tmp_path / "whole", data, stats.json()), pc.field("s") == "apple") == 1
    partial = json.dumps({"numRecords": 1, "minValues": {"id": 1}, "maxValues": {"id": 1}, "nullCount": {"id": 0}})
    assert rows(committed(tmp_path / "partial", data, partial), pc.field("s") == "apple") == 0
