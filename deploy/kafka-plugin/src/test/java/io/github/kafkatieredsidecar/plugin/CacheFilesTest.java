package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.util.List;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The sidecar's files answer parsed strictly, and file ranges read whole or not at all. */
class CacheFilesTest {

    @TempDir
    Path dir;

    @Test
    void anAnswerIsParsedIntoItsRangesInOrder() throws IOException {
        List<CacheFiles.Range> ranges = CacheFiles.parse(" {\"files\": [ {\"path\": \"/c/ab/x y[1].chunk\", "
                + "\"offset\": 0, \"length\": 4194304},\n{\"path\":\"/c/cd/z.chunk\",\"offset\":123,\"length\":456} ] }\n");
        assertEquals(List.of(new CacheFiles.Range(Path.of("/c/ab/x y[1].chunk"), 0, 4194304),
                new CacheFiles.Range(Path.of("/c/cd/z.chunk"), 123, 456)), ranges);
    }

    @Test
    void anythingElseIsRefused() {
        for (String answer : new String[] {
            "",
            "{\"files\":[]}",
            "{\"files\":[{\"path\":\"/a\",\"offset\":0,\"length\":1}]",
            "{\"files\":[{\"path\":\"/a\\\\b\",\"offset\":0,\"length\":1}]}",
            "{\"files\":[{\"path\":\"/a\\u00e9\",\"offset\":0,\"length\":1}]}",
            "{\"files\":[{\"path\":\"/a\",\"offset\":0,\"length\":1,\"x\":2}]}",
            "{\"files\":[{\"path\":\"/a\",\"offset\":1.5,\"length\":1}]}",
            "{\"files\":[{\"path\":\"/a\",\"offset\":0,\"length\":1}{\"path\":\"/b\",\"offset\":0,\"length\":1}]}",
            "{\"files\":[{\"path\":\"/a\",\"offset\":0,\"length\":99999999999999999999}]}",
            "{\"files\":[{\"path\":\"relative\",\"offset\":0,\"length\":1}]}",
        }) {
            assertThrows(IOException.class, () -> CacheFiles.parse(answer), answer);
        }
    }

    @Test
    void rangesAreReadOneAfterTheOther() throws IOException {
        Path a = Files.write(dir.resolve("a"), new byte[] {9, 9, 1, 2, 3, 9});
        Path b = Files.write(dir.resolve("b"), new byte[] {4, 5});
        byte[] bytes = CacheFiles.read(List.of(new CacheFiles.Range(a, 2, 3), new CacheFiles.Range(b, 0, 2),
                new CacheFiles.Range(a, 0, 0)), 5);
        assertArrayEquals(new byte[] {1, 2, 3, 4, 5}, bytes);
    }

    @Test
    void aMissingOrShortFileOrAWrongTotalIsAnErrorThatSaysWhich() throws IOException {
        Path a = Files.write(dir.resolve("a"), new byte[] {1, 2, 3});
        Path gone = dir.resolve("gone");
        IOException missing = assertThrows(IOException.class,
                () -> CacheFiles.read(List.of(new CacheFiles.Range(a, 0, 3), new CacheFiles.Range(gone, 0, 2)), 5));
        assertTrue(missing.getMessage().contains(gone.toString()), missing.getMessage());
        assertInstanceOf(NoSuchFileException.class, missing.getCause());
        IOException shortFile = assertThrows(IOException.class,
                () -> CacheFiles.read(List.of(new CacheFiles.Range(a, 1, 3)), 3));
        assertTrue(shortFile.getMessage().contains(a + " ends at byte 3"), shortFile.getMessage());
        IOException total = assertThrows(IOException.class,
                () -> CacheFiles.read(List.of(new CacheFiles.Range(a, 0, 3)), 4));
        assertTrue(total.getMessage().contains("do not add up to the window's 4 bytes"), total.getMessage());
        assertThrows(IOException.class, () -> CacheFiles.read(
                List.of(new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2), new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2),
                        new CacheFiles.Range(a, 0, Long.MAX_VALUE / 2)), 4));
    }
}
