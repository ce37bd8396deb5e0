/*
 * Cross-checks sidecar.metadata against Apache Kafka's own remote log metadata serde
 * (org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde,
 * in the kafka-storage jar) and partitioner (RemoteLogMetadataTopicPartitioner).
 *
 * Compile and run with Kafka's jars on the class path:
 *   javac -cp '<libs>/*' -d <out> MetadataSerdeCheck.java
 *   java -cp '<out>:<libs>/*' MetadataSerdeCheck
 *
 * It reads stdin line by line and answers every line with exactly one line on stdout, flushed,
 * so a test can keep one JVM and talk to it request by request:
 *
 *   <hex>                       decode the record value; a line without a space is a value
 *                               -> "OK <fields>\t<toString()>"  or  "ERR <exception>: <message>"
 *   E <fields>                  build the event from <fields> and serialize it with Kafka's serde
 *                               -> "OK <hex>"  or  "ERR ..."
 *   P <topicIdHex> <partition> <numPartitions>
 *                               -> "OK <metadata partition>"
 *
 * <fields> are space-separated key=value pairs; strings and bytes are hex (no escaping needed):
 *   type=segment  topic topicId partition segmentId start end broker maxTs eventTs epochs size
 *                 custom state txnEmpty
 *   type=update   topic topicId partition segmentId broker eventTs custom state
 *   type=delete   topic topicId partition broker eventTs state
 *   type=snapshot segmentId start end broker maxTs eventTs epochs size custom state txnEmpty
 * topic = hex of the UTF-8 name; topicId/segmentId = 32 hex digits (most significant half first);
 * epochs = "epoch:offset,epoch:offset" ascending; custom = hex or "null"; state = numeric id;
 * txnEmpty = true|false. In toString() and error messages, "\" "\n" "\r" "\t" are escaped.
 */

import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogMetadataTopicPartitioner;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogSegmentMetadataSnapshot;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteState;

public final class MetadataSerdeCheck {

