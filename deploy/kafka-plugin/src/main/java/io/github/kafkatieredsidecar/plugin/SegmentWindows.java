package io.github.kafkatieredsidecar.plugin;

import java.io.ByteArrayInputStream;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.LongSupplier;

/**
 * Windows of remote segments kept for the next fetches of a sequential reader, and where recent
 * reads of each segment ended.
 *
 * <p>Kafka serves a consumer's remote data one fetch at a time: each {@code fetchLogSegment}
 * reads about {@code max.partition.fetch.bytes} (1 MiB) from its start position and closes the
 * stream, and the next fetch starts a little before where that one stopped (at the offset
 * index entry before its first offset). Each fetch as a request to the sidecar costs a round
 * trip and the sidecar's per-request work, which at 1 MiB is a good part of the fetch. A read
 * that starts where a recent read of the same segment stopped, or a little before, is a
 * sequential reader's next fetch: it asks the sidecar for a larger window at once and keeps
 * it here, and the following fetches that start inside it are served from it.
 *
 * <p>A window is one of two kinds: the bytes the sidecar sent ({@link BytesWindow}, in the
 * broker's heap), or the sidecar's cache files that hold them ({@link FileWindow}, open files
 * the broker's reads are served from with no copy in the heap). The budget counts both alike,
 * in bytes of window length, which also bounds the files a file window keeps open.
 *
 * <p>A window is reference counted ({@link Window#retain}, {@link Window#release}): whoever
 * builds one holds the first reference, this class holds one while it keeps the window, and
 * every stream opened on it holds one until it is closed. A window dropped here (evicted,
 * replaced, its segment deleted, or all at {@link #close}) while a broker thread still reads
 * from it stays whole until that stream is closed; the last release frees it (a file window
 * closes its files). {@link #acquire} takes the caller's reference under the lock that drops
 * windows, so a window it returns is never one already freed.
 *
 * <p>Remote segments never change, so a window stays right until the segment is deleted
 * ({@link #forget}). The windows together hold at most {@code maxBytes}, least recently used
 * dropped first, and a window unused for longer than the idle time is dropped too
 * ({@link #expire}): a file window holds its cache files open, which keeps their disk space
 * after the sidecar's cache evicts them, and on a broker whose reads stopped nothing else would
 * ever drop it. Thread-safe: Kafka's remote reader threads share one instance.
 */
final class SegmentWindows {

    /**
     * One window: bytes {@code start .. start + length - 1} of a segment, held by references
     * (see {@link SegmentWindows}); it is built holding its builder's reference.
     */
    abstract static sealed class Window permits BytesWindow, FileWindow {
        final String segment;
        final long start;
        final int length;
        /** The references held; 0 once the last was released (for good: it never comes back). */
        private final AtomicInteger references = new AtomicInteger(1);
        /** When it was kept or last found ({@link SegmentWindows}' clock, under its lock). */
        private long usedAt;

        Window(String segment, long start, int length) {
            this.segment = segment;
            this.start = start;
            this.length = length;
        }

        /** The position after the window's last byte. */
        final long end() {
            return start + length;
        }

        final boolean covers(long position) {
            return position >= start && position < end();
        }

        /** Take a reference; false when the last one was already released (the window is freed). */
        final boolean retain() {
            while (true) {
                int held = references.get();
                if (held <= 0) {
                    return false;
                }
                if (references.compareAndSet(held, held + 1)) {
                    return true;
                }
            }
        }

        /** Drop a reference; the last one frees the window. */
        final void release() {
            int held = references.decrementAndGet();
            if (held == 0) {
                free();
            } else if (held < 0) {
                throw new IllegalStateException("window " + this + " released more often than it was retained");
            }
        }

        /** References held (tests). */
        final int references() {
            return references.get();
        }

        /**
         * Bytes {@code from .. min(last, window's last byte)}, as a stream that holds a reference
         * to the window until it is closed. The caller holds a reference while it calls this.
         */
        final InputStream stream(long from, long last) {
            if (!retain()) {
                throw new IllegalStateException("a stream of window " + this + ", which was freed");
            }
            try {
                return open((int) (from - start), (int) (Math.min(last, end() - 1) + 1 - from));
            } catch (RuntimeException e) {
                release();
                throw e;
            }
        }

        /**
         * Bytes {@code offset .. offset + count - 1} of the window as a stream whose first
         * {@code close} releases one reference.
         */
        abstract InputStream open(int offset, int count);

        /** Free what the window holds: its last reference was released. */
        abstract void free();

        /** Whether the window can still serve its bytes (a file window whose files were closed under it cannot). */
        boolean usable() {
            return true;
        }

        @Override
        public String toString() {
            return segment + ":" + start + ".." + (end() - 1);
        }
    }

    /** A window of the bytes the sidecar sent, in the heap; freeing it is the garbage collector's. */
    static final class BytesWindow extends Window {
        private final byte[] bytes;

        BytesWindow(String segment, long start, byte[] bytes) {
            super(segment, start, bytes.length);
            this.bytes = bytes;
        }

        @Override
        InputStream open(int offset, int count) {
            return new ByteArrayInputStream(bytes, offset, count) {
                private boolean closed;

                @Override
                public void close() {
                    if (!closed) {
                        closed = true;
                        release();
                    }
                }
            };
        }

