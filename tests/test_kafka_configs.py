"""``kl serve --kafka`` showing and changing topics' configs under Kafka's names:
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs and CreateTopics' configs (raw
requests, kafka-python's ``KafkaAdminClient``, confluent-kafka's ``AdminClient``)."""

from __future__ import annotations

import os

import confluent_kafka.admin as confluent_admin
import kafka.admin as kafka_admin
import pytest
from kafka.protocol.admin.configs import AlterConfigsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kafka.protocol.admin.topics import CreateTopicsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from test_kafka_admin import creatable

import kl
from kl.log.config import CONFIG_FILE
from kl.log.kafka_config import BY_NAME, LONG_MAX, kafka_configs, with_kafka_configs
from kl.net.kafka import errors as kafka_errors

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = range(4)
HOUR = 3_600_000


def describe(client, *resources, synonyms=False, documentation=False, version=4):
    """(type, name, keys) resources -> [(error code, message, {name: config})]."""
    asked = [DescribeConfigsRequest.DescribeConfigsResource(resource_type=t, resource_name=n, configuration_keys=k)
             for t, n, k in resources]  # fmt: skip
    answer = client.call(
        DescribeConfigsRequest, version, resources=asked, include_synonyms=synonyms, include_documentation=documentation
    )
    return [(r.error_code, r.error_message, {c.name: c for c in r.configs}) for r in answer.results]


def topic_configs(client, topic: str, **kw) -> dict:
    ((code, text, configs),) = describe(client, (TOPIC, topic, None), **kw)
    assert code == 0, text
    return configs


def incremental(client, *resources, validate_only=False):
    """(type, name, [(name, op, value)]) resources -> [(error code, message)]."""
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    asked = [resource(resource_type=t, resource_name=n, configs=[resource.AlterableConfig(name=k, config_operation=op, value=v)
                                                                  for k, op, v in changes])
             for t, n, changes in resources]  # fmt: skip
    answer = client.call(IncrementalAlterConfigsRequest, 1, resources=asked, validate_only=validate_only)
    return [(r.error_code, r.error_message) for r in answer.responses]


def replace(client, topic: str, configs: dict, validate_only=False):
    """An AlterConfigs of one topic: (error code, message)."""
    resource = AlterConfigsRequest.AlterConfigsResource
    changes = [resource.AlterableConfig(name=k, value=v) for k, v in configs.items()]
    asked = [resource(resource_type=TOPIC, resource_name=topic, configs=changes)]
    (answer,) = client.call(AlterConfigsRequest, 2, resources=asked, validate_only=validate_only).responses
    return answer.error_code, answer.error_message


def test_describe_configs_shows_a_topics_settings_under_kafkas_names_with_sources_synonyms_and_types(served, root):
    root.create_topic("t", kl.TopicConfig(retention_ms=HOUR, flush_ms=0, retention_bytes=5 << 20))
    _, client = served()
    configs = topic_configs(client, "t", synonyms=True, documentation=True)
    values = {name: c.value for name, c in configs.items()}
    assert values == {
        "cleanup.policy": "delete",
        "compression.type": "uncompressed",
        "flush.messages": str(LONG_MAX),  # kl's 0: never
        "flush.ms": str(LONG_MAX),
        "follower.replication.throttled.replicas": "",  # no replica follows
        "leader.replication.throttled.replicas": "",
        "max.message.bytes": "1048576",
        "message.timestamp.type": "CreateTime",
        "min.insync.replicas": "1",
        "preallocate": "false",
        "remote.storage.enable": "false",
        "retention.bytes": str(5 << 20),
        "retention.ms": str(HOUR),
        "segment.bytes": str(1 << 30),
        "segment.ms": str(LONG_MAX),
        "unclean.leader.election.enable": "false",
    }
    retention = configs["retention.ms"]
    assert (retention.config_source, retention.read_only, retention.is_sensitive) == (1, False, False)  # is_default: v0's
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("retention.ms", str(HOUR), 1),
        ("log.retention.ms", "604800000", 5),
    ]
    assert retention.config_type == 5 and "milliseconds" in retention.documentation
    segment = configs["segment.bytes"]
    assert (segment.config_source, segment.config_type) == (5, 3)
    assert [(s.name, s.source) for s in segment.synonyms] == [("log.segment.bytes", 5)]
    assert configs["compression.type"].read_only and not configs["cleanup.policy"].read_only
    plain = topic_configs(client, "t")  # without synonyms and documentation
    assert plain["retention.ms"].synonyms == [] and plain["retention.ms"].documentation is None
    old = topic_configs(client, "t", version=1)
    assert old["retention.ms"].value == str(HOUR) and old["retention.ms"].config_source == 1

    (only, none) = describe(client, (TOPIC, "t", ["retention.bytes", "no.such.config"]), (TOPIC, "t", []))
    assert list(only[2]) == ["retention.bytes"] and none[2].keys() == values.keys()  # no keys: all, as Kafka answers
    missing, bad_type = describe(client, (TOPIC, "nope", None), (8, "1", None))
    assert missing[:1] == (kafka_errors.UNKNOWN_TOPIC_OR_PARTITION,) and missing[2] == {}
    assert bad_type[0] == kafka_errors.INVALID_REQUEST and bad_type[1]