    private static final RemoteLogMetadataSerde SERDE = new RemoteLogMetadataSerde();

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        String line;
        while ((line = in.readLine()) != null) {
            String answer;
            try {
                answer = "OK " + handle(line);
            } catch (Throwable t) { // any failure is an answer, never the end of the conversation
                answer = "ERR " + t.getClass().getName() + ": " + escape(String.valueOf(t.getMessage()));
            }
            out.println(answer);
        }
    }

    private static String handle(String line) {
        if (line.startsWith("E ")) {
            return hex(SERDE.serialize(build(parse(line.substring(2)))));
        }
        if (line.startsWith("P ")) {
            String[] parts = line.split(" ");
            TopicIdPartition tp = new TopicIdPartition(uuid(parts[1]), new TopicPartition("ignored", Integer.parseInt(parts[2])));
            return Integer.toString(new RemoteLogMetadataTopicPartitioner(Integer.parseInt(parts[3])).metadataPartition(tp));
        }
        if (line.indexOf(' ') >= 0) {
            throw new IllegalArgumentException("unknown command: " + line);
        }
        RemoteLogMetadata metadata = SERDE.deserialize(unhex(line));
        return fields(metadata) + "\t" + escape(metadata.toString());
    }

    // --- events -> fields --------------------------------------------------------------------

    private static String fields(RemoteLogMetadata metadata) {
        StringBuilder b = new StringBuilder();
        if (metadata instanceof RemoteLogSegmentMetadata m) {
            b.append("type=segment");
            segmentId(b, m.remoteLogSegmentId());
            segment(b, m.startOffset(), m.endOffset(), m.brokerId(), m.maxTimestampMs(), m.eventTimestampMs(),
                    m.segmentLeaderEpochs(), m.segmentSizeInBytes(), m.customMetadata(), m.state(), m.isTxnIdxEmpty());
        } else if (metadata instanceof RemoteLogSegmentMetadataUpdate u) {
            b.append("type=update");
            segmentId(b, u.remoteLogSegmentId());
            b.append(" broker=").append(u.brokerId());
            b.append(" eventTs=").append(u.eventTimestampMs());
            b.append(" custom=").append(custom(u.customMetadata()));
            b.append(" state=").append(u.state().id());
        } else if (metadata instanceof RemotePartitionDeleteMetadata d) {
            b.append("type=delete");
            topicIdPartition(b, d.topicIdPartition());
            b.append(" broker=").append(d.brokerId());
            b.append(" eventTs=").append(d.eventTimestampMs());
            b.append(" state=").append(d.state().id());
        } else if (metadata instanceof RemoteLogSegmentMetadataSnapshot s) {
            b.append("type=snapshot");
            b.append(" segmentId=").append(uuidHex(s.segmentId()));
            segment(b, s.startOffset(), s.endOffset(), s.brokerId(), s.maxTimestampMs(), s.eventTimestampMs(),
                    s.segmentLeaderEpochs(), s.segmentSizeInBytes(), s.customMetadata(), s.state(), s.isTxnIdxEmpty());
        } else {
            throw new IllegalStateException("unexpected event class " + metadata.getClass().getName());
        }
        return b.toString();
    }

    private static void topicIdPartition(StringBuilder b, TopicIdPartition tp) {
        b.append(" topic=").append(hex(tp.topic().getBytes(StandardCharsets.UTF_8)));
        b.append(" topicId=").append(uuidHex(tp.topicId()));
        b.append(" partition=").append(tp.partition());
    }

    private static void segmentId(StringBuilder b, RemoteLogSegmentId id) {
        topicIdPartition(b, id.topicIdPartition());
        b.append(" segmentId=").append(uuidHex(id.id()));
    }

    private static void segment(StringBuilder b, long start, long end, int broker, long maxTs, long eventTs,
                                Map<Integer, Long> epochs, int size, Optional<CustomMetadata> custom,
                                RemoteLogSegmentState state, boolean txnEmpty) {
        b.append(" start=").append(start);
        b.append(" end=").append(end);
        b.append(" broker=").append(broker);
        b.append(" maxTs=").append(maxTs);
        b.append(" eventTs=").append(eventTs);
        StringBuilder e = new StringBuilder();
        for (Map.Entry<Integer, Long> entry : new TreeMap<>(epochs).entrySet()) {
            if (e.length() > 0) e.append(',');
            e.append(entry.getKey()).append(':').append(entry.getValue());
        }
        b.append(" epochs=").append(e);
        b.append(" size=").append(size);
        b.append(" custom=").append(custom(custom));
        b.append(" state=").append(state.id());
        b.append(" txnEmpty=").append(txnEmpty);
    }

    private static String custom(Optional<CustomMetadata> custom) {
        return custom.map(c -> hex(c.value())).orElse("null");
    }

    // --- fields -> events --------------------------------------------------------------------

    private static Map<String, String> parse(String text) {
        Map<String, String> fields = new HashMap<>();
        for (String pair : text.split(" ")) {
            int eq = pair.indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("not key=value: " + pair);
            fields.put(pair.substring(0, eq), pair.substring(eq + 1));
        }
        return fields;
    }

    private static RemoteLogMetadata build(Map<String, String> f) {
        String type = get(f, "type");
        switch (type) {
            case "segment":
                return new RemoteLogSegmentMetadata(remoteLogSegmentId(f), lng(f, "start"), lng(f, "end"),
                        lng(f, "maxTs"), integer(f, "broker"), lng(f, "eventTs"), integer(f, "size"),
                        customMetadata(f), segmentState(f), epochs(f), Boolean.parseBoolean(get(f, "txnEmpty")));
            case "update":
                return new RemoteLogSegmentMetadataUpdate(remoteLogSegmentId(f), lng(f, "eventTs"),
                        customMetadata(f), segmentState(f), integer(f, "broker"));
            case "delete":
                return new RemotePartitionDeleteMetadata(topicIdPartition(f),
                        RemotePartitionDeleteState.forId(Byte.parseByte(get(f, "state"))),
                        lng(f, "eventTs"), integer(f, "broker"));
            case "snapshot":
                return new RemoteLogSegmentMetadataSnapshot(uuid(get(f, "segmentId")), lng(f, "start"),
                        lng(f, "end"), lng(f, "maxTs"), integer(f, "broker"), lng(f, "eventTs"),
                        integer(f, "size"), customMetadata(f), segmentState(f), epochs(f),
                        Boolean.parseBoolean(get(f, "txnEmpty")));
            default:
                throw new IllegalArgumentException("unknown type " + type);
        }
    }

    private static TopicIdPartition topicIdPartition(Map<String, String> f) {
        String topic = new String(unhex(get(f, "topic")), StandardCharsets.UTF_8);
        return new TopicIdPartition(uuid(get(f, "topicId")), new TopicPartition(topic, integer(f, "partition")));
    }

    private static RemoteLogSegmentId remoteLogSegmentId(Map<String, String> f) {
        return new RemoteLogSegmentId(topicIdPartition(f), uuid(get(f, "segmentId")));
    }

    private static Optional<CustomMetadata> customMetadata(Map<String, String> f) {
        String custom = get(f, "custom");
        return custom.equals("null") ? Optional.empty() : Optional.of(new CustomMetadata(unhex(custom)));
    }

    private static RemoteLogSegmentState segmentState(Map<String, String> f) {
        return RemoteLogSegmentState.forId(Byte.parseByte(get(f, "state")));
    }

    private static Map<Integer, Long> epochs(Map<String, String> f) {
        Map<Integer, Long> epochs = new TreeMap<>();
        String text = get(f, "epochs");
        if (!text.isEmpty()) {
            for (String pair : text.split(",")) {
                String[] kv = pair.split(":");
                epochs.put(Integer.parseInt(kv[0]), Long.parseLong(kv[1]));
            }
        }
        return epochs;
    }

    private static String get(Map<String, String> f, String key) {
        String value = f.get(key);
        if (value == null) throw new IllegalArgumentException("missing field " + key);
        return value;
    }

    private static long lng(Map<String, String> f, String key) {
        return Long.parseLong(get(f, key));
    }

    private static int integer(Map<String, String> f, String key) {
        return Integer.parseInt(get(f, key));
    }

    // --- text helpers ------------------------------------------------------------------------

    private static Uuid uuid(String hex32) {
        return new Uuid(Long.parseUnsignedLong(hex32.substring(0, 16), 16),
                        Long.parseUnsignedLong(hex32.substring(16, 32), 16));
    }

    private static String uuidHex(Uuid id) {
        return String.format("%016x%016x", id.getMostSignificantBits(), id.getLeastSignificantBits());
    }

    private static String hex(byte[] bytes) {
        StringBuilder b = new StringBuilder(bytes.length * 2);
        for (byte x : bytes) b.append(String.format("%02x", x));
        return b.toString();
    }

    private static byte[] unhex(String hex) {
        if (hex.length() % 2 != 0) throw new IllegalArgumentException("odd hex length");
        byte[] out = new byte[hex.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    private static String escape(String text) {
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t");
    }
}
