"""Which node holds a key: partition keys' Murmur3 tokens computed in bulk, and the token ring read once on the driver,
for `lookup.repartition-by-replica` (the Spark Cassandra Connector's `repartitionByCassandraReplica`).

A partition's token is Cassandra's Murmur3Partitioner hash: MurmurHash3 x64_128's first half over the partition key's
serialized bytes (a composite key: each column as a 2-byte length, its bytes and a 0 byte), with Cassandra's
quirk of sign-extending the tail's bytes. `murmur3_tokens` computes it with numpy over a matrix of keys of one byte
length (the driver's `cassandra.murmur3.murmur3` is the reference the tests hold it to): int, bigint and string keys
are serialized in Arrow and numpy, without a Python object per key; other types and composite keys are serialized
by the driver's own type classes, once per distinct key.

`TokenRing` is the ring as the driver's cluster metadata has it (`token_map`: each range's replicas under the
keyspace's replication), reduced to each range's first local replica: the node the session's `TokenAwarePolicy`
(replicas not shuffled) sends the range's statements to while it is up. `ReplicaPlacement` puts each key into one of
`partitions_per_host` partitions of that replica's host: the SDK shuffles the rows by it before the lookup.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sluice.connector import KeyPlacement
from sluice.connectors.cassandra._types import CQLType, python_values

if TYPE_CHECKING:
    from sluice.connectors.cassandra._client import Connection

_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_MIN, _MAX = -(2 ** 63), 2 ** 63 - 1


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(k: np.ndarray) -> np.ndarray:
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xFF51AFD7ED558CCD)
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xC4CEB9FE1A85EC53)
    k ^= k >> np.uint64(33)
    return k


def _tail(data: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes start..stop of each row XORed in at their shift, each sign-extended first (Cassandra's tail)."""
    k = np.zeros(data.shape[0], dtype=np.uint64)
    for i in range(start, stop):
        k ^= data[:, i].view(np.int8).astype(np.int64).view(np.uint64) << np.uint64(8 * (i - start))
    return k


def murmur3_tokens(data: np.ndarray) -> np.ndarray:
    """The Murmur3Partitioner token (int64) of each row of `data`, a uint8 matrix of keys of one byte length."""
    with np.errstate(over="ignore"):
        n, length = data.shape
        h1 = np.zeros(n, dtype=np.uint64)
        h2 = np.zeros(n, dtype=np.uint64)
        blocks = length // 16
        if blocks:
            words = np.ascontiguousarray(data[:, :blocks * 16]).view("<u8").reshape(n, blocks, 2)
        for b in range(blocks):
            k1, k2 = words[:, b, 0].copy(), words[:, b, 1].copy()
            h1 ^= _rotl(k1 * _C1, 31) * _C2
            h1 = (_rotl(h1, 27) + h2) * np.uint64(5) + np.uint64(0x52DCE729)
            h2 ^= _rotl(k2 * _C2, 33) * _C1
            h2 = (_rotl(h2, 31) + h1) * np.uint64(5) + np.uint64(0x38495AB5)
        rest, base = length % 16, blocks * 16
        if rest > 8:
            h2 ^= _rotl(_tail(data, base + 8, base + rest) * _C2, 33) * _C1
        if rest:
            h1 ^= _rotl(_tail(data, base, base + min(rest, 8)) * _C1, 31) * _C2
        h1 ^= np.uint64(length)
        h2 ^= np.uint64(length)
        h1 += h2
        h2 += h1
        h1 = _fmix(h1)
        h2 = _fmix(h2)
        h1 += h2
        tokens = h1.view(np.int64)
        tokens[tokens == _MIN] = _MAX  # Murmur3Partitioner's normalize: the minimum token is no key's
        return tokens


