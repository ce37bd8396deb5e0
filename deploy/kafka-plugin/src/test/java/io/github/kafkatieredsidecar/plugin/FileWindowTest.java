package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** Windows served from the sidecar's cache files: checked when built, read as the caller reads, freed once. */
class FileWindowTest {

    private static final long START = 5000;

    @TempDir
    Path dir;

    private final AtomicInteger openFiles = new AtomicInteger();
    private final byte[] segment = segmentBytes();

    @AfterEach
    void noFileLeftOpen() {
        assertEquals(0, openFiles.get(), "cache files left open");
    }

    private static byte[] segmentBytes() {
        byte[] segment = new byte[20_000];
        for (int i = 0; i < segment.length; i++) {
            segment[i] = (byte) (i * 7 + i / 251);
        }
        return segment;
    }

    /** A file holding the segment's bytes {@code from .. to - 1} after {@code offset} other bytes, and some after them. */
    private CacheFiles.Range chunk(String name, long from, long to, int offset) throws IOException {
        byte[] file = new byte[offset + (int) (to - from) + 50];
        Arrays.fill(file, (byte) 0x5a);
        System.arraycopy(segment, (int) from, file, offset, (int) (to - from));
        return new CacheFiles.Range(Files.write(dir.resolve(name), file), offset, to - from);
    }

    /** The window {@code START .. START + 4277} over four files, one of them twice, with an empty range. */
    private FileWindow window() throws IOException {
        List<CacheFiles.Range> ranges = List.of(
                chunk("a.chunk", START, START + 1000, 17),
                chunk("b.chunk", START + 1000, START + 1001, 0),
                new CacheFiles.Range(dir.resolve("a.chunk"), 0, 0),
                chunk("c.chunk", START + 1001, START + 3500, 4096),
                chunk("d.chunk", START + 3500, START + 4278, 3));
        return FileWindow.open("s", START, ranges, 4278, openFiles);
    }

