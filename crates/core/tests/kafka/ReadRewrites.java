// Reads the batches `batch::rewrite` wrote (the ignored test
// `batch::rewrite::tests::write_batches_for_kafkas_reader`) with Kafka's own code: the client's
// batch reader (CRC, codec) and the broker's produce validation (LogValidator: decompression,
// record framing, offsets 0..n-1 against the record count, CreateTime, kept as written rather
// than rebuilt), then compares each record with what the Rust side wrote next to the batch
// (`<name>.expect`).
//
//   MF_REWRITE_DIR=/tmp/rewrites cargo test -p mirrorflow-core --lib write_batches_for_kafkas_reader -- --ignored
//   java -cp "$KAFKA_HOME/lib/*" crates/core/tests/kafka/ReadRewrites.java /tmp/rewrites
//
// Written for Kafka 4.3's internal classes (org.apache.kafka.common.record.internal,
// org.apache.kafka.storage.internals.log.LogValidator): other versions may need other names.

import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.record.internal.MemoryRecords;
import org.apache.kafka.common.record.internal.MutableRecordBatch;
import org.apache.kafka.common.record.internal.Record;
import org.apache.kafka.common.utils.BufferSupplier;
import org.apache.kafka.common.utils.PrimitiveRef;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.storage.internals.log.AppendOrigin;
import org.apache.kafka.storage.internals.log.LogValidator;

public class ReadRewrites {
    public static void main(String[] args) throws Exception {
        List<Path> files = new ArrayList<>();
        try (var s = Files.list(Path.of(args[0]))) {
            s.filter(p -> p.toString().endsWith(".batch")).sorted().forEach(files::add);
        }
        if (files.isEmpty()) throw new IllegalStateException("no batches in " + args[0]);
        for (Path file : files) check(file);
        System.out.println(files.size() + " batches read and validated as a broker does");
    }

    static void check(Path file) throws Exception {
        String name = file.getFileName().toString();
        String codec = name.substring(0, name.indexOf('-'));
        MemoryRecords records = MemoryRecords.readableRecords(ByteBuffer.wrap(Files.readAllBytes(file)));
        MutableRecordBatch batch = records.batches().iterator().next();
        batch.ensureValid();
        if (!batch.compressionType().name.equals(codec))
            throw new IllegalStateException(name + ": codec " + batch.compressionType().name);
        var validator = new LogValidator(records, new TopicPartition("t", 0), Time.SYSTEM,
            batch.compressionType(), Compression.of(batch.compressionType()).build(), false,
            (byte) 2, TimestampType.CREATE_TIME, Long.MAX_VALUE, Long.MAX_VALUE, 0, AppendOrigin.CLIENT);
        var result = validator.validateMessagesAndAssignOffsets(PrimitiveRef.ofLong(0), new NoMetrics(),
            BufferSupplier.create());
        // A batch whose offsets or codec a broker cannot keep is rebuilt (recompressed) by it.
        if (result.messageSizeMaybeChanged())
            throw new IllegalStateException(name + ": the broker would rebuild the batch");
        StringBuilder got = new StringBuilder();
        for (MutableRecordBatch b : result.validatedRecords().batches()) {
            if (b.timestampType() != TimestampType.CREATE_TIME) throw new IllegalStateException(name + ": not CreateTime");
            for (Record r : b) got.append(line(r));
        }
        String want = Files.readString(Path.of(file.toString().replace(".batch", ".expect")));
        if (!got.toString().equals(want))
            throw new IllegalStateException(name + ": records differ\n got: " + got + "\nwant: " + want);
        System.out.println(name + ": " + batch.countOrNull() + " records, " + codec + ", "
            + Files.size(file) + " bytes: ok");
    }

    static String line(Record r) {
        StringBuilder s = new StringBuilder();
        s.append(r.offset()).append(' ').append(r.timestamp()).append(' ')
            .append(hex(r.hasKey() ? r.key() : null)).append(' ')
            .append(hex(r.hasValue() ? r.value() : null));
        for (Header h : r.headers()) {
            s.append(' ').append(HexFormat.of().formatHex(h.key().getBytes(java.nio.charset.StandardCharsets.UTF_8)))
                .append('=').append(h.value() == null ? "-" : HexFormat.of().formatHex(h.value()));
        }
        return s.append('\n').toString();
    }

    static String hex(ByteBuffer b) {
        if (b == null) return "-";
        byte[] a = new byte[b.remaining()];
        b.duplicate().get(a);
        return HexFormat.of().formatHex(a);
    }

    static class NoMetrics implements LogValidator.MetricsRecorder {
        public void recordInvalidMagic() {}
        public void recordInvalidOffset() {}
        public void recordInvalidSequence() {}
        public void recordInvalidChecksums() {}
        public void recordNoKeyCompactedTopic() {}
    }
}
