"""``kl serve --kafka``'s consumer groups, request by request (kafka-python's protocol
classes over a raw socket, as in test_kafka.py): the coordinator's state machine, fencing,
offsets kept in kl's group files, the exclusion of kl members and Kafka members from one
group, and two daemons over one root with the coordinator killed under a real
confluent-kafka group."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import confluent_kafka
import kafka
import pytest
from kafka.protocol.admin.groups import DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from test_kafka import Client, Running, decoded, fetch

import kl
from kl.log.log import Position
from kl.net import brokers
from kl.net.kafka.errors import (
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    KAFKA_STORAGE_ERROR,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from kl.registry import Registry

from conftest import read_all, write, write_each
from kafka_clients import Daemon

KL = [sys.executable, "-m", "kl_cli"]
SESSION_MS = 6000
"""The shortest session timeout the coordinator accepts."""
PROTOCOLS = [("range", b"range-metadata"), ("roundrobin", b"roundrobin-metadata")]


class Named(Client):
    """A connection whose requests carry ``client_id``."""

    def __init__(self, address, client_id: str):
        super().__init__(address)
        self.client_id = client_id

    def send(self, request, version: int, **fields) -> None:
        self.correlation += 1
        message = request[version](**fields)
        message.with_header(correlation_id=self.correlation, client_id=self.client_id)
        self.sock.sendall(message.encode(header=True, framed=True))


class Member:
    """One group member on a connection of its own (a JoinGroup or SyncGroup may be parked
    until the others come: ``send_*`` then ``answer``)."""

    def __init__(self, address, group: str, client_id: str, *, protocols=PROTOCOLS, session_ms: int = SESSION_MS):
        self.client = Named(address, client_id)
        self.group, self.protocols, self.session_ms = group, protocols, session_ms
        self.id, self.generation = "", -1
        self._pending: tuple[object, int] | None = None

    def send_join(self, version: int = 5) -> None:
        protocol = JoinGroupRequest.JoinGroupRequestProtocol
        fields = {
            "group_id": self.group,
            "session_timeout_ms": self.session_ms,
            "member_id": self.id,
            "protocol_type": "consumer",
            "protocols": [protocol(name=n, metadata=m) for n, m in self.protocols],
        }
        if version >= 1:
            fields["rebalance_timeout_ms"] = 10_000
        self.client.send(JoinGroupRequest, version, **fields)
        self._pending = (JoinGroupRequest, version)

    def send_sync(self, assignments: dict[str, bytes] | None = None, *, generation: int | None = None, version: int = 3):
        given = SyncGroupRequest.SyncGroupRequestAssignment
        fields = {
            "group_id": self.group,
            "generation_id": self.generation if generation is None else generation,
            "member_id": self.id,
            "assignments": [given(member_id=i, assignment=a) for i, a in (assignments or {}).items()],
        }
        if version >= 5:
            fields.update(protocol_type="consumer", protocol_name="range")
        self.client.send(SyncGroupRequest, version, **fields)
        self._pending = (SyncGroupRequest, version)

    def answer(self):
        assert self._pending is not None
        request, version = self._pending
        self._pending = None
        response = self.client.receive(request, version)
        if request is JoinGroupRequest and response.error_code in (NONE, MEMBER_ID_REQUIRED):
            self.id = response.member_id
            if response.error_code == NONE:
                self.generation = response.generation_id
        return response

    def join(self, version: int = 5):
        self.send_join(version)
        return self.answer()

    def sync(self, assignments: dict[str, bytes] | None = None, **kwargs):
        self.send_sync(assignments, **kwargs)
        return self.answer()

    def heartbeat(self, *, generation: int | None = None) -> int:
        generation = self.generation if generation is None else generation
        answer = self.client.call(HeartbeatRequest, 3, group_id=self.group, generation_id=generation, member_id=self.id)
        return answer.error_code

    def commit(self, topic: str, offset: int, *, generation: int | None = None) -> int:
        return commit(self.client, self.group, topic, offset, self.generation if generation is None else generation, self.id)

    def leave(self, version: int = 0) -> int:
        if version < 3:
            return self.client.call(LeaveGroupRequest, version, group_id=self.group, member_id=self.id).error_code
        identity = LeaveGroupRequest.MemberIdentity
        answer = self.client.call(LeaveGroupRequest, version, group_id=self.group, members=[identity(member_id=self.id)])
        assert [m.error_code for m in answer.members] == [NONE]
        return answer.error_code

    def close(self) -> None:
        self.client.close()


def commit(client: Client, group: str, topic: str, offset: int, generation: int = -1, member: str = "") -> int:
    """An OffsetCommit (v8) of partition 0: its error code."""
    given = OffsetCommitRequest.OffsetCommitRequestTopic
    answer = client.call(
        OffsetCommitRequest,
        8,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id=member,
        group_instance_id=None,
        topics=[
            given(
                name=topic,
                partitions=[
                    given.OffsetCommitRequestPartition(
                        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
                    )
                ],
            )
        ],
    )
    ((code,),) = [[p.error_code for p in t.partitions] for t in answer.topics]
    return code


def fetched(client: Client, group: str, topic: str) -> tuple[int, int]:
    """An OffsetFetch (v5) of partition 0: (committed offset, error code)."""
    wanted = OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])
    answer = client.call(OffsetFetchRequest, 5, group_id=group, topics=[wanted])
    assert answer.error_code == NONE
    ((found,),) = [t.partitions for t in answer.topics]
    return found.committed_offset, found.error_code


def find_coordinator(client: Client, group: str, version: int = 2) -> tuple[int, int, str, int]:
    """(error code, node id, host, port) of the group's coordinator."""
    if version >= 4:
        answer = client.call(FindCoordinatorRequest, version, key_type=0, coordinator_keys=[group])
        (found,) = answer.coordinators
        return found.error_code, found.node_id, found.host, found.port
    fields = {"key": group} if version == 0 else {"key": group, "key_type": 0}
    answer = client.call(FindCoordinatorRequest, version, **fields)
    return answer.error_code, answer.node_id, answer.host, answer.port


