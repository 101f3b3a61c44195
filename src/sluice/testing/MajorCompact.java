import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.CompactionState;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.ConnectionFactory;

public class MajorCompact {
  public static void main(String[] args) throws Exception {
    TableName table = TableName.valueOf(args[0]);
    long deadline = System.currentTimeMillis() + Long.parseLong(args[1]);
    try (Connection connection = ConnectionFactory.createConnection(HBaseConfiguration.create());
         Admin admin = connection.getAdmin()) {
      long before = admin.getLastMajorCompactionTimestamp(table);
      admin.flush(table);
      admin.majorCompact(table);
      while (admin.getLastMajorCompactionTimestamp(table) <= before
             || admin.getCompactionState(table) != CompactionState.NONE) {
        if (System.currentTimeMillis() > deadline) {
          System.err.println("the major compaction of " + table + " did not end in time");
          System.exit(2);
        }
        Thread.sleep(100);
      }
    }
  }
}
