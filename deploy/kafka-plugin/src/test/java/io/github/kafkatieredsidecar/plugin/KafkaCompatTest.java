package io.github.kafkatieredsidecar.plugin;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.Map;
import java.util.Optional;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RetriableRemoteStorageException;
import org.junit.jupiter.api.Test;

/** On the Kafka API the plugin is compiled against (4.x), the looked-up members are found and used. */
class KafkaCompatTest {

    @Test
    void retriableErrorsAreKafkasRetriableException() {
        assertTrue(KafkaCompat.hasRetriableException());
        IOException cause = new IOException("refused");
        RemoteStorageException e = KafkaCompat.retriable("copy failed", cause);
        assertInstanceOf(RetriableRemoteStorageException.class, e);
        assertEquals("copy failed", e.getMessage());
        assertSame(cause, e.getCause());
    }

    @Test
    void theTransactionIndexFlagIsReadWhereItExists() {
        TopicIdPartition tip = new TopicIdPartition(Uuid.randomUuid(), new TopicPartition("t", 0));
        RemoteLogSegmentMetadata empty = new RemoteLogSegmentMetadata(
                new RemoteLogSegmentId(tip, Uuid.randomUuid()), 0L, 9L, 1L, 1, 1L, 100,
                Optional.empty(), RemoteLogSegmentState.COPY_SEGMENT_STARTED, Map.of(0, 0L), true);
        assertEquals(Optional.of(true), KafkaCompat.txnIndexEmpty(empty));
        String body = SidecarRemoteStorageManager.metadataJson(empty).text();
        assertTrue(body.contains("\"txn_index_empty\":true"), body);
    }
}