def offset_file(root: kl.Root, group: str, topic: str) -> bytes:
    with open(os.path.join(root.path, ".groups", group, "commits", topic), "rb") as f:
        return f.read()


def kl_run(root: kl.Root, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*KL, "--root", root.path, *args], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def served(root):
    running = Running(root)
    members: list[Member] = []

    def member(group: str, client_id: str, **kwargs) -> Member:
        members.append(Member(running.address, group, client_id, **kwargs))
        return members[-1]

    yield running, member
    for each in members:
        each.close()
    running.stop()


# ----------------------------------------------------------------- the state machine


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_find_coordinator_answers_this_daemon_and_writes_it_into_the_root(root, served, version):
    running, member = served
    client = member("g", "c").client
    address = f"127.0.0.1:{running.address[1]}"
    assert find_coordinator(client, "g", version) == (NONE, brokers.node_id(address), *running.address)
    with open(os.path.join(root.path, ".groups", ".coordinators", "g"), "rb") as f:
        assert kl.registry.decode_coordinator(f.read()) == (address, 0)  # no members yet


def test_members_join_one_generation_sync_the_leaders_assignment_and_rebalance_as_they_come_and_go(root, topic, served):
    running, member = served
    a, b, c = member("g", "client-a"), member("g", "client-b"), member("g", "client-c")
    find_coordinator(a.client, "g")
    first = a.join(version=5)  # v4 on: a new member is given its id first
    assert (first.error_code, first.generation_id) == (MEMBER_ID_REQUIRED, -1) and a.id.startswith("client-a-")
    a.send_join(version=5)  # parked: the group's first rebalance waits for more members
    assert b.join(version=4).error_code == MEMBER_ID_REQUIRED
    b.send_join(version=4)
    joined_a, joined_b = a.answer(), b.answer()
    assert joined_a.error_code == joined_b.error_code == NONE
    assert joined_a.generation_id == joined_b.generation_id == a.generation == b.generation >= 1
    assert joined_a.leader == joined_b.leader == a.id
    assert joined_a.protocol_name == joined_b.protocol_name == "range"
    assert {(m.member_id, bytes(m.metadata)) for m in joined_a.members} == {(a.id, b"range-metadata"), (b.id, b"range-metadata")}
    assert joined_b.members == []

    b.send_sync()  # parked until the leader's assignment comes
    # CompletingRebalance: no commits (b's, sent on another connection: its own is busy)
    assert commit(c.client, "g", "t", 0, b.generation, b.id) == REBALANCE_IN_PROGRESS
    assert os.listdir(os.path.join(root.path, ".groups", "g")) == ["ids"]
    synced_a = a.sync({a.id: b"for-a", b.id: b"for-b"})
    synced_b = b.answer()
    assert (synced_a.error_code, bytes(synced_a.assignment)) == (NONE, b"for-a")
    assert (synced_b.error_code, bytes(synced_b.assignment)) == (NONE, b"for-b")
    assert a.heartbeat() == b.heartbeat() == NONE

    for version in (0, 5):
        answer = a.client.call(DescribeGroupsRequest, version, groups=["g"], include_authorized_operations=False)
        (described,) = answer.groups
        assert (described.error_code, described.group_state, described.protocol_type, described.protocol_data) == (
            NONE,
            "Stable",
            "consumer",
            "range",
        )
        members = sorted(
            (m.member_id, m.client_id, bytes(m.member_metadata), bytes(m.member_assignment)) for m in described.members
        )
        assert members == sorted(
            [(a.id, "client-a", b"range-metadata", b"for-a"), (b.id, "client-b", b"range-metadata", b"for-b")]
        )
    listed = a.client.call(ListGroupsRequest, 0)
    assert [(g.group_id, g.protocol_type) for g in listed.groups] == [("g", "consumer")]
    listed = a.client.call(ListGroupsRequest, 4, states_filter=["Stable"])
    assert [(g.group_id, g.protocol_type, g.group_state) for g in listed.groups] == [("g", "consumer", "Stable")]
    assert a.client.call(ListGroupsRequest, 4, states_filter=["Empty"]).groups == []

    # A third member: the others are told to join again, and all three make the next generation.
    c.send_join(version=0)
    assert a.heartbeat() == b.heartbeat() == REBALANCE_IN_PROGRESS
    a.send_join()
    b.send_join(version=4)
    second = [m.answer() for m in (a, b, c)]
    assert [r.error_code for r in second] == [NONE] * 3
    assert len({r.generation_id for r in second}) == 1 and second[0].generation_id == joined_a.generation_id + 1
    assert [len(r.members) for r in second] == [3, 0, 0]
    c.send_sync()
    b.send_sync()
    a.sync({a.id: b"a2", b.id: b"b2", c.id: b"c2"}, version=5)
    assert [bytes(m.answer().assignment) for m in (c, b)] == [b"c2", b"b2"]

    # LeaveGroup, v0's form and v3's (a member list): each makes a rebalance.
    assert c.leave(version=0) == NONE
    assert a.heartbeat() == REBALANCE_IN_PROGRESS
    a.send_join()
    b.send_join()
    third = [a.answer(), b.answer()]
    assert [r.generation_id for r in third] == [second[0].generation_id + 1] * 2
    assert {m.member_id for m in third[0].members} == {a.id, b.id}
    b.send_sync()
    a.sync({a.id: b"a3", b.id: b"b3"})
    assert bytes(b.answer().assignment) == b"b3"
    assert b.leave(version=3) == NONE
    assert a.heartbeat() == REBALANCE_IN_PROGRESS
    assert [m.member_id for m in a.join().members] == [a.id]
    assert a.sync({a.id: b"alone"}).assignment == b"alone"
    assert a.heartbeat() == NONE


