"""``kl serve --kafka`` managing topics for Kafka's admin clients: CreateTopics,
DeleteTopics and CreatePartitions (raw requests, confluent-kafka's ``AdminClient`` and
kafka-python's ``KafkaAdminClient``), refused without ``--allow-admin``, and topics
created on first use with ``--auto-create``."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid

import confluent_kafka.admin as confluent_admin
import kafka.admin as kafka_admin
import pytest
from click.testing import CliRunner
from kafka.protocol.admin.topics import CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from test_kafka import Client, built, produce

import kl
from kl.net.kafka import errors as kafka_errors
from kl.net.kafka.broker import topic_uuid
from kl_cli.main import cli

from conftest import read_all
from kafka_clients import Daemon


def creatable(name: str, partitions: int = 1, replication: int = 1, assignments=(), configs=()):
    topic = CreateTopicsRequest.CreatableTopic
    return topic(
        name=name,
        num_partitions=partitions,
        replication_factor=replication,
        assignments=[topic.CreatableReplicaAssignment(partition_index=p, broker_ids=b) for p, b in assignments],
        configs=[topic.CreatableTopicConfig(name=k, value=v) for k, v in configs],
    )


def create(client, *topics, validate_only: bool = False, version: int = 7) -> dict[str, tuple[int, str | None, int, int]]:
    """name -> (error code, message, partitions, replication factor) of a CreateTopics."""
    answer = client.call(CreateTopicsRequest, version, topics=list(topics), timeout_ms=5000, validate_only=validate_only)
    return {t.name: (t.error_code, t.error_message, t.num_partitions, t.replication_factor) for t in answer.topics}


def codes(answers: dict) -> dict[str, int]:
    return {name: found[0] for name, found in answers.items()}


def test_create_topics_creates_each_topic_as_kl_topics_create_does_and_refuses_what_kafka_refuses(served, root, caplog):
    root.create_topic("old")
    running, client = served(allow_admin=True, default_partitions=3)
    answers = create(
        client,
        creatable("two", partitions=2, replication=3),
        creatable("default", partitions=-1, replication=-1),
        creatable("assigned", partitions=-1, replication=-1, assignments=[(0, [1, 2]), (1, [2])]),
        creatable("old"),
        creatable("bad name!"),
        creatable("none", partitions=0),
        creatable("norf", replication=0),
        creatable("twice"),
        creatable("twice"),
        creatable("gap", partitions=-1, replication=-1, assignments=[(0, [1]), (2, [1])]),
        creatable("both", partitions=2, replication=-1, assignments=[(0, [1])]),
        creatable("huge", partitions=10**9),
    )
    assert answers["two"] == (0, None, 2, 1)  # one copy, whatever the factor asked
    assert answers["default"] == (0, None, 3, 1)
    assert answers["assigned"] == (0, None, 2, 1)
    assert codes(answers) == {
        "two": 0,
        "default": 0,
        "assigned": 0,
        "old": kafka_errors.TOPIC_ALREADY_EXISTS,
        "bad name!": kafka_errors.INVALID_TOPIC_EXCEPTION,
        "none": kafka_errors.INVALID_PARTITIONS,
        "norf": kafka_errors.INVALID_REPLICATION_FACTOR,
        "twice": kafka_errors.INVALID_REQUEST,
        "gap": kafka_errors.INVALID_REPLICA_ASSIGNMENT,
        "both": kafka_errors.INVALID_REQUEST,
        "huge": kafka_errors.INVALID_PARTITIONS,
    }
    assert all(answers[n][1] for n in codes(answers) if codes(answers)[n])  # every refusal says why
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("'bad name!'" in line for line in warned) and not any("'old'" in line for line in warned)  # (made at each start)
    assert sorted(root.topics()) == ["assigned", "default", "old", "two"]
    assert [root.config(n).partitions for n in ("assigned", "default", "two")] == [2, 3, 2]
    listed = client.call(
        MetadataRequest, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    ids = {t.name: t.topic_id for t in listed.topics}
    assert ids["two"] == topic_uuid(root.config("two").topic_id)  # every daemon sees it at once


def test_validate_only_checks_everything_and_writes_nothing(served, root):
    root.create_topic("old")
    before = sorted(os.listdir(root.path))
    _, client = served(allow_admin=True)
    answers = create(client, creatable("new", partitions=4), creatable("old"), validate_only=True)
    assert answers["new"] == (0, None, 4, 1)
    assert codes(answers)["old"] == kafka_errors.TOPIC_ALREADY_EXISTS
    answer = client.call(
        CreatePartitionsRequest, 3, topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="old", count=5, assignments=None)],
        timeout_ms=5000, validate_only=True,
    )  # fmt: skip
    assert answer.results[0].error_code == 0
    assert sorted(os.listdir(root.path)) == before
    assert root.config("old").partitions == 1


def test_without_allow_admin_every_change_is_refused_naming_the_option(served, root):
    root.create_topic("old")
    _, client = served()
    ((code, text, *_),) = create(client, creatable("new")).values()
    assert code == kafka_errors.TOPIC_AUTHORIZATION_FAILED and "--allow-admin" in text
    answer = client.call(
        DeleteTopicsRequest,
        6,
        topics=[DeleteTopicsRequest.DeleteTopicState(name="old", topic_id=uuid.UUID(int=0))],
        timeout_ms=5000,
    )
    assert answer.responses[0].error_code == kafka_errors.TOPIC_AUTHORIZATION_FAILED
    answer = client.call(
        CreatePartitionsRequest, 3, topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="old", count=2, assignments=None)],
        timeout_ms=5000, validate_only=False,
    )  # fmt: skip
    assert answer.results[0].error_code == kafka_errors.TOPIC_AUTHORIZATION_FAILED
    assert root.topics() == ["old"] and root.config("old").partitions == 1


def test_a_topics_pattern_keeps_admin_to_the_topics_served(served, root):
    import re

    _, client = served(allow_admin=True, topics=re.compile("app-.*"))
    assert codes(create(client, creatable("app-1"), creatable("other"))) == {
        "app-1": 0,
        "other": kafka_errors.TOPIC_AUTHORIZATION_FAILED,
    }
    assert root.topics() == ["app-1"]


def test_delete_topics_by_name_and_by_id_and_an_old_id_deletes_no_new_creation(served, root):
    for name in ("a", "b", "c"):
        root.create_topic(name)
    old_c = topic_uuid(root.config("c").topic_id)
    root.delete_topic("c")
    root.create_topic("c")
    _, client = served(allow_admin=True)
    state = DeleteTopicsRequest.DeleteTopicState
    zero = uuid.UUID(int=0)
    answer = client.call(
        DeleteTopicsRequest, 6, timeout_ms=5000,
        topics=[state(name="a", topic_id=zero), state(name=None, topic_id=topic_uuid(root.config("b").topic_id)),
                state(name=None, topic_id=old_c), state(name="nope", topic_id=zero)],
    )  # fmt: skip
    got = [(r.name, r.error_code) for r in answer.responses]
    assert got == [("a", 0), ("b", 0), (None, kafka_errors.UNKNOWN_TOPIC_ID), ("nope", kafka_errors.UNKNOWN_TOPIC_OR_PARTITION)]
    assert root.topics() == ["c"]
    old = client.call(DeleteTopicsRequest, 1, topic_names=["c"], timeout_ms=5000)  # by name, before version 6
    assert [(r.name, r.error_code) for r in old.responses] == [("c", 0)]
    assert root.topics() == []


def test_create_partitions_grows_a_topic_and_refuses_fewer_or_as_many(served, root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    _, client = served(allow_admin=True)
    grow = CreatePartitionsRequest.CreatePartitionsTopic
    answer = client.call(
        CreatePartitionsRequest, 3, timeout_ms=5000, validate_only=False,
        topics=[grow(name="t", count=4, assignments=None), grow(name="nope", count=2, assignments=None)],
    )  # fmt: skip
    assert [(r.name, r.error_code) for r in answer.results] == [("t", 0), ("nope", kafka_errors.UNKNOWN_TOPIC_OR_PARTITION)]
    assert root.config("t").partitions == 4
    for count in (3, 4):
        answer = client.call(
            CreatePartitionsRequest,
            3,
            timeout_ms=5000,
            validate_only=False,
            topics=[grow(name="t", count=count, assignments=None)],
        )
        (result,) = answer.results
        assert result.error_code == kafka_errors.INVALID_PARTITIONS and "4 partition(s)" in result.error_message
    assigned = CreatePartitionsRequest.CreatePartitionsTopic.CreatePartitionsAssignment
    answer = client.call(
        CreatePartitionsRequest, 3, timeout_ms=5000, validate_only=False,
        topics=[grow(name="t", count=6, assignments=[assigned(broker_ids=[1])])],  # one list for two new partitions
    )  # fmt: skip
    assert answer.results[0].error_code == kafka_errors.INVALID_REPLICA_ASSIGNMENT
    assert root.config("t").partitions == 4


def test_confluent_and_kafka_python_admin_clients_create_grow_and_delete_topics(served, root):
    running, _ = served(allow_admin=True)
    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    admin = confluent_admin.AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([confluent_admin.NewTopic("c1", num_partitions=3, replication_factor=1)], request_timeout=10)
    futures["c1"].result(10)
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS|already exists"):
        admin.create_topics([confluent_admin.NewTopic("c1", num_partitions=1)], request_timeout=10)["c1"].result(10)
    admin.create_partitions([confluent_admin.NewPartitions("c1", 5)], request_timeout=10)["c1"].result(10)
    assert root.config("c1").partitions == 5
    listed = admin.list_topics(timeout=10)
    assert len(listed.topics["c1"].partitions) == 5

    python = kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        python.create_topics([kafka_admin.NewTopic("p1", num_partitions=2, replication_factor=1)])
        assert root.config("p1").partitions == 2
        python.create_partitions({"p1": kafka_admin.NewPartitions(total_count=3)})
        assert root.config("p1").partitions == 3
        python.delete_topics(["p1"])
    finally:
        python.close()
    admin.delete_topics(["c1"], request_timeout=10)["c1"].result(10)
    assert root.topics() == []


def test_auto_create_makes_a_topic_a_producer_names_and_without_it_the_name_is_logged_once(served, root, caplog):
    os.makedirs(root.path)
    _, client = served(allow_produce=True)
    caplog.set_level(logging.WARNING, "kl.serve")
    for _ in range(3):
        assert produce(client, "fresh", built([b"x"])).error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    assert [r.getMessage() for r in caplog.records if "'fresh'" in r.getMessage()] == [
        f"{_peer(client)}: asked for topic 'fresh', which does not exist (kl serve --auto-create makes it)"
    ]
    assert root.topics() == []

    _, client = served(allow_produce=True, auto_create=True, default_partitions=2)
    assert produce(client, "fresh", built([b"x"])).error_code == 0
    assert root.config("fresh").partitions == 2
    answer = client.call(MetadataRequest, 12, topics=[MetadataRequest.MetadataRequestTopic(name="meta", topic_id=None)],
                         allow_auto_topic_creation=False, include_topic_authorized_operations=False)  # fmt: skip
    assert answer.topics[0].error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION and "meta" not in root.topics()
    answer = client.call(MetadataRequest, 12, topics=[MetadataRequest.MetadataRequestTopic(name="meta", topic_id=None)],
                         allow_auto_topic_creation=True, include_topic_authorized_operations=False)  # fmt: skip
    assert answer.topics[0].error_code == 0 and len(answer.topics[0].partitions) == 2
    assert root.config("meta").partitions == 2


def _peer(client) -> str:
    host, port = client.sock.getsockname()[:2]
    return f"{host}:{port}"


def test_creates_racing_deletes_of_one_name_through_two_daemons_leave_the_root_whole(served, root, tmp_path):
    """A create and a delete of one name at once, again and again, through two daemons (one
    a process of its own): each is answered as its turn makes it, and the root stays whole."""
    root.create_topic("bystander")
    _, near = served(allow_admin=True)
    far = Daemon(root.path, tmp_path / "far.log", "--allow-admin")
    try:
        host, port = far.bootstrap.rsplit(":", 1)
        other = Client((host, int(port)))
        answers: dict[str, list[int]] = {"create": [], "delete": []}
        rounds = threading.Barrier(2, timeout=60)  # each round, both at once

        def creates() -> None:
            for _ in range(60):
                rounds.wait()
                answers["create"].append(create(near, creatable("race", partitions=3))["race"][0])

        def deletes() -> None:
            for _ in range(60):
                rounds.wait()
                named = [DeleteTopicsRequest.DeleteTopicState(name="race")]
                answer = other.call(DeleteTopicsRequest, 6, topics=named, timeout_ms=5000)
                answers["delete"].append(answer.responses[0].error_code)

        threads = [threading.Thread(target=creates), threading.Thread(target=deletes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(answers["create"]) <= {0, kafka_errors.TOPIC_ALREADY_EXISTS} and 0 in answers["create"], answers
        assert set(answers["delete"]) <= {0, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION} and 0 in answers["delete"], answers
        left = kl.Root(root.path).topics()
        assert answers["create"].count(0) - answers["delete"].count(0) == int("race" in left)  # each done once
        assert "race" not in left or kl.Root(root.path).config("race").partitions == 3
        checked = CliRunner().invoke(cli, ["--root", root.path, "recover", "--deep", "--dry-run"])
        assert checked.exit_code == 0 and all(": ok (" in line for line in checked.output.splitlines()), checked.output
        assert kl.Root(root.path).strays() == []  # no half-made or half-deleted topic left behind
        assert far.proc.poll() is None and "unexpected" not in far.text() and "Traceback" not in far.text()
    finally:
        far.stop()


def test_a_topic_deleted_under_a_producer_and_readers_elsewhere_ends_them_cleanly(served, root, tmp_path):
    """DeleteTopics through a daemon while kl's own producer and a follower append to and read
    the topic on the root (another host's processes): both stop with the topic gone, nothing
    of the old creation reaches the one created again, and the root stays whole."""
    root.create_topic("live", kl.TopicConfig(partitions=2))
    daemon = Daemon(root.path, tmp_path / "serve.log", "--allow-admin")
    try:
        host, port = daemon.bootstrap.rsplit(":", 1)
        client = Client((host, int(port)))
        ended: dict[str, BaseException] = {}
        appended = threading.Event()

        def produce_on() -> None:
            producer = kl.Producer(kl.Root(root.path))
            try:
                for i in itertools.count():
                    producer.send("live", b"old %d" % i, partition=i % 2)
                    appended.set()
            except kl.KlError as e:
                ended["producer"] = e

        def follow_on() -> None:
            try:
                for _ in kl.Consumer(kl.Root(root.path)).stream("live", 0, 0, idle_timeout=30):
                    pass
            except kl.KlError as e:
                ended["reader"] = e

        threads = [threading.Thread(target=produce_on), threading.Thread(target=follow_on)]
        for t in threads:
            t.start()
        assert appended.wait(30)
        named = [DeleteTopicsRequest.DeleteTopicState(name="live")]
        assert client.call(DeleteTopicsRequest, 6, topics=named, timeout_ms=5000).responses[0].error_code == 0
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a producer or reader of the deleted topic went on"
        assert {type(e) for e in ended.values()} <= {kl.TopicNotFound, kl.TopicRecreated} and len(ended) == 2, ended
        assert create(client, creatable("live", partitions=2))["live"][0] == 0
        kl.Producer(kl.Root(root.path)).send("live", b"new", partition=0)
        assert [m.value for p in (0, 1) for m in read_all(kl.Root(root.path), "live", partition=p)] == [b"new"]
        checked = CliRunner().invoke(cli, ["--root", root.path, "recover", "--deep", "--dry-run"])
        assert checked.exit_code == 0 and all(": ok (" in line for line in checked.output.splitlines()), checked.output
        assert kl.Root(root.path).strays() == [] and daemon.proc.poll() is None and "unexpected" not in daemon.text()
    finally:
        daemon.stop()
