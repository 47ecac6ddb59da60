import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.RemoteClusterUtils;

/**
 * What MirrorMaker 2's client library says a consumer group should resume at on this cluster:
 * RemoteClusterUtils.translateOffsets over the checkpoints of a remote (source) cluster alias.
 *
 * Usage: TranslateOffsets BOOTSTRAP REMOTE_ALIAS GROUP [GROUP...] [--prop KEY=VALUE]...
 * (--prop passes client or replication-policy settings, e.g. replication.policy.separator=_).
 * Prints one JSON object: {"remote":"A","groups":[{"group":"g","partitions":[{"topic":"A.t",
 * "partition":0,"offset":12,"metadata":""}]}]}, partitions sorted by topic and partition.
 */
public final class TranslateOffsets {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: TranslateOffsets BOOTSTRAP REMOTE_ALIAS GROUP [GROUP...] [--prop KEY=VALUE]...");
            System.exit(2);
        }
        Map<String, Object> props = new HashMap<>();
        props.put("bootstrap.servers", args[0]);
        String remote = args[1];
        List<String> groups = new ArrayList<>();
        for (int i = 2; i < args.length; i++) {
            if (args[i].equals("--prop") && i + 1 < args.length) {
                String[] kv = args[++i].split("=", 2);
                props.put(kv[0], kv.length > 1 ? kv[1] : "");
            } else {
                groups.add(args[i]);
            }
        }
        StringBuilder out = new StringBuilder();
        out.append("{\"remote\":").append(quote(remote)).append(",\"groups\":[");
        for (int g = 0; g < groups.size(); g++) {
            Map<TopicPartition, OffsetAndMetadata> offsets =
                RemoteClusterUtils.translateOffsets(props, remote, groups.get(g), Duration.ofSeconds(30));
            List<TopicPartition> tps = new ArrayList<>(offsets.keySet());
            tps.sort((a, b) -> a.topic().equals(b.topic())
                ? Integer.compare(a.partition(), b.partition()) : a.topic().compareTo(b.topic()));
            if (g > 0) out.append(',');
            out.append("{\"group\":").append(quote(groups.get(g))).append(",\"partitions\":[");
            for (int i = 0; i < tps.size(); i++) {
                OffsetAndMetadata om = offsets.get(tps.get(i));
                if (i > 0) out.append(',');
                out.append("{\"topic\":").append(quote(tps.get(i).topic()))
                    .append(",\"partition\":").append(tps.get(i).partition())
                    .append(",\"offset\":").append(om.offset())
                    .append(",\"metadata\":").append(quote(om.metadata() == null ? "" : om.metadata()))
                    .append('}');
            }
            out.append("]}");
        }
        out.append("]}");
        System.out.println(out);
    }

    private static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
