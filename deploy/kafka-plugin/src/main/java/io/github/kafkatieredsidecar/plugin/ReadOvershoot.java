package io.github.kafkatieredsidecar.plugin;

/**
 * How far recent segment reads went past one fetch window: the largest overshoot of the last
 * {@value #REMEMBERED} reads, rounded up to {@value #ROUND_BYTES} bytes and at most
 * {@value #MAX_BYTES}. A read of Kafka's remote fetch path starts at the offset index entry
 * before its offset, so it reads its fetch's worth plus the batches before that offset; adding
 * this headroom to the first window lets one request serve the whole read.
 *
 * <p>The largest of recent reads rather than an average: a window a little too long costs the
 * sidecar a few KiB it sends and the plugin reads and drops, one too short costs a second
 * request.
 */
final class ReadOvershoot {
    static final int REMEMBERED = 32;
    static final int ROUND_BYTES = 16 * 1024;
    static final int MAX_BYTES = 1024 * 1024;

    private final long[] recent = new long[REMEMBERED];
    private int next;

    /** Note one read that went {@code bytes} past its first window (0 or less: it did not). */
    synchronized void record(long bytes) {
        recent[next] = Math.max(0, Math.min(bytes, MAX_BYTES));
        next = (next + 1) % REMEMBERED;
    }

    /** The bytes to add to the next read's first window. */
    synchronized int headroom() {
        long most = 0;
        for (long bytes : recent) {
            most = Math.max(most, bytes);
        }
        return (int) ((most + ROUND_BYTES - 1) / ROUND_BYTES * ROUND_BYTES);
    }
}
