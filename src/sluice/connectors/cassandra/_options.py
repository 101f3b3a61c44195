"""The options of format("cassandra"), declared once and typed once on the driver: the cluster and table
(_client.py's), how rows become statements and batches (consistency, grouping, timestamps, TTLs), how reads are
split by token range."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sluice.connector import (
    ERROR_OPTIONS,
    PARTITION_ORDERED,
    SINK_SPEC,
    Option,
    OptionSpec,
    TypedOptions,
    check_error_options,
    lookup_max_concurrent_requests,
    lookup_max_keys_per_request,
    lookup_max_retries,
    pushdown_option,
    tracking_options,
    unchanged_column_option,
)
from sluice.connector import LOOKUP_OPTIONS as SDK_LOOKUP_OPTIONS
from sluice.connectors.cassandra._client import CONNECTION_OPTIONS, CONSISTENCY_LEVELS, Connection

GROUPINGS = ("partition", "mixed", "none")
TIMESTAMPS = ("client", "micro-batch")

WRITE_OPTIONS = (
    Option("consistency", "choice", "LOCAL_QUORUM", "Consistency level of every write.", choices=CONSISTENCY_LEVELS),
    Option("batch.grouping", "choice", "partition",
           "partition: each request is an UNLOGGED batch of one partition key's rows, routed to a replica of it "
           "(sink.mode becomes partition-ordered by the table's partition key, sink.batch-by=key); mixed: batches "
           "of rows of any partitions; none: every row its own statement, sent concurrently.", choices=GROUPINGS),
    Option("write.timestamp", "choice", "client",
           "Where each row's write timestamp comes from: client (the executor's clock when the row is encoded, "
           "strictly increasing within a task) or micro-batch (streaming: the batch id and the row's position, so "
           "a replayed batch never overwrites a later one's cells). See docs/cassandra.md.", choices=TIMESTAMPS),
    Option("write.replay-guard", "bool", True,
           "Streaming: keep the last micro-batch committed per query in write.replay-guard-table, and write nothing "
           "for an older one replayed (a restart from an older checkpoint copy), so a replay never brings back a "
           "row a later micro-batch deleted, however long ago (a tombstone lasts gc_grace_seconds). "
           "docs/cassandra.md."),
    Option("write.replay-guard-table", "str", "sluice_replay_guard",
           "The table of write.replay-guard's markers, in the target's keyspace (created at the first commit if "
           "missing): a row per query and target table."),
    Option("write.timestamp-column", "str", None,
           "Column holding each row's write timestamp (long microseconds since the epoch, or a timestamp). Not "
           "written."),
    Option("write.ttl", "int", 0, "Seconds until written cells expire (0: never).", minimum=0, maximum=630_720_000),
    Option("write.ttl-column", "str", None, "Column holding each row's TTL in seconds (int). Not written."),
    Option("write.ignore-nulls", "bool", False,
           "Leave a null cell unset (the stored value stays) instead of deleting it, as Cassandra does for null."),
    Option("upsert.op-column", "str", None,
           "Column whose value d, delete, D or -D deletes the row (by its whole primary key). Not written."),
    unchanged_column_option("the INSERT leaves each column a row names unset, so the stored cell stays."),
)


@dataclass(frozen=True)
class WriteOptions(TypedOptions):
    """The write options of format("cassandra") (WRITE_OPTIONS), parsed and checked once, one field per option."""

    declared = WRITE_OPTIONS

    consistency: str
    batch_grouping: str
    write_timestamp: str
    write_replay_guard: bool
    write_replay_guard_table: str
    write_timestamp_column: str | None
    write_ttl: int
    write_ttl_column: str | None
    write_ignore_nulls: bool
    upsert_op_column: str | None
    upsert_unchanged_column: str | None


# Partition-ordered by default: rows of one partition share a task (sluice.write repartitions by the key), so they
# can share batches. Cassandra warns about batches over 5 KiB (batch_size_warn_threshold) and refuses them over
# 50 KiB (batch_size_fail_threshold): small batches.
WRITE_SPEC = SINK_SPEC.extend(
    (*CONNECTION_OPTIONS, *WRITE_OPTIONS),
    sink_batch_max_size=100, sink_flush_buffer_size=4096, sink_requests_max_inflight=32,
    sink_mode=PARTITION_ORDERED,
).renamed("cassandra")


READ_OPTIONS = (
    Option("partitions", "int", None, "Splits (Spark partitions) of a read, as equal ranges of the token ring; "
           "default: the table's estimated size / read.split-size-mb (a readStream: each micro-batch is read in this "
           "many slices, default 1).", minimum=1, maximum=100_000),
    Option("read.split-size-mb", "int", 64, "Estimated megabytes per split when partitions is not set.", minimum=1),
    Option("read.fetch-size", "int", 5000, "Rows per page of a split's SELECT.", minimum=1, maximum=1_000_000),
    Option("read.consistency", "choice", "LOCAL_ONE", "Consistency level of reads (a readStream's: LOCAL_QUORUM "
           "unless set, so that with writes at LOCAL_QUORUM it sees every acknowledged write).",
           choices=CONSISTENCY_LEVELS),
    pushdown_option("the CQL: = or IN on every partition key column, ranges of the first clustering column"),
)


# readStream: a tracking-column stream (docs/tracking.md, _tracking.py), typed by sluice.connector.TrackingSettings.
STREAM_OPTIONS = tuple(
    replace(option, meaning="Not for format('cassandra') (refused): a micro-batch is read in `partitions` slices of "
                            "the token ring, as counting rows would mean reading them.")
    if option.name == "tracking.rows-per-task" else option
    for option in tracking_options(
        "a tinyint, smallint, int, bigint or timestamp column with a storage-attached index (CREATE INDEX ... USING "
        "'sai', Cassandra 5.0) whose values grow as rows are written (e.g. toTimestamp(now())); a micro-batch takes "
        "whole groups of one value."))

# errors.*: a row with a value that has no form in its column's Spark type goes to the read's dead-letter target
# (errors.tolerance=all).
READ_SPEC = OptionSpec("cassandra", (*CONNECTION_OPTIONS, *READ_OPTIONS, *STREAM_OPTIONS, *ERROR_OPTIONS),
                       (check_error_options,))


@dataclass(frozen=True)
class ReadOptions(TypedOptions):
    """The read options of format("cassandra") (READ_OPTIONS), parsed and checked once, one field per option;
    `conn`: the cluster and table."""

    declared = READ_OPTIONS
    conn_from = Connection.from_options

    partitions: int | None
    read_split_size_mb: int
    read_fetch_size: int
    read_consistency: str
    pushdown: bool
    conn: Connection


# sluice.lookup(df, "cassandra", ...): rows by partition key (docs/lookup.md), the cache's options too. Reads at
# LOCAL_QUORUM unless told: with writes at LOCAL_QUORUM (the sink's default) a lookup sees every acknowledged write.
LOOKUP_OPTIONS = (
    replace(next(o for o in READ_OPTIONS if o.name == "read.consistency"), default="LOCAL_QUORUM",
            meaning="Consistency level of each lookup's SELECTs (LOCAL_QUORUM: with writes at LOCAL_QUORUM, a "
            "lookup sees every acknowledged write)."),
    lookup_max_concurrent_requests("SELECTs (each of a group of one replica's keys, or of one partition or "
                                   "clustering prefix: see lookup.max-keys-per-request; routed to a replica of its "
                                   "keys, by the driver's execute_concurrent)", default=64),
    # A partition is Cassandra's unit of a read: an IN over a single-column partition key reads the listed
    # partitions on the node the statement reaches, so a group holds the keys of one replica (CQL's IN over several
    # partition-key columns would be their cartesian product: those keys stay a SELECT each).
    lookup_max_keys_per_request("SELECT ... WHERE pk IN ? of one replica's keys, routed to it, when on= is exactly a "
                                "single-column partition key (a composite partition key or a clustering prefix: a "
                                "SELECT per key; 1: a SELECT per key here too)", default=100),
    lookup_max_retries("after a failure that passes (a timeout, unavailable replicas, no node reachable): the "
                       "batch's SELECTs, all of them (reads: sending one again changes nothing)"),
    Option("lookup.repartition-by-replica", "bool", False, "Shuffle the DataFrame by the node that holds each key "
           "(its partition's first replica, from the driver's token ring) before the lookup, so each task's SELECTs "
           "go to one node: the Spark Cassandra Connector's repartitionByCassandraReplica. Costs a shuffle."),
    Option("lookup.partitions-per-host", "int", 10, "With lookup.repartition-by-replica: partitions (tasks) per "
           "node holding keys (the Spark Cassandra Connector's partitionsPerHost).", minimum=1, maximum=10_000),
)
LOOKUP_SPEC = OptionSpec("cassandra", (*CONNECTION_OPTIONS, *LOOKUP_OPTIONS, *SDK_LOOKUP_OPTIONS))


@dataclass(frozen=True)
class LookupOptions(TypedOptions):
    """The lookup options of format("cassandra") besides the cache's; `conn`: the cluster and table."""

    declared = LOOKUP_OPTIONS
    conn_from = Connection.from_options

    read_consistency: str
    lookup_max_concurrent_requests: int
    lookup_max_keys_per_request: int
    lookup_max_retries: int
    lookup_repartition_by_replica: bool
    lookup_partitions_per_host: int
    conn: Connection
