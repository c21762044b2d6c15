// A withdrawal as a Java application writes it, with pgjdbc: read the balance, compute, write it back.
// --for-update locks the row as it reads it (the cure). Connects with the PG* variables pgrace sets (PgEnv.java).
import java.sql.*;

public class Withdraw {
    public static void main(String[] args) throws Exception {
        String lock = args.length > 0 && args[0].equals("--for-update") ? " FOR UPDATE" : "";
        try (Connection conn = PgEnv.connect()) {
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
