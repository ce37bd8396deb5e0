package io.github.kafkatieredsidecar.plugin;

import java.io.IOException;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The sidecar's answer that names its cache files instead of sending bytes: a fetch that asks
 * for {@code "files"} may be answered with where the sidecar's chunk cache holds the window,
 * {@code {"files":[{"path":"/abs/x.chunk","offset":0,"length":4194304}, ...]}}, file ranges in
 * order whose bytes together are the window. The plugin then serves the window from those
 * files ({@link FileWindow}), which saves the sidecar sending the bytes and the plugin copying
 * them into the heap.
 *
 * <p>The sidecar offers only absolute paths of printable ASCII without {@code "} and
 * {@code \}, so the answer is parsed with a regular expression, strictly: anything else is an
 * {@link IOException}, never data.
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
}