def test_describe_configs_of_the_broker_shows_the_daemons_options_read_only(served, root):
    os.makedirs(root.path)
    _, client = served(default_partitions=3, auto_create=True)
    (node,) = client.call(MetadataRequest, 12, topics=[], allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False).brokers  # fmt: skip
    ((code, text, configs), (default_code, _, defaults), (other, other_text, _)) = describe(
        client, (BROKER, str(node.node_id), None), (BROKER, "", None), (BROKER, str(node.node_id + 1), None)
    )
    assert code == 0, text
    assert {n: configs[n].value for n in ("broker.id", "num.partitions", "auto.create.topics.enable", "socket.request.max.bytes",
                                          "log.retention.ms", "log.flush.interval.messages", "message.max.bytes")} == {
        "broker.id": str(node.node_id), "num.partitions": "3", "auto.create.topics.enable": "true",
        "socket.request.max.bytes": str(1 << 20), "log.retention.ms": "604800000",
        "log.flush.interval.messages": str(LONG_MAX), "message.max.bytes": "1048576"}  # fmt: skip
    assert all(c.read_only for c in configs.values())
    assert configs["num.partitions"].config_source == 4 and configs["log.retention.ms"].config_source == 5
    assert (default_code, defaults) == (0, {})  # the cluster's dynamic defaults: none
    assert other == kafka_errors.INVALID_REQUEST and str(node.node_id) in other_text
    ((refused, why),) = incremental(client, (BROKER, str(node.node_id), [("num.partitions", SET, "5")]))
    assert refused == kafka_errors.INVALID_CONFIG and "kl serve" in why
    throttles = [(name, DELETE, None) for name in ("leader.replication.throttled.rate", "follower.replication.throttled.rate")]
    assert incremental(client, (BROKER, str(node.node_id), throttles)) == [(0, None)]  # none set: deleted, no change


