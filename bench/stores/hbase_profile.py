"""bench.stores.hbase_write --profile's measures, kept with the TPut-object encoder they measured (sluice's
connectors/hbase/_wire.py replaced it; the figures are in docs/hbase.md): one task's share of the rows through
RowEncoder alone, then the whole task in this process against the server, beside the hand-written writer and the
prototype that writes Thrift bytes itself."""

from __future__ import annotations

import json
import sys
import time

from bench.stores.hbase_write import CLIENT_BATCH, client_puts


def task_batches(rows: int):
    """One of the 2 tasks' rows (every other id: spread over every region, as a hash partition by id gives), as the
    Arrow RecordBatches of 10,000 rows Spark hands a Python writer (spark.sql.execution.arrow.maxRecordsPerBatch)."""
    import numpy as np
    import pyarrow as pa

    ids = np.arange(0, rows, 2, dtype=np.int64)
    out = []
    for start in range(0, len(ids), 10_000):
        chunk = ids[start:start + 10_000]
        out.append(pa.RecordBatch.from_pydict({
            "id": pa.array(chunk),
            "region": pa.array([f"region-{i % 10}" for i in chunk.tolist()]),
            "title": pa.array([f"Order {i:012d} shipped to warehouse {i % 10}, priority {i % 7}"
                               for i in chunk.tolist()]),
            "amount": pa.array(chunk * 0.25),
            "qty": pa.array((chunk % 100).astype(np.int32))}))
    return out


def thrift_puts(keys, cells, stamps):
    """PROTOTYPE of a fix (not sluice's code): each row's TPut as Thrift binary bytes, built column by column in
    Arrow: no Python object per row or cell but one bytes object per row (which the cyclic GC does not track), and
    nothing left to serialize at send time. The same bytes thriftpy2 writes for RowEncoder's TPut objects (checked
    in profile()). keys: binary array; cells: [(family, qualifier, binary array, nulls = no cell)]; stamps: int64."""
    import struct

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def fixed(values, kind: str, width: int):
        raw = pa.py_buffer(np.asarray(values, kind).tobytes())
        return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(values), [None, raw]).cast(pa.binary())

    def length(array):
        return fixed(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), ">i4", 4)

    def const(b: bytes):
        return pa.scalar(b, pa.binary())

    ts = fixed(stamps, ">i8", 8)
    counts = np.zeros(len(keys), np.int64)
    pieces = []
    for family, qualifier, values in cells:  # TColumnValue: 1 family, 2 qualifier, 3 value, 4 timestamp, stop
        head = (b"\x0b\x00\x01" + struct.pack(">i", len(family)) + family + b"\x0b\x00\x02" +
                struct.pack(">i", len(qualifier)) + qualifier + b"\x0b\x00\x03")
        cell = pc.binary_join_element_wise(const(head), length(values), values, const(b"\x0a\x00\x04"), ts,
                                           const(b"\x00"), const(b""), null_handling="emit_null")
        counts += values.is_valid().to_numpy(zero_copy_only=False)
        pieces.append(cell.fill_null(b"") if values.null_count else cell)
    # TPut: 1 row, 2 columnValues (list of structs), 3 timestamp, stop
    return pc.binary_join_element_wise(
        const(b"\x0b\x00\x01"), length(keys), keys, const(b"\x0f\x00\x02\x0c"), fixed(counts, ">i4", 4), *pieces,
        const(b"\x0a\x00\x03"), ts, const(b"\x00"), const(b""))


def put_multiple_raw(client, table: bytes, puts: list[bytes]) -> None:
    """PROTOTYPE: putMultiple(table, puts) with the TPuts already Thrift bytes: one buffer, one send."""
    import struct

    from thriftpy2.thrift import TMessageType

    client._oprot.write_message_begin("putMultiple", TMessageType.CALL, 0)
    client._oprot.trans.write(b"".join([b"\x0b\x00\x01", struct.pack(">i", len(table)), table, b"\x0f\x00\x02\x0c",
                                        struct.pack(">i", len(puts)), *puts, b"\x00"]))
    client._oprot.write_message_end()
    client._oprot.trans.flush()
    client._recv("putMultiple")