def test_a_member_silent_past_its_session_timeout_is_removed_and_fenced_and_the_others_rejoin(root, topic, served):
    running, member = served
    offsets = write_each(root, "t", [b"m%d" % i for i in range(10)])
    a, b = member("g", "a"), member("g", "b")
    find_coordinator(a.client, "g")
    assert member("g", "short", session_ms=1000).join().error_code == INVALID_SESSION_TIMEOUT
    a.send_join(version=3)
    b.send_join(version=3)
    assert a.answer().error_code == b.answer().error_code == NONE
    b.send_sync()
    a.sync({a.id: b"x", b.id: b"y"})
    assert b.answer().error_code == NONE
    other = member("g", "other", protocols=[("sticky", b"")])
    assert other.join(version=3).error_code == INCONSISTENT_GROUP_PROTOCOL  # nothing in common with a and b
    offset = write_each(root, "t", [b"more"])[0]
    assert b.commit("t", 10) == NONE  # the Kafka offset of the 11th message
    before = offset_file(root, "g", "t")
    assert Registry(root.path, "g").committed("t", 0).position == Position(offset)
    # An outside commit (an assign() consumer's) is refused while the group has members.
    assert commit(a.client, "g", "t", 0) == UNKNOWN_MEMBER_ID

    started = time.monotonic()
    while (code := a.heartbeat()) == NONE:  # a beats, b is silent
        assert time.monotonic() - started < SESSION_MS / 1000 + 10, "b was never removed"
        time.sleep(0.5)
    assert code == REBALANCE_IN_PROGRESS and time.monotonic() - started >= SESSION_MS / 1000 - 1.5
    stale = a.generation
    rejoined = a.join(version=3)
    assert (rejoined.error_code, [m.member_id for m in rejoined.members]) == (NONE, [a.id])

    # b, back: unknown everywhere, its commit refused and the file untouched.
    assert b.heartbeat() == UNKNOWN_MEMBER_ID
    assert b.sync().error_code == UNKNOWN_MEMBER_ID
    assert b.commit("t", 0) == UNKNOWN_MEMBER_ID
    assert b.commit("t", 0, generation=rejoined.generation_id) == UNKNOWN_MEMBER_ID
    assert b.join(version=3).error_code == UNKNOWN_MEMBER_ID
    # a's stale generation: ILLEGAL_GENERATION on everything.
    assert a.sync({a.id: b"x"}).error_code == NONE
    assert a.heartbeat(generation=stale) == ILLEGAL_GENERATION
    assert a.sync({a.id: b"x"}, generation=stale).error_code == ILLEGAL_GENERATION
    assert a.commit("t", 0, generation=stale) == ILLEGAL_GENERATION
    assert offset_file(root, "g", "t") == before
    assert fetched(a.client, "g", "t") == (10, NONE)

    # Once a left, an outside commit is taken.
    assert a.leave() == NONE
    assert commit(a.client, "g", "t", 2) == NONE
    assert Registry(root.path, "g").committed("t", 0).position == Position(offsets[2])