    /** Everything {@code in} has, read in reads of the sizes given in turn, a size of 1 by {@link InputStream#read()}. */
    private static byte[] readInSizes(InputStream in, int... sizes) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        byte[] buffer = new byte[5000];
        for (int i = 0; ; i++) {
            int size = sizes[i % sizes.length];
            if (size == 1) {
                int b = in.read();
                if (b < 0) {
                    return out.toByteArray();
                }
                out.write(b);
            } else {
                int n = in.read(buffer, 11, size); // into the middle of the array
                if (n < 0) {
                    return out.toByteArray();
                }
                assertTrue(n > 0 && n <= size, "read " + n + " of " + size);
                out.write(buffer, 11, n);
            }
        }
    }

    @Test
    void rangesAreServedOneAfterTheOther() throws IOException {
        Path a = Files.write(dir.resolve("a"), new byte[] {9, 9, 1, 2, 3, 9});
        Path b = Files.write(dir.resolve("b"), new byte[] {4, 5});
        FileWindow window = FileWindow.open("s", 0, List.of(new CacheFiles.Range(a, 2, 3), new CacheFiles.Range(b, 0, 2),
                new CacheFiles.Range(a, 0, 0)), 5, openFiles);
        assertEquals(3, openFiles.get());
        try (InputStream in = window.stream(0, 4)) {
            assertArrayEquals(new byte[] {1, 2, 3, 4, 5}, in.readAllBytes());
        } finally {
            window.release();
        }
    }

    @Test
    void readsOfAnySizeGetTheWindowsBytesAcrossRangesAndFilesAndNeverPastTheLast() throws IOException {
        FileWindow window = window();
        long end = START + 4278;
        long[][] spans = {
            {START, end - 1}, {START, end + 100}, {START + 999, START + 1001}, {START + 1000, START + 1000},
            {START + 17, START + 3499}, {START + 1001, end - 2}, {end - 1, end - 1}, {START + 2222, START + 2222 + 1},
        };
        int[][] sizes = {{1}, {3, 1, 7}, {13}, {1000, 1}, {4096}, {999, 2, 1, 5}};
        try {
            for (long[] span : spans) {
                byte[] expected = Arrays.copyOfRange(segment, (int) span[0], (int) Math.min(span[1] + 1, end));
                for (int[] size : sizes) {
                    try (InputStream in = window.stream(span[0], span[1])) {
                        assertEquals(expected.length, in.available());
                        assertArrayEquals(expected, readInSizes(in, size), Arrays.toString(span) + " " + Arrays.toString(size));
                        assertEquals(0, in.available());
                        assertEquals(-1, in.read());
                        assertEquals(-1, in.read(new byte[10], 0, 10));
                        assertEquals(0, in.read(new byte[10], 0, 0));
                    }
                }
            }
            // skips, then reads on from there
            try (InputStream in = window.stream(START + 10, end - 1)) {
                assertEquals(990, in.skip(990));
                assertArrayEquals(Arrays.copyOfRange(segment, (int) START + 1000, (int) START + 1003), in.readNBytes(3));
                assertEquals(2000, in.skip(2000));
                assertArrayEquals(Arrays.copyOfRange(segment, (int) START + 3003, (int) end), in.readAllBytes());
                assertEquals(0, in.skip(5));
            }
            assertEquals(5, openFiles.get(), "one open file per range");
            assertEquals(1, window.references());
        } finally {
            window.release();
        }
        assertEquals(0, window.references());
    }

    @Test
    void aStreamHoldsItsWindowUntilItIsClosedOnce() throws IOException {
        FileWindow window = window();
        InputStream in = window.stream(START + 500, START + 1500);
        assertEquals(2, window.references());
        window.release(); // the builder's: the stream alone holds the window now
        assertEquals(5, openFiles.get());
        assertArrayEquals(Arrays.copyOfRange(segment, (int) START + 500, (int) START + 1501), in.readAllBytes());
        in.close();
        assertEquals(0, openFiles.get(), "the last reference closes the files");
        assertEquals(0, window.references());
        in.close(); // again: nothing more is released
        assertEquals(0, window.references());
        assertThrows(IOException.class, in::read);
        assertFalse(window.retain(), "a freed window is never taken again");
        assertThrows(IllegalStateException.class, () -> window.stream(START, START + 10));
    }

    @Test
    void aFileDeletedAfterTheWindowWasBuiltStillServesItsBytes() throws IOException {
        FileWindow window = window();
        try (InputStream in = window.stream(START, START + 4277)) {
            assertArrayEquals(Arrays.copyOfRange(segment, (int) START, (int) START + 10), in.readNBytes(10));
            for (String name : new String[] {"a.chunk", "b.chunk", "c.chunk", "d.chunk"}) {
                Files.delete(dir.resolve(name)); // the sidecar's cache evicts them
            }
            assertArrayEquals(Arrays.copyOfRange(segment, (int) START + 10, (int) START + 4278), in.readAllBytes());
        } finally {
            window.release();
        }
    }

    @Test
    void aMissingOrShortFileOrAWrongTotalIsAnErrorThatSaysWhichAndLeavesNoFileOpen() throws IOException {
        Path a = Files.write(dir.resolve("a"), new byte[] {1, 2, 3});
        Path gone = dir.resolve("gone");
        IOException missing = assertThrows(IOException.class, () -> FileWindow.open("s", 0,
                List.of(new CacheFiles.Range(a, 0, 3), new CacheFiles.Range(gone, 0, 2)), 5, openFiles));
        assertTrue(missing.getMessage().contains(gone.toString()), missing.getMessage());
        assertInstanceOf(NoSuchFileException.class, missing.getCause());
        assertEquals(0, openFiles.get(), "the file opened before is closed");
        IOException shortFile = assertThrows(IOException.class, () -> FileWindow.open("s", 0,
                List.of(new CacheFiles.Range(a, 0, 1), new CacheFiles.Range(a, 1, 3)), 4, openFiles));
        assertTrue(shortFile.getMessage().contains(a + " ends at byte 3, before the end of its range 1..3"),
                shortFile.getMessage());
        assertEquals(0, openFiles.get());
        IOException total = assertThrows(IOException.class,
                () -> FileWindow.open("s", 0, List.of(new CacheFiles.Range(a, 0, 3)), 4, openFiles));
        assertTrue(total.getMessage().contains("do not add up to the window's 4 bytes"), total.getMessage());
        assertThrows(IOException.class, () -> FileWindow.open("s", 0,
                List.of(new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2), new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2),
                        new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2)), 4, openFiles));
        // a range that is whole in its file is fine, to its last byte
        FileWindow whole = FileWindow.open("s", 0, List.of(new CacheFiles.Range(a, 1, 2)), 2, openFiles);
        try (InputStream in = whole.stream(0, 1)) {
            assertArrayEquals(new byte[] {2, 3}, in.readAllBytes());
        } finally {
            whole.release();
        }
    }

    @Test
    void aFailedReadIsAnIOExceptionAndTheWindowIsNoLongerUsable() throws IOException {
        FileWindow window = window();
        List<InputStream> streams = new ArrayList<>();
        try {
            streams.add(window.stream(START, START + 4277));
            streams.add(window.stream(START, START + 4277));
            assertTrue(window.usable());
            // an interrupted reader: Java closes the file channel it was reading
            Thread.currentThread().interrupt();
            IOException e = assertThrows(IOException.class, () -> streams.get(0).readNBytes(100));
            assertTrue(Thread.interrupted());
            assertTrue(e.getMessage().contains(dir.resolve("a.chunk").toString()), e.getMessage());
            assertFalse(window.usable());
            assertThrows(IOException.class, () -> streams.get(1).readNBytes(100), "the file is closed for every reader");
        } finally {
            Thread.interrupted();
            for (InputStream in : streams) {
                in.close();
            }
            window.release();
        }
    }
}
