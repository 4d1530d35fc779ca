import java.lang.reflect.Field;
import java.time.Instant;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

import de.bwaldvogel.mongo.MongoBackend;
import de.bwaldvogel.mongo.MongoCollection;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import de.bwaldvogel.mongo.bson.BsonTimestamp;
import de.bwaldvogel.mongo.bson.Document;

/**
 * Starts mongo-java-server on 127.0.0.1 with its oplog enabled (for change streams).
 * Usage: Launcher PORT [H2_FILE]. Without H2_FILE the memory backend is used.
 * Prints "listening mongodb://127.0.0.1:PORT/" once bound, then serves until killed or, when the system
 * property bucketq.exitOnStdinEof is set, until its standard input closes: a parent that dies, even by
 * SIGKILL, takes its server with it.
 *
 * <p>The handshake. mongo-java-server 1.47 (the newest release) reports maxWireVersion 8 (MongoDB 4.2) and
 * pymongo 4.18 and later refuse any server below wire version 9 (MongoDB 4.4). The launcher sets the backend's
 * version (MongoBackend.version, its public API; nothing else in the server reads it) so that the server
 * reports MongoDB 4.4, the lowest level the newest pymongo accepts. The fields that changes, and why the server
 * backs each claim for what bucketq and pymongo 4.13 to 4.20 send:
 *
 * <pre>
 * field                             mongo-java-server  launcher
 * isMaster.maxWireVersion           8                  9
 * buildInfo.version, versionArray   5.0.0 [5, 0, 0]    4.4.0 [4, 4, 0]   (and serverStatus.version)
 * </pre>
 *
 * <ul>
 * <li>maxWireVersion 9 says the server speaks OP_MSG (wire 6) with find, getMore, aggregate cursors, the
 *     write commands and change streams from startAtOperationTime (wire 7): it serves all of these at wire
 *     8 already, and they are all bucketq uses. What 9 adds over 8 for a driver: pymongo 4.13 sends a
 *     command's "comment" field on getMore too, and bucketq sets no comment; pymongo 4.20
 *     turns nothing on at 9 (its first feature switches are snapshot reads at 13, replica-set election ids at
 *     17, Queryable Encryption at 21 and the bulkWrite command at 25). The Java driver of the Spark
 *     connector (5.1) checks for 4.4 to send a getMore's comment, a createIndexes commitQuorum and a hint on an
 *     unacknowledged write: the connector and bucketq set none of these (the spark tests run it).</li>
 * <li>What MongoDB 4.4 has and the server lacks is not claimed by the wire version, and the drivers ask
 *     for it by other fields the server leaves out: the "hello" command (only after a reply carries
 *     helloOk, so the drivers keep to isMaster), the streaming monitor (topologyVersion), sessions and
 *     retryable writes (logicalSessionTimeoutMinutes), transactions (setName: a replica set). bucketq and
 *     tests/features.py read those same fields, never the wire version.</li>
 * <li>The version string follows the wire version (4.4 is the release of wire 9); no driver turns a
 *     feature on by it. The gitVersion a real mongod reports stays absent (tests/features.py credits TTL
 *     indexes only where it is present).</li>
 * </ul>
 *
 * With the system property bucketq.shippedHandshake set, the backend keeps mongo-java-server's own (wire 8):
 * the tests of a server the installed pymongo refuses use it.
 *
 * <p>The oplog. mongo-java-server keeps every write in local.oplog.rs, uncapped, and each change-stream getMore
 * reads it whole, under its lock: a long run with many streams (the stress and soak runs) slows every write and
 * read down until the server barely answers. With the system property bucketq.oplogWindowS set to N, entries
 * older than N seconds are deleted every N/4 seconds, as a capped oplog drops its oldest: a change stream that
 * resumes from further back misses what was dropped (MongoDB refuses it instead; bucketq opens its streams from
 * a second ago). The oplog does not log deletes from itself.
 *
 * <p>Cursor ids. mongo-java-server numbers cursors 1, 2, 3, ... from each start, and its getMore looks a cursor up
 * by id alone. After a restart, a client's getMore on a cursor of the server that went (a change stream's, sent on
 * a new connection) then reads whichever new cursor got that number, another client's on another collection:
 * the stream answers, empty, and never hears of its own collection again. MongoDB's cursor ids are random 64-bit
 * numbers, and a cursor the server does not know is refused (CursorNotFound), which the driver resumes from. The
 * launcher starts the count at a random number (a private field, set by reflection), so that ids do not repeat
 * across restarts and such a getMore is refused as on MongoDB.
 */
public class Launcher {
    /** MongoDB 4.4: wire version 9. */
    static final MongoVersion MONGODB_4_4 = new MongoVersion() {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(4, 4, 0);
        }

        @Override
        public int getWireVersion() {
            return 9;
        }
    };

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        MongoBackend backend = args.length > 1 ? new H2Backend(args[1]) : new MemoryBackend();
        if (!Boolean.getBoolean("bucketq.shippedHandshake")) {
            backend.version(MONGODB_4_4);
        }
        randomizeCursorIds(backend);
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        long windowS = Long.getLong("bucketq.oplogWindowS", 0L);
        if (windowS > 0) {
            trimOplog(backend, windowS);
        }
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

    /** Starts the backend's cursor ids at a random number below 2^62 (room for any run's count above it). */
    static void randomizeCursorIds(MongoBackend backend) throws ReflectiveOperationException {
        Field registryField = Class.forName("de.bwaldvogel.mongo.backend.AbstractMongoBackend")
            .getDeclaredField("cursorRegistry");
        registryField.setAccessible(true);
        Object registry = registryField.get(backend);
        Field counterField = registry.getClass().getDeclaredField("cursorIdCounter");
        counterField.setAccessible(true);
        ((AtomicLong) counterField.get(registry)).set(ThreadLocalRandom.current().nextLong(1L << 32, 1L << 62));
    }

    /** Deletes, every windowS / 4 seconds, the oplog entries older than windowS seconds (a daemon thread). */
    static void trimOplog(MongoBackend backend, long windowS) {
        Thread trimmer = new Thread(() -> {
            while (true) {
                try {
                    Thread.sleep(Math.max(1L, windowS / 4) * 1000L);
                    MongoCollection<?> oplog = backend.resolveDatabase("local").resolveCollection("oplog.rs", false);
                    if (oplog != null) {
                        BsonTimestamp oldest = new BsonTimestamp(Instant.now().minusSeconds(windowS), 0);
                        oplog.deleteDocuments(new Document("ts", new Document("$lt", oldest)), 0);
                    }
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    System.err.println("oplog trim failed: " + e);
                }
            }
        }, "bucketq-oplog-trim");
        trimmer.setDaemon(true);
        trimmer.start();
    }
}
