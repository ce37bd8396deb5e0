package io.github.kafkatieredsidecar.plugin;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A window of a segment served straight from the sidecar's cache files ({@link CacheFiles}): the
 * file ranges that together hold its bytes, each with its file open. A broker's read of the
 * window is a positional read of the file into the broker's own array, the one copy there is
 * (as with Kafka's own {@code LocalTieredStorage}); the window's bytes never sit in the heap.
 *
 * <p>Every file is opened, and checked to hold its whole range, when the window is built: a
 * file missing by then (the sidecar's cache evicted it), or shorter than its range, is an
 * {@link IOException} then, and the caller asks for the bytes instead. After that the window
 * needs nothing more of the cache: the cache evicts a file by unlinking it, which an open file
 * survives, and it renames complete files into place and never rewrites or truncates one, so
 * an open file that was long enough keeps its bytes. The files stay open until the window's
 * last reference is released ({@link SegmentWindows}).
 *
 * <p>A reader thread interrupted in a read closes that file for every reader (Java's file
 * channels are interruptible); the window then says it is no longer {@link #usable}, and
 * {@link SegmentWindows} drops it.
 */
final class FileWindow extends SegmentWindows.Window {

    private final CacheFiles.Range[] ranges;
    private final FileChannel[] channels;
    /** The window's position after each range's last byte. */
    private final long[] ends;
    /** The plugin's count of open cache files. */
    private final AtomicInteger openFiles;

    private FileWindow(String segment, long start, int length, CacheFiles.Range[] ranges, FileChannel[] channels,
            AtomicInteger openFiles) {
        super(segment, start, length);
        this.ranges = ranges;
        this.channels = channels;
        this.openFiles = openFiles;
        this.ends = new long[ranges.length];
        long end = 0;
        for (int i = 0; i < ranges.length; i++) {
            end += ranges[i].length();
            ends[i] = end;
        }
    }

    /**
     * Bytes {@code start .. start + length - 1} of {@code segment}, which are the bytes of
     * {@code ranges} one after the other: every file opened and checked to hold its range (each
     * open file counted in {@code openFiles} until it is closed). Ranges that do not add up to
     * {@code length}, a file that cannot be opened or is too short: an {@link IOException}, and
     * no file left open.
     */
    static FileWindow open(String segment, long start, List<CacheFiles.Range> ranges, int length,
            AtomicInteger openFiles) throws IOException {
        long total = 0;
        for (CacheFiles.Range range : ranges) {
            total += range.length();
            if (total > length) {
                break; // too many already (and no overflow of the sum)
            }
        }
        if (total != length) {
            throw new IOException("the sidecar's cache file ranges " + ranges + " do not add up to the window's "
                    + length + " bytes");
        }
        FileChannel[] channels = new FileChannel[ranges.size()];
        boolean built = false;
        try {
            // every file opened before any is checked: the cache may evict one meanwhile
            for (int i = 0; i < channels.length; i++) {
                channels[i] = open(ranges.get(i).path());
                openFiles.incrementAndGet();
            }
            for (int i = 0; i < channels.length; i++) {
                check(channels[i], ranges.get(i));
            }
            FileWindow window = new FileWindow(segment, start, length, ranges.toArray(new CacheFiles.Range[0]),
                    channels, openFiles);
            built = true;
            return window;
        } finally {
            if (!built) {
                close(channels, openFiles);
            }
        }
    }

    private static FileChannel open(Path path) throws IOException {
        try {
            return FileChannel.open(path, StandardOpenOption.READ);
        } catch (IOException e) {
            throw new IOException("cannot open the sidecar's cache file " + path + ": " + e, e);
        }
    }

    /** {@code range} lies within its file. */
    private static void check(FileChannel channel, CacheFiles.Range range) throws IOException {
        long size;
        try {
            size = channel.size();
        } catch (IOException e) {
            throw new IOException("cannot read the sidecar's cache file " + range.path() + ": " + e, e);
        }
        if (size < range.offset() + range.length()) {
            throw new EOFException("the sidecar's cache file " + range.path() + " ends at byte " + size
                    + ", before the end of its range " + range.offset() + ".."
                    + (range.offset() + range.length() - 1));
        }
    }

    /** Close the channels opened (those not null), each counted off {@code openFiles}. */
    private static void close(FileChannel[] channels, AtomicInteger openFiles) {
        for (FileChannel channel : channels) {
            if (channel != null) {
                SidecarHttp.closeQuietly(channel);
                openFiles.decrementAndGet();
            }
        }
    }

    @Override
    InputStream open(int offset, int count) {
        return new Stream(offset, offset + count);
    }

    @Override
    void free() {
        close(channels, openFiles);
    }

    @Override
    boolean usable() {
        for (FileChannel channel : channels) {
            if (!channel.isOpen()) {
                return false;
            }
        }
        return true;
    }

    /** The window's bytes {@code at .. limit - 1}, read from the files as the caller reads them. */
    private final class Stream extends InputStream {
        /** The window's position of the next byte. */
        private long at;
        private final long limit;
        /** The range that holds {@code at} (or one before it, skipped on the next read). */
        private int range;
        private boolean closed;
        private byte[] one;

        Stream(long at, long limit) {
            this.at = at;
            this.limit = limit;
        }

        @Override
        public int read() throws IOException {
            if (one == null) {
                one = new byte[1];
            }
            return read(one, 0, 1) < 0 ? -1 : one[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            Objects.checkFromIndexSize(off, len, b.length);
            if (closed) {
                throw new IOException("stream closed");
            }
            if (len == 0) {
                return 0;
            }
            if (at >= limit) {
                return -1;
            }
            int wanted = (int) Math.min(len, limit - at);
            int done = 0;
            while (done < wanted) {
                while (at >= ends[range]) {
                    range++; // past this range's end (or an empty range)
                }
                long rangeStart = ends[range] - ranges[range].length();
                int n = (int) Math.min(wanted - done, ends[range] - at);
                readFully(range, b, off + done, n, ranges[range].offset() + (at - rangeStart));
                done += n;
                at += n;
            }
            return done;
        }

        /** {@code n} bytes of the file of range {@code i} from {@code position} into {@code b} from {@code off}. */
        private void readFully(int i, byte[] b, int off, int n, long position) throws IOException {
            ByteBuffer target = ByteBuffer.wrap(b, off, n);
            while (target.hasRemaining()) {
                int read;
                try {
                    read = channels[i].read(target, position);
                } catch (IOException e) {
                    throw new IOException("cannot read the sidecar's cache file " + ranges[i].path() + ": " + e, e);
                }
                if (read < 0) {
                    // the file was checked to be long enough, and cache files are never truncated
                    throw new EOFException("the sidecar's cache file " + ranges[i].path() + " ends at byte "
                            + position + ", inside its range " + ranges[i].offset() + ".."
                            + (ranges[i].offset() + ranges[i].length() - 1));
                }
                position += read;
            }
        }

        @Override
        public long skip(long n) throws IOException {
            if (closed) {
                throw new IOException("stream closed");
            }
            long skipped = Math.max(0, Math.min(n, limit - at));
            at += skipped;
            return skipped;
        }

        @Override
        public int available() {
            return closed ? 0 : (int) Math.min(Integer.MAX_VALUE, Math.max(0, limit - at));
        }

        @Override
        public void close() {
            if (!closed) {
                closed = true;
                release();
            }
        }
    }
}
