"""GroupConsumer's Kafka-client API: seek, pause/resume, position/committed, commit(offsets),
on_assign/on_revoke and deserializers; rebalances and kill -9 with member processes."""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

import kl
import kl.registry
from kl.registry import COMMITS, LEGACY_OFFSETS
from kl.serde import json_deserializer, string_deserializer

from conftest import write, write_each

FAST = {"poll_interval": 0.05, "session_timeout": 0.5}

MEMBER = """
import signal, sys, time
import kl
root, group, topic, out, slow = sys.argv[1:6]
log = open(out, "a", buffering=1)

def note(kind, partitions):
    for t, p in partitions:
        log.write(f"{kind} {time.monotonic()} {t} {p}\\n")

member = kl.GroupConsumer(root, group, [topic], auto_commit=False, poll_interval=0.05, session_timeout=1,
                          on_assign=lambda c, ps: note("assign", ps), on_revoke=lambda c, ps: note("revoke", ps))
signal.signal(signal.SIGTERM, lambda *_: member.stop())  # then close(): on_revoke of what it owns
log.write("joined\\n")
for record in member:
    log.write(f"m {record.partition} {record.offset} {record.value.decode()}\\n")
    time.sleep(float(slow))  # the processing
    try:
        member.commit({(record.topic, record.partition): record.next_offset})
    except kl.NotOwner as e:
        log.write(f"rejected {e}\\n")
        continue
    log.write(f"c {record.partition} {record.next_offset}\\n")
member.close()
"""


class Member:
    """A member process (``MEMBER``) committing each message after processing it for ``slow`` seconds."""

    def __init__(self, root: kl.Root, out: str, slow: float = 0.0):
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-c", MEMBER, root.path, "g", "t", out, str(slow)])
        wait_for(lambda: self.lines("joined"), "the member to join")

    def lines(self, kind: str) -> list[list[str]]:
        if not os.path.exists(self.out):
            return []
        with open(self.out, encoding="utf-8") as f:
            text = f.read()
        return [line.split()[1:] for line in text[: text.rfind("\n") + 1].splitlines() if line.split()[0] == kind]

    def values(self) -> list[str]:
        return [v for _, _, v in self.lines("m")]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for m in started:
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait()


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := condition():
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def offset_files(member: kl.GroupConsumer) -> dict[str, bytes]:
    """The group's committed offsets files and their bytes."""
    out = {}
    for kind in (COMMITS, LEGACY_OFFSETS):
        for where, _, names in os.walk(os.path.join(member.registry.path, kind)):
            for name in names:
                with open(os.path.join(where, name), "rb") as f:
                    out[os.path.join(where, name)] = f.read()
    return out


def test_seek_back_rereads_and_position_follows(root, topic):
    offsets = write_each(root, topic, [b"a", b"b", b"c", b"d"])
    with kl.GroupConsumer(root, "g", [topic], auto_commit=False, **FAST) as member:
        stream = iter(member)
        assert member.position(topic, 0) == kl.Position(offsets[0])
        first, second = stream.poll(5), stream.poll(5)
        assert member.position(topic, 0) == kl.Position(second.next_offset)
        member.seek(topic, 0, first.offset)
        assert [stream.poll(5).value for _ in range(3)] == [b"a", b"b", b"c"]
        member.seek(topic, 0, "latest")
        assert stream.poll(0.3) is None
        member.seek(topic, 0, "earliest")
        assert stream.poll(5).value == b"a"
        with pytest.raises(kl.NotOwner, match="cannot seek t/1: not owned"):
            member.seek(topic, 1, 0)
        with pytest.raises(kl.InvalidConfig, match="a position must be a byte offset"):
            member.seek(topic, 0, -1)


def test_positions_inside_a_compressed_batch(root, topic):
    (appended,) = write(root, topic, [b"a", b"b", b"c"], compression="gzip")
    with kl.GroupConsumer(root, "g", [topic], auto_commit=False, **FAST) as member:
        stream = iter(member)
        assert stream.poll(5).value == b"a"
        inside = member.position(topic, 0)
        assert inside == kl.Position(appended.offset, 1)
        assert stream.poll(5).value == b"b"
        member.seek(topic, 0, inside)
        assert stream.poll(5).value == b"b"
        member.commit({(topic, 0): inside})
        assert member.committed(topic, 0) == inside


def test_committed_and_commit_of_given_offsets(root, topic):
    offsets = write_each(root, topic, [b"a", b"b", b"c"])
    with kl.GroupConsumer(root, "g", [topic], auto_commit=False, **FAST) as member:
        assert member.committed(topic, 0) is None
        records = [next(iter(member)) for _ in range(3)]
        member.commit([((topic, 0), records[0].next_offset)])  # stored with the result: not everything handed out
        assert member.committed(topic, 0) == kl.Position(offsets[1])
    with kl.GroupConsumer(root, "g", [topic], auto_commit=False, **FAST) as member:
        assert next(iter(member)).value == b"b"