# ----------------------------------------------------------------- offsets


def test_committed_offsets_are_kls_group_files_inside_compressed_batches_too(root, topic, served):
    running, member = served
    client = member("g", "c").client
    find_coordinator(client, "g")
    first = write_each(root, "t", [b"a", b"b"])
    (batch,) = {a.offset for a in write(root, "t", [b"z%d" % i for i in range(10)], compression="gzip")}
    assert [offset for offset, *_ in decoded(fetch(client, "t", 2))] == list(range(2, 12))  # Kafka offsets

    assert fetched(client, "g", "t") == (-1, NONE)
    assert commit(client, "g", "t", 1) == NONE
    assert fetched(client, "g", "t") == (1, NONE)
    committed = Registry(root.path, "g").committed("t", 0)
    assert (committed.position, committed.member) == (Position(first[1]), "kafka")
    described = json.loads(kl_run(root, "groups", "describe", "g", "--json").stdout)
    assert [(p["topic"], p["partition"], p["committed"], p["skip"]) for p in described["partitions"]] == [("t", 0, first[1], 0)]

    assert commit(client, "g", "t", 2 + 3) == NONE  # the 4th message of the batch
    assert Registry(root.path, "g").committed("t", 0).position == Position(batch, 3)
    assert fetched(client, "g", "t") == (5, NONE)
    every = client.call(OffsetFetchRequest, 2, group_id="g", topics=None)  # v2 on: None asks for all
    assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in every.topics] == [
        ("t", [(0, 5)])
    ]
    asked = OffsetFetchRequest.OffsetFetchRequestGroup
    wanted = asked.OffsetFetchRequestTopics(name="t", partition_indexes=[0])
    (group,) = client.call(OffsetFetchRequest, 8, groups=[asked(group_id="g", topics=[wanted])], require_stable=False).groups
    assert [[(p.committed_offset, p.error_code) for p in t.partitions] for t in group.topics] == [[(5, NONE)]]
    resumed = kl_run(root, "consume", "t", "--group", "g")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == [b"z%d" % i for i in range(3, 10)]
    assert fetched(client, "g", "t") == (12, NONE)  # what kl consume committed: the log end

    # A damaged offset file (of an older kl): an error, not "nothing committed".
    path = os.path.join(root.path, ".groups", "h", "offsets", "t", "0")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"offset 3\n")
    assert fetched(client, "h", "t") == (-1, KAFKA_STORAGE_ERROR)

    # A topic deleted and created again: its old offset counts as none.
    root.create_topic("u")
    write_each(root, "u", [b"1", b"2", b"3"])
    assert commit(client, "g", "u", 2) == NONE and fetched(client, "g", "u") == (2, NONE)
    root.delete_topic("u")
    root.create_topic("u")
    write_each(root, "u", [b"1", b"2", b"3"])
    assert fetched(client, "g", "u") == (-1, NONE)


