package io.github.kafkatieredsidecar.plugin;

import static io.github.kafkatieredsidecar.plugin.SidecarRemoteStorageManagerTest.metadata;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import io.github.kafkatieredsidecar.plugin.SidecarRemoteStorageManagerTest.FakeSidecar;

/** Fetches answered with the sidecar's cache files, read by the plugin, and the way back to bytes. */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class CacheFileFetchTest {

    private static final String JSON = "application/json; charset=utf-8";

    @TempDir
    Path dir;

    private FakeSidecar sidecar;
    private final AtomicLong now = new AtomicLong(1_000_000_000L);
    private final List<SidecarRemoteStorageManager> plugins = new ArrayList<>();
    private final byte[] segment = segmentBytes();
    /** The plugin's logger (held: the logging framework keeps it weakly) and what it logged. */
    private final Logger log = Logger.getLogger(SidecarRemoteStorageManager.class.getName());
    private final List<LogRecord> logged = new CopyOnWriteArrayList<>();
    private final Handler capture = new Handler() {
        @Override
        public void publish(LogRecord record) {
            logged.add(record);
        }

        @Override
        public void flush() {
        }

        @Override
        public void close() {
        }
    };

    @BeforeEach
    void setUp() throws IOException {
        sidecar = new FakeSidecar(dir.resolve("read.sock"));
        log.addHandler(capture);
        log.setUseParentHandlers(false);
    }

    @AfterEach
    void tearDown() {
        plugins.forEach(SidecarRemoteStorageManager::close);
        sidecar.close();
        log.removeHandler(capture);
        log.setUseParentHandlers(true);
        for (SidecarRemoteStorageManager plugin : plugins) {
            assertEquals(0, plugin.openFileChannels(), "cache files left open");
        }
    }

    /** A plugin with plain windows of 100 bytes (and {@code settings} over that), on the test's clock. */
    private SidecarRemoteStorageManager plugin(String... settings) {
        Map<String, String> configs = new HashMap<>(Map.of(
                "socket.path", sidecar.path.toString(),
                "request.timeout.ms", "2000",
                "read.idle.timeout.ms", "2000",
                "fetch.window.bytes", "100",
                "fetch.cache.bytes", "0"));
        for (int i = 0; i < settings.length; i += 2) {
            configs.put(settings[i], settings[i + 1]);
        }
        SidecarRemoteStorageManager plugin = new SidecarRemoteStorageManager(now::get);
        plugin.configure(configs);
        plugins.add(plugin);
        return plugin;
    }

    /** Windows of 1000 bytes kept for sequential readers, none fetched in the background. */
    private SidecarRemoteStorageManager sequentialPlugin(String... settings) {
        List<String> all = new ArrayList<>(List.of("fetch.sequential.window.bytes", "1000",
                "fetch.cache.bytes", "10000", "fetch.readahead.windows", "0"));
        all.addAll(List.of(settings));
        return plugin(all.toArray(new String[0]));
    }

    private static byte[] segmentBytes() {
        byte[] segment = new byte[1_000_000];
        for (int i = 0; i < segment.length; i++) {
            segment[i] = (byte) (i * 7 + i / 251);
        }
        return segment;
    }

    private byte[] range(long from, long to) {
        return Arrays.copyOfRange(segment, (int) from, (int) to);
    }

    /**
     * A cache file at {@code name} holding the segment's bytes {@code from .. to - 1} after
     * {@code offset} other bytes, and other bytes after them; its range in a files answer.
     */
    private String chunk(String name, long from, long to, int offset) throws IOException {
        byte[] file = new byte[offset + (int) (to - from) + 50];
        Arrays.fill(file, (byte) 0x5a);
        System.arraycopy(segment, (int) from, file, offset, (int) (to - from));
        Path path = dir.resolve(name);
        Files.createDirectories(path.getParent());
        Files.write(path, file);
        return fileRange(path, offset, to - from);
    }

    private static String fileRange(Path path, long offset, long length) {
        return "{\"path\":\"" + path + "\",\"offset\":" + offset + ",\"length\":" + length + "}";
    }

    private void answerFiles(String... ranges) {
        answerJson("{\"files\":[" + String.join(",", ranges) + "]}");
    }

    private void answerJson(String json) {
        sidecar.answer(200, JSON, json.getBytes(StandardCharsets.UTF_8));
    }

    private String nextRequest() throws InterruptedException {
        return sidecar.requests.take().body();
    }

    /** A first read of the segment from 0 (a plain window), answered with bytes; it asked for files. */
    private void firstPlainRead(SidecarRemoteStorageManager plugin) throws Exception {
        sidecar.answer(200, range(0, 100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 0)) {
            assertArrayEquals(range(0, 100), in.readNBytes(100));
        }
        assertTrue(nextRequest().contains("\"files\":true"));
    }

    @Test
    void aSequentialWindowIsReadFromTheFilesOffered() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        answerFiles(chunk("ab/first.chunk", 100, 600, 7), chunk("cd/second.chunk", 600, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 1100), in.readNBytes(1000));
        }
        String body = nextRequest();
        assertTrue(body.contains("\"start\":100,\"end\":1099,\"readahead_end\":999999,\"files\":true"), body);
        assertEquals(1000, plugin.windows().bytes());
        assertEquals(1, plugin.fileWindows());
        assertEquals(0, plugin.fileFallbacks());
        assertEquals(2, plugin.openFileChannels(), "the kept window holds its files open");
        // the next fetch inside it is served from the files, with no request
        try (InputStream in = plugin.fetchLogSegment(metadata(), 590, 620)) {
            assertArrayEquals(range(590, 621), in.readAllBytes());
        }
        assertTrue(sidecar.requests.isEmpty());
        // the segment is deleted: its window's files are closed
        sidecar.answer(200, "{}");
        plugin.deleteLogSegmentData(metadata());
        assertEquals(0, plugin.windows().count());
        assertEquals(0, plugin.openFileChannels());
    }

    @Test
    void aKeptWindowEvictedWhileAReaderIsInItServesThatReaderToItsEnd() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin("fetch.cache.bytes", "1000");
        firstPlainRead(plugin);
        answerFiles(chunk("a1.chunk", 100, 600, 7), chunk("a2.chunk", 600, 1100, 0));
        try (InputStream first = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 400), first.readNBytes(300));
            nextRequest();
            // a second reader in the same window, served from its files
            try (InputStream second = plugin.fetchLogSegment(metadata(), 150)) {
                assertArrayEquals(range(150, 250), second.readNBytes(100));
                assertEquals(2, plugin.openFileChannels());
                // the first reader reads on into the next window, which takes the budget
                answerFiles(chunk("b.chunk", 1100, 2100, 3));
                assertArrayEquals(range(400, 1300), first.readNBytes(900));
                assertTrue(nextRequest().contains("\"start\":1100,\"end\":2099,"));
                assertEquals(1, plugin.windows().count());
                assertEquals(1000, plugin.windows().bytes());
                assertEquals(3, plugin.openFileChannels(), "the evicted window is still read");
                // the second reader reads the evicted window to its end
                assertArrayEquals(range(250, 1100), second.readNBytes(850));
            }
            assertEquals(1, plugin.openFileChannels(), "the evicted window's files close with its last reader");
            assertArrayEquals(range(1300, 2100), first.readNBytes(800));
        }
        assertEquals(1, plugin.openFileChannels(), "the kept window's file");
        assertEquals(2, plugin.fileWindows());
        assertTrue(sidecar.requests.isEmpty());
    }

    @Test
    void fetchesAheadStillQueuedWhenThePluginIsConfiguredAgainAreNotWaitedFor() throws Exception {
        // two read-ahead threads: of six windows ahead, four wait in the queue, which the
        // executor's shutdown drops; a reader of their bytes must not wait request.timeout.ms
        SidecarRemoteStorageManager plugin = sequentialPlugin("fetch.readahead.windows", "6",
                "fetch.cache.bytes", "100000", "request.timeout.ms", "60000");
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 100, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 1100), in.readNBytes(1000));
        }
        nextRequest();
        assertEquals(6, plugin.pendingFetchesAhead());
        var waitedFor = plugin.fetchesAhead();
        plugin.configure(Map.of("socket.path", sidecar.path.toString(), "request.timeout.ms", "2000",
                "fetch.window.bytes", "100", "fetch.sequential.window.bytes", "1000",
                "fetch.readahead.windows", "0"));
        assertEquals(0, plugin.pendingFetchesAhead(), "every fetch ahead is told it was stopped");
        assertTrue(waitedFor.stream().allMatch(CompletableFuture::isDone), "a reader waiting on one returns now");
    }

    @Test
    void aKeptWindowLeftUnusedClosesItsCacheFilesOnItsOwn() throws Exception {
        // a broker whose reads stopped makes no call that would drop it: the plugin's sweeper does
        SidecarRemoteStorageManager plugin = sequentialPlugin("fetch.cache.idle.ms", "200");
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 100, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100, 1099)) {
            assertArrayEquals(range(100, 1100), in.readAllBytes());
        }
        nextRequest();
        assertEquals(1, plugin.windows().count());
        assertEquals(1, plugin.openFileChannels());
        now.addAndGet(201_000_000L); // the plugin's clock: past the idle time
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (plugin.openFileChannels() > 0 && System.nanoTime() < deadline) {
            Thread.sleep(10); // the sweeper runs every 100 ms of real time
        }
        assertEquals(0, plugin.openFileChannels());
        assertEquals(0, plugin.windows().count());
    }

    @Test
    void aReaderThatReadsToTheEndAndNeverClosesLeavesNoCacheFileOpen() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 100, 1100, 0));
        InputStream in = plugin.fetchLogSegment(metadata(), 100, 1099);
        nextRequest();
        sidecar.answer(200, "{}");
        plugin.deleteLogSegmentData(metadata()); // the window is no longer kept: the reader alone holds it
        nextRequest();
        assertEquals(1, plugin.openFileChannels(), "the reader holds the window");
        assertArrayEquals(range(100, 1100), in.readAllBytes());
        assertEquals(0, plugin.openFileChannels(), "the window's files are closed at the end, unclosed stream or not");
    }

    @Test
    void aDeletedSegmentsWindowStaysWithItsReaderAndClosingThePluginClosesTheKeptOnes() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 100, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            nextRequest();
            assertArrayEquals(range(100, 200), in.readNBytes(100));
            sidecar.answer(200, "{}");
            plugin.deleteLogSegmentData(metadata());
            nextRequest();
            assertEquals(0, plugin.windows().count());
            assertEquals(1, plugin.openFileChannels(), "the reader holds the window");
            assertArrayEquals(range(200, 1100), in.readNBytes(900));
        }
        assertEquals(0, plugin.openFileChannels());
        // a window kept again, then the plugin configured again: the windows kept before are dropped
        firstPlainRead(plugin);
        answerFiles(chunk("b.chunk", 100, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100, 1099)) {
            assertArrayEquals(range(100, 1100), in.readAllBytes());
        }
        nextRequest();
        assertEquals(1, plugin.windows().count());
        assertEquals(1, plugin.openFileChannels());
        plugin.configure(Map.of("socket.path", sidecar.path.toString(), "fetch.window.bytes", "100",
                "fetch.sequential.window.bytes", "1000", "fetch.readahead.windows", "0"));
        assertEquals(0, plugin.openFileChannels());
        // and closing the plugin drops the windows kept; a reader in one reads on to its end
        firstPlainRead(plugin);
        answerFiles(chunk("c.chunk", 100, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            nextRequest();
            assertArrayEquals(range(100, 600), in.readNBytes(500));
            assertEquals(1, plugin.windows().count());
            plugin.close();
            assertEquals(0, plugin.windows().count());
            assertEquals(1, plugin.openFileChannels(), "the reader holds its window");
            assertArrayEquals(range(600, 1100), in.readNBytes(500));
        }
        assertEquals(0, plugin.openFileChannels());
    }

    @Test
    void aKeptWindowsFilesDeletedByTheCacheStillServeIt() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 100, 600, 7), chunk("b.chunk", 600, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 110), in.readNBytes(10));
            Files.delete(dir.resolve("a.chunk"));
            Files.delete(dir.resolve("b.chunk"));
            assertArrayEquals(range(110, 1100), in.readNBytes(990));
        }
        nextRequest();
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099)) {
            assertArrayEquals(range(1000, 1100), in.readAllBytes());
        }
        assertTrue(sidecar.requests.isEmpty(), "served from the kept window's open files");
        assertEquals(0, plugin.fileFallbacks());
    }

    @Test
    void aWindowFetchedAheadFromFilesServesTheReaderThatGetsThere() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin("fetch.readahead.windows", "1");
        firstPlainRead(plugin);
        answerFiles(chunk("a.chunk", 80, 1080, 0));
        answerFiles(chunk("b.chunk", 1080, 2080, 5));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 80)) {
            // across the windows' boundary: the one fetched ahead (the one after it is asked for
            // in the background meanwhile, and never answered)
            assertArrayEquals(range(80, 1500), in.readNBytes(1420));
        }
        assertTrue(nextRequest().contains("\"start\":80,\"end\":1079,"));
        assertTrue(nextRequest().contains("\"start\":1080,\"end\":2079,"));
        assertEquals(2, plugin.fileWindows());
        assertEquals(2, plugin.windows().count());
        assertEquals(2, plugin.openFileChannels());
    }

    @Test
    void aPlainWindowsFilesCloseWithItsStream() throws Exception {
        SidecarRemoteStorageManager plugin = plugin();
        answerFiles(chunk("a.chunk", 1000, 1050, 13), chunk("b.chunk", 1050, 1100, 0));
        InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099);
        assertEquals(2, plugin.openFileChannels());
        assertArrayEquals(range(1000, 1030), in.readNBytes(30));
        assertEquals(0, plugin.windows().count());
        in.close();
        assertEquals(0, plugin.openFileChannels());
        in.close();
        assertEquals(0, plugin.openFileChannels());
        assertThrows(IOException.class, in::read);
    }

    @Test
    void aPlainWindowIsReadFromTheFilesOfferedAndBytesAreTakenToo() throws Exception {
        SidecarRemoteStorageManager plugin = plugin();
        // three windows: files, then bytes (a chunk only in the sidecar's memory), then files
        answerFiles(chunk("a.chunk", 1000, 1100, 13));
        sidecar.answer(200, range(1100, 1200));
        answerFiles(chunk("b.chunk", 1200, 1230, 0), chunk("c.chunk", 1230, 1250, 4096));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1249)) {
            assertEquals(1, plugin.openFileChannels());
            assertArrayEquals(range(1000, 1100), in.readNBytes(100));
            assertArrayEquals(range(1100, 1101), in.readNBytes(1));
            assertEquals(0, plugin.openFileChannels(), "the window read is closed when the stream moves on");
            assertArrayEquals(range(1101, 1201), in.readNBytes(100));
            assertEquals(2, plugin.openFileChannels());
            assertArrayEquals(range(1201, 1250), in.readAllBytes());
        }
        assertEquals(0, plugin.openFileChannels());
        for (String start : new String[] {"1000", "1100", "1200"}) {
            String body = nextRequest();
            assertTrue(body.contains("\"start\":" + start + ","), body);
            assertTrue(body.contains("\"files\":true"), body);
        }
        assertEquals(2, plugin.fileWindows());
        assertEquals(0, plugin.fileFallbacks());
    }

    /** A plain window answered with {@code answer}: the plugin asks again without files, gets bytes. */
    private void assertAsksAgainForTheBytes(SidecarRemoteStorageManager plugin, String answer) throws Exception {
        long fallbacks = plugin.fileFallbacks();
        answerJson(answer);
        sidecar.answer(200, range(1000, 1100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099)) {
            assertArrayEquals(range(1000, 1100), in.readAllBytes());
        }
        String first = nextRequest();
        assertTrue(first.contains("\"start\":1000,\"end\":1099,") && first.contains("\"files\":true"), first);
        String again = nextRequest();
        assertTrue(again.contains("\"start\":1000,\"end\":1099,"), again);
        assertFalse(again.contains("\"files\""), again);
        assertEquals(fallbacks + 1, plugin.fileFallbacks());
    }

    @Test
    void aMissingFileIsAskedForAgainAsBytes() throws Exception {
        SidecarRemoteStorageManager plugin = plugin();
        assertAsksAgainForTheBytes(plugin, "{\"files\":[" + fileRange(dir.resolve("evicted.chunk"), 0, 100) + "]}");
        assertEquals(0, plugin.fileWindows());
    }

    @Test
    void aShortFileIsAskedForAgainAsBytes() throws Exception {
        Path file = Files.write(dir.resolve("short.chunk"), range(1000, 1060));
        SidecarRemoteStorageManager plugin = plugin();
        assertAsksAgainForTheBytes(plugin, "{\"files\":[" + chunk("a.chunk", 1000, 1040, 0) + ","
                + fileRange(file, 1, 60) + "]}");
        assertAsksAgainForTheBytes(plugin, "{\"files\":[" + fileRange(file, 0, 100) + "]}");
        assertEquals(0, plugin.openFileChannels());
    }

    @Test
    void aSequentialWindowWithAMissingFileIsAskedForAgainAsBytes() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        answerFiles(chunk("here.chunk", 100, 600, 0), fileRange(dir.resolve("gone.chunk"), 0, 500));
        sidecar.answer(200, range(100, 1100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 1100), in.readNBytes(1000));
        }
        assertTrue(nextRequest().contains("\"start\":100,\"end\":1099,\"readahead_end\":999999,\"files\":true"));
        String again = nextRequest();
        assertTrue(again.contains("\"start\":100,\"end\":1099,"), again);
        assertFalse(again.contains("\"files\""), again);
        assertEquals(1000, plugin.windows().bytes());
        assertEquals(1, plugin.fileFallbacks());
        assertEquals(0, plugin.openFileChannels(), "the file opened is closed");
    }

    @Test
    void aSequentialWindowWithAFileTooShortForItsRangeIsAskedForAgainAsBytes() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin();
        firstPlainRead(plugin);
        Path tooShort = Files.write(dir.resolve("short.chunk"), range(600, 1099));
        answerFiles(chunk("here.chunk", 100, 600, 0), fileRange(tooShort, 0, 500));
        sidecar.answer(200, range(100, 1100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertEquals(0, plugin.openFileChannels(), "a bytes window");
            assertArrayEquals(range(100, 1100), in.readNBytes(1000));
        }
        nextRequest();
        assertFalse(nextRequest().contains("\"files\""));
        assertEquals(1, plugin.fileFallbacks());
        assertEquals(0, plugin.fileWindows());
        assertEquals(1000, plugin.windows().bytes());
    }

    @Test
    void anAnswerThatIsNotAListOfFilesIsAskedForAgainAsBytes() throws Exception {
        String file = chunk("a.chunk", 1000, 1100, 0);
        String path = dir.resolve("a.chunk").toString();
        for (String answer : new String[] {
            "not json",
            "{\"files\":[]}",
            "{\"files\":[" + file + "],\"more\":1}",
            "{\"files\":[{\"path\":\"" + path + "\",\"offset\":0}]}",
            "{\"files\":[{\"path\":\"a.chunk\",\"offset\":0,\"length\":100}]}",
            "{\"files\":[{\"path\":\"" + path + "\",\"offset\":-1,\"length\":100}]}",
            "{\"files\":[" + file + "," + "]}",
        }) {
            assertAsksAgainForTheBytes(plugin(), answer);
        }
    }

    @Test
    void rangesThatDoNotAddUpToTheWindowAreAskedForAgainAsBytes() throws Exception {
        String path = chunk("a.chunk", 1000, 1100, 0);
        assertAsksAgainForTheBytes(plugin(), "{\"files\":[" + path.replace("\"length\":100", "\"length\":90") + "]}");
        assertAsksAgainForTheBytes(plugin(), "{\"files\":[" + path + "," + path + "]}");
    }

    @Test
    void threeFallbacksInARowPauseFileReadsUntilTheClockSaysSo() throws Exception {
        SidecarRemoteStorageManager plugin = plugin();
        Path gone = dir.resolve("gone.chunk");
        String missing = "{\"files\":[" + fileRange(gone, 0, 100) + "]}";
        // two failures, a window read from files (which resets the count), two failures
        assertAsksAgainForTheBytes(plugin, missing);
        assertAsksAgainForTheBytes(plugin, missing);
        answerFiles(chunk("a.chunk", 1000, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099)) {
            assertArrayEquals(range(1000, 1100), in.readAllBytes());
        }
        nextRequest();
        assertAsksAgainForTheBytes(plugin, missing);
        assertAsksAgainForTheBytes(plugin, missing);
        assertTrue(logged.isEmpty(), "no warning before three in a row");
        // the third in a row: one warning, and no fetch asks for files for a while
        assertAsksAgainForTheBytes(plugin, missing);
        assertEquals(1, logged.size());
        LogRecord warning = logged.get(0);
        assertEquals(Level.WARNING, warning.getLevel());
        assertTrue(warning.getMessage().contains(gone.toString()), warning.getMessage());
        assertTrue(warning.getMessage().contains("NoSuchFileException"), warning.getMessage());
        assertTrue(warning.getMessage().contains("over the sidecar's socket until"), warning.getMessage());
        assertBytesWithoutFiles(plugin);
        now.addAndGet(CacheFileReads.OFF_NANOS - 1);
        assertBytesWithoutFiles(plugin);
        // the pause is over: files again, and three more failures in a row pause them again
        now.addAndGet(1);
        for (int i = 0; i < CacheFileReads.FAILURES_IN_A_ROW; i++) {
            assertAsksAgainForTheBytes(plugin, missing);
        }
        assertEquals(2, logged.size(), "one warning per pause");
        assertBytesWithoutFiles(plugin);
        assertEquals(8, plugin.fileFallbacks());
        assertEquals(1, plugin.fileWindows());
    }

    @Test
    void failuresOfFetchesThatAskedBeforeThePauseNeitherWarnNorExtendIt() {
        CacheFileReads reads = new CacheFileReads(true, now::get);
        IOException gone = new IOException("cannot open the sidecar's cache file /c/x.chunk");
        for (int i = 0; i < CacheFileReads.FAILURES_IN_A_ROW; i++) {
            assertTrue(reads.ask());
            reads.failed("fetch", gone);
        }
        assertFalse(reads.ask());
        now.addAndGet(CacheFileReads.OFF_NANOS / 2);
        for (int i = 0; i < 2 * CacheFileReads.FAILURES_IN_A_ROW; i++) {
            reads.failed("fetch", gone); // those in flight when the pause began
        }
        assertEquals(1, logged.size());
        now.addAndGet(CacheFileReads.OFF_NANOS - CacheFileReads.OFF_NANOS / 2);
        assertTrue(reads.ask(), "the pause counts from the failure that began it");
        assertEquals(3 * CacheFileReads.FAILURES_IN_A_ROW, reads.fallbacks());
    }

    /** A plain window that does not ask for files. */
    private void assertBytesWithoutFiles(SidecarRemoteStorageManager plugin) throws Exception {
        sidecar.answer(200, range(1000, 1100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099)) {
            assertArrayEquals(range(1000, 1100), in.readAllBytes());
        }
        String body = nextRequest();
        assertFalse(body.contains("\"files\""), body);
    }

    @Test
    void withFetchFilesFalseNoFetchAsksForFiles() throws Exception {
        SidecarRemoteStorageManager plugin = sequentialPlugin("fetch.files", "False");
        sidecar.answer(200, range(0, 100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 0)) {
            assertArrayEquals(range(0, 100), in.readNBytes(100));
        }
        sidecar.answer(200, range(100, 1100));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 100)) {
            assertArrayEquals(range(100, 1100), in.readNBytes(1000));
        }
        for (int i = 0; i < 2; i++) {
            String body = nextRequest();
            assertFalse(body.contains("\"files\""), body);
        }
        assertEquals(1000, plugin.windows().bytes());
    }

    @Test
    void fetchFilesMustBeTrueOrFalse() throws Exception {
        SidecarRemoteStorageManager other = new SidecarRemoteStorageManager();
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> other.configure(Map.of("fetch.files", "yes")));
        assertTrue(e.getMessage().contains("rsm.config.fetch.files must be true or false, not yes"), e.getMessage());
        // any case is fine
        SidecarRemoteStorageManager plugin = plugin("fetch.files", "TRUE");
        answerFiles(chunk("a.chunk", 1000, 1100, 0));
        try (InputStream in = plugin.fetchLogSegment(metadata(), 1000, 1099)) {
            assertArrayEquals(range(1000, 1100), in.readAllBytes());
        }
        assertTrue(nextRequest().contains("\"files\":true"));
    }
}