        @Override
        void free() {
        }
    }

    /** Segments whose last reads are remembered (to tell a sequential reader's next fetch). */
    static final int READS_REMEMBERED = 4096;

    private final long maxBytes;
    private final long slackBytes;
    private final LongSupplier nanoClock;
    private final long idleNanos;
    /** Windows by segment and start, least recently used first; each holds a reference of ours. */
    private final LinkedHashMap<String, Window> windows = new LinkedHashMap<>(16, 0.75f, true);
    private long bytes;
    private boolean closed;
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
        this(maxBytes, slackBytes, System::nanoTime, 0);
    }

    /**
     * @param nanoClock the clock of the idle time
     * @param idleNanos how long a kept window may go unused before it is dropped (0: no limit)
     */
    SegmentWindows(long maxBytes, long slackBytes, LongSupplier nanoClock, long idleNanos) {
        this.maxBytes = maxBytes;
        this.slackBytes = slackBytes;
        this.nanoClock = nanoClock;
        this.idleNanos = idleNanos;
    }

    boolean enabled() {
        return maxBytes > 0;
    }

    /**
     * The window of {@code segment} that holds byte {@code position}, with a reference taken for
     * the caller (who releases it), or null.
     */
    Window acquire(String segment, long position) {
        List<Window> dropped = new ArrayList<>(0);
        Window found;
        synchronized (this) {
            expireInto(dropped);
            found = find(segment, position, dropped);
            if (found != null && !found.retain()) {
                found = null; // not while we hold ours: never
            }
        }
        dropped.forEach(Window::release);
        return found;
    }

    /** The end of the window of {@code segment} that holds byte {@code position}, or -1 when none does. */
    long keptEnd(String segment, long position) {
        List<Window> dropped = new ArrayList<>(0);
        Window found;
        synchronized (this) {
            found = find(segment, position, dropped);
        }
        dropped.forEach(Window::release);
        return found == null ? -1 : found.end();
    }

    /**
     * Under the lock: the window that holds {@code position}, now the most recently used; a
     * window found no longer usable is removed and added to {@code dropped} (to release).
     */
    private Window find(String segment, long position, List<Window> dropped) {
        Iterator<Window> all = windows.values().iterator();
        while (all.hasNext()) {
            Window window = all.next();
            if (window.segment.equals(segment) && window.covers(position)) {
                if (!window.usable()) {
                    bytes -= window.length;
                    all.remove();
                    dropped.add(window);
                    return null;
                }
                windows.get(key(window)); // access order: most recently used
                window.usedAt = nanoClock.getAsLong();
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

    /**
     * Keep {@code window}, with a reference of its own (the caller holds one while it calls
     * this, and keeps it); false when it is not kept: larger than the budget, or closed.
     */
    boolean put(Window window) {
        List<Window> dropped = new ArrayList<>(0);
        synchronized (this) {
            if (closed || window.length > maxBytes || !window.retain()) {
                return false;
            }
            expireInto(dropped);
            window.usedAt = nanoClock.getAsLong();
            Window replaced = windows.put(key(window), window);
            if (replaced != null) {
                bytes -= replaced.length;
                dropped.add(replaced);
            }
            bytes += window.length;
            Iterator<Window> eldest = windows.values().iterator();
            while (bytes > maxBytes && eldest.hasNext()) {
                Window evicted = eldest.next();
                bytes -= evicted.length;
                eldest.remove();
                dropped.add(evicted);
            }
        }
        dropped.forEach(Window::release);
        return true;
    }

    /**
     * Drop the windows unused for longer than the idle time (a file window's cache files are
     * closed once its last reader is done); returns how many were dropped. Called on every
     * lookup and keep, and periodically by the plugin for a broker whose reads stopped.
     */
    int expire() {
        List<Window> dropped = new ArrayList<>(0);
        synchronized (this) {
            expireInto(dropped);
        }
        dropped.forEach(Window::release);
        return dropped.size();
    }

    /** Under the lock: move the idle windows to {@code dropped} (to release). */
    private void expireInto(List<Window> dropped) {
        if (idleNanos <= 0) {
            return;
        }
        long now = nanoClock.getAsLong();
        Iterator<Window> eldest = windows.values().iterator();
        while (eldest.hasNext()) {
            Window window = eldest.next();
            if (now - window.usedAt <= idleNanos) {
                return; // access order: every window after it was used later
            }
            bytes -= window.length;
            eldest.remove();
            dropped.add(window);
        }
    }

    /** Drop what is known of {@code segment} (it was deleted). */
    void forget(String segment) {
        List<Window> dropped = new ArrayList<>(0);
        synchronized (this) {
            lastReads.remove(segment);
            Iterator<Window> all = windows.values().iterator();
            while (all.hasNext()) {
                Window window = all.next();
                if (window.segment.equals(segment)) {
                    bytes -= window.length;
                    all.remove();
                    dropped.add(window);
                }
            }
        }
        dropped.forEach(Window::release);
    }

    /** Drop every window, and keep none from now on (the plugin is closed or reconfigured). */
    void close() {
        List<Window> dropped;
        synchronized (this) {
            closed = true;
            dropped = new ArrayList<>(windows.values());
            windows.clear();
            bytes = 0;
        }
        dropped.forEach(Window::release);
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
