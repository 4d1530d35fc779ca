import de.bwaldvogel.mongo.MongoBackend;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

/**
 * Starts mongo-java-server on 127.0.0.1 with its oplog enabled (for change streams).
 * Usage: Launcher PORT [H2_FILE]. Without H2_FILE the memory backend is used.
 * Prints "listening mongodb://127.0.0.1:PORT/" once bound, then serves until killed or, when the system
 * property bucketq.exitOnStdinEof is set, until its standard input closes: a parent that dies, even by
 * SIGKILL, takes its server with it.
 */
public class Launcher {
    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        MongoBackend backend = args.length > 1 ? new H2Backend(args[1]) : new MemoryBackend();
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        server.bind("127.0.0.1", port);
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdown));
        System.out.println("listening mongodb://127.0.0.1:" + port + "/");
        System.out.flush();
        if (Boolean.getBoolean("bucketq.exitOnStdinEof")) {
            while (System.in.read() != -1) {
                // the parent never writes; read() returns -1 once it has gone
            }
            System.exit(0);
        }
        Thread.currentThread().join();
    }
}
