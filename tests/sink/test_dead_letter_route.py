"""The dead-letter route's own choices, on a real PostgreSQL: a dead letter keeps the refused row's columns as they
are (errors.record-as=columns) or as JSON, and every errors.* option is checked before anything is written."""

from __future__ import annotations

import uuid

import psycopg
import pytest

pytestmark = pytest.mark.spark


def write(spark, pg, table: str, **options: str) -> None:
    rows = spark.range(0, 200, 1, 2).selectExpr("id", "CASE WHEN id IN (3, 150) THEN -1 ELSE id END AS v",
                                                "concat('n', id) AS name")
    writer = rows.write.format("postgres").option("url", pg.url).option("table", table).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


@pytest.fixture
def checked(pg):
    table = f"checked_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigint, v bigint CHECK (v >= 0), name text)")
    return table


def test_a_dead_letter_keeps_the_rows_columns_as_they_are(spark, pg, checked):
    letters = f"letters_{uuid.uuid4().hex[:8]}"
    write(spark, pg, checked, **{"errors.tolerance": "all", "errors.record-as": "columns",
                                 "errors.deadletter.format": "postgres", "errors.deadletter.url": pg.url,
                                 "errors.deadletter.table": letters, "errors.deadletter.create-table": "true"})
    with psycopg.connect(pg.url) as conn:
        got = conn.execute(f"SELECT id, v, name, error_class, connector, task IS NOT NULL FROM {letters} "
                           "ORDER BY id").fetchall()
        assert conn.execute(f"SELECT count(*) FROM {checked}").fetchone()[0] == 198
    assert got == [(3, -1, "n3", "RecordError", "postgres", True), (150, -1, "n150", "RecordError", "postgres", True)]


@pytest.mark.parametrize(("options", "message"), [
    ({"errors.tolerance": "all"}, r"errors.tolerance=all .* none is set: set errors.deadletter.format"),
    ({"errors.max-ratio": "0.1"}, r"errors.max-ratio only applies with errors.tolerance=all"),
    ({"errors.tolerance": "all", "errors.deadletter.format": "postgres", "errors.deadletter.url": "postgresql://x",
      "errors.deadletter.tabel": "t"}, r"dead-letter target .*Did you mean 'table'"),
    ({"errors.tolerance": "all", "errors.deadletter.format": "sluice_kafka", "errors.record-as": "columns",
      "errors.deadletter.topic": "t", "errors.deadletter.kafka.bootstrap.servers": "127.0.0.1:1"},
     r"errors.record-as=columns needs a table target"),
    ({"errors.tolerance": "all", "errors.deadletter.format": "postgres_changes"}, r"not a format sluice writes"),
    ({"errors.tolerence": "all"}, r"Did you mean 'errors.tolerance'"),
])
def test_errors_options_are_refused_before_anything_is_written(spark, pg, checked, options, message):
    with pytest.raises(Exception, match=message):
        write(spark, pg, checked, **options)
    with psycopg.connect(pg.url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {checked}").fetchone()[0] == 0
