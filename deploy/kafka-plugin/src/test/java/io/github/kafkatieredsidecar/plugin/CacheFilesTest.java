package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.nio.file.Path;
import java.util.List;

import org.junit.jupiter.api.Test;

/** The sidecar's files answer parsed strictly. */
class CacheFilesTest {

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
}
