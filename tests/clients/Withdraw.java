// A withdrawal as a Java application writes it, with pgjdbc: read the balance, compute, write it back.
// --for-update locks the row as it reads it (the cure). Connects with the PG* variables pgrace sets;
// assumeMinServerVersion lets pgjdbc send its session settings at start-up, not as two SETs after it.
import java.sql.*;

public class Withdraw {
    public static void main(String[] args) throws Exception {
        String lock = args.length > 0 && args[0].equals("--for-update") ? " FOR UPDATE" : "";
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?sslmode=disable&assumeMinServerVersion=9.0";
        try (Connection conn = DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"))) {
            conn.setAutoCommit(false);
            int balance;
            try (Statement read = conn.createStatement();
                 ResultSet rs = read.executeQuery("SELECT balance FROM accounts WHERE id = 1" + lock)) {
                rs.next();
                balance = rs.getInt(1);
            }
            try (Statement write = conn.createStatement()) {
                write.executeUpdate("UPDATE accounts SET balance = " + (balance - 100) + " WHERE id = 1");
            }
            conn.commit();
        }
    }
}
