package io.github.kafkatieredsidecar.plugin;

import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Windows of remote segments kept in memory for the next fetches of a sequential reader, and
 * where recent reads of each segment ended.
 *
 * <p>Kafka serves a consumer's remote data one fetch at a time: each {@code fetchLogSegment}
 * reads about {@code max.partition.fetch.bytes} (1 MiB) from its start position and closes the
 * stream, and the next fetch starts a little before where that one stopped (at the offset
 * index entry before its first offset). Each fetch as a request to the sidecar costs a round
 * trip and the sidecar's per-request work, which at 1 MiB is a good part of the fetch. A read
 * that starts where a recent read of the same segment stopped, or a little before, is a
 * sequential reader's next fetch: it asks the sidecar for a larger window at once and keeps
 * it here, and the following fetches that start inside it are served from memory.
 *
 * <p>Remote segments never change, so a window stays right until the segment is deleted
 * ({@link #forget}). The windows together hold at most {@code maxBytes}, least recently used
 * dropped first. Thread-safe: Kafka's remote reader threads share one instance.
 */
final class SegmentWindows {

    /** One window: bytes {@code start .. start + bytes.length - 1} of a segment. */
    static final class Window {
        final String segment;
        final long start;
        final byte[] bytes;

        Window(String segment, long start, byte[] bytes) {
            this.segment = segment;
            this.start = start;
            this.bytes = bytes;
        }

        /** The position after the window's last byte. */
        long end() {
            return start + bytes.length;
        }

        boolean covers(long position) {
            return position >= start && position < end();
        }

        /** Bytes {@code from .. min(last, window's last byte)}. */
        InputStream stream(long from, long last) {
            int offset = (int) (from - start);
            int length = (int) (Math.min(last + 1, end()) - from);
            return new ByteArrayInputStream(bytes, offset, length);
        }
    }

    /** Segments whose last reads are remembered (to tell a sequential reader's next fetch). */
    static final int READS_REMEMBERED = 4096;

    private final long maxBytes;
    private final long slackBytes;
    /** Windows by segment and start, least recently used first. */
    private final LinkedHashMap<String, Window> windows = new LinkedHashMap<>(16, 0.75f, true);
    private long bytes;
    /** Segment → {start, end} of its last read. */
    private final LinkedHashMap<String, long[]> lastReads = new LinkedHashMap<>(16, 0.75f, true) {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, long[]> eldest) {
            return size() > READS_REMEMBERED;
        }
    };

    /**
     * @param maxBytes the windows' bytes at most (0: keep none, every read is a plain window)
     * @param slackBytes how far past a recent read's end a read may start and still count as
     *     that reader's next fetch
     */
    SegmentWindows(long maxBytes, long slackBytes) {
        this.maxBytes = maxBytes;
        this.slackBytes = slackBytes;
    }

    boolean enabled() {
        return maxBytes > 0;
    }

    /** The window of {@code segment} that holds byte {@code position}, or null. */
    synchronized Window find(String segment, long position) {
        for (Window window : windows.values()) {
            if (window.segment.equals(segment) && window.covers(position)) {
                windows.get(key(window)); // access order: most recently used
                return window;
            }
        }
        return null;
    }

    /** Whether a read of {@code segment} from {@code start} continues a recent read of it. */
    synchronized boolean follows(String segment, long start) {
        long[] last = lastReads.get(segment);
        return last != null && start >= last[0] && start <= last[1] + slackBytes;
    }

    /** A read of {@code segment} went from {@code start} to {@code end} (exclusive). */
    synchronized void read(String segment, long start, long end) {
        lastReads.put(segment, new long[] {start, end});
    }

    /** Keep {@code window} (a window larger than the budget is not kept). */
    synchronized void put(Window window) {
        if (window.bytes.length > maxBytes) {
            return;
        }
        Window replaced = windows.put(key(window), window);
        if (replaced != null) {
            bytes -= replaced.bytes.length;
        }
        bytes += window.bytes.length;
        Iterator<Window> eldest = windows.values().iterator();
        while (bytes > maxBytes && eldest.hasNext()) {
            bytes -= eldest.next().bytes.length;
            eldest.remove();
        }
    }

    /** Drop what is known of {@code segment} (it was deleted). */
    synchronized void forget(String segment) {
        lastReads.remove(segment);
        Iterator<Window> all = windows.values().iterator();
        while (all.hasNext()) {
            Window window = all.next();
            if (window.segment.equals(segment)) {
                bytes -= window.bytes.length;
                all.remove();
            }
        }
    }

    synchronized long bytes() {
        return bytes;
    }

    synchronized int count() {
        return windows.size();
    }

    private static String key(Window window) {
        return window.segment + ":" + window.start;
    }
}
