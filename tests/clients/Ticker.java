// A withdrawal beside an application timer: a scheduled task every 50 ms, asleep in a timed wait between
// runs. pgrace cannot tell what the timer does when it fires, so it must not take the process for quiet.
import java.sql.*;
import java.util.concurrent.*;

public class Ticker {
    public static void main(String[] args) throws Exception {
        ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
        timer.scheduleAtFixedRate(() -> {}, 50, 50, TimeUnit.MILLISECONDS);
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?sslmode=disable&assumeMinServerVersion=9.0";
        try (Connection conn = DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"));
             Statement s = conn.createStatement()) {
            s.executeQuery("SELECT balance FROM accounts WHERE id = 1").close();
        } finally {
            timer.shutdownNow();
        }
    }
}
