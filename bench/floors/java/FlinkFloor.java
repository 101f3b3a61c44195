import java.io.BufferedReader;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.sink2.StatefulSinkWriter;
import org.apache.flink.api.connector.sink2.WriterInitContext;
import org.apache.flink.connector.base.sink.AsyncSinkBase;
import org.apache.flink.connector.base.sink.writer.AsyncSinkWriter;
import org.apache.flink.connector.base.sink.writer.AsyncSinkWriterStateSerializer;
import org.apache.flink.connector.base.sink.writer.BufferedRequestState;
import org.apache.flink.connector.base.sink.writer.DequeRequestBuffer;
import org.apache.flink.connector.base.sink.writer.ElementConverter;
import org.apache.flink.connector.base.sink.writer.ResultHandler;
import org.apache.flink.connector.base.sink.writer.SimpleBatchCreator;
import org.apache.flink.connector.base.sink.writer.config.AsyncSinkWriterConfiguration;
import org.apache.flink.core.io.SimpleVersionedSerializer;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * Flink's side of bench/floors/flink_async_sink.py: rows of ~100 bytes made in place by 2 parallel source subtasks go
 * through Flink's AsyncSinkWriter (flink-connector-base; its default FLIP-509 batch creator and request buffer, named)
 * into a store that only counts them, batches of 500, on a local MiniCluster. Usage: FlinkFloor ROWS. A warm-up job
 * first (class loading, JIT), then "ready"; then one job per line read from stdin, each answered with a line "job <net
 * runtime ms> <rows counted>" (so that the bench alternates Flink's jobs with Spark's writes). It fails when the sink
 * did not count every row.
 */
public final class FlinkFloor {
    static final AtomicLong COUNTED = new AtomicLong(); // the MiniCluster runs in this JVM: one counter for all subtasks
    static final int PARALLELISM = 2;
    static final int BATCH = 500;

    /** The store: counts each request's entries and completes it at once. */
    static final class CountingWriter extends AsyncSinkWriter<String, String> {
        CountingWriter(WriterInitContext context, Collection<BufferedRequestState<String>> states) {
            super((element, ctx) -> element, context, AsyncSinkWriterConfiguration.builder()
                    .setMaxBatchSize(BATCH).setMaxBatchSizeInBytes(1 << 20).setMaxInFlightRequests(50)
                    .setMaxBufferedRequests(10_000).setMaxTimeInBufferMS(1_000).setMaxRecordSizeInBytes(1 << 20)
                    .build(), states, new SimpleBatchCreator<>(1 << 20), new DequeRequestBuffer<>());
        }

        @Override
        protected void submitRequestEntries(List<String> entries, ResultHandler<String> result) {
            COUNTED.addAndGet(entries.size());
            result.complete();
        }

        @Override
        protected long getSizeInBytes(String entry) {
            return entry.length();
        }
    }

    static final class CountingSink extends AsyncSinkBase<String, String> {
        private static final long serialVersionUID = 1L;

        CountingSink() {
            super((ElementConverter<String, String>) (element, ctx) -> element, BATCH, 50, 10_000, 1 << 20, 1_000,
                    1 << 20);
        }

        @Override
        public StatefulSinkWriter<String, BufferedRequestState<String>> createWriter(WriterInitContext context) {
            return new CountingWriter(context, Collections.emptyList());
        }

        @Override
        public StatefulSinkWriter<String, BufferedRequestState<String>> restoreWriter(
                WriterInitContext context, Collection<BufferedRequestState<String>> states) {
            return new CountingWriter(context, states);
        }

        @Override
        public SimpleVersionedSerializer<BufferedRequestState<String>> getWriterStateSerializer() {
            return new AsyncSinkWriterStateSerializer<String>() {
                @Override
                protected void serializeRequestToStream(String entry, DataOutputStream out) throws IOException {
                    out.writeUTF(entry);
                }

                @Override
                protected String deserializeRequestFromStream(long size, DataInputStream in) throws IOException {
                    return in.readUTF();
                }

                @Override
                public int getVersion() {
                    return 1;
                }
            };
        }
    }

    /** Spark's rows in bench/floors/flink_async_sink.py: the id zero-padded to 20 digits, then 80 x's. */
    static String body(long id) {
        String digits = Long.toString(id);
        StringBuilder out = new StringBuilder(100);
        for (int i = digits.length(); i < 20; i++) {
            out.append('0');
        }
        return out.append(digits).append("x".repeat(80)).toString();
    }

    static JobExecutionResult run(long rows) throws Exception {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(PARALLELISM);
        env.fromSequence(0, rows - 1).map(FlinkFloor::body).returns(Types.STRING).sinkTo(new CountingSink());
        return env.execute("flink-floor");
    }

    static long counted(long rows) throws Exception {
        COUNTED.set(0);
        JobExecutionResult result = run(rows);
        if (COUNTED.get() != rows) {
            throw new IllegalStateException("the counting sink saw " + COUNTED.get() + " rows of " + rows);
        }
        return result.getNetRuntime();
    }

    public static void main(String[] args) throws Exception {
        long rows = Long.parseLong(args[0]);
        counted(rows); // the warm-up
        System.out.println("ready");
        BufferedReader commands = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        while (commands.readLine() != null) {
            long millis = counted(rows);
            System.out.println("job " + millis + " " + COUNTED.get());
        }
    }
}
