package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.apache.kafka.server.log.remote.storage.RetriableRemoteStorageException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** The plugin against a scripted sidecar on a real Unix socket: requests, answers, errors, deadlines. */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class SidecarRemoteStorageManagerTest {

    @TempDir
    Path dir;

    private FakeSidecar sidecar;
    private SidecarRemoteStorageManager rsm;

    @BeforeEach
    void setUp() throws IOException {
        sidecar = new FakeSidecar(dir.resolve("read.sock"));
        rsm = new SidecarRemoteStorageManager();
        rsm.configure(Map.of(
                "socket.path", sidecar.path.toString(),
                "request.timeout.ms", "2000",
                "copy.timeout.ms", "2000",
                "read.idle.timeout.ms", "2000",
                "connect.timeout.ms", "2000",
                // one request per fetch: the tests of sequential windows configure their own
                "fetch.cache.bytes", "0"));
    }

    @AfterEach
    void tearDown() {
        rsm.close();
        sidecar.close();
    }

    static RemoteLogSegmentMetadata metadata() {
        TopicIdPartition tip = new TopicIdPartition(Uuid.fromString("AAAAAAAAAAAAAAAAAAAAAQ"),
                new TopicPartition("orders\"x", 3));
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tip, Uuid.fromString("AAAAAAAAAAAAAAAAAAAAAg")),
                100L, 199L, 1_700_000_000_000L, 7, 1_700_000_000_500L, 1_000_000, Map.of(0, 100L, 2, 150L));
    }

    @Test
    void copySendsTheBrokersFilesAndLeaderEpochs() throws Exception {
        sidecar.answer(200, "{\"custom_metadata\":null}");
        Path log = dir.resolve("00000000000000000100.log");
        LogSegmentData data = new LogSegmentData(log, dir.resolve("00000000000000000100.index"),
                dir.resolve("00000000000000000100.timeindex"), Optional.empty(),
                dir.resolve("00000000000000000200.snapshot"),
                ByteBuffer.wrap("0\n1\n0 100\n".getBytes(StandardCharsets.UTF_8)));
        assertEquals(Optional.empty(), rsm.copyLogSegmentData(metadata(), data));
        FakeSidecar.Request request = sidecar.requests.take();
        assertEquals("/v1/rsm/copy", request.path);
        assertTrue(request.head.contains("\r\nX-Sidecar-Rsm-Protocol: 1\r\n"), request.head);
        String body = request.body;
        assertTrue(body.contains("\"topic\":\"orders\\\"x\""), body);
        assertTrue(body.contains("\"topic_id\":\"AAAAAAAAAAAAAAAAAAAAAQ\""), body);
        assertTrue(body.contains("\"segment_id\":\"AAAAAAAAAAAAAAAAAAAAAg\""), body);
        assertTrue(body.contains("\"partition\":3"), body);
        assertTrue(body.contains("\"segment_leader_epochs\":[[0,100],[2,150]]"), body);
        assertTrue(body.contains("\"log\":\"" + log + "\""), body);
        assertTrue(body.contains("\"txn_index\":null"), body);
        assertTrue(body.contains("\"leader_epoch_index\":\"MAoxCjAgMTAwCg==\""), body);
    }

    @Test
    void anInterruptedCallGivesUpAtOnceAndKeepsTheFlag() throws Exception {
        // Kafka interrupts a copy or delete it gives up on (RLMTaskWithFuture.cancel(true)); the
        // sidecar does not answer here, so only the interrupt can end the wait before its deadline
        sidecar.silent = true;
        LogSegmentData data = new LogSegmentData(dir.resolve("a.log"), dir.resolve("a.index"),
                dir.resolve("a.timeindex"), Optional.empty(), dir.resolve("b.snapshot"), ByteBuffer.allocate(0));
        for (String call : List.of("copy", "delete")) {
            Thread.currentThread().interrupt();
            RemoteStorageException e;
            try {
                e = assertThrows(RemoteStorageException.class, () -> {
                    if (call.equals("copy")) {
                        rsm.copyLogSegmentData(metadata(), data);
                    } else {
                        rsm.deleteLogSegmentData(metadata());
                    }
                });
            } finally {
                assertTrue(Thread.interrupted(), call + ": the interrupt flag was cleared");
            }
            assertInstanceOf(RetriableRemoteStorageException.class, e, call);
            // not the deadline's SocketTimeoutException, which the spinning wait ended with
            assertEquals(InterruptedIOException.class, e.getCause().getClass(), call + ": " + e.getCause());
        }
    }

    @Test
    void copyReturnsTheSidecarsCustomMetadata() throws Exception {
        sidecar.answer(200, "{\"custom_metadata\":\"AQI=\"}");
        LogSegmentData data = new LogSegmentData(dir.resolve("a.log"), dir.resolve("a.index"),
                dir.resolve("a.timeindex"), Optional.of(dir.resolve("a.txnindex")), dir.resolve("b.snapshot"),
                ByteBuffer.allocate(0));
        Optional<RemoteLogSegmentMetadata.CustomMetadata> custom = rsm.copyLogSegmentData(metadata(), data);
        assertArrayEquals(new byte[] {1, 2}, custom.orElseThrow().value());
    }

    @Test
    void aWindowAnsweredShortFailsTheFetchInsteadOfLeavingAGap() {
        sidecar.answer(200, new byte[299_999]); // one byte short of 10..300009
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchLogSegment(metadata(), 10, 300_009).close());
        assertFalse(e instanceof RetriableRemoteStorageException, e.toString());
        assertTrue(e.getMessage().contains("answered 299999 bytes for a window of 300000"), e.getMessage());
    }

    @Test
    void fetchStreamsTheBodyAndSendsAnInclusiveRange() throws Exception {
        byte[] payload = new byte[300_000];
        for (int i = 0; i < payload.length; i++) {
            payload[i] = (byte) (i * 31);
        }
        sidecar.answer(200, payload);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 10, 300_009)) {
            assertArrayEquals(payload, in.readAllBytes());
            assertEquals(-1, in.read());
        }
        FakeSidecar.Request request = sidecar.requests.take();
        assertTrue(request.head.contains("\r\nX-Sidecar-Rsm-Protocol: 1\r\n"), request.head);
        String body = request.body;
        assertTrue(body.contains("\"start\":10,\"end\":300009"), body);
    }

    @Test
    void fetchWithoutEndAsksForOneWindowUpToTheSegmentEnd() throws Exception {
        sidecar.answerTruncated(200, new byte[] {1}, 999_995, false); // the window's length, then closed
        try (InputStream in = rsm.fetchLogSegment(metadata(), 5)) {
            assertEquals(1, in.read());
        }
        String body = sidecar.requests.take().body;
        assertTrue(body.contains("\"start\":5,\"end\":999999"), body);
    }

    @Test
    void aLongRangeIsFetchedWindowByWindowAsItIsRead() throws Exception {
        SidecarRemoteStorageManager windowed = new SidecarRemoteStorageManager();
        windowed.configure(Map.of("socket.path", sidecar.path.toString(), "fetch.window.bytes", "100"));
        byte[] payload = new byte[250];
        for (int i = 0; i < payload.length; i++) {
            payload[i] = (byte) i;
        }
        sidecar.answer(200, java.util.Arrays.copyOfRange(payload, 0, 100));
        sidecar.answer(200, java.util.Arrays.copyOfRange(payload, 100, 200));
        sidecar.answer(200, java.util.Arrays.copyOfRange(payload, 200, 250));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 1000, 1249)) {
            assertEquals(1, sidecar.requests.size(), "only the first window before reading");
            assertArrayEquals(payload, in.readAllBytes());
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":1000,\"end\":1099"));
        assertTrue(sidecar.requests.take().body.contains("\"start\":1100,\"end\":1199"));
        assertTrue(sidecar.requests.take().body.contains("\"start\":1200,\"end\":1249"));
    }

    @Test
    void readsReadToTheEndShareOneConnection() throws Exception {
        sidecar.keepAlive = true;
        byte[] payload = new byte[50_000];
        for (int round = 0; round < 3; round++) {
            sidecar.answer(200, payload);
            try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 49_999)) {
                assertEquals(payload.length, in.readAllBytes().length);
            }
            assertEquals(1, rsm.idleConnections());
        }
        sidecar.answer(200, "{}".getBytes(StandardCharsets.UTF_8));
        try (InputStream in = rsm.fetchIndex(metadata(), IndexType.OFFSET)) {
            assertEquals(2, in.readAllBytes().length);
        }
        assertEquals(1, sidecar.accepted.get());
        for (int i = 0; i < 4; i++) {
            assertFalse(sidecar.requests.take().head.toLowerCase().contains("connection: close"));
        }
    }

    @Test
    void aStreamReadToItsEndHandsItsConnectionBackUnclosed() throws Exception {
        // Kafka's RemoteLogManager.read, on one path, reads a stream to its end and drops it
        // unclosed; the JDK never reclaims an unclosed socket
        sidecar.keepAlive = true;
        for (int round = 0; round < 3; round++) {
            sidecar.answer(200, new byte[1000]);
            InputStream in = rsm.fetchLogSegment(metadata(), 0, 999);
            assertEquals(1000, in.readAllBytes().length);
            assertEquals(-1, in.read());
            assertEquals(1, rsm.idleConnections());
        }
        sidecar.answer(200, "{}".getBytes(StandardCharsets.UTF_8));
        InputStream index = rsm.fetchIndex(metadata(), IndexType.OFFSET);
        assertEquals(2, index.readAllBytes().length);
        assertEquals(1, rsm.idleConnections());
        index.close(); // a close after the end hands nothing back twice
        assertEquals(1, rsm.idleConnections());
        assertEquals(1, sidecar.accepted.get());
    }

    @Test
    void configuringAgainClosesTheIdleConnectionsOfTheSettingsBefore() throws Exception {
        sidecar.keepAlive = true;
        sidecar.answer(200, new byte[10]);
        try (InputStream in = rsm.fetchIndex(metadata(), IndexType.OFFSET)) {
            assertEquals(10, in.readAllBytes().length);
        }
        assertEquals(1, rsm.idleConnections());
        rsm.configure(Map.of("socket.path", sidecar.path.toString(), "fetch.cache.bytes", "0"));
        assertEquals(0, rsm.idleConnections());
        assertEquals(Boolean.TRUE, sidecar.hangups.poll(10, TimeUnit.SECONDS), "the kept connection was not closed");
    }

    @Test
    void aReadClosedFarFromItsEndDoesNotGoBackToThePool() throws Exception {
        sidecar.keepAlive = true;
        int size = SidecarHttp.BodyStream.DRAIN_MAX_BYTES + 100_000;
        sidecar.answer(200, new byte[size]);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0, size - 1)) {
            assertEquals(10, in.readNBytes(10).length);
        }
        assertEquals(0, rsm.idleConnections());
        sidecar.answer(200, new byte[10]);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 9)) {
            assertEquals(10, in.readAllBytes().length);
        }
        assertEquals(2, sidecar.accepted.get());
    }

    @Test
    void aReadClosedNearItsEndIsDrainedAndItsConnectionKept() throws Exception {
        sidecar.keepAlive = true;
        byte[] payload = new byte[200_000];
        payload[199_999] = 7;
        sidecar.answer(200, payload);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 199_999)) {
            assertEquals(150_000, in.readNBytes(150_000).length);
        }
        assertEquals(1, rsm.idleConnections());
        // the next answer on that connection starts where the drained body ended
        sidecar.answer(200, new byte[] {1, 2, 3});
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 2)) {
            assertArrayEquals(new byte[] {1, 2, 3}, in.readAllBytes());
        }
        assertEquals(1, sidecar.accepted.get());
    }

    @Test
    void theFirstWindowGrowsByWhatRecentReadsReadPastIt() throws Exception {
        SidecarRemoteStorageManager windowed = new SidecarRemoteStorageManager();
        windowed.configure(Map.of("socket.path", sidecar.path.toString(), "fetch.window.bytes", "100"));
        sidecar.answer(200, new byte[100]);
        sidecar.answer(200, new byte[100]);
        // a reader that needs 30 bytes more than one window: two requests
        try (InputStream in = windowed.fetchLogSegment(metadata(), 1000)) {
            assertEquals(130, in.readNBytes(130).length);
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":1000,\"end\":1099"));
        assertTrue(sidecar.requests.take().body.contains("\"start\":1100,\"end\":1199"));
        // the next read's first window covers that, rounded up to the overshoot's granularity
        long end = 2000 + 100 + ReadOvershoot.ROUND_BYTES - 1;
        sidecar.answer(200, new byte[100 + ReadOvershoot.ROUND_BYTES]);
        try (InputStream in = windowed.fetchLogSegment(metadata(), 2000)) {
            assertEquals(130, in.readNBytes(130).length);
        }
        String body = sidecar.requests.take().body;
        assertTrue(body.contains("\"start\":2000,\"end\":" + end + ","), body);
        assertTrue(sidecar.requests.isEmpty(), "one request for the whole read");
        windowed.close();
    }

    @Test
    void aLongScanDoesNotGrowTheFirstWindow() throws Exception {
        SidecarRemoteStorageManager windowed = new SidecarRemoteStorageManager();
        windowed.configure(Map.of("socket.path", sidecar.path.toString(), "fetch.window.bytes", "100"));
        for (int i = 0; i < 4; i++) {
            sidecar.answer(200, new byte[100]);
        }
        // a read of three and a half windows, stopped before the range's end (a search by time)
        try (InputStream in = windowed.fetchLogSegment(metadata(), 1000)) {
            assertEquals(350, in.readNBytes(350).length);
        }
        for (int i = 0; i < 4; i++) {
            sidecar.requests.take();
        }
        sidecar.answer(200, new byte[100]);
        try (InputStream in = windowed.fetchLogSegment(metadata(), 2000)) {
            assertEquals(50, in.readNBytes(50).length);
        }
        String body = sidecar.requests.take().body;
        assertTrue(body.contains("\"start\":2000,\"end\":2099,"), body);
        windowed.close();
    }

    /** Windows kept for sequential readers; none fetched in the background unless asked. */
    private SidecarRemoteStorageManager sequentialWindows(int window, int sequentialWindow, int cacheBytes) {
        return sequentialWindows(window, sequentialWindow, cacheBytes, 0);
    }

    private SidecarRemoteStorageManager sequentialWindows(int window, int sequentialWindow, int cacheBytes,
            int readAhead) {
        SidecarRemoteStorageManager windowed = new SidecarRemoteStorageManager();
        windowed.configure(Map.of("socket.path", sidecar.path.toString(),
                "fetch.window.bytes", Integer.toString(window),
                "fetch.sequential.window.bytes", Integer.toString(sequentialWindow),
                "fetch.cache.bytes", Integer.toString(cacheBytes),
                "fetch.readahead.windows", Integer.toString(readAhead)));
        return windowed;
    }

    private static byte[] segmentBytes() {
        byte[] segment = new byte[1_000_000];
        for (int i = 0; i < segment.length; i++) {
            segment[i] = (byte) (i * 7 + i / 251);
        }
        return segment;
    }

    /** A first read of the segment from 0, one plain window of 100 bytes, {@code bytes} of it read. */
    private void firstPlainRead(SidecarRemoteStorageManager windowed, byte[] segment, int bytes) throws Exception {
        sidecar.answer(200, range(segment, 0, 100));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 0)) {
            in.readNBytes(bytes);
        }
    }

    private static byte[] range(byte[] segment, long from, long to) {
        return java.util.Arrays.copyOfRange(segment, (int) from, (int) to);
    }

    @Test
    void aConsumersNextFetchesAreServedFromOneSequentialWindow() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 10_000);
        // the first fetch: a plain window (with no overshoot recorded yet, 100 bytes)
        sidecar.answer(200, range(segment, 5000, 5100));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 5000)) {
            assertArrayEquals(range(segment, 5000, 5090), in.readNBytes(90));
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":5000,\"end\":5099,"));
        // the next fetch starts a little before where that one stopped: one window of 1000, kept
        sidecar.answer(200, range(segment, 5080, 6080));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 5080)) {
            assertArrayEquals(range(segment, 5080, 5180), in.readNBytes(100));
        }
        String body = sidecar.requests.take().body;
        assertTrue(body.contains("\"start\":5080,\"end\":6079,\"readahead_end\":999999"), body);
        assertEquals(1000, windowed.windows().bytes());
        // the fetches after it come from memory, up to the window's end and across it
        for (int at = 5170; at < 5900; at += 90) {
            try (InputStream in = windowed.fetchLogSegment(metadata(), at)) {
                assertArrayEquals(range(segment, at, at + 100), in.readNBytes(100));
            }
        }
        assertTrue(sidecar.requests.isEmpty(), "no request while the window holds the bytes");
        sidecar.answer(200, range(segment, 6080, 7080));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 5980)) {
            assertArrayEquals(range(segment, 5980, 6180), in.readNBytes(200));
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":6080,\"end\":7079,"));
        assertEquals(2000, windowed.windows().bytes());
        windowed.close();
    }

    @Test
    void theNextWindowIsFetchedInTheBackgroundAndServesTheFetchThatGetsThere() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 10_000, 1);
        firstPlainRead(windowed, segment, 90);
        sidecar.requests.take();
        // the consumer's next fetch: its window, and right after it the next one in the background
        sidecar.answer(200, range(segment, 80, 1080));
        sidecar.answer(200, range(segment, 1080, 2080));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 80)) {
            assertArrayEquals(range(segment, 80, 180), in.readNBytes(100));
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":80,\"end\":1079,"));
        String ahead = sidecar.requests.poll(10, TimeUnit.SECONDS).body;
        assertTrue(ahead.contains("\"start\":1080,\"end\":2079,"), ahead);
        // a fetch across the windows' boundary is served from both, with no request of its own
        // (the one after that, 2080.., is asked for in the background meanwhile)
        sidecar.answer(200, range(segment, 2080, 3080));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 170)) {
            assertArrayEquals(range(segment, 170, 1500), in.readNBytes(1330));
        }
        String next = sidecar.requests.poll(10, TimeUnit.SECONDS).body;
        assertTrue(next.contains("\"start\":2080,\"end\":3079,"), next);
        windowed.close();
    }

    @Test
    void aFailedBackgroundFetchIsAskedForAgainByTheReaderThatGetsThere() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 10_000, 1);
        firstPlainRead(windowed, segment, 90);
        sidecar.requests.take();
        sidecar.answer(200, range(segment, 80, 1080));
        sidecar.answer(503, "{\"code\":\"storage_unavailable\"}");
        try (InputStream in = windowed.fetchLogSegment(metadata(), 80)) {
            in.readNBytes(100);
        }
        sidecar.requests.take();
        assertTrue(sidecar.requests.poll(10, TimeUnit.SECONDS).body.contains("\"start\":1080,"));
        // the consumer's next fetch reaches 1080: it asks itself, once the failed fetch ahead is
        // done, and the window after that is fetched ahead again
        sidecar.answer(200, range(segment, 1080, 2080));
        sidecar.answer(200, range(segment, 2080, 3080));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 170)) {
            assertArrayEquals(range(segment, 170, 1170), in.readNBytes(1000));
        }
        assertTrue(sidecar.requests.poll(10, TimeUnit.SECONDS).body.contains("\"start\":1080,\"end\":2079,"));
        assertTrue(sidecar.requests.poll(10, TimeUnit.SECONDS).body.contains("\"start\":2080,\"end\":3079,"));
        windowed.close();
    }

    @Test
    void aReadElsewhereInTheSegmentIsAPlainWindow() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 10_000);
        sidecar.answer(200, range(segment, 0, 100));
        try (InputStream in = windowed.fetchLogSegment(metadata(), 0)) {
            assertEquals(50, in.readNBytes(50).length);
        }
        sidecar.requests.take();
        // far past the last read, and before its start: plain windows, nothing kept
        for (int at : new int[] {500_000, 400}) {
            sidecar.answer(200, range(segment, at, at + 100));
            try (InputStream in = windowed.fetchLogSegment(metadata(), at)) {
                assertArrayEquals(range(segment, at, at + 50), in.readNBytes(50));
            }
            String body = sidecar.requests.take().body;
            assertTrue(body.contains("\"start\":" + at + ",\"end\":" + (at + 99) + ","), body);
        }
        assertEquals(0, windowed.windows().count());
        windowed.close();
    }

    @Test
    void keptWindowsStayWithinTheBudgetAndADeletedSegmentsAreDropped() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 2500);
        firstPlainRead(windowed, segment, 100);
        // a sequential reader through 3000 bytes: three windows of 1000, two kept
        for (int at = 100; at < 3100; at += 1000) {
            sidecar.answer(200, range(segment, at, at + 1000));
            try (InputStream in = windowed.fetchLogSegment(metadata(), at)) {
                assertArrayEquals(range(segment, at, at + 1000), in.readNBytes(1000));
            }
        }
        assertEquals(4, sidecar.requests.size());
        assertEquals(2000, windowed.windows().bytes());
        assertEquals(2, windowed.windows().count());
        sidecar.answer(200, "{}");
        windowed.deleteLogSegmentData(metadata());
        assertEquals(0, windowed.windows().count());
        windowed.close();
    }

    @Test
    void aShortSequentialWindowIsAnErrorAndNothingIsKept() throws Exception {
        byte[] segment = segmentBytes();
        SidecarRemoteStorageManager windowed = sequentialWindows(100, 1000, 10_000);
        firstPlainRead(windowed, segment, 100);
        sidecar.answerTruncated(200, range(segment, 100, 600), 1000, false);
        assertThrows(RetriableRemoteStorageException.class, () -> windowed.fetchLogSegment(metadata(), 100));
        assertEquals(0, windowed.windows().count());
        windowed.close();
    }

    @Test
    void aConnectionTheSidecarClosedIsReplacedAndTheReadSucceeds() throws Exception {
        // the fake closes every connection after one answer: the pooled one is dead
        for (int round = 0; round < 3; round++) {
            sidecar.answer(200, new byte[1000]);
            try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 999)) {
                assertEquals(1000, in.readAllBytes().length);
            }
        }
        assertEquals(3, sidecar.accepted.get());
        assertEquals(3, sidecar.requests.size());
    }

    @Test
    void copiesAndDeletesNeverReuseAConnection() throws Exception {
        sidecar.keepAlive = true;
        sidecar.answer(200, new byte[10]);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0, 9)) {
            in.readAllBytes();
        }
        sidecar.answer(200, "{}");
        rsm.deleteLogSegmentData(metadata());
        sidecar.requests.take();
        assertTrue(sidecar.requests.take().head.toLowerCase().contains("connection: close"));
        assertEquals(2, sidecar.accepted.get());
        assertEquals(1, rsm.idleConnections());
    }

    @Test
    void anEndPastTheSegmentIsClamped() throws Exception {
        sidecar.answer(200, new byte[] {1});
        try (InputStream in = rsm.fetchLogSegment(metadata(), 999_999, 5_000_000)) {
            assertEquals(1, in.read());
        }
        assertTrue(sidecar.requests.take().body.contains("\"start\":999999,\"end\":999999"));
    }

    @Test
    void aMissingIndexIsResourceNotFound() {
        sidecar.answer(404, "{\"code\":\"index_not_found\",\"message\":\"no txn_index\"}");
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchIndex(metadata(), IndexType.TRANSACTION));
        assertInstanceOf(RemoteResourceNotFoundException.class, e);
        assertTrue(e.getMessage().contains("index_not_found: no txn_index"), e.getMessage());
    }

    @Test
    void aTransactionIndexOfASegmentMissingFromTheBucketIsNotAnAbsentIndex() {
        // Kafka's RemoteIndexCache takes RemoteResourceNotFoundException from this fetch as "no
        // aborted transactions" and would serve aborted records to read_committed consumers
        sidecar.answer(404, "{\"code\":\"remote_object_not_found\",\"message\":\"not in the bucket\"}");
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchIndex(metadata(), IndexType.TRANSACTION));
        assertFalse(e instanceof RemoteResourceNotFoundException, e.toString());
        assertFalse(e instanceof RetriableRemoteStorageException, e.toString());
        assertTrue(e.getMessage().contains("remote_object_not_found: not in the bucket"), e.getMessage());
        // the other indexes: a missing segment is still "not found"
        sidecar.answer(404, "{\"code\":\"remote_object_not_found\",\"message\":\"not in the bucket\"}");
        assertInstanceOf(RemoteResourceNotFoundException.class,
                assertThrows(RemoteStorageException.class, () -> rsm.fetchIndex(metadata(), IndexType.OFFSET)));
    }

    @Test
    void storageDownIsRetriableAndCorruptDataIsNot() {
        sidecar.answer(503, "{\"code\":\"storage_unavailable\",\"message\":\"S3 down\"}");
        assertInstanceOf(RetriableRemoteStorageException.class,
                assertThrows(RemoteStorageException.class, () -> rsm.deleteLogSegmentData(metadata())));
        sidecar.answer(502, "{\"code\":\"remote_data_invalid\",\"message\":\"bad crc\"}");
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.fetchLogSegment(metadata(), 0));
        assertFalse(e instanceof RetriableRemoteStorageException);
        assertFalse(e instanceof RemoteResourceNotFoundException);
    }

    @Test
    void aMissingSocketIsRetriable() throws Exception {
        sidecar.close();
        Files.deleteIfExists(sidecar.path);
        RemoteStorageException e = assertThrows(RemoteStorageException.class, () -> rsm.deleteLogSegmentData(metadata()));
        assertInstanceOf(RetriableRemoteStorageException.class, e);
    }

    @Test
    void aHostThatDoesNotResolveIsRetriable() {
        // not the JDK's unchecked UnresolvedAddressException, which Kafka does not take as a storage error
        SidecarRemoteStorageManager tcp = new SidecarRemoteStorageManager();
        tcp.configure(Map.of("tcp.host", "no-such-host.invalid", "tcp.port", "9", "fetch.cache.bytes", "0"));
        try {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> tcp.deleteLogSegmentData(metadata()));
            assertInstanceOf(RetriableRemoteStorageException.class, e);
            assertTrue(e.getMessage().contains("no-such-host.invalid"), e.getMessage());
        } finally {
            tcp.close();
        }
    }

    @Test
    void aSilentSidecarIsRetriableAtTheDeadline() {
        sidecar.silent = true;
        long started = System.nanoTime();
        RemoteStorageException e = assertThrows(RemoteStorageException.class, () -> rsm.deleteLogSegmentData(metadata()));
        assertInstanceOf(RetriableRemoteStorageException.class, e);
        long ms = (System.nanoTime() - started) / 1_000_000;
        assertTrue(ms >= 1_900, "gave up after " + ms + " ms, before the 2000 ms deadline");
    }

    @Test
    void aStallMidBodyEndsTheReadAtTheIdleDeadline() throws Exception {
        sidecar.answerTruncated(200, new byte[100], 1_000_000, true);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0)) {
            assertEquals(100, in.readNBytes(100).length);
            IOException e = assertThrows(IOException.class, in::read);
            assertTrue(e.getMessage().contains("idle"), e.getMessage());
        }
    }

    @Test
    void aTruncatedBodyIsAnErrorNotAShortRead() throws Exception {
        sidecar.answerTruncated(200, new byte[100], 1_000_000, false);
        try (InputStream in = rsm.fetchLogSegment(metadata(), 0)) {
            assertThrows(EOFException.class, in::readAllBytes);
        }
    }

    @Test
    void settingsAreChecked() {
        SidecarRemoteStorageManager other = new SidecarRemoteStorageManager();
        assertThrows(IllegalArgumentException.class, () -> other.configure(Map.of("request.timeout.ms", "-1")));
        assertThrows(IllegalArgumentException.class, () -> other.configure(Map.of("copy.timeout.ms", "soon")));
        assertThrows(IllegalArgumentException.class, () -> other.configure(Map.of("fetch.cache.bytes", "-1")));
        assertThrows(IllegalArgumentException.class, () -> other.configure(Map.of("fetch.cache.idle.ms", "-1")));
        // past an int: not cut to its low 32 bits (this one to 1, 2^31 to a negative count)
        assertThrows(IllegalArgumentException.class,
                () -> other.configure(Map.of("fetch.readahead.windows", "4294967297")));
        // a window past 256 MiB would overflow once the overshoot is added to it
        String tooLarge = String.valueOf(Integer.MAX_VALUE - 1000);
        IllegalArgumentException refused = assertThrows(IllegalArgumentException.class,
                () -> other.configure(Map.of("fetch.window.bytes", tooLarge)));
        assertTrue(refused.getMessage().contains("at most"), refused.getMessage());
        assertThrows(IllegalArgumentException.class,
                () -> other.configure(Map.of("fetch.sequential.window.bytes", tooLarge)));
        other.configure(Map.of("fetch.window.bytes", String.valueOf(SidecarRemoteStorageManager.MAX_WINDOW_BYTES)));
        other.close();
    }

    @Test
    void aPortOutOfRangeIsRefusedByConfigure() {
        // else every call would fail with the JDK's IllegalArgumentException, not a RemoteStorageException
        for (String port : List.of("0", "-1", "65536", "80x")) {
            SidecarRemoteStorageManager other = new SidecarRemoteStorageManager();
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> other.configure(Map.of("tcp.port", port)), port);
            assertTrue(e.getMessage().contains("rsm.config.tcp.port"), e.getMessage());
            other.close();
        }
    }

    /** A scripted HTTP/1.1 server on a Unix socket: one queued answer per connection. */
    static final class FakeSidecar implements AutoCloseable {
        record Request(String path, String body, String head) { }

        final Path path;
        final BlockingQueue<Request> requests = new ArrayBlockingQueue<>(16);
        private final BlockingQueue<byte[]> answers = new ArrayBlockingQueue<>(16);
        private final ServerSocketChannel server;
        private final Thread thread;
        volatile boolean silent;
        /** Serve further requests on a connection unless the request says Connection: close. */
        volatile boolean keepAlive;
        final AtomicInteger accepted = new AtomicInteger();
        /** One entry for each connection the client closed between requests. */
        final BlockingQueue<Boolean> hangups = new ArrayBlockingQueue<>(16);

        FakeSidecar(Path path) throws IOException {
            this.path = path;
            server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
            server.bind(UnixDomainSocketAddress.of(path));
            thread = new Thread(this::serve, "fake-sidecar");
            thread.setDaemon(true);
            thread.start();
        }

        void answer(int status, String json) {
            answer(status, json.getBytes(StandardCharsets.UTF_8));
        }

        void answer(int status, byte[] body) {
            answerTruncated(status, body, body.length, false);
        }

        /** Answer {@code body} as {@code contentType}. */
        void answer(int status, String contentType, byte[] body) {
            answer(status, contentType, body, body.length, false);
        }

        /** Declare {@code declared} bytes, send {@code body}, then hang ({@code stall}) or close. */
        void answerTruncated(int status, byte[] body, int declared, boolean stall) {
            answer(status, "application/octet-stream", body, declared, stall);
        }

        private void answer(int status, String contentType, byte[] body, int declared, boolean stall) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            String head = "HTTP/1.1 " + status + " X\r\nContent-Type: " + contentType + "\r\nContent-Length: "
                    + declared + "\r\n\r\n";
            out.writeBytes(head.getBytes(StandardCharsets.US_ASCII));
            out.writeBytes(body);
            byte[] framed = out.toByteArray();
            byte[] withFlag = new byte[framed.length + 1];
            withFlag[0] = (byte) (stall ? 1 : 0);
            System.arraycopy(framed, 0, withFlag, 1, framed.length);
            answers.add(withFlag);
        }

        private void serve() {
            while (server.isOpen()) {
                SocketChannel channel;
                try {
                    channel = server.accept();
                } catch (IOException e) {
                    return;
                }
                accepted.incrementAndGet();
                Thread handler = new Thread(() -> handle(channel), "fake-sidecar-connection");
                handler.setDaemon(true);
                handler.start();
            }
        }

        /** One connection: one answer and close, or (keepAlive) answers until the client closes. */
        private void handle(SocketChannel channel) {
            try (channel) {
                Request request;
                do {
                    try {
                        request = readRequest(channel);
                    } catch (ClientClosedException e) {
                        hangups.offer(true);
                        return;
                    }
                    if (silent) {
                        Thread.sleep(10_000);
                        return;
                    }
                    requests.add(request);
                    byte[] answer = answers.take();
                    channel.write(ByteBuffer.wrap(answer, 1, answer.length - 1));
                    if (answer[0] == 1) {
                        Thread.sleep(10_000);
                    }
                } while (keepAlive && !request.head.toLowerCase().contains("connection: close"));
            } catch (IOException | InterruptedException e) {
                // the client closed the connection, or the test ended
            }
        }

        private static Request readRequest(SocketChannel channel) throws IOException {
            ByteArrayOutputStream seen = new ByteArrayOutputStream();
            ByteBuffer buffer = ByteBuffer.allocate(8192);
            while (true) {
                String text = seen.toString(StandardCharsets.UTF_8);
                int end = text.indexOf("\r\n\r\n");
                if (end >= 0) {
                    int length = 0;
                    for (String line : text.substring(0, end).split("\r\n")) {
                        if (line.toLowerCase().startsWith("content-length:")) {
                            length = Integer.parseInt(line.substring(15).trim());
                        }
                    }
                    byte[] all = seen.toByteArray();
                    int headBytes = text.substring(0, end + 4).getBytes(StandardCharsets.UTF_8).length;
                    if (all.length - headBytes >= length) {
                        String path = text.substring(0, text.indexOf("\r\n")).split(" ")[1];
                        return new Request(path, new String(all, headBytes, length, StandardCharsets.UTF_8),
                                text.substring(0, end));
                    }
                }
                buffer.clear();
                if (channel.read(buffer) < 0) {
                    throw new ClientClosedException();
                }
                seen.write(buffer.array(), 0, buffer.position());
            }
        }

        @Override
        public void close() {
            SidecarHttp.closeQuietly(server);
            thread.interrupt();
        }

        /** The client closed the connection before (or instead of) its next request. */
        private static final class ClientClosedException extends IOException {
            private static final long serialVersionUID = 1L;

            ClientClosedException() {
                super("client closed");
            }
        }
    }
}
