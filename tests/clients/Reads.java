// A JVM that waits for input: it connects to the port given and reads one byte. Nothing else of the
// application runs meanwhile; the JVM's own threads sleep beside it, some in timed waits.
import java.net.Socket;

public class Reads {
    public static void main(String[] args) throws Exception {
        try (Socket socket = new Socket("127.0.0.1", Integer.parseInt(args[0]))) {
            socket.getOutputStream().write('!');
            System.out.println(socket.getInputStream().read());
        }
    }
}
