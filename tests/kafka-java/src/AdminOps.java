// The Java Admin client's side of the driver (tests/kafka-java/src/Driver.java): one "admin"
// request runs the steps a topic's life takes through org.apache.kafka.clients.admin.Admin,
// unmodified, each step observed on its own within "seconds" (a step that fails is
// {"error": "ExceptionClass"}, and the steps after it still run):
//
//   create        createTopics(topic: 2 partitions, replication 1, retention.ms=3600000)
//   again         the same once more (TopicExistsException)
//   listed        whether listTopics() names the topic
//   described     describeTopics: the partitions, each one's replicas and ISR counts
//   grown         createPartitions(3), then the partition count describeTopics sees
//   configs       describeConfigs(topic): retention.ms, max.message.bytes, cleanup.policy
//                 as [value, source, isDefault, readOnly]
//   altered       incrementalAlterConfigs: SET retention.ms=7200000, DELETE max.message.bytes,
//                 then retention.ms and max.message.bytes as describeConfigs shows them
//   records       6 records produced to partition 0, deleteRecords before offset 2: the low
//                 watermark, then beginningOffsets
//   cluster       describeCluster: the node count, whether the controller is one of them
//   log dirs      describeLogDirs of every node: the topic's partitions found
//   groups        a group (a consumer commits offset 4 of partition 0, leaves): listGroups
//                 names it, listConsumerGroupOffsets, deleteConsumerGroupOffsets, then the
//                 offsets left, deleteConsumerGroups
//   deleted       deleteTopics, then whether listTopics still names it
import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.ByteArraySerializer;

final class AdminOps {
    private AdminOps() {}

    static Object admin(JsonNode r) throws Exception {
        String topic = r.path("topic").asText();
        String group = topic + "-group";
        long timeout = (long) (r.path("seconds").asDouble(10) * 1000);
        Properties p = Driver.common(r);
        p.put("request.timeout.ms", String.valueOf(timeout / 2));
        p.put("default.api.timeout.ms", String.valueOf(timeout));
        Map<String, Object> seen = new LinkedHashMap<>();
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        try (Admin admin = Admin.create(p)) {
            NewTopic wanted = new NewTopic(topic, 2, (short) 1).configs(Map.of("retention.ms", "3600000"));
            step(seen, "create", () -> { admin.createTopics(List.of(wanted)).all().get(); return "ok"; });
            step(seen, "again", () -> { admin.createTopics(List.of(wanted)).all().get(); return "ok"; });
            step(seen, "listed", () -> admin.listTopics().names().get().contains(topic));
            step(seen, "described", () -> partitions(admin, topic));
            step(seen, "grown", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get();
                long end = System.nanoTime() + timeout * 1_000_000;  // Kafka's broker has them once its metadata does
                while (partitions(admin, topic).size() < 3 && System.nanoTime() < end) Thread.sleep(50);
                return partitions(admin, topic).size();
            });
            step(seen, "configs", () -> configs(admin, resource, "retention.ms", "max.message.bytes", "cleanup.policy"));
            step(seen, "altered", () -> {
                admin.incrementalAlterConfigs(Map.of(resource, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("max.message.bytes", ""), AlterConfigOp.OpType.DELETE)))).all().get();
                return configs(admin, resource, "retention.ms", "max.message.bytes");
            });
            TopicPartition first = new TopicPartition(topic, 0);
            step(seen, "records", () -> {
                produce(r, topic, 6, timeout);
                long low = admin.deleteRecords(Map.of(first, RecordsToDelete.beforeOffset(2))).lowWatermarks().get(first).get().lowWatermark();
                try (KafkaConsumer<byte[], byte[]> consumer = Driver.consumer(r, null)) {
                    return List.of(low, consumer.beginningOffsets(List.of(first), java.time.Duration.ofMillis(timeout)).get(first));
                }
            });
            step(seen, "cluster", () -> {
                DescribeClusterResult cluster = admin.describeCluster();
                Collection<Node> nodes = cluster.nodes().get();
                return List.of(nodes.size(), nodes.contains(cluster.controller().get()));
            });
            step(seen, "log dirs", () -> {
                List<Integer> ids = new ArrayList<>();
                for (Node n : admin.describeCluster().nodes().get()) ids.add(n.id());
                Set<Integer> found = new java.util.TreeSet<>();
                for (Map<String, LogDirDescription> dirs : admin.describeLogDirs(ids).allDescriptions().get().values()) {
                    for (LogDirDescription dir : dirs.values()) {
                        for (TopicPartition tp : dir.replicaInfos().keySet()) {
                            if (tp.topic().equals(topic)) found.add(tp.partition());
                        }
                    }
                }
                return found;
            });
            step(seen, "groups", () -> {
                try (KafkaConsumer<byte[], byte[]> consumer = Driver.consumer(r, group)) {
                    consumer.commitSync(Map.of(first, new OffsetAndMetadata(4)), java.time.Duration.ofMillis(timeout));
                }
                Map<String, Object> g = new LinkedHashMap<>();
                List<String> listed = new ArrayList<>();
                for (GroupListing l : admin.listGroups().all().get()) listed.add(l.groupId());
                g.put("listed", listed.contains(group));
                g.put("offsets", committed(admin, group));
                admin.deleteConsumerGroupOffsets(group, Set.of(first)).all().get();
                g.put("after delete-offsets", committed(admin, group));
                admin.deleteConsumerGroups(List.of(group)).all().get();
                return g;
            });
            step(seen, "deleted", () -> {
                admin.deleteTopics(List.of(topic)).all().get();
                return admin.listTopics().names().get().contains(topic);
            });
        }
        return seen;
    }

    interface Step {
        Object run() throws Exception;
    }

    static void step(Map<String, Object> seen, String name, Step step) {
        try {
            seen.put(name, step.run());
        } catch (Exception e) {
            Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            seen.put(name, Map.of("error", cause.getClass().getSimpleName()));
        }
    }

    static List<List<Integer>> partitions(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<List<Integer>> out = new ArrayList<>();
        d.partitions().forEach(info -> out.add(List.of(info.partition(), info.replicas().size(), info.isr().size())));
        return out;
    }

    static Map<String, Object> configs(Admin admin, ConfigResource resource, String... names) throws Exception {
        Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
        Map<String, Object> out = new LinkedHashMap<>();
        for (String name : names) {
            ConfigEntry e = config.get(name);
            out.put(name, e == null ? null : List.of(String.valueOf(e.value()), e.source().name(), e.isDefault(), e.isReadOnly()));
        }
        return out;
    }

    static Map<String, Long> committed(Admin admin, String group) throws Exception {
        Map<String, Long> out = new java.util.TreeMap<>();
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                .forEach((tp, o) -> out.put(tp.toString(), o == null ? null : o.offset()));
        return out;
    }

    static void produce(JsonNode r, String topic, int count, long timeout) throws Exception {
        Properties p = Driver.common(r);
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("acks", "all");
        p.put("max.block.ms", String.valueOf(timeout / 2));
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, 0, null, ("v" + i).getBytes())).get(timeout, TimeUnit.MILLISECONDS);
            }
        }
    }
}
