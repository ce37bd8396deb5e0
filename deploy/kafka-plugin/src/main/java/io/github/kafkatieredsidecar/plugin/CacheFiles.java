package io.github.kafkatieredsidecar.plugin;

import java.io.EOFException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A window of a segment read straight from the sidecar's cache files: a fetch that asks for
 * {@code "files"} may be answered with where the sidecar's chunk cache holds the bytes,
 * {@code {"files":[{"path":"/abs/x.chunk","offset":0,"length":4194304}, ...]}}, file ranges in
 * order whose bytes together are the window. Reading them here saves the sidecar sending them
 * and one copy of every byte.
 *
 * <p>The sidecar offers only absolute paths of printable ASCII without {@code "} and
 * {@code \}, so the answer is parsed with a regular expression, strictly: anything else, or
 * ranges that do not add up to the window, is an {@link IOException}, never data.
 *
 * <p>The sidecar's cache evicts a file by unlinking it, which an open file survives: every file
 * of an answer is opened before any is read, and a file gone by then is an
 * {@link IOException} like any other (the caller asks for the bytes instead).
 */
final class CacheFiles {

    /** Bytes {@code offset .. offset + length - 1} of the file at {@code path}. */
    record Range(Path path, long offset, long length) {
    }

    private static final String RANGE = "\\{\\s*\"path\"\\s*:\\s*\"([ !#-\\[\\]-~]+)\""
            + "\\s*,\\s*\"offset\"\\s*:\\s*(\\d{1,18})\\s*,\\s*\"length\"\\s*:\\s*(\\d{1,18})\\s*\\}";
    private static final Pattern ONE_RANGE = Pattern.compile(RANGE);
    private static final Pattern ANSWER = Pattern.compile(
            "\\s*\\{\\s*\"files\"\\s*:\\s*\\[\\s*(" + RANGE + "(?:\\s*,\\s*" + RANGE + ")*)\\s*\\]\\s*\\}\\s*");
    /** How much of an answer that does not parse its error message quotes. */
    private static final int QUOTED_CHARS = 200;

    private CacheFiles() {
    }

    /** The file ranges of the sidecar's JSON answer, in order. */
    static List<Range> parse(String answer) throws IOException {
        Matcher whole = ANSWER.matcher(answer);
        if (!whole.matches()) {
            throw new IOException("the sidecar's answer is not a list of cache files: "
                    + (answer.length() > QUOTED_CHARS ? answer.substring(0, QUOTED_CHARS) + "..." : answer));
        }
        List<Range> ranges = new ArrayList<>();
        Matcher range = ONE_RANGE.matcher(whole.group(1));
        while (range.find()) {
            ranges.add(new Range(path(range.group(1)), Long.parseLong(range.group(2)),
                    Long.parseLong(range.group(3))));
        }
        return ranges;
    }

    private static Path path(String text) throws IOException {
        Path path;
        try {
            path = Path.of(text);
        } catch (InvalidPathException e) {
            throw new IOException("the sidecar offered an invalid cache file path " + text + ": " + e, e);
        }
        if (!path.isAbsolute()) {
            throw new IOException("the sidecar offered a relative cache file path " + text);
        }
        return path;
    }

    /** The bytes of {@code ranges} one after the other, which must be {@code length} bytes. */
    static byte[] read(List<Range> ranges, int length) throws IOException {
        long total = 0;
        for (Range range : ranges) {
            total += range.length();
            if (total > length) {
                break; // too many already (and no overflow of the sum)
            }
        }
        if (total != length) {
            throw new IOException("the sidecar's cache file ranges " + ranges + " do not add up to the window's "
                    + length + " bytes");
        }
        List<FileChannel> channels = new ArrayList<>(ranges.size());
        try {
            for (Range range : ranges) {
                channels.add(open(range.path()));
            }
            byte[] bytes = new byte[length];
            int at = 0;
            for (int i = 0; i < ranges.size(); i++) {
                readRange(channels.get(i), ranges.get(i), bytes, at);
                at += (int) ranges.get(i).length();
            }
            return bytes;
        } finally {
            channels.forEach(SidecarHttp::closeQuietly);
        }
    }

    private static FileChannel open(Path path) throws IOException {
        try {
            return FileChannel.open(path, StandardOpenOption.READ);
        } catch (IOException e) {
            throw new IOException("cannot open the sidecar's cache file " + path + ": " + e, e);
        }
    }

    /** Read {@code range} whole into {@code bytes} from {@code at}, with positional reads. */
    private static void readRange(FileChannel channel, Range range, byte[] bytes, int at) throws IOException {
        ByteBuffer target = ByteBuffer.wrap(bytes, at, (int) range.length());
        long position = range.offset();
        while (target.hasRemaining()) {
            int n;
            try {
                n = channel.read(target, position);
            } catch (IOException e) {
                throw new IOException("cannot read the sidecar's cache file " + range.path() + ": " + e, e);
            }
            if (n < 0) {
                throw new EOFException("the sidecar's cache file " + range.path() + " ends at byte " + position
                        + ", inside its range " + range.offset() + ".." + (range.offset() + range.length() - 1));
            }
            position += n;
        }
    }
}
