package io.github.kafkatieredsidecar.plugin;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;

/**
 * Kafka's {@link RemoteStorageManager} backed by the kafka-tiered-sidecar running beside the
 * broker. Every method is one request to the sidecar's read socket ({@code /v1/rsm/...}); the
 * sidecar does every S3 byte (uploads with its own uploader, reads through its chunk cache).
 *
 * <p>Settings, under the broker's {@code rsm.config.} prefix:
 * <ul>
 *   <li>{@code socket.path}: the sidecar's Unix socket (default {@value #DEFAULT_SOCKET});</li>
 *   <li>{@code tcp.port} (and {@code tcp.host}, default 127.0.0.1): use loopback TCP instead;</li>
 *   <li>{@code connect.timeout.ms} (5000), {@code request.timeout.ms} (30000: fetches, deletes),
 *       {@code copy.timeout.ms} (600000: a copy uploads a whole segment),
 *       {@code read.idle.timeout.ms} (30000: each wait for body bytes of a fetch);</li>
 *   <li>{@code fetch.window.bytes} (1 MiB): a fetch asks the sidecar for this much at a time;</li>
 *   <li>{@code fetch.sequential.window.bytes} (4 MiB): a fetch that continues a recent read of
 *       the same segment (a consumer's next fetch) asks for this much at once and keeps it
 *       (its bytes, or its open cache files) for the fetches after it ({@link SegmentWindows});</li>
 *   <li>{@code fetch.cache.bytes} (64 MiB, 0: none): the bytes those windows hold at most: the
 *       broker's heap for windows sent as bytes, open cache files for windows served from files
 *       (so a few dozen files open at most);</li>
 *   <li>{@code fetch.readahead.windows} (1, 0: none): how many such windows past the one a
 *       sequential reader is in are fetched in the background (two threads of the plugin), so
 *       its next fetches rarely wait for the sidecar; none when {@code fetch.cache.bytes} cannot
 *       keep a window.</li>
 *   <li>{@code fetch.files} ({@code true}): serve windows straight from the sidecar's cached
 *       chunk files when it offers them ({@link CacheFiles}, {@link FileWindow}: the broker's
 *       reads go from the file into its own buffer, with no copy in the heap; the broker needs
 *       read access to the sidecar's cache directory: the same host, or a volume shared in the
 *       pod); {@code false}: always the bytes over the socket. Files that cannot be opened cost
 *       their fetch a second request, for the bytes; after a few in a row, fetches ask for the
 *       bytes only, for a while ({@link CacheFileReads}).</li>
 * </ul>
 *
 * <p>Reads (segment windows, indexes) reuse idle connections ({@link SidecarHttp}); copies and
 * deletes open one each.
 *
 * <p>Errors: the sidecar unreachable, a timeout, or the sidecar saying a dependency is down
 * (HTTP 429, 503, 504) are {@code RetriableRemoteStorageException} (a plain
 * {@link RemoteStorageException} on Kafka 3.9, which retries on any; see {@link KafkaCompat}); a
 * missing segment or index
 * (HTTP 404) is {@link RemoteResourceNotFoundException} (for the transaction index, only an index
 * the segment does not have: Kafka takes that as no aborted transactions); anything else (a
 * corrupt segment, bad data in the bucket) is a plain {@link RemoteStorageException}.
 */
public class SidecarRemoteStorageManager implements RemoteStorageManager {