def test_incremental_alter_configs_sets_and_deletes_and_refuses_per_resource(served, root):
    for name in ("a", "b"):
        root.create_topic(name)
    b = root.config("b")
    _, client = served(allow_admin=True)
    answers = incremental(
        client,
        (TOPIC, "a", [("retention.ms", SET, str(2 * HOUR)), ("flush.messages", SET, "10"), ("retention.bytes", SET, "-1")]),
        (TOPIC, "b", [("retention.ms", SET, "60000"), ("cleanup.policy", SET, "compact")]),
    )
    assert answers[0] == (0, None)
    assert answers[1][0] == kafka_errors.INVALID_CONFIG and "kl does not compact" in answers[1][1]
    a = root.config("a")
    assert (a.retention_ms, a.flush_messages, a.retention_bytes) == (2 * HOUR, 10, 0)
    assert root.config("b") == b  # untouched: retention.ms too
    assert topic_configs(client, "a")["retention.ms"].config_source == 1

    assert incremental(client, (TOPIC, "a", [("retention.ms", DELETE, None), ("flush.messages", DELETE, None)])) == [(0, None)]
    assert (root.config("a").retention_ms, root.config("a").flush_messages) == (kl.TopicConfig().retention_ms, 0)
    assert topic_configs(client, "a")["retention.ms"].config_source == 5

    refusals = {
        "append to a number": ([("retention.ms", APPEND, "5")], kafka_errors.INVALID_CONFIG, "type is not LIST"),
        "append compact": ([("cleanup.policy", APPEND, "compact")], kafka_errors.INVALID_CONFIG, "kl does not compact"),
        "subtract delete": ([("cleanup.policy", SUBTRACT, "delete")], kafka_errors.INVALID_CONFIG, "cleanup.policy"),
        "read-only": ([("min.insync.replicas", SET, "2")], kafka_errors.POLICY_VIOLATION, "min.insync.replicas=1"),
        "unknown": ([("segment.jitter.ms", SET, "5")], kafka_errors.INVALID_CONFIG, "Unknown topic config name"),
        "out of range": ([("retention.ms", SET, "-2")], kafka_errors.INVALID_CONFIG, "retention.ms"),
        "zero retention": ([("retention.bytes", SET, "0")], kafka_errors.INVALID_CONFIG, "-1 (no limit)"),
        "never by time 0": ([("flush.ms", SET, "0")], kafka_errors.INVALID_CONFIG, "flush.messages=1"),
        "not a number": ([("segment.bytes", SET, "1GB")], kafka_errors.INVALID_CONFIG, "segment.bytes"),
        "past Long.MAX": ([("retention.ms", SET, str(LONG_MAX + 1))], kafka_errors.INVALID_CONFIG, "Not a number of type LONG"),
        "past an int": ([("segment.bytes", SET, str(1 << 31))], kafka_errors.INVALID_CONFIG, "Not a number of type INT"),
        "a null SET": ([("retention.ms", SET, None)], kafka_errors.INVALID_REQUEST, "Null value not supported"),
        "smaller messages": ([("max.message.bytes", SET, "1000")], kafka_errors.POLICY_VIOLATION, "can only grow"),
        "segments below messages": ([("segment.bytes", SET, "1000")], kafka_errors.INVALID_CONFIG,
                                    "segment.bytes (1000) must be at least max.message.bytes"),
        "twice": ([("retention.ms", SET, "1"), ("retention.ms", SET, "2")], kafka_errors.INVALID_REQUEST, "duplicate config"),
    }  # fmt: skip
    before = root.config("a")
    for what, (changes, code, text) in refusals.items():
        ((got, message),) = incremental(client, (TOPIC, "a", changes))
        assert got == code and text in message, what
    assert root.config("a") == before
    # a read-only config given its value, and cleanup.policy=delete, change nothing and are taken
    assert incremental(client, (TOPIC, "a", [("min.insync.replicas", SET, "1"), ("cleanup.policy", APPEND, "delete")])) == [
        (0, None)
    ]
    assert incremental(client, (TOPIC, "nope", [("retention.ms", SET, "1")]))[0][0] == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION


def test_alter_configs_sets_the_whole_config_what_it_does_not_name_back_to_defaults(served, root):
    root.create_topic("t", kl.TopicConfig(retention_ms=HOUR, flush_messages=7))
    _, client = served(allow_admin=True)
    assert replace(client, "t", {"segment.bytes": str(64 << 20)}) == (0, None)
    config = root.config("t")
    assert (config.segment_bytes, config.retention_ms, config.flush_messages) == (64 << 20, kl.TopicConfig().retention_ms, 0)
    code, text = replace(client, "t", {"cleanup.policy": "compact,delete"})
    assert code == kafka_errors.INVALID_CONFIG and "kl does not compact" in text
    assert root.config("t") == config


def test_validate_only_checks_everything_and_writes_nothing(served, root):
    root.create_topic("t")
    path = os.path.join(root.topic_path("t"), CONFIG_FILE)
    before = open(path, "rb").read(), os.stat(path).st_mtime_ns
    _, client = served(allow_admin=True)
    assert incremental(client, (TOPIC, "t", [("retention.ms", SET, "1000")]), validate_only=True) == [(0, None)]
    assert replace(client, "t", {"retention.ms": "1000"}, validate_only=True) == (0, None)
    ((code, _),) = incremental(client, (TOPIC, "t", [("max.message.bytes", SET, "100")]), validate_only=True)
    assert code == kafka_errors.POLICY_VIOLATION
    assert (open(path, "rb").read(), os.stat(path).st_mtime_ns) == before


def test_without_allow_admin_alterations_are_refused_and_descriptions_answered(served, root):
    root.create_topic("t")
    _, client = served()
    ((code, text),) = incremental(client, (TOPIC, "t", [("retention.ms", SET, "1000")]))
    assert code == kafka_errors.TOPIC_AUTHORIZATION_FAILED and "--allow-admin" in text
    assert replace(client, "t", {"retention.ms": "1000"})[0] == kafka_errors.TOPIC_AUTHORIZATION_FAILED
    assert root.config("t").retention_ms == kl.TopicConfig().retention_ms
    assert topic_configs(client, "t")["retention.ms"].value == "604800000"


