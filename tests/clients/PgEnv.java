// The test clients' connection: pgjdbc does not read the PG* variables pgrace sets, so the URL is built from them;
// assumeMinServerVersion lets pgjdbc send its session settings at start-up, not as two SETs after it.
import java.sql.*;

final class PgEnv {
    static Connection connect() throws SQLException {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?sslmode=disable&assumeMinServerVersion=9.0";
        return DriverManager.getConnection(url, System.getenv("PGUSER"), System.getenv("PGPASSWORD"));
    }
}
