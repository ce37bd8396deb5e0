package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The windows kept within their budget, each freed once neither kept nor read. */
class SegmentWindowsTest {

    @TempDir
    Path dir;

    private final AtomicInteger openFiles = new AtomicInteger();
    /** Room for two windows of 1000 bytes. */
    private final SegmentWindows windows = new SegmentWindows(2000, 100);
    private int files;

    @AfterEach
    void noFileLeftOpen() {
        windows.close();
        assertEquals(0, openFiles.get(), "cache files left open");
    }

    private static byte expected(String segment, long position) {
        return (byte) (segment.hashCode() + position * 7);
    }

    private byte[] bytes(String segment, long from, long to) {
        byte[] bytes = new byte[(int) (to - from)];
        for (int i = 0; i < bytes.length; i++) {
            bytes[i] = expected(segment, from + i);
        }
        return bytes;
    }

    /** A window of {@code segment} from {@code start}, of {@code length} bytes in two cache files. */
    private FileWindow fileWindow(String segment, long start, int length) throws IOException {
        int half = length / 2;
        Path a = Files.write(dir.resolve("f" + files++), bytes(segment, start, start + half));
        Path b = Files.write(dir.resolve("f" + files++), bytes(segment, start + half, start + length));
        return FileWindow.open(segment, start, List.of(new CacheFiles.Range(a, 0, half),
                new CacheFiles.Range(b, 0, length - half)), length, openFiles);
    }

    /** Keep {@code window}, dropping the builder's reference as the plugin does. */
    private void keep(SegmentWindows.Window window) {
        try {
            assertTrue(windows.put(window));
        } finally {
            window.release();
        }
    }

    /** A stream from {@code from} to the end of the kept window that holds it, as a reader takes it. */
    private InputStream read(String segment, long from) {
        SegmentWindows.Window window = windows.acquire(segment, from);
        try {
            return window.stream(from, Long.MAX_VALUE);
        } finally {
            window.release();
        }
    }

    @Test
    void aWindowEvictedWhileAStreamReadsItServesThatStreamToItsEnd() throws IOException {
        FileWindow first = fileWindow("s", 0, 1000);
        keep(first);
        keep(fileWindow("s", 1000, 1000));
        assertEquals(4, openFiles.get());
        try (InputStream in = read("s", 100)) {
            assertArrayEquals(bytes("s", 100, 200), in.readNBytes(100));
            read("s", 1000).close(); // the first is the least recently used again
            keep(fileWindow("s", 2000, 1000)); // evicts it
            assertNull(windows.acquire("s", 500));
            assertEquals(2, windows.count());
            assertEquals(2000, windows.bytes());
            assertEquals(6, openFiles.get(), "the stream holds the evicted window's files");
            assertEquals(1, first.references());
            assertArrayEquals(bytes("s", 200, 1000), in.readAllBytes());
        }
        assertEquals(0, first.references());
        assertEquals(4, openFiles.get(), "the evicted window's files close with its last stream");
    }

    @Test
    void theLeastRecentlyUsedWindowIsEvictedAndAReplacedOneIsFreed() throws IOException {
        FileWindow first = fileWindow("s", 0, 1000);
        FileWindow second = fileWindow("s", 1000, 1000);
        keep(first);
        keep(second);
        read("s", 10).close(); // the first is now the most recently used
        keep(fileWindow("s", 2000, 1000));
        assertEquals(0, second.references());
        assertEquals(1, first.references());
        assertEquals(1000, windows.keptEnd("s", 999));
        assertEquals(-1, windows.keptEnd("s", 1000));
        // the same window again (two readers fetched it): the one kept before is freed
        FileWindow again = fileWindow("s", 0, 1000);
        keep(again);
        assertEquals(0, first.references());
        assertEquals(2, windows.count());
        assertEquals(2000, windows.bytes());
        assertEquals(4, openFiles.get());
        SegmentWindows.Window found = windows.acquire("s", 0);
        assertSame(again, found);
        found.release();
    }