def test_kl_groups_reset_is_refused_while_kafka_members_live_and_then_moves_what_offset_fetch_answers(root, topic, served):
    running, member = served
    offsets = write_each(root, "t", [b"a", b"b", b"c"])
    a = member("g", "a")
    find_coordinator(a.client, "g")
    a.join(version=3)
    assert a.sync({a.id: b""}).error_code == NONE
    assert a.commit("t", 2) == NONE
    refused = kl_run(root, "groups", "reset", "g", "--to", "earliest")
    assert refused.returncode != 0 and b"g" in refused.stderr and b"live" in refused.stderr
    assert fetched(a.client, "g", "t") == (2, NONE)
    assert a.leave() == NONE
    reset = kl_run(root, "groups", "reset", "g", "--to", "earliest")
    assert (reset.returncode, reset.stdout) == (0, b"t/0: %d -> 0\n" % offsets[2])
    assert fetched(a.client, "g", "t") == (0, NONE)


# ----------------------------------------------------------------- kl members and Kafka members


def test_a_kafka_client_cannot_join_a_group_with_a_live_kl_member(root, topic, served, caplog):
    running, member = served
    write_each(root, "t", [b"a"])
    kl_member = subprocess.Popen(
        [*KL, "--root", root.path, "consume", "t", "--group", "g", "--follow"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        assert kl_member.stdout.readline() == b"a\n"  # it has joined and owns t/0
        a = member("g", "a")
        find_coordinator(a.client, "g")
        with caplog.at_level(logging.WARNING, logger="kl.serve"):
            assert a.join(version=3).error_code == INCONSISTENT_GROUP_PROTOCOL
        assert any("group g:" in r.getMessage() and "kl members live" in r.getMessage() for r in caplog.records)
        assert commit(a.client, "g", "t", 0) == UNKNOWN_MEMBER_ID  # from outside the group: refused too
        assert [m.subscription.get("kafka") for m in Registry(root.path, "g").members()] == [None]
        assert kl_member.poll() is None
    finally:
        kl_member.send_signal(signal.SIGTERM)
        kl_member.wait(30)
    # Gone, it leaves the group to them.
    assert a.join(version=3).error_code == NONE


def test_a_kl_member_cannot_join_a_group_with_kafka_members(root, topic, served):
    running, member = served
    write_each(root, "t", [b"a"])
    a = member("g", "a")
    find_coordinator(a.client, "g")
    a.join(version=3)
    assert a.sync({a.id: b"t/0"}).error_code == NONE
    refused = kl_run(root, "consume", "t", "--group", "g")
    assert refused.returncode != 0 and refused.stdout == b""
    (line,) = refused.stderr.decode().splitlines()
    assert line.startswith("Error: group 'g' has Kafka clients as members"), line
    with pytest.raises(kl.GroupTaken, match="group 'g'"):
        kl.GroupConsumer(root, "g", ["t"])
    registry = Registry(root.path, "g")
    assert [m.subscription for m in registry.members()] == [{"kafka": f"127.0.0.1:{running.address[1]}"}]
    assert [owner.member for _, _, owner in registry.owners() if owner.member is not None] == []
    assert a.heartbeat() == NONE


def test_a_kl_member_waits_out_the_session_of_kafka_members_whose_coordinator_was_killed(root, topic, tmp_path):
    """The Kafka clients keep reading their partitions until their session times out
    without a coordinator: a kl member may not join before."""
    write_each(root, "t", [b"a"])
    daemon = Daemon(root.path, tmp_path / "serve.log")
    host, port = daemon.bootstrap.split(":")
    a = Member((host, int(port)), "g", "a")
    try:
        find_coordinator(a.client, "g")
        assert a.join().error_code == MEMBER_ID_REQUIRED
        assert a.join().error_code == NONE
        assert a.sync({a.id: b"t/0"}).error_code == NONE
        daemon.proc.kill()
        daemon.proc.wait()
        killed = time.monotonic()
        with pytest.raises(
            kl.GroupTaken,
            match=r"group 'g' had Kafka clients as members until their coordinator .*"
            r"stopped: they may read their partitions for [0-9]+ s more",
        ):
            kl.GroupConsumer(root, "g", ["t"])
        while True:
            try:
                member = kl.GroupConsumer(root, "g", ["t"])
                break
            except kl.GroupTaken:
                assert time.monotonic() - killed < SESSION_MS / 1000 + 30, "refused long past the clients' session"
                time.sleep(0.2)
        waited = time.monotonic() - killed
        member.close()
        assert waited >= SESSION_MS / 1000 - 1.5, f"a kl member joined {waited:.1f} s after the coordinator's death"
    finally:
        a.close()
        daemon.proc.kill()


# ----------------------------------------------------------------- two daemons over one root


def brokers_of(address: str) -> set[tuple[int, str, int]]:
    host, port = address.split(":")
    client = Client((host, int(port)))
    try:
        answer = client.call(MetadataRequest, 1, topics=[])
    finally:
        client.close()
    return {(b.node_id, b.host, b.port) for b in answer.brokers}


def coordinator_seen_by(address: str, group: str) -> tuple[int, int, str, int]:
    host, port = address.split(":")
    client = Client((host, int(port)))
    try:
        return find_coordinator(client, group)
    finally:
        client.close()


def test_two_daemons_name_one_coordinator_and_the_survivor_takes_over_a_group_when_it_is_killed(root, tmp_path):
    partitions = 4
    root.create_topic("t", kl.TopicConfig(partitions=partitions))
    first, second = Daemon(root.path, tmp_path / "first.log"), Daemon(root.path, tmp_path / "second.log")
    consumers = []
    try:
        both = {(brokers.node_id(d.bootstrap), "127.0.0.1", int(d.bootstrap.split(":")[1])) for d in (first, second)}
        assert brokers_of(first.bootstrap) == brokers_of(second.bootstrap) == both
        named = coordinator_seen_by(first.bootstrap, "g")
        assert named == coordinator_seen_by(second.bootstrap, "g") == (NONE, *_node(first.bootstrap))

        config = {
            "bootstrap.servers": f"{first.bootstrap},{second.bootstrap}",
            "group.id": "g",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "range",
            "fetch.wait.max.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000,
        }
        assigned: list[dict[int, float]] = [{}, {}]

        def on_assign(i):
            def record(consumer, given):
                for p in given:
                    assigned[i][p.partition] = time.monotonic()

            return record

        for i in range(2):
            consumer = confluent_kafka.Consumer(config)
            consumer.subscribe(["t"], on_assign=on_assign(i))
            consumers.append(consumer)
        producer = kl.Producer(root)
        values = [b"%d" % i for i in range(400)]
        for i, value in enumerate(values[:200]):
            producer.send("t", value, partition=i % partitions)
        seen: list[bytes] = []
        uncommitted: list[bytes] = []
        """Messages whose commit failed (the coordinator was gone): they may come again."""

        def consume_until(done, timeout: float = 40) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                assert time.monotonic() < deadline, f"{len(set(seen))} of {len(values)} read"
                for consumer in consumers:
                    message = consumer.poll(0.05)
                    if message is None or message.error():
                        continue
                    seen.append(message.value())
                    try:
                        consumer.commit(message=message, asynchronous=False)
                    except confluent_kafka.KafkaException:
                        uncommitted.append(message.value())

        registry = Registry(root.path, "g")

        def all_committed() -> bool:
            ends = {p: root.log("t", p).state().log_end_offset for p in range(partitions)}
            found = {p: registry.committed("t", p) for p in range(partitions)}
            return all(found[p] is not None and found[p].position == Position(ends[p]) for p in range(partitions))

        consume_until(lambda: set(seen) >= set(values[:200]) and all_committed())
        assert all(assigned) and sorted(p for a in assigned for p in a) == list(range(partitions))
        committed_before = {p: registry.committed("t", p).position for p in range(partitions)}

        killed_at = time.monotonic()
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        for i, value in enumerate(values[200:]):
            producer.send("t", value, partition=i % partitions)
        consume_until(lambda: set(seen) == set(values) and all_committed())
        reassigned = [max(a.values()) for a in assigned]
        print(f"partitions reassigned {max(reassigned) - killed_at:.2f} s after the coordinator's SIGKILL")
        assert all(at > killed_at for at in reassigned), "the group did not rebalance after its coordinator died"
        assert coordinator_seen_by(second.bootstrap, "g") == (NONE, *_node(second.bootstrap))
        assert brokers_of(second.bootstrap) == {_node(second.bootstrap)}  # the dead one's registration is ignored
        assert all(registry.committed("t", p).position.offset > committed_before[p].offset for p in range(partitions))
        duplicates = len(seen) - len(set(seen))
        print(f"{duplicates} duplicates, {len(uncommitted)} commits refused while the coordinator moved")
        assert duplicates <= len(uncommitted)
    finally:
        for consumer in consumers:
            consumer.close()
        first.stop()
        second.stop()


def _node(address: str) -> tuple[int, str, int]:
    host, port = address.split(":")
    return brokers.node_id(address), host, int(port)


def leaders_seen_by(address: str, topic: str) -> dict[int, int]:
    host, port = address.split(":")
    client = Client((host, int(port)))
    try:
        (found,) = client.call(MetadataRequest, 1, topics=[MetadataRequest.MetadataRequestTopic(name=topic)]).topics
    finally:
        client.close()
    return {p.partition_index: p.leader_id for p in found.partitions}


def test_two_daemons_name_the_same_leaders_so_an_idempotent_producer_writes_each_record_once(root, tmp_path):
    """Issue 35: each daemon named itself every partition's leader, so a producer's metadata
    refreshes moved partitions between them (kafka-python: OutOfOrderSequenceNumberError)."""
    partitions = 8
    root.create_topic("t", kl.TopicConfig(partitions=partitions))
    first, second = Daemon(root.path, tmp_path / "first.log"), Daemon(root.path, tmp_path / "second.log")
    try:
        pool = sorted([first.bootstrap, second.bootstrap])
        expected = {p: brokers.node_id(brokers.leader("t", p, pool)) for p in range(partitions)}
        assert leaders_seen_by(first.bootstrap, "t") == leaders_seen_by(second.bootstrap, "t") == expected
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": f"{first.bootstrap},{second.bootstrap}",
                "enable.idempotence": True,
                "linger.ms": 5,
                "topic.metadata.refresh.interval.ms": 200,
            }
        )
        errors: list[object] = []
        values = [b"%d" % i for i in range(3000)]
        for i, value in enumerate(values):
            producer.produce("t", value, partition=i % partitions, on_delivery=lambda e, _: e and errors.append(e))
            producer.poll(0)
            if i % 250 == 0:
                time.sleep(0.3)  # metadata refreshed meanwhile, from either daemon
            if i == 1000:  # a leader that hangs: its partitions' clients wait for it (with each, 3 of 6 runs stored some twice)
                first.proc.send_signal(signal.SIGSTOP)
            elif i == 2000:
                time.sleep(3)
                first.proc.send_signal(signal.SIGCONT)
        assert producer.flush(30) == 0 and errors == []
        python = kafka.KafkaProducer(
            bootstrap_servers=[first.bootstrap, second.bootstrap], enable_idempotence=True, metadata_max_age_ms=200, linger_ms=5
        )
        more = [b"k%d" % i for i in range(2000)]
        futures = []
        for i, value in enumerate(more):
            futures.append(python.send("t", value, partition=i % partitions))
            if i % 250 == 0:
                time.sleep(0.3)
        python.flush(30)
        python.close()
        assert [f.exception for f in futures if f.failed()] == []
        stored = {p: [m.value for m in read_all(root, "t", p)] for p in range(partitions)}
        assert stored == {p: values[p::partitions] + more[p::partitions] for p in range(partitions)}
        first.proc.kill()
        first.proc.wait()
        deadline = time.monotonic() + 20
        while set(leaders_seen_by(second.bootstrap, "t").values()) != {brokers.node_id(second.bootstrap)}:
            assert time.monotonic() < deadline, "the survivor does not lead every partition"
            time.sleep(0.1)
    finally:
        first.proc.send_signal(signal.SIGCONT)
        first.stop()
        second.stop()
