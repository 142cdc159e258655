// Drives the Java reference client (org.apache.kafka:kafka-clients), unmodified, for the JSON
// requests of tests/goclients/drive (one a line on stdin, one JSON observation a line on
// stdout; keys, values and header values as base64), so that one JVM serves a test session:
//
//   produce  records to topic/partition through one KafkaProducer (idempotent as asked,
//            acks=all), flushed: {"offsets", "errors"}, each record's delivery offset
//   consume  assign() the partition, then seekToBeginning ("earliest"), seekToEnd
//            ("latest"), seek ({"offset": N}) or seek to offsetsForTimes ({"timestamp": T});
//            poll until count records and quiet seconds more: {"records"}
//   group    subscribe() as a member of group, read count records one poll at a time,
//            commitSync(record.offset() + 1) of the last, close (leave): {"records", "committed"}
//   offsets  beginningOffsets, endOffsets and, with timestamp, offsetsForTimes: {"earliest",
//            "latest", "timestamp"} (null where no record is stamped at or after it)
//   watch    assign() the partition and seekToBeginning (how "assign"), or subscribe() as a
//            member of group (how "group", nothing committed); poll until count records and
//            quiet seconds more, or seconds, or until a file progress + ".stop" is there, a line appended to the file progress as each
//            record comes: {"records", "errors"}, the class names of the exceptions poll
//            threw, each once, in the order they first came
//   admin    a topic's life through the Admin client, step by step (AdminOps.java)
//
// A request that fails is answered {"error": "ExceptionClass: message"}; the JVM goes on.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class Driver {
    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            Object answer;
            try {
                answer = handle(JSON.readTree(line));
            } catch (Exception e) {
                Throwable cause = e.getCause() != null && e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
                answer = Map.of("error", cause.getClass().getSimpleName() + ": " + cause.getMessage());
            }
            System.out.println(JSON.writeValueAsString(answer));
            System.out.flush();
        }
    }

    static Object handle(JsonNode r) throws Exception {
        switch (r.path("op").asText()) {
            case "produce": return produce(r);
            case "consume": return consume(r);
            case "group": return group(r);
            case "offsets": return offsets(r);
            case "watch": return watch(r);
            case "admin": return AdminOps.admin(r);
            default: throw new IllegalArgumentException("no op " + r.path("op"));
        }
    }

    static byte[] raw(JsonNode text) {
        return text == null || text.isNull() ? null : Base64.getDecoder().decode(text.asText());
    }

    static String b64(byte[] data) {
        return data == null ? null : Base64.getEncoder().encodeToString(data);
    }

    static Duration timeout(JsonNode r) {
        return Duration.ofMillis((long) (r.path("timeout").asDouble(15) * 1000));
    }

    static Properties common(JsonNode r) {
        Properties p = new Properties();
        p.put("bootstrap.servers", r.path("bootstrap").asText());
        p.put("request.timeout.ms", "10000");
        secured(p, r.path("security"));
        return p;
    }

    /** A request's "security" ({protocol, ca, keystore, mechanism, user, password}) as the client's settings. */
    static void secured(Properties p, JsonNode s) {
        if (s.isMissingNode()) {
            return;
        }
        p.put("security.protocol", s.path("protocol").asText());
        if (s.has("ca")) {
            p.put("ssl.truststore.type", "PEM");
            p.put("ssl.truststore.location", s.path("ca").asText());
        }
        if (s.has("keystore")) {
            p.put("ssl.keystore.type", "PEM");
            p.put("ssl.keystore.location", s.path("keystore").asText());
        }
        if (s.has("mechanism")) {
            String mechanism = s.path("mechanism").asText();
            String module = mechanism.equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                    : "org.apache.kafka.common.security.scram.ScramLoginModule";
            p.put("sasl.mechanism", mechanism);
            p.put("sasl.jaas.config", module + " required username=\"" + s.path("user").asText() + "\" password=\""
                    + s.path("password").asText() + "\";");
        }
    }

    static Object produce(JsonNode r) throws Exception {
        Properties p = common(r);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("acks", "all");
        p.put("enable.idempotence", String.valueOf(r.path("idempotent").asBoolean(false)));
        p.put("compression.type", r.path("compression").asText("none").isEmpty() ? "none" : r.path("compression").asText("none"));
        p.put("linger.ms", "50");
        p.put("max.block.ms", "10000");
        p.put("delivery.timeout.ms", String.valueOf(Math.max(timeout(r).toMillis(), 10_050)));
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (JsonNode record : r.path("records")) {
                List<Header> headers = new ArrayList<>();
                for (JsonNode h : record.path("headers")) {
                    headers.add(new RecordHeader(h.get(0).asText(), raw(h.get(1))));
                }
                sent.add(producer.send(new ProducerRecord<>(r.path("topic").asText(), r.path("partition").asInt(0),
                        record.path("timestamp").asLong(), raw(record.get("key")), raw(record.get("value")), headers)));
            }
            producer.flush();
        }
        List<Long> offsets = new ArrayList<>();
        List<String> errors = new ArrayList<>();
        for (Future<RecordMetadata> f : sent) {
            try {
                offsets.add(f.get().offset());
                errors.add(null);
            } catch (java.util.concurrent.ExecutionException e) {
                offsets.add(null);
                errors.add(e.getCause().getClass().getSimpleName());
            }
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("offsets", offsets);
        answer.put("errors", errors);
        return answer;
    }

    static KafkaConsumer<byte[], byte[]> consumer(JsonNode r, String group) {
        Properties p = common(r);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("fetch.max.wait.ms", "100");
        p.put("auto.offset.reset", "earliest");
        if (group != null) {
            p.put("group.id", group);
            p.put("max.poll.records", "1");
            p.put("session.timeout.ms", "10000");
            p.put("heartbeat.interval.ms", "1000");
        }
        return new KafkaConsumer<>(p);
    }

    static Map<String, Object> record(ConsumerRecord<byte[], byte[]> m) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("offset", m.offset());
        out.put("key", b64(m.key()));
        out.put("value", b64(m.value()));
        List<List<String>> headers = new ArrayList<>();
        for (Header h : m.headers()) {
            headers.add(java.util.Arrays.asList(h.key(), h.value() == null ? "" : b64(h.value())));
        }
        out.put("headers", headers);
        out.put("timestamp", m.timestamp());
        return out;
    }

    /** Polls until count records have come and quiet more passed, or the deadline; the last record read kept in last[0]. */
    static List<Map<String, Object>> read(KafkaConsumer<byte[], byte[]> consumer, JsonNode r, double quiet,
                                          List<ConsumerRecord<byte[], byte[]>> last) {
        int count = r.path("count").asInt();
        List<Map<String, Object>> got = new ArrayList<>();
        long end = System.nanoTime() + timeout(r).toNanos();
        while (got.size() <= count && System.nanoTime() < end) {
            if (got.size() >= count) {
                if (quiet == 0) break;
                end = Math.min(end, System.nanoTime() + (long) (quiet * 1e9));
            }
            for (ConsumerRecord<byte[], byte[]> m : consumer.poll(Duration.ofMillis(100))) {
                got.add(record(m));
                last.clear();
                last.add(m);
            }
        }
        return got;
    }

    static Object consume(JsonNode r) {
        TopicPartition tp = new TopicPartition(r.path("topic").asText(), r.path("partition").asInt(0));
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(r, null)) {
            consumer.assign(List.of(tp));
            JsonNode start = r.path("start");
            if (start.isTextual() && start.asText().equals("earliest")) {
                consumer.seekToBeginning(List.of(tp));
            } else if (start.isTextual() && start.asText().equals("latest")) {
                consumer.seekToEnd(List.of(tp));
            } else if (start.has("offset")) {
                consumer.seek(tp, start.path("offset").asLong());
            } else if (start.has("timestamp")) {
                OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(tp, start.path("timestamp").asLong()), timeout(r)).get(tp);
                if (found == null) {
                    consumer.seekToEnd(List.of(tp));
                } else {
                    consumer.seek(tp, found.offset());
                }
            } else {
                throw new IllegalArgumentException("no start " + start);
            }
            return Map.of("records", read(consumer, r, r.path("quiet").asDouble(0), new ArrayList<>()));
        }
    }

    static Object group(JsonNode r) {
        List<ConsumerRecord<byte[], byte[]>> last = new ArrayList<>();
        Map<String, Object> answer = new LinkedHashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(r, r.path("group").asText())) {
            consumer.subscribe(List.of(r.path("topic").asText()));
            answer.put("records", read(consumer, r, 0, last));
            Long committed = null;
            if (!last.isEmpty()) {
                ConsumerRecord<byte[], byte[]> m = last.get(0);
                committed = m.offset() + 1;
                consumer.commitSync(Map.of(new TopicPartition(m.topic(), m.partition()), new OffsetAndMetadata(committed)), timeout(r));
            }
            answer.put("committed", committed);
        }
        return answer;
    }

    static Object offsets(JsonNode r) {
        TopicPartition tp = new TopicPartition(r.path("topic").asText(), r.path("partition").asInt(0));
        Map<String, Object> answer = new LinkedHashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(r, null)) {
            answer.put("earliest", consumer.beginningOffsets(List.of(tp), timeout(r)).get(tp));
            answer.put("latest", consumer.endOffsets(List.of(tp), timeout(r)).get(tp));
            if (r.hasNonNull("timestamp")) {
                OffsetAndTimestamp found = consumer.offsetsForTimes(Map.of(tp, r.path("timestamp").asLong()), timeout(r)).get(tp);
                answer.put("timestamp", found == null ? null : found.offset());
            }
        }
        return answer;
    }

    static Object watch(JsonNode r) throws Exception {
        boolean group = r.path("how").asText().equals("group");
        int count = r.path("count").asInt();
        double quiet = r.path("quiet").asDouble(0);
        List<Map<String, Object>> got = new ArrayList<>();
        List<String> errors = new ArrayList<>();
        java.nio.file.Path progress = java.nio.file.Path.of(r.path("progress").asText());
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(r, group ? r.path("group").asText() : null);
             java.io.OutputStream lines = java.nio.file.Files.newOutputStream(progress, java.nio.file.StandardOpenOption.CREATE,
                     java.nio.file.StandardOpenOption.APPEND)) {
            if (group) {
                consumer.subscribe(List.of(r.path("topic").asText()));
            } else {
                TopicPartition tp = new TopicPartition(r.path("topic").asText(), r.path("partition").asInt(0));
                consumer.assign(List.of(tp));
                consumer.seekToBeginning(List.of(tp));
            }
            long end = System.nanoTime() + (long) (r.path("seconds").asDouble() * 1e9);
            java.nio.file.Path stop = java.nio.file.Path.of(r.path("progress").asText() + ".stop");
            while (got.size() <= count && System.nanoTime() < end && !java.nio.file.Files.exists(stop)) {
                if (got.size() >= count) {
                    end = Math.min(end, System.nanoTime() + (long) (quiet * 1e9));
                }
                try {
                    for (ConsumerRecord<byte[], byte[]> m : consumer.poll(Duration.ofMillis(100))) {
                        got.add(record(m));
                        lines.write('\n');
                        lines.flush();
                    }
                } catch (org.apache.kafka.common.KafkaException e) {
                    if (!errors.contains(e.getClass().getSimpleName())) {
                        errors.add(e.getClass().getSimpleName());
                    }
                    Thread.sleep(50);
                }
            }
        }
        Map<String, Object> answer = new LinkedHashMap<>();
        answer.put("records", got);
        answer.put("errors", errors);
        return answer;
    }
}