    static final String DEFAULT_SOCKET = "/var/run/kafka-tiered-sidecar/read.sock";
    private static final String FETCH_SEGMENT = "/v1/rsm/fetch-segment";
    /** The sidecar's code for an index the segment does not have. */
    static final String INDEX_NOT_FOUND = "index_not_found";
    private static final Pattern CODE = Pattern.compile("\"code\"\\s*:\\s*\"([^\"]*)\"");
    private static final Pattern MESSAGE = Pattern.compile("\"message\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"");
    private static final Pattern CUSTOM = Pattern.compile("\"custom_metadata\"\\s*:\\s*\"([A-Za-z0-9+/=]*)\"");

    private SidecarHttp http;
    private int requestTimeoutMs = 30_000;
    private int copyTimeoutMs = 600_000;
    private int idleTimeoutMs = 30_000;
    private int fetchWindowBytes = 1024 * 1024;
    private int sequentialWindowBytes = 4 * 1024 * 1024;
    private final ReadOvershoot overshoot = new ReadOvershoot();
    private SegmentWindows windows = new SegmentWindows(0, 0);
    private int readAheadWindows = 1;
    /** Fetches of windows ahead of sequential readers; null when there are none. */
    private ThreadPoolExecutor readAhead;
    /** Drops the kept windows that went unused (see {@link SegmentWindows#expire}); null when none are kept. */
    private ScheduledThreadPoolExecutor windowSweeper;
    /** The windows being fetched ahead, by segment and start. */
    private final ConcurrentHashMap<String, Pending> pending = new ConcurrentHashMap<>();
    private final LongSupplier nanoClock;
    private CacheFileReads fileReads;
    /** The cache files open in file windows, kept or being read (tests). */
    private final AtomicInteger openFiles = new AtomicInteger();

    /**
     * A window fetched in the background: bytes {@code start .. end} of {@code segment}. The
     * window it completes with was kept, if it could be; a reader takes a reference to it only if
     * it was not freed meanwhile ({@link SegmentWindows.Window#retain}).
     */
    private record Pending(String segment, long start, long end, CompletableFuture<SegmentWindows.Window> window) {
    }

    /** Kafka's: the settings come with {@link #configure}. */
    public SidecarRemoteStorageManager() {
        this(System::nanoTime);
    }

    /** With a clock of its own for the pause of file reads (tests). */
    SidecarRemoteStorageManager(LongSupplier nanoClock) {
        this.nanoClock = nanoClock;
        this.fileReads = new CacheFileReads(true, nanoClock);
    }

    @Override
    public void configure(Map<String, ?> configs) {
        SidecarHttp.Endpoint endpoint = endpointSetting(configs);
        int connectTimeoutMs = intSetting(configs, "connect.timeout.ms", 5_000);
        requestTimeoutMs = intSetting(configs, "request.timeout.ms", 30_000);
        copyTimeoutMs = intSetting(configs, "copy.timeout.ms", 600_000);
        idleTimeoutMs = intSetting(configs, "read.idle.timeout.ms", 30_000);
        fetchWindowBytes = windowSetting(configs, "fetch.window.bytes", 1024 * 1024);
        sequentialWindowBytes = windowSetting(configs, "fetch.sequential.window.bytes", 4 * 1024 * 1024);
        long cacheBytes = longSetting(configs, "fetch.cache.bytes", 64L * 1024 * 1024);
        readAheadWindows = countSetting(configs, "fetch.readahead.windows", 1);
        fileReads = new CacheFileReads(booleanSetting(configs, "fetch.files", true), nanoClock);
        long windowIdleMs = longSetting(configs, "fetch.cache.idle.ms", 30_000);
        stopReadAhead();
        if (windowSweeper != null) {
            windowSweeper.shutdownNow();
            windowSweeper = null;
        }
        windows.close(); // the windows of the settings before, if any (their open files)
        windows = new SegmentWindows(cacheBytes, fetchWindowBytes, nanoClock, windowIdleMs * 1_000_000L);
        if (cacheBytes > 0 && windowIdleMs > 0) {
            windowSweeper = new ScheduledThreadPoolExecutor(1, task -> {
                Thread thread = new Thread(task, "sidecar-rsm-windows");
                thread.setDaemon(true);
                return thread;
            });
            long periodMs = Math.max(100, Math.min(windowIdleMs / 2, 10_000));
            SegmentWindows kept = windows;
            windowSweeper.scheduleWithFixedDelay(kept::expire, periodMs, periodMs, TimeUnit.MILLISECONDS);
        }
        // a window fetched ahead is of use only kept: one the budget cannot keep is not fetched ahead
        if (cacheBytes >= sequentialWindowBytes && readAheadWindows > 0) {
            readAhead = new ThreadPoolExecutor(2, 2, 0L, TimeUnit.MILLISECONDS, new ArrayBlockingQueue<>(8), task -> {
                Thread thread = new Thread(task, "sidecar-rsm-readahead");
                thread.setDaemon(true);
                return thread;
            }, new ThreadPoolExecutor.AbortPolicy());
        }
        if (http != null) {
            http.close(); // the idle connections of the settings before, if any
        }
        http = new SidecarHttp(endpoint, connectTimeoutMs);
    }

    /**
     * {@code tcp.port} (with {@code tcp.host}) or {@code socket.path}. A port out of range is
     * refused here: the JDK would refuse it at every call, as an unchecked exception.
     */
    private static SidecarHttp.Endpoint endpointSetting(Map<String, ?> configs) {
        Object port = configs.get("tcp.port");
        if (port != null && !port.toString().isBlank()) {
            long parsed = setting(configs, "tcp.port", 0, 1);
            if (parsed > 65_535) {
                throw new IllegalArgumentException("rsm.config.tcp.port must be a TCP port (1 to 65535), not " + port);
            }
            Object host = configs.get("tcp.host");
            return SidecarHttp.Endpoint.tcp(host == null ? "127.0.0.1" : host.toString(), (int) parsed);
        }
        Object socket = configs.get("socket.path");
        return SidecarHttp.Endpoint.unix(Path.of(socket == null ? DEFAULT_SOCKET : socket.toString()));
    }

    /** A setting that may be 0 (none); negative values are refused. */
    private static long longSetting(Map<String, ?> configs, String name, long fallback) {
        return setting(configs, name, fallback, 0);
    }

    /** A setting that may be 0 (none) and must fit an int. */
    private static int countSetting(Map<String, ?> configs, String name, int fallback) {
        long parsed = setting(configs, name, fallback, 0);
        if (parsed > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("rsm.config." + name + " must be an integer, not " + configs.get(name));
        }
        return (int) parsed;
    }

    /** A setting that must be positive and fit an int. */
    private static int intSetting(Map<String, ?> configs, String name, int fallback) {
        long parsed = setting(configs, name, fallback, 1);
        if (parsed > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("rsm.config." + name + " must be an integer, not " + configs.get(name));
        }
        return (int) parsed;
    }

    /** The largest window a fetch may ask for: a window is one array or one stream's range. */
    static final int MAX_WINDOW_BYTES = 256 * 1024 * 1024;

    /** A window size: positive and at most {@link #MAX_WINDOW_BYTES} (the overshoot is added to it). */
    private static int windowSetting(Map<String, ?> configs, String name, int fallback) {
        int parsed = intSetting(configs, name, fallback);
        if (parsed > MAX_WINDOW_BYTES) {
            throw new IllegalArgumentException("rsm.config." + name + " must be at most " + MAX_WINDOW_BYTES
                    + " (256 MiB), not " + parsed);
        }
        return parsed;
    }

    /** {@code true} or {@code false}, in any case. */
    private static boolean booleanSetting(Map<String, ?> configs, String name, boolean fallback) {
        Object value = configs.get(name);
        if (value == null || value.toString().isBlank()) {
            return fallback;
        }
        String text = value.toString().trim();
        if (text.equalsIgnoreCase("true") || text.equalsIgnoreCase("false")) {
            return Boolean.parseBoolean(text);
        }
        throw new IllegalArgumentException("rsm.config." + name + " must be true or false, not " + value);
    }

    private static long setting(Map<String, ?> configs, String name, long fallback, long minimum) {
        Object value = configs.get(name);
        if (value == null || value.toString().isBlank()) {
            return fallback;
        }
        long parsed;
        try {
            parsed = Long.parseLong(value.toString().trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("rsm.config." + name + " must be an integer, not " + value, e);
        }
        if (parsed < minimum) {
            throw new IllegalArgumentException("rsm.config." + name + " must be "
                    + (minimum > 0 ? "positive" : "0 or more") + ", not " + parsed);
        }
        return parsed;
    }

    @Override
    public Optional<RemoteLogSegmentMetadata.CustomMetadata> copyLogSegmentData(
            RemoteLogSegmentMetadata metadata, LogSegmentData data) throws RemoteStorageException {
        Json body = metadataJson(metadata);
        body.object("files")
                .field("log", data.logSegment().toString())
                .field("offset_index", data.offsetIndex().toString())
                .field("time_index", data.timeIndex().toString())
                .field("txn_index", data.transactionIndex().map(Path::toString).orElse(null))
                .field("producer_snapshot", data.producerSnapshotIndex().toString())
                .end();
        ByteBuffer epochs = data.leaderEpochIndex().duplicate();
        byte[] epochBytes = new byte[epochs.remaining()];
        epochs.get(epochBytes);
        body.field("leader_epoch_index", Base64.getEncoder().encodeToString(epochBytes));
        byte[] answer = call("/v1/rsm/copy", body, copyTimeoutMs, "copy of " + describe(metadata));
        Matcher custom = CUSTOM.matcher(new String(answer, StandardCharsets.UTF_8));
        if (custom.find()) {
            return Optional.of(new RemoteLogSegmentMetadata.CustomMetadata(Base64.getDecoder().decode(custom.group(1))));
        }
        return Optional.empty();
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata metadata, int startPosition)
            throws RemoteStorageException {
        return fetch(metadata, startPosition, null);
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata metadata, int startPosition, int endPosition)
            throws RemoteStorageException {
        return fetch(metadata, startPosition, endPosition);
    }

    private InputStream fetch(RemoteLogSegmentMetadata metadata, int start, Integer end) throws RemoteStorageException {
        if (start < 0 || end != null && end < start) {
            throw new IllegalArgumentException("invalid range " + start + ".." + end + " of " + describe(metadata));
        }
        // the end is inclusive, and never past the segment's last byte
        long last = Math.min(end == null ? Long.MAX_VALUE : end, metadata.segmentSizeInBytes() - 1L);
        return new WindowedStream(metadata, start, Math.max(last, start));
    }

    /**
     * Bytes {@code start .. end} of a segment, read whole from the sidecar or served from its cache
     * files; the caller holds the window's first reference.
     */
    private SegmentWindows.Window fetchWhole(RemoteLogSegmentMetadata metadata, String segment, long start, long end,
            long rangeEnd) throws RemoteStorageException {
        String what = "fetch of " + describe(metadata) + " from byte " + start;
        SegmentWindows.Window window = fileReads.ask()
                ? readWhole(metadata, segment, start, end, rangeEnd, true, what) : null;
        if (window == null) {
            window = readWhole(metadata, segment, start, end, rangeEnd, false, what);
        }
        return window;
    }

    /**
     * Bytes {@code start .. end} read whole: the answer's body, or with {@code files} the cache
     * files the sidecar may offer instead; null when it offered files that could not be opened.
     */
    private SegmentWindows.Window readWhole(RemoteLogSegmentMetadata metadata, String segment, long start, long end,
            long rangeEnd, boolean files, String what) throws RemoteStorageException {
        int size = (int) (end - start + 1);
        Json body = fetchBody(metadata, start, end, rangeEnd, files);
        String answer;
        try (SidecarHttp.Response response = send(FETCH_SEGMENT, body, requestTimeoutMs, what, true)) {
            if (!files || !response.json()) {
                byte[] bytes = response.body.readRest();
                if (bytes.length != size) {
                    throw new RemoteStorageException(what + " failed: the sidecar sent " + bytes.length
                            + " bytes for a window of " + size);
                }
                return new SegmentWindows.BytesWindow(segment, start, bytes);
            }
            answer = new String(response.readAll(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw unreachable(what, e);
        }
        return openFiles(answer, segment, start, size, what);
    }

    /**
     * The window of {@code size} bytes from {@code start} served from the cache files the
     * sidecar's JSON {@code answer} names, holding the caller's reference; null when they cannot
     * be opened (the caller asks for the bytes).
     */
    private FileWindow openFiles(String answer, String segment, long start, int size, String what)
            throws RemoteStorageException {
        try {
            FileWindow window = FileWindow.open(segment, start, CacheFiles.parse(answer), size, openFiles);
            fileReads.succeeded();
            return window;
        } catch (IOException e) {
            if (Thread.currentThread().isInterrupted()) {
                throw new RemoteStorageException(what + " was interrupted", e); // not the files' fault
            }
            fileReads.failed(what, e);
            return null;
        }
    }

    /**
     * Fetch the {@code fetch.readahead.windows} windows from {@code from} in the background, those
     * neither kept nor being fetched (never past {@code last}). A failure is dropped: the reader
     * that gets there asks the sidecar itself, and sees the error then.
     */
    private void readAheadFrom(RemoteLogSegmentMetadata metadata, String segment, long from, long last) {
        ThreadPoolExecutor executor = readAhead;
        SegmentWindows kept = windows; // closed with the executor: a late window is then freed, not kept
        for (int i = 0; executor != null && i < readAheadWindows && from <= last; i++) {
            long end = Math.min(last, from + sequentialWindowBytes - 1);
            long keptEnd = kept.keptEnd(segment, from);
            if (keptEnd >= 0) {
                from = keptEnd;
                continue;
            }
            String key = segment + ":" + from;
            Pending fetch = new Pending(segment, from, end, new CompletableFuture<>());
            if (pending.putIfAbsent(key, fetch) == null) {
                long start = from;
                try {
                    executor.execute(() -> {
                        try {
                            SegmentWindows.Window window = fetchWhole(metadata, segment, start, end, last);
                            try {
                                kept.put(window);
                            } finally {
                                window.release(); // kept, it lives on in the windows; else it is freed
                            }
                            fetch.window.complete(window);
                        } catch (RemoteStorageException | RuntimeException e) {
                            fetch.window.completeExceptionally(e);
                        } finally {
                            pending.remove(key, fetch);
                        }
                    });
                } catch (RejectedExecutionException e) {
                    pending.remove(key, fetch); // enough in flight: the reader fetches it itself
                    return;
                }
            }
            from = end + 1;
        }
    }

    /**
     * Stop the fetches ahead: the ones still queued never run, so their readers are told now
     * (they fetch the bytes themselves) instead of waiting out {@code request.timeout.ms}.
     */
    private void stopReadAhead() {
        if (readAhead != null) {
            readAhead.shutdownNow();
            readAhead = null;
        }
        for (Pending fetch : pending.values()) {
            fetch.window.completeExceptionally(new RemoteStorageException("the fetch ahead was stopped"));
            pending.remove(fetch.segment + ":" + fetch.start, fetch);
        }
    }

    /**
     * The window being fetched ahead that will hold byte {@code position}, once fetched, with a
     * reference taken for the caller; null when none is being fetched, its fetch failed, or it was
     * freed meanwhile (dropped from the windows).
     */
    private SegmentWindows.Window fetchedAhead(String segment, long position) {
        for (Pending fetch : pending.values()) {
            if (fetch.segment.equals(segment) && position >= fetch.start && position <= fetch.end) {
                try {
                    SegmentWindows.Window window = fetch.window.get(requestTimeoutMs, TimeUnit.MILLISECONDS);
                    return window.retain() ? window : null;
                } catch (ExecutionException | TimeoutException e) {
                    return null;
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return null;
                }
            }
        }
        return null;
    }

    /** Windows kept for sequential readers (tests). */
    SegmentWindows windows() {
        return windows;
    }

    /**
     * One window {@code start..end} of a range that ends at {@code rangeEnd}: the sidecar may read
     * ahead up to {@code rangeEnd} (its chunk prefetch), never past it.
     */
    private InputStream fetchWindow(RemoteLogSegmentMetadata metadata, long start, long end, long rangeEnd)
            throws RemoteStorageException {
        String what = "fetch of " + describe(metadata) + " from byte " + start;
        if (fileReads.ask()) {
            SidecarHttp.Response response = send(FETCH_SEGMENT, fetchBody(metadata, start, end, rangeEnd, true),
                    requestTimeoutMs, what, true);
            if (!response.json()) {
                return whole(response, end - start + 1, what);
            }
            String answer;
            try (response) {
                answer = new String(response.readAll(), StandardCharsets.UTF_8);
            } catch (IOException e) {
                throw unreachable(what, e);
            }
            String segment = metadata.remoteLogSegmentId().id().toString();
            FileWindow window = openFiles(answer, segment, start, (int) (end - start + 1), what);
            if (window != null) {
                try {
                    return window.stream(start, end); // the stream alone holds the window: closing it frees it
                } finally {
                    window.release();
                }
            }
        }
        return whole(send(FETCH_SEGMENT, fetchBody(metadata, start, end, rangeEnd, false), requestTimeoutMs, what,
                true), end - start + 1, what);
    }

    /**
     * The body of a window's answer, which must be the {@code length} bytes asked for: a reader
     * goes on at the byte after the window, so a shorter body would leave a gap in the stream
     * that no check downstream sees (the batches before and after it may both be whole).
     */
    private static InputStream whole(SidecarHttp.Response response, long length, String what)
            throws RemoteStorageException {
        if (response.contentLength != length) {
            SidecarHttp.closeQuietly(response);
            throw new RemoteStorageException(what + ": the sidecar answered " + response.contentLength
                    + " bytes for a window of " + length);
        }
        return response.body;
    }

    /**
     * The body of a fetch of bytes {@code start .. end} of a range that ends at {@code rangeEnd};
     * with {@code files} the sidecar may answer with its cache files that hold them.
     */
    private static Json fetchBody(RemoteLogSegmentMetadata metadata, long start, long end, long rangeEnd,
            boolean files) {
        Json body = metadataJson(metadata).field("start", start).field("end", end).field("readahead_end", rangeEnd);
        return files ? body.field("files", true) : body;
    }

    /**
     * A segment range read in windows of {@code fetch.window.bytes}: the broker reads one fetch's
     * worth (about {@code max.partition.fetch.bytes}) from the stream and closes it, so asking the
     * sidecar for the rest of a segment would make it read and send bytes nobody reads. The first
     * window is requested at once (so a missing segment fails the call itself); the next one when
     * the reader gets to it.
     *
     * <p>The broker starts a read at the offset index entry before the offset it wants, so it
     * reads a batch or more before its fetch's worth: a first window of exactly
     * {@code fetch.window.bytes} would end a little short, and every fetch would cost a second
     * request for a few KiB of a second window. The first window is therefore
     * {@code fetch.window.bytes} plus {@link ReadOvershoot#headroom()}, what recent readers read
     * past it.
     *
     * <p>A read that continues a recent read of the segment (a consumer's next fetch) reads
     * windows of {@code fetch.sequential.window.bytes} whole and keeps them in
     * {@link SegmentWindows}; a read that starts inside a kept window is served from it.
     */
    private final class WindowedStream extends InputStream {
        private final RemoteLogSegmentMetadata metadata;
        private final String segment;
        private final long start;
        private final long last;
        private final boolean sequential;
        /** Whether the first window was a plain request (its size is what the overshoot tunes). */
        private final boolean plain;
        private long next;
        private long consumed;
        private InputStream current;
        private boolean closed;

        WindowedStream(RemoteLogSegmentMetadata metadata, long start, long last) throws RemoteStorageException {
            this.metadata = metadata;
            this.segment = metadata.remoteLogSegmentId().id().toString();
            this.start = start;
            this.last = last;
            this.next = start;
            this.sequential = windows.enabled() && windows.follows(segment, start);
            InputStream first = kept();
            this.plain = first == null && !sequential;
            if (first == null) {
                first = sequential ? openKept() : open(fetchWindowBytes + overshoot.headroom());
            }
            this.current = first;
        }

        private InputStream open(long bytes) throws RemoteStorageException {
            long end = Math.min(last, next + bytes - 1);
            InputStream window = fetchWindow(metadata, next, end, last);
            next = end + 1;
            return window;
        }

        /** The bytes from {@code next} out of a kept window (or one being fetched ahead), or null
         * when none holds them. */
        private InputStream kept() {
            if (!windows.enabled()) {
                return null;
            }
            SegmentWindows.Window window = windows.acquire(segment, next);
            if (window == null) {
                window = fetchedAhead(segment, next);
            }
            if (window == null) {
                return null;
            }
            try {
                return serve(window);
            } finally {
                window.release();
            }
        }

        /** A sequential window read whole from the sidecar (or served from its cache files), kept,
         * and served from it. */
        private InputStream openKept() throws RemoteStorageException {
            long end = Math.min(last, next + sequentialWindowBytes - 1);
            SegmentWindows.Window window = fetchWhole(metadata, segment, next, end, last);
            try {
                windows.put(window);
                return serve(window);
            } finally {
                window.release(); // kept, it lives on in the windows; else the stream alone holds it
            }
        }

        /** A stream of the bytes from {@code next} out of {@code window}, which the caller holds. */
        private InputStream serve(SegmentWindows.Window window) {
            long end = Math.min(last + 1, window.end());
            if (sequential) {
                readAheadFrom(metadata, segment, end, last);
            }
            InputStream bytes = window.stream(next, last);
            next = end;
            return bytes;
        }

        @Override
        public int read() throws IOException {
            byte[] one = new byte[1];
            int n = read(one, 0, 1);
            return n < 0 ? -1 : one[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            if (closed) {
                throw new IOException("stream closed");
            }
            if (len == 0) {
                return 0;
            }
            while (true) {
                int n = current.read(b, off, len);
                if (n >= 0) {
                    consumed += n;
                    return n;
                }
                if (next > last) {
                    // the last window's connection or cache files go back now: a caller may
                    // read to the end and never close (Kafka's reader does, on one path)
                    current.close();
                    current = InputStream.nullInputStream();
                    return -1;
                }
                current.close();
                try {
                    InputStream following = kept();
                    if (following == null) {
                        following = sequential ? openKept() : open(fetchWindowBytes);
                    }
                    current = following;
                } catch (RemoteStorageException e) {
                    throw new IOException(e.getMessage(), e);
                }
            }
        }

        @Override
        public void close() throws IOException {
            if (!closed) {
                closed = true;
                // a reader that stopped before the range's end shows how far a fetch reads; one
                // that read more than two windows is a scan (a search by timestamp), not a fetch
                // with the batches before its offset, and would make the next fetches' windows
                // too long to keep their connections
                if (start + consumed <= last && plain && consumed <= 2L * fetchWindowBytes) {
                    overshoot.record(consumed - fetchWindowBytes);
                }
                windows.read(segment, start, start + consumed);
                current.close();
            }
        }
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata metadata, IndexType indexType) throws RemoteStorageException {
        Json body = metadataJson(metadata).field("index_type", indexType.name());
        String what = "fetch of the " + indexType + " index of " + describe(metadata);
        return send("/v1/rsm/fetch-index", body, requestTimeoutMs, what, true, indexType == IndexType.TRANSACTION)
                .body;
    }

    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata metadata) throws RemoteStorageException {
        windows.forget(metadata.remoteLogSegmentId().id().toString());
        call("/v1/rsm/delete", metadataJson(metadata), requestTimeoutMs, "delete of " + describe(metadata));
    }

    @Override
    public void close() {
        stopReadAhead();
        if (windowSweeper != null) {
            windowSweeper.shutdownNow();
        }
        windows.close(); // streams still open keep their windows' files open until they are closed
        if (http != null) {
            http.close();
        }
    }

    /** Windows read from the sidecar's cache files (tests). */
    long fileWindows() {
        return fileReads.windows();
    }

    /** Cache files offered that could not be read, so the bytes were asked for (tests). */
    long fileFallbacks() {
        return fileReads.fallbacks();
    }

    /** Cache files open in file windows, kept or being read (tests). */
    int openFileChannels() {
        return openFiles.get();
    }

    /** Windows being fetched ahead, queued or in flight (tests). */
    int pendingFetchesAhead() {
        return pending.size();
    }

    /** What readers of the windows being fetched ahead wait for (tests). */
    List<CompletableFuture<SegmentWindows.Window>> fetchesAhead() {
        return pending.values().stream().map(Pending::window).toList();
    }

    /** Idle connections kept for the next read (tests). */
    int idleConnections() {
        return http == null ? 0 : http.idleConnections();
    }

    // -- requests -------------------------------------------------------------------------

    private byte[] call(String path, Json body, int timeoutMs, String what) throws RemoteStorageException {
        try (SidecarHttp.Response response = send(path, body, timeoutMs, what)) {
            return response.readAll();
        } catch (IOException e) {
            throw unreachable(what, e);
        }
    }

    private SidecarHttp.Response send(String path, Json body, int timeoutMs, String what) throws RemoteStorageException {
        return send(path, body, timeoutMs, what, false);
    }

    private SidecarHttp.Response send(String path, Json body, int timeoutMs, String what, boolean reuse)
            throws RemoteStorageException {
        return send(path, body, timeoutMs, what, reuse, false);
    }

    /**
     * Send the request; a non-2xx answer becomes the matching exception (and is closed). With
     * {@code reuse} (reads only: idempotent) it may go over a kept-alive connection;
     * {@code txnIndex}: a fetch of the transaction index ({@link #errorFor}).
     */
    private SidecarHttp.Response send(String path, Json body, int timeoutMs, String what, boolean reuse,
            boolean txnIndex) throws RemoteStorageException {
        if (http == null) {
            throw new RemoteStorageException("the sidecar plugin is not configured");
        }
        SidecarHttp.Response response;
        try {
            response = http.post(path, body.bytes(), timeoutMs, idleTimeoutMs, reuse);
        } catch (IOException e) {
            throw unreachable(what, e);
        }
        if (response.status >= 200 && response.status < 300) {
            return response;
        }
        String text;
        try (response) {
            text = response.contentLength <= 64 * 1024
                    ? new String(response.readAll(), StandardCharsets.UTF_8) : "";
        } catch (IOException e) {
            text = "";
        }
        throw errorFor(response.status, text, what, txnIndex);
    }

    private RemoteStorageException unreachable(String what, IOException cause) {
        return KafkaCompat.retriable(
                what + " failed: the sidecar at " + http.endpoint() + " did not answer (" + cause + ")", cause);
    }

    /**
     * The exception for the sidecar's error answer. Kafka reads
     * {@link RemoteResourceNotFoundException} from a fetch of the transaction index
     * ({@code txnIndex}) as "the segment has none", that is no aborted transactions, and serves
     * every record as committed: there it stands only for the sidecar's {@value #INDEX_NOT_FOUND};
     * a segment or object missing from the bucket fails the read instead.
     */
    static RemoteStorageException errorFor(int status, String body, String what, boolean txnIndex) {
        Matcher code = CODE.matcher(body);
        Matcher message = MESSAGE.matcher(body);
        String errorCode = code.find() ? code.group(1) : "http_" + status;
        String detail = errorCode + (message.find() ? ": " + message.group(1) : "");
        String text = what + " failed: the sidecar answered HTTP " + status + " " + detail;
        if (status == 404) {
            return !txnIndex || errorCode.equals(INDEX_NOT_FOUND)
                    ? new RemoteResourceNotFoundException(text) : new RemoteStorageException(text);
        }
        if (status == 429 || status == 503 || status == 504) {
            return KafkaCompat.retriable(text, null);
        }
        return new RemoteStorageException(text);
    }

    // -- the request bodies -----------------------------------------------------------------

    static Json metadataJson(RemoteLogSegmentMetadata metadata) {
        TopicIdPartition tip = metadata.topicIdPartition();
        Json json = new Json()
                .field("topic", tip.topic())
                .field("topic_id", tip.topicId().toString())
                .field("partition", tip.partition())
                .field("segment_id", metadata.remoteLogSegmentId().id().toString())
                .field("start_offset", metadata.startOffset())
                .field("end_offset", metadata.endOffset())
                .field("max_timestamp_ms", metadata.maxTimestampMs())
                .field("broker_id", metadata.brokerId())
                .field("event_timestamp_ms", metadata.eventTimestampMs())
                .field("segment_size_in_bytes", metadata.segmentSizeInBytes());
        // absent on Kafka 3.9; the sidecar then treats the transaction index as possibly non-empty
        KafkaCompat.txnIndexEmpty(metadata).ifPresent(empty -> json.field("txn_index_empty", empty));
        json.array("segment_leader_epochs");
        for (Map.Entry<Integer, Long> entry : metadata.segmentLeaderEpochs().entrySet()) {
            json.pair(entry.getKey(), entry.getValue());
        }
        return json.endArray();
    }

    private static String describe(RemoteLogSegmentMetadata metadata) {
        TopicIdPartition tip = metadata.topicIdPartition();
        return "segment " + metadata.remoteLogSegmentId().id() + " (" + tip.topic() + "-" + tip.partition()
                + ", offsets " + metadata.startOffset() + ".." + metadata.endOffset() + ")";
    }

    /** A small JSON object writer: enough for the request bodies, no dependency. */
    static final class Json {
        private final StringBuilder text = new StringBuilder("{");
        private boolean first = true;

        private Json name(String name) {
            if (!first) {
                text.append(',');
            }
            first = false;
            quote(name);
            text.append(':');
            return this;
        }

        Json field(String name, String value) {
            name(name);
            if (value == null) {
                text.append("null");
            } else {
                quote(value);
            }
            return this;
        }

        Json field(String name, long value) {
            name(name).text.append(value);
            return this;
        }

        Json field(String name, Integer value) {
            name(name).text.append(value == null ? "null" : value.toString());
            return this;
        }

        Json field(String name, boolean value) {
            name(name).text.append(value);
            return this;
        }

        Json object(String name) {
            name(name).text.append('{');
            first = true;
            return this;
        }

        Json end() {
            text.append('}');
            first = false;
            return this;
        }

        Json array(String name) {
            name(name).text.append('[');
            first = true;
            return this;
        }

        Json pair(long a, long b) {
            if (!first) {
                text.append(',');
            }
            first = false;
            text.append('[').append(a).append(',').append(b).append(']');
            return this;
        }

        Json endArray() {
            text.append(']');
            first = false;
            return this;
        }

        private void quote(String value) {
            text.append('"');
            for (int i = 0; i < value.length(); i++) {
                char c = value.charAt(i);
                if (c == '"' || c == '\\') {
                    text.append('\\').append(c);
                } else if (c < 0x20) {
                    text.append(String.format("\\u%04x", (int) c));
                } else {
                    text.append(c);
                }
            }
            text.append('"');
        }

        String text() {
            return text + "}";
        }

        byte[] bytes() {
            return text().getBytes(StandardCharsets.UTF_8);
        }
    }
}