def test_commit_of_an_unowned_partition_is_refused_and_nothing_is_written(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    for p in range(2):
        write_each(root, "t", [b"x"], partition=p)
    a = kl.GroupConsumer(root, "g", ["t"], auto_commit=False, **FAST)
    b = kl.GroupConsumer(root, "g", ["t"], auto_commit=False, **FAST)
    try:
        wait_for(lambda: len(a.assignment().get("t", [])) == 1 and len(b.assignment().get("t", [])) == 1, "the split")
        (mine,), (theirs,) = a.assignment()["t"], b.assignment()["t"]
        before = offset_files(a)
        with pytest.raises(kl.NotOwner, match=f"cannot commit t/{theirs}: not owned by this member") as e:
            a.commit({("t", mine): 0, ("t", theirs): 0})
        assert f"t/{mine}" not in str(e.value)
        assert offset_files(a) == before
        assert a.committed("t", mine) is None
    finally:
        a.close()
        b.close()


def test_pause_hands_out_nothing_and_keeps_the_partition_past_the_session_timeout(root, members, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    with kl.GroupConsumer(root, "g", ["t"], auto_commit=False, poll_interval=0.05, session_timeout=1) as a:
        other = Member(root, str(tmp_path / "b"))
        members.append(other)
        wait_for(lambda: len(a.assignment()["t"]) == 1 and len(other.lines("assign")) == 1, "the split")
        (mine,) = a.assignment()["t"]
        a.pause([("t", mine)])
        assert a.paused() == [("t", mine)]
        for p in range(2):
            write_each(root, "t", [f"{p}".encode()], partition=p)
        assert iter(a).poll(2.5) is None  # over twice the session timeout: nothing handed out ...
        assert a.assignment() == {"t": [mine]}  # ... and still this member's, the other one took nothing
        assert other.values() == [f"{1 - mine}"] and other.lines("revoke") == []
        a.resume([("t", mine)])
        assert a.paused() == []
        assert iter(a).poll(5).value == f"{mine}".encode()
        with pytest.raises(kl.NotOwner, match=f"cannot pause t/{1 - mine}"):
            a.pause([("t", 1 - mine)])


def test_rebalance_calls_revoke_before_assign_and_explicit_commits_lose_nothing(root, members, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=4))
    count = 400
    producer = kl.Producer(root)
    for i in range(count):
        producer.send("t", str(i).encode(), partition=i % 4)
    a = Member(root, str(tmp_path / "a"), slow=0.005)
    members.append(a)
    wait_for(lambda: len(a.values()) > 20, "a to read")
    b = Member(root, str(tmp_path / "b"), slow=0.005)
    members.append(b)
    wait_for(lambda: len(set(a.values()) | set(b.values())) == count, "every message")
    a.stop()
    b.stop()
    events = sorted(
        (float(at), kind, m, int(p))
        for m, member in (("a", a), ("b", b))
        for kind in ("assign", "revoke")
        for at, _, p in member.lines(kind)
    )
    owner: dict[int, str | None] = {}
    last: dict[int, str] = {}
    moved = 0
    for _, kind, m, p in events:  # each partition is one member's at a time: revoked before the other gets it
        if kind == "assign":
            assert owner.get(p) is None, f"{m} got partition {p} while {owner.get(p)} had it"
            owner[p] = m
            moved += last.get(p, m) != m
        else:
            assert owner[p] == m
            owner[p], last[p] = None, m
    assert moved >= 1
    seen = collections.Counter(a.values() + b.values())
    assert set(seen) == {str(i) for i in range(count)}
    assert sum(seen.values()) - count <= moved  # again: at most what was in processing when its partition moved


def test_a_member_killed_mid_processing_is_resumed_from_its_last_commit(root, members, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    offsets = write_each(root, "t", [str(i).encode() for i in range(200)])
    a = Member(root, str(tmp_path / "a"), slow=0.01)
    members.append(a)
    wait_for(lambda: len(a.lines("c")) >= 10, "a to commit")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    last = int(a.lines("c")[-1][1])
    with kl.GroupConsumer(root, "g", ["t"], auto_commit=False, poll_interval=0.05, session_timeout=1) as b:
        stored = b.committed("t", 0)
        in_processing = offsets.index(int(a.lines("m")[-1][1]))
        assert stored is not None and stored.offset in (last, offsets[in_processing + 1])  # killed after its commit or before
        record = wait_for(lambda: iter(b).poll(0.5), "b to read")
        assert record.offset == stored.offset
        assert int(record.value) == offsets.index(record.offset)


def test_on_revoke_comes_after_the_final_auto_commit_and_its_own_commit_stands(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    offsets = {p: write_each(root, "t", [b"x", b"y"], partition=p) for p in range(2)}
    seen = {}

    def on_revoke(member, partitions):
        for t, p in partitions:
            seen[p] = member.committed(t, p)
            member.commit({(t, p): offsets[p][1]})  # the caller's own, after the auto-commit

    a = kl.GroupConsumer(root, "g", ["t"], on_revoke=on_revoke, auto_commit_interval=60, **FAST)
    stream = iter(a)
    assert len([stream.poll(5) for _ in range(4)]) == 4
    assert stream.poll(0.1) is None  # the last one is consumed too
    b = kl.GroupConsumer(root, "g", ["t"], **FAST)
    try:
        (moved,) = wait_for(lambda: b.assignment().get("t"), "b to take a partition")
        assert seen[moved] == kl.Position(a.root.log("t", moved).state().log_end_offset)
        assert b.committed("t", moved) == kl.Position(offsets[moved][1])
        assert iter(b).poll(5).offset == offsets[moved][1]
    finally:
        b.close()
        a.close()


def test_callbacks_in_process_and_a_raising_callback_is_logged(root, topic, caplog):
    write_each(root, topic, [b"a"])
    calls = []

    def on_assign(member, partitions):
        calls.append(("assign", partitions, member.position(topic, 0)))
        raise RuntimeError("the callback's own bug")

    with caplog.at_level(logging.ERROR, logger="kl.group"):
        member = kl.GroupConsumer(
            root, "g", [topic], on_assign=on_assign, on_revoke=lambda m, ps: calls.append(("revoke", ps, None)), **FAST
        )
        assert next(iter(member)).value == b"a"  # it went on
        member.close()
    assert calls == [("assign", [(topic, 0)], kl.Position(0)), ("revoke", [(topic, 0)], None)]
    assert "the callback's own bug" in caplog.text and "on_assign raised" in caplog.text


def test_a_topic_created_again_is_revoked_before_its_new_partitions_are_assigned(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write_each(root, "t", [b"old"])
    calls = []
    member = kl.GroupConsumer(
        root,
        "g",
        ["t"],
        on_assign=lambda m, ps: calls.append(("assign", ps)),
        on_revoke=lambda m, ps: calls.append(("revoke", ps)),
        **FAST,
    )
    try:
        assert iter(member).poll(5).value == b"old"
        root.delete_topic("t")
        root.create_topic("t", kl.TopicConfig(partitions=1))
        write_each(root, "t", [b"new"])
        wait_for(lambda: len(calls) >= 3, "the new topic's partition to be assigned")
    finally:
        member.close()
    assert calls == [
        ("assign", [("t", 0), ("t", 1)]),
        ("revoke", [("t", 0), ("t", 1)]),
        ("assign", [("t", 0)]),
        ("revoke", [("t", 0)]),
    ]


@pytest.mark.parametrize("damage", ["out of range", "damaged offset file"])
def test_seek_is_the_way_on_for_a_partition_blocked_under_reset_fail(root, damage):
    """Kafka's remedy under ``auto.offset.reset=none``: polls raise until a seek; then
    reading goes on from there and the commit of it is stored (a damaged offset file set aside)."""
    root.create_topic("t")
    offsets = write_each(root, "t", [b"a", b"b", b"c"])
    registry = kl.registry.Registry(root.path, "g")
    if damage == "out of range":
        registry.write_offset("t", 0, 10**9, "admin")
        error = kl.OffsetOutOfRange
    else:
        path = os.path.join(registry.path, LEGACY_OFFSETS, "t", "0")
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(b"offset 9")
        error = kl.CorruptOffset
    with kl.GroupConsumer(root, "g", ["t"], reset="fail", auto_commit=False, **FAST) as member:
        stream = iter(member)
        for _ in range(2):  # every poll, until the seek
            with pytest.raises(error):
                stream.poll(1)
        member.seek("t", 0, offsets[1])
        assert stream.poll(5).value == b"b"
        member.commit()
        assert member.committed("t", 0) == kl.Position(offsets[2])
    if damage != "out of range":
        assert os.path.exists(path + ".damaged") and not os.path.exists(path)
    with kl.GroupConsumer(root, "g", ["t"], reset="fail", **FAST) as later:
        assert iter(later).poll(5).value == b"c"


def test_deserializers_hand_out_objects_and_null_stays_none(root, topic):
    producer = kl.Producer(root)
    producer.send(topic, json.dumps({"n": 1}).encode(), key=b"k")
    producer.send(topic, None, key=b"gone")
    with kl.GroupConsumer(
        root, "g", [topic], key_deserializer=string_deserializer, value_deserializer=json_deserializer, **FAST
    ) as member:
        stream = iter(member)
        first, second = stream.poll(5), stream.poll(5)
    assert (first.key, first.value) == ("k", {"n": 1})
    assert (second.key, second.value) == ("gone", None)
