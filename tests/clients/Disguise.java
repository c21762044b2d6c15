// A withdrawal beside an application thread that takes the name of HotSpot's own VM Thread and wakes every
// 50 ms: the JVM still counts it as a Java thread, so the name alone must not make it trusted.
import java.sql.*;

public class Disguise {
    public static void main(String[] args) throws Exception {
        Object tick = new Object();
        Thread disguised = new Thread(() -> {
            synchronized (tick) {
                try {
                    while (true) {
                        tick.wait(50);
                    }
                } catch (InterruptedException e) {
                    // the withdrawal is over
                }
            }
        }, "VM Thread");
        disguised.setDaemon(true);
        disguised.start();
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?sslmode=disable&assumeMinServerVersion=9.0";
        try (Connection conn = DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"));
             Statement s = conn.createStatement()) {
            s.executeQuery("SELECT balance FROM accounts WHERE id = 1").close();
        }
    }
}