def test_a_topic_json_damaged_or_gone_between_requests_is_answered_per_resource(served, root):
    for name in ("t", "u"):
        root.create_topic(name)
    _, client = served(allow_admin=True)
    assert topic_configs(client, "t")["retention.ms"].value == "604800000"
    path = os.path.join(root.topic_path("t"), CONFIG_FILE)
    with open(path + ".new", "w") as f:  # replaced, as every writer of topic.json does
        f.write('{"partitions": "many"')
    os.replace(path + ".new", path)
    damaged, fine = describe(client, (TOPIC, "t", None), (TOPIC, "u", None))
    assert damaged[0] == kafka_errors.INVALID_CONFIG and "unreadable" in damaged[1]
    assert fine[0] == 0 and fine[2]["retention.ms"].value == "604800000"
    ((code, _),) = incremental(client, (TOPIC, "t", [("retention.ms", SET, "1000")]))
    assert code == kafka_errors.INVALID_CONFIG and open(path).read() == '{"partitions": "many"'
    os.unlink(path)
    ((code, _, _),) = describe(client, (TOPIC, "t", None))
    assert code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    assert incremental(client, (TOPIC, "t", [("retention.ms", SET, "1000")]))[0][0] == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    assert not os.path.exists(path)


def test_create_topics_takes_kafka_named_configs_and_answers_the_topics_configs(served, root):
    os.makedirs(root.path)
    _, client = served(allow_admin=True)
    answer = client.call(
        CreateTopicsRequest, 7, timeout_ms=5000, validate_only=False,
        topics=[creatable("made", configs=[("retention.ms", "-1"), ("max.message.bytes", "2000000"),
                                           ("flush.ms", str(LONG_MAX))]),
                creatable("compacted", configs=[("cleanup.policy", "compact")]),
                creatable("nulled", configs=[("retention.ms", None)]),
                creatable("fixed", configs=[("compression.type", "zstd")]),
                creatable("twice", configs=[("retention.ms", "1"), ("retention.ms", "2")])],  # the last, as in Kafka
    )  # fmt: skip
    results = {t.name: t for t in answer.topics}
    assert results["made"].error_code == 0
    configs = {c.name: (c.value, c.config_source, c.read_only) for c in results["made"].configs}
    assert configs["retention.ms"] == ("-1", 1, False) and configs["max.message.bytes"] == ("2000000", 1, False)
    assert configs["flush.ms"] == (str(LONG_MAX), 1, False) and configs["segment.bytes"] == (str(1 << 30), 5, False)
    assert configs["compression.type"] == ("uncompressed", 5, True)
    made = root.config("made")
    assert (made.retention_ms, made.max_message_bytes, made.flush_ms) == (0, 2_000_000, 0)
    assert {n: t.error_code for n, t in results.items() if n != "made"} == {
        "compacted": kafka_errors.INVALID_CONFIG,
        "nulled": kafka_errors.INVALID_CONFIG,
        "fixed": kafka_errors.POLICY_VIOLATION,
        "twice": 0,
    }
    assert "kl does not compact" in results["compacted"].error_message
    assert root.topics() == ["made", "twice"] and root.config("twice").retention_ms == 2


def test_kafka_python_admin_client_describes_alters_and_resets_configs(served, root):
    running, _ = served(allow_admin=True)
    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([kafka_admin.NewTopic("p", 1, 1, topic_configs={"retention.ms": str(HOUR)})])
        resource = kafka_admin.ConfigResource(kafka_admin.ConfigResourceType.TOPIC, "p")
        modified = admin.describe_configs([resource])["topic"]["p"]
        assert {name: c["value"] for name, c in modified.items()} == {"retention.ms": str(HOUR)}
        everything = admin.describe_configs([resource], config_filter="all")["topic"]["p"]
        assert everything["segment.bytes"]["value"] == str(1 << 30)
        changed = kafka_admin.ConfigResource("topic", "p", {"retention.bytes": "1000000", "segment.bytes": str(8 << 20)})
        assert admin.alter_configs([changed]) == {"topic": {"p": "OK"}}
        assert (root.config("p").retention_bytes, root.config("p").segment_bytes) == (1_000_000, 8 << 20)
        old_way = kafka_admin.ConfigResource("topic", "p", {"flush.messages": "100"})
        # AlterConfigs: the client sends the others it finds set, which are kept
        assert admin.alter_configs([old_way], incremental=False) == {"topic": {"p": "OK"}}
        config = root.config("p")
        assert (config.flush_messages, config.retention_bytes, config.retention_ms) == (100, 1_000_000, HOUR)
        assert admin.reset_configs([kafka_admin.ConfigResource("topic", "p", ["retention.ms"])]) == {"topic": {"p": "OK"}}
        assert root.config("p").retention_ms == kl.TopicConfig().retention_ms
        with pytest.raises(ValueError, match="min.insync.replicas"):  # read-only: not among the configs it may alter
            admin.alter_configs([kafka_admin.ConfigResource("topic", "p", {"min.insync.replicas": "2"})])
        refused = admin.alter_configs([kafka_admin.ConfigResource("topic", "p", {"cleanup.policy": "compact"})])
        assert "kl does not compact" in refused["topic"]["p"]
    finally:
        admin.close()