def profile(rows: int, fresh, drop, server) -> None:
    """--profile: where one task's time goes. Its share of --rows (task_batches) through RowEncoder alone (GC on and
    off; cProfile with GC off, so that the collections' time is not charged to whichever line allocated), then the
    whole task in this process (RowEncoder -> AsyncSinkWriter -> HBaseStore, sluice's defaults) into a fresh table of
    the real server: as is; with the cyclic GC off; with a 4 MiB Thrift transport buffer in place of thriftpy2's 4 KiB
    (one sendall a request, not ~65: each releases and re-takes the GIL, which the task thread holds while it
    encodes); both; with the prototype thrift_puts/put_multiple_raw; and the hand-written writer on the same batches.
    Each: wall rows/s, this process's CPU a row (every thread), the GC's share (gc.callbacks), the requests."""
    import bisect
    import cProfile
    import gc
    import io
    import pstats
    import struct

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import thriftpy2.transport as transport
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType
    from thriftpy2.protocol.cybin import TCyBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport.buffered.cybuffered import TCyBufferedTransport

    from sluice.connector import Encoded
    from sluice.connectors.hbase import HBaseDataSource
    from sluice.connectors.hbase._client import thrift
    from sluice.connectors.hbase._sink import HBaseStore
    from sluice.engine import AsyncSinkWriter, WriteContext
    from sluice.sink._arrow_writers import batching

    t = thrift()
    batches = task_batches(rows)
    n = sum(b.num_rows for b in batches)
    schema = StructType([StructField("id", LongType()), StructField("region", StringType()),
                         StructField("title", StringType()), StructField("amount", DoubleType()),
                         StructField("qty", IntegerType())])
    collected: dict[int, list] = {}
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            counted = collected.setdefault(info["generation"], [0, 0.0])
            counted[0] += 1
            counted[1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)

    def plan_for(table: str):
        opts = {"host": server.host, "port": str(server.port), "table": table, "rowkey": "id", "family": "d"}
        return HBaseDataSource(opts)._plan(schema, overwrite=False, streaming=False)

    default_factory = transport.TCyBufferedTransportFactory

    class BigBuffer:
        def get_transport(self, trans):
            return TCyBufferedTransport(trans, 4 << 20)

    def measured(label: str, action, table: str | None = None) -> dict:
        """action(table) timed: wall, this process's CPU (all threads), the GC's; the table dropped afterwards."""
        collected.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        extra = action(table) or {}
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if table is not None:
            drop(table)
        gc_s = sum(s for _, s in collected.values())
        row = {"variant": label, "rows_per_s": round(n / wall), "cpu_us_per_row": round(cpu / n * 1e6, 1),
               "gc_us_per_row": round(gc_s / n * 1e6, 1),
               "gc_collections": {f"gen{g}": c for g, (c, _) in sorted(collected.items())}, **extra}
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    # 1. The encoder alone.
    table = fresh()
    plan = plan_for(table)
    encoder = plan.open_task(WriteContext()).encode

    def encode_all(_) -> None:
        for b in batches:
            encoder(b)  # its output dropped at once (the engine holds a few chunks' worth)

    encoder_rows = []
    for label, enabled in (("RowEncoder alone", True), ("RowEncoder alone, GC off", False)):
        gc.enable() if enabled else gc.disable()
        encoder_rows.append(measured(label, encode_all))
    profiler = cProfile.Profile()
    profiler.enable()
    for b in batches[:20]:
        encoder(b)
    profiler.disable()
    gc.enable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    # The prototype writes what thriftpy2 writes.
    first = encoder(batches[0])
    entries = first.entries[:1000]
    wire = transport.TMemoryBuffer()
    TCyBinaryProtocolFactory().get_protocol(wire).write_struct(
        t.THBaseService.putMultiple_args(table=table.encode(), tputs=entries))
    keys = pa.array([e.row for e in entries], pa.binary())
    cells = [(c.family, c.qualifier, pa.array([c.value for c in (e.columnValues[j] for e in entries)], pa.binary()))
             for j, c in enumerate(entries[0].columnValues)]
    raw = thrift_puts(keys, cells, np.array([e.timestamp for e in entries], np.int64)).to_pylist()
    ours = b"".join([b"\x0b\x00\x01", struct.pack(">i", len(table)), table.encode(), b"\x0f\x00\x02\x0c",
                     struct.pack(">i", len(raw)), *raw, b"\x00"])
    assert wire.getvalue() == ours, "the prototype's bytes differ from thriftpy2's"
    drop(table)

    # 2. The whole task against the server.
    def task(variant: str):
        def run(table: str) -> dict:
            transport.TCyBufferedTransportFactory = BigBuffer if "4 MiB" in variant else default_factory
            plan = plan_for(table)
            writer_task = plan.open_task(WriteContext())
            encode, store = writer_task.encode, writer_task.store
            if "prototype" in variant:
                encoder = encode

                def encode(b):  # the prototype in place of RowEncoder's per-row loop
                    keys = encoder.plan.key.encode(b)
                    cells = [(f, q, pa.array(fn(b.column(c)), pa.binary())) for c, f, q, fn in encoder.cell_encoders]
                    puts = thrift_puts(pa.array(keys, pa.binary()), cells, np.asarray(encoder._stamps(b, keys)))
                    return Encoded(puts.to_pylist(), pc.binary_length(puts).to_numpy().tolist(), None,
                                   [bisect.bisect_right(encoder.plan.region_starts, k) for k in keys])

                class RawStore(HBaseStore):
                    def write_batch(self, batch) -> None:
                        put_multiple_raw(self.conn.client(self.gateway), self.table_bytes, batch.entries)

                store = RawStore(store.conn, store.table, store.io_threads, store.gateway)
            creator, buffer = batching(plan)
            if "GC off" in variant:
                gc.disable()
            try:
                with AsyncSinkWriter(store, plan.config, batch_creator=creator, buffer=buffer) as writer:
                    for b in batches:
                        e = encode(b)
                        writer.write_keyed(e.entries, e.sizes, e.groups, None)
                    writer.finish()
            finally:
                gc.enable()
                transport.TCyBufferedTransportFactory = default_factory
            return {"requests": writer.stats.batches}
        return run

    def hand(table: str) -> dict:
        client = make_client(t.THBaseService, server.host, server.port, timeout=600_000)
        convert = 0.0
        for b in batches:
            for start in range(0, b.num_rows, CLIENT_BATCH):
                began_at = time.perf_counter()
                chunk = b.slice(start, CLIENT_BATCH)
                puts = client_puts(t, chunk)
                convert += time.perf_counter() - began_at
                client.putMultiple(table.encode(), puts)
        client.close()
        return {"requests": n // CLIENT_BATCH, "convert_us_per_row": round(convert / n * 1e6, 1)}

    measured("warm-up (untimed)", task("sluice task"), fresh())
    variants = ["sluice task", "sluice task, GC off", "sluice task, 4 MiB transport buffer",
                "sluice task, 4 MiB transport buffer, GC off", "sluice task, prototype thrift_puts"]
    task_rows = [measured(v, task(v), fresh()) for v in variants]
    task_rows.append(measured("hand-written putMultiple", hand, fresh()))
    print(f"\n| variant (one task's {n} rows, this process) | rows/s | CPU us/row | GC us/row | GC collections |")
    print("| --- | --- | --- | --- | --- |")
    for row in encoder_rows + task_rows:
        print(f"| {row['variant']} | {row['rows_per_s']} | {row['cpu_us_per_row']} | {row['gc_us_per_row']} | "
              f"{row['gc_collections']} |")
    print(f"\ncProfile of RowEncoder (GC off), {sum(b.num_rows for b in batches[:20])} rows, by own time:")
    print("\n".join(text.getvalue().splitlines()[4:]))
