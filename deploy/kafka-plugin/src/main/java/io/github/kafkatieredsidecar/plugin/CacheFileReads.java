package io.github.kafkatieredsidecar.plugin;

import java.io.IOException;
import java.lang.System.Logger.Level;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.LongSupplier;

/**
 * Whether fetches ask the sidecar for its cache files ({@link CacheFiles}): the
 * {@code fetch.files} setting, and a pause after the files offered could not be read.
 *
 * <p>A file that cannot be opened, or is shorter than its range, when its window is built
 * ({@link FileWindow}) costs its fetch a second request, for the bytes. Now and then that is
 * the sidecar's cache evicting a file before the plugin opened it;
 * {@value #FAILURES_IN_A_ROW} times in a row means the files are out of the broker's reach (a
 * cache directory the broker may not read, a volume not shared with it), so fetches then stop
 * asking for files for {@link #OFF_NANOS} (5 minutes), with one warning, and try them again
 * after that. A window served from files resets the count.
 *
 * <p>Thread-safe: Kafka's remote reader threads and the plugin's read-ahead threads share one
 * instance.
 */
final class CacheFileReads {

    static final int FAILURES_IN_A_ROW = 3;
    static final long OFF_NANOS = TimeUnit.MINUTES.toNanos(5);
    private static final System.Logger LOG = System.getLogger(SidecarRemoteStorageManager.class.getName());

    private final boolean enabled;
    private final LongSupplier nanoClock;
    private final AtomicInteger failuresInARow = new AtomicInteger();
    /** While file reads are paused, until when (of {@code nanoClock}); null otherwise. */
    private final AtomicReference<Long> offUntil = new AtomicReference<>();
    private final AtomicLong windows = new AtomicLong();
    private final AtomicLong fallbacks = new AtomicLong();

    /**
     * @param enabled the {@code fetch.files} setting
     * @param nanoClock {@link System#nanoTime} but in tests
     */
    CacheFileReads(boolean enabled, LongSupplier nanoClock) {
        this.enabled = enabled;
        this.nanoClock = nanoClock;
    }

    /** Whether the next fetch asks for files. */
    boolean ask() {
        if (!enabled) {
            return false;
        }
        Long until = offUntil.get();
        if (until == null) {
            return true;
        }
        if (nanoClock.getAsLong() - until < 0) {
            return false;
        }
        if (offUntil.compareAndSet(until, null)) {
            failuresInARow.set(0); // failures of fetches that asked before the pause
        }
        return true;
    }

    /** A window is served from the files offered. */
    void succeeded() {
        windows.incrementAndGet();
        failuresInARow.set(0);
    }

    /** The files offered for {@code what} could not be read ({@code cause}); it asks for the bytes. */
    void failed(String what, IOException cause) {
        fallbacks.incrementAndGet();
        if (failuresInARow.incrementAndGet() < FAILURES_IN_A_ROW) {
            return;
        }
        if (offUntil.compareAndSet(null, nanoClock.getAsLong() + OFF_NANOS)) {
            failuresInARow.set(0);
            Instant until = Instant.now().plusNanos(OFF_NANOS).truncatedTo(ChronoUnit.SECONDS);
            LOG.log(Level.WARNING, "the sidecar's cache files could not be read " + FAILURES_IN_A_ROW
                    + " times in a row, the last for the " + what + ": " + cause
                    + "; fetches get the bytes over the sidecar's socket until " + until
                    + ", then try the files again (rsm.config.fetch.files=false turns them off for good)");
        }
    }

    /** Windows served from files. */
    long windows() {
        return windows.get();
    }

    /** Files offered that could not be read. */
    long fallbacks() {
        return fallbacks.get();
    }
}