def _binary_tokens(values: pa.Array) -> np.ndarray:
    """Tokens of a binary or string column's values (their bytes as serialized), grouped by byte length."""
    values = values.cast(pa.large_binary())
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(values.buffers()[2], dtype=np.uint8) if values.buffers()[2] is not None else \
        np.zeros(0, dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    tokens = np.empty(len(values), dtype=np.int64)
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        matrix = data[starts[rows, None] + np.arange(length)] if length else np.zeros((rows.size, 0), np.uint8)
        tokens[rows] = murmur3_tokens(matrix)
    return tokens


_FIXED = {"int": ">i4", "bigint": ">i8", "counter": ">i8", "smallint": ">i2", "tinyint": ">i1"}
_TEXT = ("text", "varchar", "ascii", "blob")


def partition_tokens(keys: pa.Table, columns: tuple[str, ...], kinds: dict[str, CQLType]) -> np.ndarray:
    """The token of each row of `keys` (no nulls) by its partition key `columns`, typed as `kinds` says."""
    if len(columns) == 1:
        column, kind = keys.column(columns[0]).combine_chunks(), kinds[columns[0]]
        if kind.name in _FIXED:
            raw = np.asarray(column.to_numpy(zero_copy_only=False)).astype(_FIXED[kind.name])
            return murmur3_tokens(raw.view(np.uint8).reshape(len(raw), -1))
        if kind.name in _TEXT:
            return _binary_tokens(column)
    return _driver_tokens(keys, columns, kinds)


def _driver_tokens(keys: pa.Table, columns: tuple[str, ...], kinds: dict[str, CQLType]) -> np.ndarray:
    """Tokens of keys serialized by the driver's type classes, one Python value per key and column."""
    from cassandra.cqltypes import _cqltypes  # the driver's CQL name -> type class (lookup_casstype takes Java's)
    from cassandra.murmur3 import murmur3

    types = [_cqltypes[kinds[c].name] for c in columns]
    values = [python_values(keys.column(c).combine_chunks(), kinds[c]) for c in columns]
    out = np.empty(keys.num_rows, dtype=np.int64)
    for i, row in enumerate(zip(*values, strict=True)):
        parts = [t.serialize(v, 5) for t, v in zip(types, row, strict=True)]
        key = parts[0] if len(parts) == 1 else b"".join(struct.pack(">H", len(p)) + p + b"\0" for p in parts)
        out[i] = murmur3(key)
    return out


@dataclass(frozen=True)
class TokenRing:
    """The ring of one keyspace: range i is (tokens[i-1], tokens[i]] (range 0 also takes the wrap past the last
    token), its first replica `hosts[owners[i]]`."""

    tokens: tuple[int, ...]  # ascending
    owners: tuple[int, ...]
    hosts: tuple[str, ...]  # "address:port" of each node holding a range

    def owner_of(self, tokens: np.ndarray) -> np.ndarray:
        """The index into `hosts` of each token's first replica."""
        at = np.searchsorted(np.asarray(self.tokens, dtype=np.int64), tokens, side="left")
        at[at == len(self.tokens)] = 0
        return np.asarray(self.owners, dtype=np.int64)[at]


def read_ring(conn: Connection, needed_by: str = "lookup.repartition-by-replica",
              advice: str = "set lookup.repartition-by-replica=false") -> TokenRing:
    """The ring of `conn`'s keyspace from this process's session's cluster metadata (for lookup.repartition-by-
    replica: once, on the driver; for the lookup's groups of keys: once per task); `needed_by` and `advice` name
    what needs it in the error when the driver has none."""
    from cassandra.policies import HostDistance

    from sluice.connectors.cassandra._client import TUPLES, CassandraError

    session = conn.session()
    # The lookup's TokenAwarePolicy (no shuffling) sends a statement to the first replica its child policy counts
    # as local (local-dc): the ring names that one.
    policy = session.get_execution_profile(TUPLES).load_balancing_policy
    token_map = session.cluster.metadata.token_map
    if token_map is None or not token_map.ring:
        raise CassandraError(f"{needed_by}: the driver has no token ring for {conn.display} "
                             f"(its token metadata is off); {advice}",
                             store="cassandra", target=conn.display)
    hosts: dict[str, int] = {}
    tokens, owners = [], []
    for token in token_map.ring:
        replicas = token_map.get_replicas(conn.keyspace, token)
        local = [r for r in replicas if policy.distance(r) == HostDistance.LOCAL]
        first = (local or replicas or [token_map.token_to_host_owner[token]])[0]
        tokens.append(int(token.value))
        owners.append(hosts.setdefault(str(first.endpoint), len(hosts)))
    return TokenRing(tuple(tokens), tuple(owners), tuple(hosts))


@dataclass(frozen=True)
class ReplicaPlacement(KeyPlacement):
    """Each key to one of `per_host` partitions of its first replica's host (the token picks which of them)."""

    ring: TokenRing
    columns: tuple[str, ...]  # the partition key's columns, in the table's order
    kinds: dict[str, CQLType]
    per_host: int

    @property
    def partitions(self) -> int:
        return len(self.ring.hosts) * self.per_host

    def assign(self, keys: pa.Table) -> pa.Array:
        tokens = partition_tokens(keys, self.columns, self.kinds)
        part = self.ring.owner_of(tokens) * self.per_host + np.mod(tokens, self.per_host)
        return pa.array(part.astype(np.int32))

    def host_of(self, keys: pa.Table) -> list[str]:
        """Each key's first replica's host (for tests and benchmarks)."""
        return [self.ring.hosts[i] for i in self.ring.owner_of(partition_tokens(keys, self.columns, self.kinds))]

