"""Any group id Kafka accepts (issue 36, point 5), and OffsetDelete (point 1).

A group is stored under a name made of its id (``kl.registry.group_name``): plain names of
earlier kl versions as they are, others escaped, long ones as a digest with the id in a
file.  Every listing shows the id.  Checked through the library, the CLI, and Kafka's
clients against ``kl serve --kafka`` (confluent-kafka and kafka-python consumers and
admin clients, and OffsetDelete request by request)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import confluent_kafka
import confluent_kafka.admin
import hypothesis
import kafka
import kafka.errors
import pytest
from hypothesis import strategies as st
from kafka.protocol.consumer.group import JoinGroupRequest, OffsetDeleteRequest
from test_kafka import Client
from test_kafka_groups import Member, commit, fetched, find_coordinator

import kl
from kl import groups
from kl.log.log import Position
from kl.net.kafka.errors import (
    GROUP_ID_NOT_FOUND,
    GROUP_SUBSCRIBED_TO_TOPIC,
    INVALID_GROUP_ID,
    NON_EMPTY_GROUP,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from kl.registry import Registry, group_name, group_of

from conftest import run_on_a_terminal, write
from kafka_clients import module_fixtures

KL = [sys.executable, "-m", "kl_cli"]
LONG = "long:" + "x" * 295
"""A 300-byte id: its escaped name is past the 249 bytes a name is kept to."""
IDS = ["app:v1", "my group", "team/app", "ü", LONG, "..", "-x"]
"""Ids that earlier kl versions refused (but ``-x``, a plain name), as Kafka takes them."""
PLAIN = ["g", "-x", "a.b", "A_9-z", "_", "x" * 249, "loaders.v2"]
"""Names earlier kl versions accepted: each is its own name on disk."""

root, daemon, kafkajs, no_client_left = module_fixtures("group-ids")


def kl_run(r: kl.Root, *args: str, input: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KL, "--root", r.path, *args], capture_output=True, text=True, timeout=60, input=input)


def on_disk(r: kl.Root) -> set[str]:
    return {n for n in os.listdir(os.path.join(r.path, ".groups")) if not n.startswith(".")}


# ----------------------------------------------------------------- the names


def test_plain_names_are_their_own_names():
    assert [group_name(g) for g in PLAIN] == PLAIN
    assert [group_of("/nowhere", g) for g in PLAIN] == PLAIN


def test_other_ids_are_escaped_into_safe_names():
    found = {g: group_name(g) for g in [*IDS, "", "%", ".coordinators", ".", "a\x00\n\x7f", "x" * 250, "a~b"]}
    assert found["app:v1"] == "app%3Av1" and found["my group"] == "my%20group" and found["team/app"] == "team%2Fapp"
    assert (found["ü"], found[".."], found["-x"], found[""], found["%"]) == ("%C3%BC", "%2E.", "-x", "%", "%25")
    assert found[".coordinators"] == "%2Ecoordinators" and found["."] == "%2E"
    assert len(set(found.values())) == len(found)
    for name in found.values():
        assert not name.startswith(".") and name not in ("", ".", "..")
        assert not any(c == "/" or ord(c) < 0x20 or ord(c) == 0x7F for c in name)
        assert len(name.encode()) <= 255


def test_a_long_id_is_a_digest_with_the_id_beside(tmp_path):
    r = kl.Root(tmp_path)
    twins = [LONG, LONG[:-1] + "y", "ü" * 16383 + "z"]  # the last 32,767 bytes, Kafka's longest
    for g in twins:
        Registry(r.path, g).write_offset("t", 0, 0, "test")
    names = {group_name(g) for g in twins}
    assert len(names) == 3 and on_disk(r) == names
    for g in twins:
        name = group_name(g)
        assert len(name.encode()) <= 255 and "%~" in name and name.startswith(group_name(g)[:20])
        with open(os.path.join(r.path, ".groups", name, "id"), "rb") as f:
            assert f.read() == g.encode()
    assert groups.list_groups(r) == sorted(twins)


def test_entries_that_are_no_ids_name_are_not_groups(tmp_path):
    r = kl.Root(tmp_path)
    Registry(r.path, "g").write_offset("t", 0, 0, "test")
    for stray in ["a b", "a~b", "app%3av1", "%zz", "%2", "x%7e", "x%41", "%~" + "0" * 64, "%FF"]:
        os.makedirs(os.path.join(r.path, ".groups", stray))
    assert groups.list_groups(r) == ["g"]


@hypothesis.given(st.lists(st.text(max_size=300), max_size=8, unique=True))
@hypothesis.settings(max_examples=60)
def test_any_ids_are_stored_and_listed_as_they_are(tmp_path_factory, ids):
    r = kl.Root(tmp_path_factory.mktemp("ids"))
    for g in ids:
        Registry(r.path, g).write_offset("t", 0, 7, "test")
    assert groups.list_groups(r) == sorted(ids)
    assert all(Registry(r.path, g).committed("t", 0).offset == 7 for g in ids)


# ----------------------------------------------------------------- the library and the CLI


@pytest.fixture
def events(tmp_path):
    r = kl.Root(tmp_path / "root")
    os.makedirs(r.path)
    r.create_topic("events", kl.TopicConfig(partitions=2))
    r.create_topic("other")
    write(r, "events", [b"a", b"b", b"c"])
    write(r, "other", [b"x"])
    yield r
    r.close()


def test_library_takes_any_id(events):
    start = events.log("events", 0).log_start_offset
    for g in IDS:
        groups.import_offsets(events, g, f"events 0 {start}\nother 0 0\n")
    assert groups.list_groups(events) == sorted(IDS)
    assert on_disk(events) == {group_name(g) for g in IDS}
    for g in IDS:
        info = groups.describe(events, g)
        assert info.group == g
        assert [(p.topic, p.partition, p.lag_messages) for p in info.partitions if p.committed is not None] == [
            ("events", 0, 3),
            ("other", 0, 1),
        ]
        assert groups.export(events, g) == f"events 0 {start}\nother 0 0\n"
        [change] = groups.reset(events, g, "latest", topic="other")
        assert change.new == Position(events.log("other", 0).log_end_offset)
    groups.delete(events, "team/app")
    with pytest.raises(kl.GroupNotFound, match="no group 'team/app'"):
        groups.describe(events, "team/app")
    assert "team/app" not in groups.list_groups(events)


def test_old_plain_groups_keep_their_files(events):
    for g in PLAIN:
        groups.import_offsets(events, g, "other 0 0\n")
    assert on_disk(events) == set(PLAIN)
    assert os.path.isfile(os.path.join(events.path, ".groups", "loaders.v2", "commits", "other"))
    assert groups.list_groups(events) == sorted(PLAIN)


def test_a_kl_member_joins_any_id_but_the_empty_one(events):
    with kl.GroupConsumer(events, "app:v1", ["events"]) as consumer:
        got = [v for batch in consumer.batches(values_only=True) for v in batch.messages]
        consumer.commit()
    assert sorted(got) == [b"a", b"b", b"c"]
    assert [p.lag_messages for p in groups.describe(events, "app:v1").partitions] == [0, 0]
    with pytest.raises(kl.InvalidConfig, match="a group id cannot be empty"):
        kl.GroupConsumer(events, "", ["events"])


def test_delete_offsets(events):
    end = events.log("events", 0).log_end_offset
    groups.import_offsets(events, "my group", f"events 0 {end}\nevents 1 0\nother 0 0\n")
    assert groups.delete_offsets(events, "my group", "events", [0]) == [(0, Position(end))]
    described = {(p.topic, p.partition): p.status for p in groups.describe(events, "my group").partitions}
    assert described == {
        ("events", 0): groups.Status.NOT_COMMITTED,
        ("events", 1): groups.Status.OK,
        ("other", 0): groups.Status.OK,
    }
    assert groups.delete_offsets(events, "my group", "events", [0]) == []
    with kl.GroupConsumer(events, "my group", ["other"]):
        with pytest.raises(kl.GroupActive, match="1 live member"):
            groups.delete_offsets(events, "my group", "other")
        assert groups.delete_offsets(events, "my group", "events") == [(1, Position(0))]  # not its topic
        assert groups.delete_offsets(events, "my group", "other", force=True) == [(0, Position(0))]
    assert groups.export(events, "my group") == ""
    with pytest.raises(kl.GroupNotFound):
        groups.delete_offsets(events, "nope", "events")


def test_cli_takes_and_shows_ids(events):
    for g in ("app:v1", "my group", "ü", "[bold]x[/bold]"):
        imported = kl_run(events, "groups", "import", g, input="other 0 0\nevents 1 0\n")
        assert imported.returncode == 0, imported.stderr
    listed = kl_run(events, "groups", "list")
    assert listed.stdout.splitlines() == sorted(["app:v1", "my group", "ü", "[bold]x[/bold]"])
    as_json = [json.loads(line)["group"] for line in kl_run(events, "groups", "list", "--json").stdout.splitlines()]
    assert as_json == sorted(["app:v1", "my group", "ü", "[bold]x[/bold]"])
    described = kl_run(events, "groups", "describe", "app:v1")
    assert described.returncode == 0 and described.stdout.startswith("group  app:v1\n")
    assert json.loads(kl_run(events, "groups", "describe", "my group", "--json").stdout)["group"] == "my group"
    deleted = kl_run(events, "groups", "delete-offsets", "ü", "other")
    assert (deleted.returncode, deleted.stdout) == (0, "other/0: 0 -> deleted\n")
    assert kl_run(events, "groups", "export", "ü").stdout == "events 1 0\n"
    again = kl_run(events, "groups", "delete-offsets", "ü", "events", "-p", "0")
    assert (again.returncode, again.stdout) == (0, "")
    missing = kl_run(events, "groups", "delete-offsets", "nope:1", "events")
    assert missing.returncode == 1 and missing.stderr.splitlines()[-1].startswith("Error: no group 'nope:1'")
    consumed = kl_run(events, "consume", "events", "--group", "app:v1")
    assert (consumed.returncode, sorted(consumed.stdout.split())) == (0, ["a", "b", "c"])
    assert kl_run(events, "consume", "events", "--group", "app:v1").stdout == ""  # from its commits
    assert kl_run(events, "groups", "import", "--", "-x", input="other 0 0\n").returncode == 0
    assert json.loads(kl_run(events, "groups", "describe", "--json", "--", "-x").stdout)["group"] == "-x"
    assert kl_run(events, "groups", "delete", "--", "-x").returncode == 0
    assert kl_run(events, "groups", "delete", "my group").returncode == 0
    assert kl_run(events, "groups", "list").stdout.splitlines() == sorted(["app:v1", "ü", "[bold]x[/bold]"])


def on_a_terminal(r: kl.Root, *args: str) -> str:
    """What ``kl ARGS`` prints with stdout on a pseudo-terminal (its tables)."""
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200"}
    code, seen = run_on_a_terminal([*KL, "--root", r.path, *args], env)
    assert code == 0
    return seen.decode()


def test_tables_show_ids_as_they_are(events):
    for g in ("[bold]x[/bold]", "ü:1"):
        groups.import_offsets(events, g, "other 0 0\n")
    listed = on_a_terminal(events, "groups", "list")
    assert "[bold]x[/bold]" in listed and "ü:1" in listed
    described = on_a_terminal(events, "groups", "describe", "[bold]x[/bold]")
    assert "group [bold]x[/bold]: no live members" in described


# ----------------------------------------------------------------- Kafka's clients


def consume(client: str, bootstrap: str, group: str, topic: str, count: int) -> list[bytes]:
    """``count`` messages of ``topic`` read by a consumer of ``group`` (from its committed
    offsets, else the earliest), committed before it leaves."""
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    if client == "confluent":
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
        consumer.subscribe([topic])
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
        consumer.commit(asynchronous=False)
        consumer.close()
    else:
        consumer = kafka.KafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
        )
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                values.extend(r.value for r in records)
        consumer.commit()
        consumer.close()
    return values


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_kafka_consumers_take_any_group_id(root, daemon, client):
    topic = f"ids-{client}"
    root.create_topic(topic)
    write(root, topic, [b"1", b"2", b"3"])
    ids = IDS  # (each test deletes its groups at its end)
    for g in ids:
        assert consume(client, daemon.bootstrap, g, topic, 3) == [b"1", b"2", b"3"], daemon.text()
    assert set(ids) <= set(groups.list_groups(root))
    assert {group_name(g) for g in ids} <= on_disk(root)
    for g in ids:
        assert [p.lag_messages for p in groups.describe(root, g).partitions if p.topic == topic] == [0]
    write(root, topic, [b"4"])
    for g in ids:  # each resumes from its own commit
        assert consume(client, daemon.bootstrap, g, topic, 1) == [b"4"]
    if client == "confluent":
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": daemon.bootstrap})
        listed = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
        described = {g: f.result(30).group_id for g, f in admin.describe_consumer_groups(ids).items()}
        offsets = {
            g: [
                tp.offset
                for tp in admin.list_consumer_group_offsets([confluent_kafka.ConsumerGroupTopicPartitions(g)])[g]
                .result(30)
                .topic_partitions
            ]
            for g in ids
        }
        deleted = {g: f.result(30) for g, f in admin.delete_consumer_groups(ids).items()}
        assert deleted == dict.fromkeys(ids)
    else:
        admin = kafka.KafkaAdminClient(bootstrap_servers=daemon.bootstrap, request_timeout_ms=10_000)
        listed = {g["group_id"] for g in admin.list_groups()}
        described = {g: info["group_id"] for g, info in admin.describe_groups(ids).items()}
        offsets = {g: [o.offset for o in admin.list_group_offsets({g: None})[g].values()] for g in ids}
        assert admin.delete_groups(ids) == dict.fromkeys(ids, "OK")
        admin.close()
    assert set(ids) <= listed
    assert described == {g: g for g in ids}
    assert offsets == {g: [4] for g in ids}
    assert not set(ids) & set(groups.list_groups(root))


def test_the_empty_group_id_as_kafka_takes_it(root, daemon):
    root.create_topic("empty-id")
    write(root, "empty-id", [b"1", b"2"])
    client = Client(address(daemon))
    assert find_coordinator(client, "")[0] == NONE
    joined = Member(address(daemon), "", "test").join()
    assert joined.error_code == INVALID_GROUP_ID
    assert commit(client, "", "empty-id", 1) == NONE  # OffsetCommit and OffsetFetch take it, as Kafka's do
    assert fetched(client, "", "empty-id") == (1, NONE)
    assert "" in groups.list_groups(root) and "%" in on_disk(root)
    answer = client.call(OffsetDeleteRequest, 0, group_id="", topics=[])
    assert answer.error_code == INVALID_GROUP_ID
    client.close()


def address(daemon) -> tuple[str, int]:
    host, port = daemon.bootstrap.rsplit(":", 1)
    return host, int(port)


def offset_delete(client: Client, group: str, topics: dict[str, list[int]]):
    given = OffsetDeleteRequest.OffsetDeleteRequestTopic
    answer = client.call(
        OffsetDeleteRequest,
        0,
        group_id=group,
        topics=[
            given(name=t, partitions=[given.OffsetDeleteRequestPartition(partition_index=p) for p in ps])
            for t, ps in topics.items()
        ],
    )
    return answer.error_code, {t.name: [(p.partition_index, p.error_code) for p in t.partitions] for t in answer.topics}


def test_offset_delete_follows_kafkas_rules(root, daemon):
    root.create_topic("od-a", kl.TopicConfig(partitions=2))
    root.create_topic("od-b")
    write(root, "od-a", [b"1", b"2"])
    write(root, "od-b", [b"1"])
    client = Client(address(daemon))
    assert find_coordinator(client, "od:g")[0] == NONE
    assert offset_delete(client, "od:g", {"od-a": [0]}) == (GROUP_ID_NOT_FOUND, {})
    admin = kafka.KafkaAdminClient(bootstrap_servers=daemon.bootstrap, request_timeout_ms=10_000)
    with pytest.raises(kafka.errors.GroupIdNotFoundError):
        admin.delete_group_offsets("od:g", [kafka.TopicPartition("od-a", 0)])
    consumer = kafka.KafkaConsumer(
        "od-a", bootstrap_servers=daemon.bootstrap, group_id="od:g", auto_offset_reset="earliest", enable_auto_commit=False
    )
    got = 0
    deadline = time.monotonic() + 60
    while got < 2 and time.monotonic() < deadline:
        got += sum(len(records) for records in consumer.poll(500).values())
    consumer.commit()
    groups.import_offsets(root, "od:g", "od-b 0 0\n", force=True)  # a topic the member does not subscribe to
    tp = kafka.TopicPartition
    answer = admin.delete_group_offsets("od:g", [tp("od-a", 0), tp("od-a", 1), tp("od-b", 0), tp("od-b", 5), tp("nope", 0)])
    assert answer == {
        tp("od-a", 0): kafka.errors.GroupSubscribedToTopicError,
        tp("od-a", 1): kafka.errors.GroupSubscribedToTopicError,
        tp("od-b", 0): kafka.errors.NoError,
        tp("od-b", 5): kafka.errors.UnknownTopicOrPartitionError,
        tp("nope", 0): kafka.errors.UnknownTopicOrPartitionError,
    }
    assert admin.list_group_offsets({"od:g": None})["od:g"].keys() == {tp("od-a", 0), tp("od-a", 1)}
    consumer.close()
    code, codes = offset_delete(client, "od:g", {"od-a": [0, 1]})
    assert (code, codes) == (NONE, {"od-a": [(0, NONE), (1, NONE)]})
    assert fetched(client, "od:g", "od-a") == (-1, NONE)
    assert groups.export(root, "od:g") == ""
    assert offset_delete(client, "od:g", {"od-a": [0]}) == (NONE, {"od-a": [(0, NONE)]})  # nothing left: still fine
    assert offset_delete(client, "od:g", {"od-a": [7]}) == (NONE, {"od-a": [(7, UNKNOWN_TOPIC_OR_PARTITION)]})
    admin.close()
    client.close()


def test_offset_delete_keeps_the_topics_kl_members_subscribe_to(root, daemon):
    root.create_topic("od-kl-a")
    root.create_topic("od-kl-b")
    write(root, "od-kl-a", [b"1"])
    groups.import_offsets(root, "kl:members", "od-kl-a 0 0\nod-kl-b 0 0\n")
    client = Client(address(daemon))
    with kl.GroupConsumer(root, "kl:members", ["od-kl-a"]):
        answer = offset_delete(client, "kl:members", {"od-kl-a": [0], "od-kl-b": [0]})
        assert answer == (NONE, {"od-kl-a": [(0, GROUP_SUBSCRIBED_TO_TOPIC)], "od-kl-b": [(0, NONE)]})
    assert groups.export(root, "kl:members") == "od-kl-a 0 0\n"
    client.close()


def test_offset_delete_refuses_a_group_of_another_protocol_while_it_has_members(root, daemon):
    root.create_topic("od-connect")
    groups.import_offsets(root, "connect:workers", "od-connect 0 0\n")
    client = Client(address(daemon))
    assert find_coordinator(client, "connect:workers")[0] == NONE
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    joined = client.call(
        JoinGroupRequest,
        3,
        group_id="connect:workers",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="connect",
        protocols=[protocol(name="sessioned", metadata=b"")],
    )
    assert joined.error_code == NONE
    assert offset_delete(client, "connect:workers", {"od-connect": [0]}) == (NON_EMPTY_GROUP, {})
    client.close()  # its member goes with its connection
    admin = Client(address(daemon))
    deadline = time.monotonic() + 30
    while (answer := offset_delete(admin, "connect:workers", {"od-connect": [0]}))[0] == NON_EMPTY_GROUP:
        assert time.monotonic() < deadline, daemon.text()
        time.sleep(0.2)
    assert answer == (NONE, {"od-connect": [(0, NONE)]})
    assert groups.export(root, "connect:workers") == ""
    admin.close()
