import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import java.io.BufferedWriter;
import java.io.FileWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * Debezium's embedded engine on the latency benchmark's table (bench/latency/): for every change, the commit time
 * of its transaction (source.ts_us) and the moment the consumer callback got it, as "commit_us arrival_us" lines.
 *
 * <p>Arguments: host port database user slot publication table out-file. The password comes from $PGPASSWORD, never
 * from the command line. Prints READY once the connector's task runs; a SIGTERM stops the engine and flushes the file.
 */
public final class DebeziumLatency {
    public static void main(String[] args) throws IOException {
        Properties config = new Properties();
        config.setProperty("name", "latency");
        config.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        config.setProperty("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
        config.setProperty("offset.flush.interval.ms", "60000");
        config.setProperty("database.hostname", args[0]);
        config.setProperty("database.port", args[1]);
        config.setProperty("database.dbname", args[2]);
        config.setProperty("database.user", args[3]);
        config.setProperty("database.password", System.getenv().getOrDefault("PGPASSWORD", ""));
        config.setProperty("topic.prefix", "latency");
        config.setProperty("plugin.name", "pgoutput");
        config.setProperty("slot.name", args[4]);
        config.setProperty("slot.drop.on.stop", "true");
        config.setProperty("publication.name", args[5]);
        config.setProperty("publication.autocreate.mode", "disabled");
        config.setProperty("table.include.list", args[6]);
        config.setProperty("snapshot.mode", "no_data"); // changes from the slot's creation on, as sluice's query

        BufferedWriter out = new BufferedWriter(new FileWriter(args[7]), 1 << 20);
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine =
                DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                        .using(config)
                        .using(new DebeziumEngine.ConnectorCallback() {
                            @Override
                            public void taskStarted() {
                                System.out.println("READY");
                                System.out.flush();
                            }
                        })
                        .notifying(event -> {
                            long arrival = ChronoUnit.MICROS.between(Instant.EPOCH, Instant.now());
                            if (!(event.record().value() instanceof Struct change)) {
                                return; // a tombstone or a heartbeat: no row change
                            }
                            Struct source = change.getStruct("source");
                            long commit = source.schema().field("ts_us") != null
                                    ? source.getInt64("ts_us") : source.getInt64("ts_ms") * 1000;
                            synchronized (out) {
                                try {
                                    out.write(commit + " " + arrival + "\n");
                                } catch (IOException e) {
                                    throw new UncheckedIOException(e);
                                }
                            }
                        })
                        .build();
        ExecutorService runner = Executors.newSingleThreadExecutor();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                engine.close();
                synchronized (out) {
                    out.close();
                }
            } catch (IOException e) {
                e.printStackTrace();
            }
        }));
        runner.execute(engine);
    }
}
