"""Lookups near the data on HBase (`lookup.repartition-by-region`): each key to a partition of the region server
whose region holds its row key, so each task's getMultiple asks one server (and, with as many partitions per server
as the server has regions, one region).

The table's regions are read once on the driver (`getAllRegionLocations`) as a typed `RegionMap`. On the workers,
a batch's keys are encoded by the connector's key codec (_keys.py) into one Arrow binary array and placed by a sort:
the keys and the region start keys sorted together (bytes compared unsigned, left to right, as HBase orders rows), a
key's region is the number of start keys at or before it. No per-key Python. A region that splits or moves after
the plan only makes the placement coarser: the gateway still routes every Get to the region holding it now.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sluice.connector import KeyPlacement
from sluice.connectors.hbase._client import Region
from sluice.connectors.hbase._keys import KeyCodec


@dataclass(frozen=True)
class RegionMap:
    """A table's regions in key order: region i holds the row keys in [starts[i], starts[i + 1]) (the last one, all
    keys from its start on), served by `servers[server_of[i]]`, where it is the `rank[i]`th of the server's
    `count[server_of[i]]` regions in key order."""

    starts: tuple[bytes, ...]  # the first is b"" (HBase's first region starts at the empty key)
    server_of: tuple[int, ...]
    servers: tuple[str, ...]  # "host:port" of each region server
    rank: tuple[int, ...]
    count: tuple[int, ...]

    @classmethod
    def of(cls, regions: list[Region]) -> RegionMap:
        ordered = sorted(regions, key=lambda r: r.start)
        servers: dict[str, int] = {}
        server_of = tuple(servers.setdefault(r.server, len(servers)) for r in ordered)
        count = [0] * len(servers)
        rank = []
        for s in server_of:
            rank.append(count[s])
            count[s] += 1
        return cls(tuple(r.start for r in ordered), server_of, tuple(servers), tuple(rank), tuple(count))

    def dealt(self, servers: tuple[str, ...]) -> RegionMap:
        """The same regions with region i served by `servers[i % len(servers)]` (tests and benchmarks on one
        region server stand in for several with it)."""
        return RegionMap.of([Region(start, b"", servers[i % len(servers)]) for i, start in enumerate(self.starts)])

    def region_of(self, keys: pa.Array) -> np.ndarray:
        """Each row key's region (an index into `starts`)."""
        n = len(keys)
        bounds = pa.array(self.starts[1:], pa.binary())
        both = pa.table({"key": pa.concat_arrays([keys.cast(pa.binary()), bounds]),
                         "is_key": np.r_[np.ones(n, dtype=np.int8), np.zeros(len(bounds), dtype=np.int8)]})
        # A start key sorts before a row key equal to it: the row belongs to the region it starts.
        order = np.asarray(pc.sort_indices(both, sort_keys=[("key", "ascending"), ("is_key", "ascending")]))
        passed = np.cumsum(order >= n)  # start keys at or before each sorted position
        region = np.empty(n, dtype=np.int64)
        is_row = order < n
        region[order[is_row]] = passed[is_row]
        return region


@dataclass(frozen=True)
class RegionPlacement(KeyPlacement):
    """Each key to one of `per_server` partitions of the server holding its region: a server's regions are dealt to
    its partitions in key order, in contiguous runs (one region each when it has at most `per_server`)."""

    regions: RegionMap
    key: KeyCodec
    per_server: int

    @property
    def partitions(self) -> int:
        return len(self.regions.servers) * self.per_server

    def assign(self, keys: pa.Table) -> pa.Array:
        regions = self.regions
        server = np.asarray(regions.server_of, dtype=np.int64)
        slot = np.asarray(regions.rank, dtype=np.int64) * self.per_server // np.asarray(regions.count)[server]
        part = server * self.per_server + slot
        return pa.array(part[self.region_of(keys)].astype(np.int32))

    def region_of(self, keys: pa.Table) -> np.ndarray:
        """Each key's region (an index into `regions.starts`)."""
        batch = pa.RecordBatch.from_arrays([keys.column(name).combine_chunks() for name in keys.column_names],
                                           names=keys.column_names)
        return self.regions.region_of(self.key.encoded(batch))