    @Test
    void forgetAndCloseFreeTheWindowsNotInUseAndTheRestWithTheirLastStream() throws IOException {
        FileWindow deleted = fileWindow("gone", 0, 1000);
        keep(deleted);
        keep(fileWindow("s", 0, 1000));
        InputStream reading = read("gone", 10);
        windows.forget("gone");
        assertNull(windows.acquire("gone", 10));
        assertEquals(1, windows.count());
        assertEquals(4, openFiles.get(), "the window of the deleted segment is still read");
        assertArrayEquals(bytes("gone", 10, 1000), reading.readAllBytes());
        reading.close();
        assertEquals(2, openFiles.get());
        InputStream open = read("s", 0);
        windows.close();
        assertEquals(0, windows.count());
        assertEquals(0, windows.bytes());
        assertEquals(2, openFiles.get(), "the window still read");
        assertArrayEquals(bytes("s", 0, 1000), open.readAllBytes());
        open.close();
        assertEquals(0, openFiles.get());
        // closed: nothing is kept from now on, and a window built meanwhile is freed by its builder
        FileWindow late = fileWindow("s", 0, 1000);
        try {
            assertFalse(windows.put(late));
        } finally {
            late.release();
        }
        assertEquals(0, late.references());
        assertEquals(0, windows.count());
    }

    @Test
    void aWindowLargerThanTheBudgetIsNotKeptAndIsFreedWithItsLastStream() throws IOException {
        FileWindow large = fileWindow("s", 0, 2001);
        InputStream in;
        try {
            assertFalse(windows.put(large));
            in = large.stream(0, 2000);
        } finally {
            large.release();
        }
        assertEquals(0, windows.count());
        assertEquals(2, openFiles.get());
        assertArrayEquals(bytes("s", 0, 2001), in.readAllBytes());
        in.close();
        assertEquals(0, openFiles.get());
        SegmentWindows none = new SegmentWindows(0, 0);
        FileWindow any = fileWindow("s", 0, 10);
        try {
            assertFalse(none.put(any), "windows off: none kept");
        } finally {
            any.release();
        }
    }

    @Test
    void aWindowWhoseFilesWereClosedUnderItIsDropped() throws IOException {
        FileWindow broken = fileWindow("s", 0, 1000);
        keep(broken);
        try (InputStream in = read("s", 0)) {
            Thread.currentThread().interrupt(); // the reader is interrupted: its file is closed for all
            try {
                assertThrows(IOException.class, () -> in.readNBytes(10));
            } finally {
                assertTrue(Thread.interrupted());
            }
        }
        assertFalse(broken.usable());
        assertEquals(1000, windows.bytes());
        assertNull(windows.acquire("s", 0), "not served: the reader fetches it again");
        assertEquals(0, windows.count());
        assertEquals(0, windows.bytes());
        assertEquals(0, broken.references());
        assertEquals(0, openFiles.get());
    }

    @Test
    void aBytesWindowIsServedAndCountedLikeAnyOther() throws IOException {
        byte[] bytes = bytes("s", 0, 1500);
        SegmentWindows.BytesWindow window = new SegmentWindows.BytesWindow("s", 0, bytes);
        keep(window);
        assertEquals(1500, windows.bytes());
        InputStream in = read("s", 700);
        assertEquals(2, window.references());
        assertArrayEquals(Arrays.copyOfRange(bytes, 700, 1500), in.readAllBytes());
        in.close();
        in.close();
        assertEquals(1, window.references());
        keep(new SegmentWindows.BytesWindow("s", 1500, new byte[1000])); // evicts it
        assertEquals(0, window.references());
        assertEquals(1, windows.count());
        assertThrows(IllegalStateException.class, window::release, "released once too often");
    }

    @Test
    void aWindowUnusedForTheIdleTimeIsDroppedAndItsFilesClosed() throws IOException {
        AtomicLong clock = new AtomicLong();
        SegmentWindows timed = new SegmentWindows(4000, 100, clock::get, 1000);
        try {
            FileWindow first = fileWindow("s", 0, 1000);
            assertTrue(timed.put(first));
            first.release();
            clock.set(600);
            FileWindow second = fileWindow("s", 1000, 1000);
            assertTrue(timed.put(second));
            second.release();
            assertEquals(4, openFiles.get());
            clock.set(1000);
            assertEquals(0, timed.expire(), "unused for the idle time exactly: kept");
            clock.set(1001);
            assertEquals(1, timed.expire());
            assertEquals(0, first.references());
            assertEquals(2, openFiles.get(), "the dropped window's cache files are closed");
            assertEquals(1, timed.count());
            assertEquals(1000, timed.bytes());
            // a lookup counts as a use
            clock.set(1500);
            SegmentWindows.Window found = timed.acquire("s", 1500);
            assertNotNull(found);
            found.release();
            clock.set(2500);
            assertEquals(0, timed.expire());
            // and a lookup drops what went idle before it looks
            clock.set(2501);
            assertNull(timed.acquire("s", 1500));
            assertEquals(0, timed.count());
            assertEquals(0, timed.bytes());
            assertEquals(0, openFiles.get());
        } finally {
            timed.close();
        }
    }
}
