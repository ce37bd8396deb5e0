package io.github.kafkatieredsidecar.plugin;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.Optional;

import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;

/**
 * The members of Kafka's storage API that newer brokers have and Kafka 3.9 lacks. The plugin is
 * compiled against Kafka 4.x but loads on 3.9 brokers too, so it never names these members
 * directly (a direct reference fails class verification or the call on 3.9); they are looked up
 * once, here, and used when present.
 *
 * <ul>
 *   <li>{@code RetriableRemoteStorageException} (4.0+): Kafka retries the copy and deletes nothing
 *       locally. Kafka 3.9 retries on any {@link RemoteStorageException}, so the plain exception
 *       carries the same meaning there.</li>
 *   <li>{@code RemoteLogSegmentMetadata.isTxnIdxEmpty()} (4.0+): absent on 3.9, where the sidecar
 *       takes the transaction index as possibly non-empty (it reads it to find out).</li>
 * </ul>
 */
final class KafkaCompat {

    static final String RETRIABLE_CLASS =
            "org.apache.kafka.server.log.remote.storage.RetriableRemoteStorageException";

    private static final MethodHandle RETRIABLE = retriableConstructor();
    private static final MethodHandle TXN_INDEX_EMPTY = txnIndexEmptyGetter();

    private KafkaCompat() {
    }

    /** Whether this broker's storage API has {@code RetriableRemoteStorageException}. */
    static boolean hasRetriableException() {
        return RETRIABLE != null;
    }

    /** An error Kafka retries: {@code RetriableRemoteStorageException} where it exists. */
    static RemoteStorageException retriable(String message, Throwable cause) {
        if (RETRIABLE != null) {
            try {
                return (RemoteStorageException) RETRIABLE.invoke(message, cause);
            } catch (RuntimeException | Error e) {
                throw e;
            } catch (Throwable e) {
                // the constructor declares no checked exception; keep the original error's meaning
            }
        }
        return new RemoteStorageException(message, cause);
    }

    /** {@code metadata.isTxnIdxEmpty()}, or empty on brokers without it. */
    static Optional<Boolean> txnIndexEmpty(RemoteLogSegmentMetadata metadata) {
        if (TXN_INDEX_EMPTY == null) {
            return Optional.empty();
        }
        try {
            return Optional.of((boolean) TXN_INDEX_EMPTY.invoke(metadata));
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable e) {
            return Optional.empty();
        }
    }

    private static MethodHandle retriableConstructor() {
        try {
            Class<?> type = Class.forName(
                    RETRIABLE_CLASS, false, RemoteStorageException.class.getClassLoader());
            return MethodHandles.publicLookup().findConstructor(
                    type, MethodType.methodType(void.class, String.class, Throwable.class));
        } catch (ClassNotFoundException | NoSuchMethodException | IllegalAccessException e) {
            return null;
        }
    }

    private static MethodHandle txnIndexEmptyGetter() {
        try {
            return MethodHandles.publicLookup().findVirtual(
                    RemoteLogSegmentMetadata.class, "isTxnIdxEmpty", MethodType.methodType(boolean.class));
        } catch (NoSuchMethodException | IllegalAccessException e) {
            return null;
        }
    }
}
