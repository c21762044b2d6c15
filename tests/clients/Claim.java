// A worker's claim with pgjdbc: read the first pending job, then mark it claimed (tests/claiming.py).
// --skip-locked reads with FOR UPDATE SKIP LOCKED (the cure). Connects with the PG* variables pgrace sets.
import java.sql.*;

public class Claim {
    public static void main(String[] args) throws Exception {
        String lock = args.length > 0 && args[0].equals("--skip-locked") ? " FOR UPDATE SKIP LOCKED" : "";
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?sslmode=disable&assumeMinServerVersion=9.0";
        try (Connection conn = DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"))) {
            conn.setAutoCommit(false);
            try (Statement read = conn.createStatement();
                 ResultSet rs = read.executeQuery("SELECT id FROM jobs WHERE status = 'pending' ORDER BY id LIMIT 1" + lock)) {
                if (rs.next()) {
                    try (PreparedStatement claim = conn.prepareStatement(
                            "UPDATE jobs SET status = 'claimed', claims = claims + 1 WHERE id = ?")) {
                        claim.setInt(1, rs.getInt(1));
                        claim.executeUpdate();
                    }
                }
            }
            conn.commit();
        }
    }
}