def test_confluent_admin_client_creates_with_configs_describes_and_alters(served, root):
    running, _ = served(allow_admin=True)
    admin = confluent_admin.AdminClient({"bootstrap.servers": f"127.0.0.1:{running.server.kafka_port}"})
    new = confluent_admin.NewTopic("c", 2, 1, config={"retention.ms": "86400000", "segment.bytes": str(16 << 20)})
    admin.create_topics([new], request_timeout=10)["c"].result(10)
    assert (root.config("c").retention_ms, root.config("c").segment_bytes) == (86_400_000, 16 << 20)
    checked = confluent_admin.NewTopic("d", 1, 1, config={"cleanup.policy": "compact"})
    with pytest.raises(Exception, match="kl does not compact"):
        admin.create_topics([checked], request_timeout=10)["d"].result(10)
    assert "d" not in root.topics()

    resource = confluent_admin.ConfigResource("topic", "c")
    (described,) = admin.describe_configs([resource], request_timeout=10).values()
    entries = described.result(10)
    assert entries["retention.ms"].value == "86400000" and not entries["retention.ms"].is_default
    assert entries["retention.bytes"].value == "-1" and entries["retention.bytes"].is_default
    assert entries["compression.type"].is_read_only

    change = confluent_admin.ConfigResource("topic", "c", incremental_configs=[
        confluent_admin.ConfigEntry("retention.ms", "-1", incremental_operation=confluent_admin.AlterConfigOpType.SET),
        confluent_admin.ConfigEntry("segment.bytes", None, incremental_operation=confluent_admin.AlterConfigOpType.DELETE),
    ])  # fmt: skip
    (future,) = admin.incremental_alter_configs([change], request_timeout=10).values()
    future.result(10)
    assert (root.config("c").retention_ms, root.config("c").segment_bytes) == (0, 1 << 30)
    bad = confluent_admin.ConfigResource("topic", "c", incremental_configs=[
        confluent_admin.ConfigEntry("min.insync.replicas", "3", incremental_operation=confluent_admin.AlterConfigOpType.SET)
    ])  # fmt: skip
    with pytest.raises(Exception, match="min.insync.replicas"):
        next(iter(admin.incremental_alter_configs([bad], request_timeout=10).values())).result(10)
    (node,) = admin.list_topics(timeout=10).brokers
    (broker,) = admin.describe_configs([confluent_admin.ConfigResource("broker", str(node))], request_timeout=10).values()
    entries = broker.result(10)
    assert entries["num.partitions"].value == "1" and entries["num.partitions"].is_read_only


@pytest.mark.parametrize(
    ("name", "values", "kl_values"),
    [
        ("retention.ms", ["-1", "1", "604800000", str(LONG_MAX)], [0, 1, 604_800_000, LONG_MAX]),
        ("retention.bytes", ["-1", "1", str(1 << 40)], [0, 1, 1 << 40]),
        ("flush.messages", ["1", "1000", str(LONG_MAX)], [1, 1000, 0]),
        ("flush.ms", ["1", "1000", str(LONG_MAX)], [1, 1000, 0]),
        ("segment.bytes", ["1048576", str((1 << 31) - 1)], [1 << 20, (1 << 31) - 1]),
        ("max.message.bytes", ["64", "1048576"], [64, 1 << 20]),
    ],
)
def test_kafkas_values_convert_to_kls_settings_and_back_exactly(name, values, kl_values):
    setting = BY_NAME[name].kl_name
    for value, kl_value in zip(values, kl_values, strict=True):
        config = with_kafka_configs(kl.TopicConfig(max_message_bytes=64, segment_bytes=1 << 20), {name: value})
        assert getattr(config, setting) == kl_value
        assert {c.name: c.value for c in kafka_configs(config)}[name] == value


def test_a_kafka_config_back_to_its_default_is_kls_default():
    set_ = with_kafka_configs(kl.TopicConfig(), {"retention.ms": "-1", "flush.ms": str(LONG_MAX)})
    assert with_kafka_configs(set_, {"retention.ms": None, "flush.ms": None}) == kl.TopicConfig()
