"""What the records of an S2 stream are, as sluice writes and reads them."""

from __future__ import annotations

from enum import StrEnum


class RecordKind(StrEnum):
    """`format("s2")` writes one record per row (APPEND); `format("s2_upsert")` writes flink-connector-s2's upsert
    changelog: the key in an @key header, the change in @action (u, d), the other columns in the body (UPSERT)."""

    APPEND = "append"
    UPSERT = "upsert"
