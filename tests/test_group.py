"""Consumer groups with real member processes: sharing, joining and leaving, kill -9, SIGSTOP."""

from __future__ import annotations

import collections
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

import kl
from kl import groups
from kl.registry import SLOT, Commit, Committed, Registry, decode_commit, encode_commit, encode_forgotten

from conftest import active_segment, flip_byte, output_lines, write_each

MEMBER = os.path.join(os.path.dirname(__file__), "groupmember.py")


def wait_for(condition, timeout: float = 30.0, what: str = "condition", report: str | None = None):
    """``condition()`` once true; else AssertionError after ``timeout`` (quoting the file ``report``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.02)
    if report is not None:
        with open(report, encoding="utf-8", errors="replace") as f:
            what += f"; {report} holds {f.read()!r}"
    raise AssertionError(f"timed out waiting for {what}")


STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_member_outlives_its_test():
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Member:
    """A member process and what it wrote."""

    def __init__(self, root: kl.Root, group: str, topics: str, out: str, *args: str):
        self.out = out
        self.proc = subprocess.Popen([sys.executable, MEMBER, root.path, group, topics, out, *args])
        STARTED.append(self.proc)
        wait_for(lambda: self.lines("joined"), what="the member to join")

    def lines(self, kind: str) -> list[list[str]]:
        return output_lines(self.out, kind, 5 if kind == "m" else 3)

    def received(self) -> list[tuple[float, str, int, int, str]]:
        return [(float(t), topic, int(p), int(o), v) for t, topic, p, o, v in self.lines("m")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def produce(root: kl.Root, topic: str, count: int, *, batch: int = 100, pause: float = 0.0, first: int = 0) -> list[str]:
    """Values ``first`` to ``first + count`` (as text), in batches to the partitions in turn."""
    producer = kl.Producer(root)
    values = [str(i) for i in range(first, first + count)]
    for i in range(0, count, batch):
        producer.send_batch(
            topic, [v.encode() for v in values[i : i + batch]], partition=(i // batch) % root.config(topic).partitions
        )
        if pause:
            time.sleep(pause)
    return values


def delivered(members: list[Member]) -> collections.Counter[str]:
    return collections.Counter(v for m in members for *_, v in m.received())


def runs(members: list[Member], topic: str, partition: int) -> list[tuple[int, list[int]]]:
    """The deliveries of one partition in time order, as runs of one member: (member, offsets)."""
    events = sorted(
        (t, i, o) for i, m in enumerate(members) for t, top, p, o, _ in m.received() if (top, p) == (topic, partition)
    )
    out: list[tuple[int, list[int]]] = []
    for _, i, offset in events:
        if out and out[-1][0] == i:
            out[-1][1].append(offset)
        else:
            out.append((i, [offset]))
    return out


def check_handovers(root: kl.Root, members: list[Member], topic: str, partitions: int, max_runs: int) -> None:
    """One member at a time per partition, each taking over where the last one's commit left it."""
    for p in range(partitions):
        following = {m.offset: m.next_offset for b in kl.Consumer(root).consume(topic, [p]) for m in b.messages}  # type: ignore[union-attr]
        seen = runs(members, topic, p)
        assert len(seen) <= max_runs, f"partition {p} went back and forth between members: {[i for i, _ in seen]}"
        for (_, before), (_, after) in itertools.pairwise(seen):
            assert after[0] <= following[before[-1]], f"partition {p}: a gap at a hand-over ({before[-1]} then {after[0]})"
        for _, offsets in seen:
            assert offsets == sorted(offsets)


@pytest.fixture
def out(tmp_path):
    return lambda name: str(tmp_path / f"{name}.out")


def test_four_members_share_eight_partitions_while_members_join_and_leave(root, out):
    root.create_topic("t", kl.TopicConfig(partitions=8))
    values: list[str] = []
    shared = threading.Event()

    def keep_producing() -> None:  # 20,000 messages, and more until the members below have each had a share
        while len(values) < 20000 or not shared.is_set():
            values.extend(produce(root, "t", 1000, pause=0.01, first=len(values)))

    producer = threading.Thread(target=keep_producing)
    first = [Member(root, "g", "t", out(f"m{i}")) for i in range(2)]
    producer.start()
    time.sleep(0.3)
    more = [Member(root, "g", "t", out(f"m{i}")) for i in range(2, 4)]
    time.sleep(0.3)
    first[0].stop()  # leaves mid-stream
    late = Member(root, "g", "t", out("m4"))
    wait_for(lambda: all(m.received() for m in [first[1], *more]), timeout=120, what="a share for each member")
    shared.set()
    producer.join()
    members = [*first, *more, late]
    wait_for(lambda: set(delivered(members)) >= set(values), what="every message to be delivered")
    live = [m for m in members if m.proc.poll() is None]
    wait_for(lambda: sorted(p for m in live for p in _owned(root, "g", "t", m)) == list(range(8)), what="8 owned")
    for m in live:
        m.stop()
    counts = delivered(members)
    assert set(counts) == set(values)
    duplicates = sum(c - 1 for c in counts.values())
    assert duplicates <= 8 * 4, f"{duplicates} duplicates"  # at most the message in hand at each hand-over
    shares = [len(m.received()) for m in members]
    assert all(shares[1:4]), f"some member got nothing: {shares}"
    check_handovers(root, members, "t", 8, max_runs=8)
    assert Registry(root.path, "g").members() == []


def _owned(root: kl.Root, group: str, topic: str, member: Member) -> list[int]:
    me = member.lines("joined")[0][0]
    registry = Registry(root.path, group)
    return [p for p in range(root.config(topic).partitions) if registry.owner(topic, p).member == me]


def test_a_member_killed_is_replaced_and_only_its_uncommitted_messages_come_again(root, out):
    root.create_topic("t", kl.TopicConfig(partitions=4))
    values = produce(root, "t", 4000)
    a = Member(root, "g", "t", out("a"), "--sleep", "0.002")
    b = Member(root, "g", "t", out("b"), "--sleep", "0.002")
    wait_for(lambda: _owned(root, "g", "t", a) and _owned(root, "g", "t", b), what="both to own partitions")
    wait_for(lambda: len(a.received()) > 200, what="a to consume")
    a_partitions = _owned(root, "g", "t", a)
    registry = Registry(root.path, "g")
    committed_before = {p: registry.committed("t", p) for p in a_partitions}
    a.kill()
    wait_for(lambda: sorted(_owned(root, "g", "t", b)) == [0, 1, 2, 3], what="b to take a's partitions over")
    wait_for(lambda: set(delivered([a, b])) >= set(values), what="every message")
    b.stop()
    counts = delivered([a, b])
    assert set(counts) == set(values)
    duplicates = {v for v, c in counts.items() if c > 1}
    # Only what a received after its last commit comes again (a commits every 0.2 s).
    a_after_commit = {
        v
        for _, _, p, o, v in a.received()
        if p in a_partitions and (committed_before[p] is None or o >= committed_before[p].offset)
    }
    # ... and at most the one message in hand when a partition moved as b joined.
    assert len(duplicates - a_after_commit) <= 2, sorted(duplicates - a_after_commit)
    assert all(c == 2 for c in (counts[v] for v in duplicates))
    check_handovers(root, [a, b], "t", 4, max_runs=2)


def test_a_member_stopped_past_the_session_timeout_loses_its_partitions(root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 400)
    # A session that a busy machine's stalls (scheduling, fsyncs; its lock waits are 5% of
    # it) do not outlast: only the SIGSTOP expires a member.
    session = "5"
    a = Member(root, "g", "t", out("a"), "--session", session, "--sleep", "0.05", "--commit-every", "1")
    b = Member(root, "g", "t", out("b"), "--session", session, "--sleep", "0.05", "--commit-every", "1")
    wait_for(lambda: len(_owned(root, "g", "t", a)) == 1 and len(_owned(root, "g", "t", b)) == 1, what="one each")
    [(lost_partition)] = _owned(root, "g", "t", a)
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: sorted(_owned(root, "g", "t", b)) == [0, 1], what="b to take the stopped member's partition")
        stopped_at = max(t for t, *_ in a.received())
        time.sleep(0.5)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: a.lines("lost"), what="a to notice")
    [topic, partition, why] = a.lines("lost")[0]
    assert (topic, int(partition)) == ("t", lost_partition)
    assert "taken over" in why or "rejected" in why
    # Back, a hands out nothing more of it until it claims it again after b let it go.
    registry = Registry(root.path, "g")
    wait_for(lambda: sum(len(_owned(root, "g", "t", m)) for m in (a, b)) == 2 and _owned(root, "g", "t", a), what="a back")
    a.stop()
    b.stop()
    assert registry.committed("t", lost_partition).offset <= root.log("t", lost_partition).log_end_offset
    after = [o for t, _, p, o, _ in a.received() if p == lost_partition and t > stopped_at]
    b_offsets = [o for t, _, p, o, _ in b.received() if p == lost_partition]
    assert not set(after[1:]) & set(b_offsets[:-1]) or after[0] >= max(b_offsets[:-1], default=0)


def test_two_groups_each_get_everything_and_extra_members_idle(root, out):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    g1 = [Member(root, "g1", "t", out(f"a{i}")) for i in range(3)]
    g2 = [Member(root, "g2", "t", out("b0"))]
    ids = sorted(m.lines("joined")[0][0] for m in g1)
    owned = [{ids[0]: 1, ids[1]: 1}.get(m.lines("joined")[0][0], 0) for m in g1]  # the range assignment
    wait_for(lambda: [len(_owned(root, "g1", "t", m)) for m in g1] == owned, what="two owners, one idle")
    values = produce(root, "t", 1000)
    wait_for(lambda: set(delivered(g1)) == set(values) and set(delivered(g2)) == set(values), what="both groups")
    assert [bool(m.received()) for m in g1] == [bool(n) for n in owned]
    for m in g1 + g2:
        m.stop()
    assert sum(delivered(g1).values()) == sum(delivered(g2).values()) == 1000


# ----------------------------------------------------------------- in one process


def test_streams_split_partitions_and_pick_up_new_topics(root):
    root.create_topic("a", kl.TopicConfig(partitions=3))
    produce(root, "a", 300)
    with kl.GroupConsumer(root, "g", poll_interval=0.05, session_timeout=2) as consumer:
        streams = consumer.create_message_streams({"a": 2})["a"]
        got = [[r.partition for r in iter_all(s)] for s in streams]
        assert sorted({p for ps in got for p in ps}) == [0, 1, 2]
        assert not set(got[0]) & set(got[1])
        assert sum(map(len, got)) == 300
    with kl.GroupConsumer(root, "f", poll_interval=0.05, session_timeout=2) as consumer:
        [stream] = consumer.create_message_streams_by_filter(whitelist="[a-c]", blacklist="b")
        assert len(list(iter_all(stream))) == 300
        root.create_topic("b", kl.TopicConfig(partitions=1))
        root.create_topic("c", kl.TopicConfig(partitions=1))
        kl.Producer(root).send("b", b"not me")
        kl.Producer(root).send("c", b"new topic")
        assert [(r.topic, r.value) for r in iter_all(stream)] == [("c", b"new topic")]


def iter_all(stream: kl.MessageStream, idle: float = 0.5) -> list[kl.Record]:
    out = []
    while (record := stream.poll(idle)) is not None:
        out.append(record)
    return out


def test_a_member_whose_coordinator_stalls_stops_handing_out_and_its_commit_is_rejected(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    produce(root, "t", 100)
    a = kl.GroupConsumer(root, "g", ["t"], poll_interval=0.05, session_timeout=0.5, auto_commit=False)
    stall = threading.Event()
    polls = a._poll
    a._poll = lambda: stall.wait() or polls()  # type: ignore[method-assign]  # the coordinator hangs
    first = next(iter(a))
    stall.clear()
    b = kl.GroupConsumer(root, "g", ["t"], poll_interval=0.05, session_timeout=0.5)
    wait_for(lambda: b.assignment() == {"t": [0]}, what="b to take the partition over")
    assert iter(a).poll(0.3) is None  # a's lease ran out: it hands out nothing
    with pytest.raises(kl.NotOwner, match="rejected"):
        a.commit()
    assert first.offset == 0
    stall.set()
    b.close()
    a.close()


def test_commit_close_and_restart_resume_exactly(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    values = produce(root, "t", 500)
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        seen = [r.value.decode() for _, r in zip(range(200), consumer, strict=False)]
        consumer.commit()
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        rest = [v.decode() for batch in consumer.batches(values_only=True) for v in batch.messages]  # type: ignore[union-attr]
    assert sorted(seen + [v for v in rest], key=int) == values
    assert Registry(root.path, "g").committed("t", 0) is not None


def test_committed_offsets_out_of_the_log_follow_the_reset_policy(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    produce(root, "t", 10)
    Registry(root.path, "g").write_offset("t", 0, 10**9, "admin")
    with kl.GroupConsumer(root, "g", ["t"], reset="fail") as consumer:
        with pytest.raises(kl.OffsetOutOfRange, match="outside the log"):
            next(iter(consumer))
    with kl.GroupConsumer(root, "g", ["t"], reset="earliest") as consumer:
        assert sum(len(b.messages) for b in consumer.batches()) == 10
    with kl.GroupConsumer(root, "h", ["t"], start="latest") as consumer:
        assert list(consumer.batches()) == []


def test_bad_arguments_are_named(root):
    root.create_topic("t")
    with pytest.raises(kl.InvalidConfig, match="topics or with a pattern"):
        kl.GroupConsumer(root, "g", ["t"], pattern="t")
    with pytest.raises(kl.InvalidConfig, match="a group id cannot be empty"):
        kl.GroupConsumer(root, "", ["t"])
    with pytest.raises(kl.InvalidConfig, match="bad topic pattern"):
        kl.GroupConsumer(root, "g", pattern="(")
    with pytest.raises(kl.InvalidConfig, match="session_timeout"):
        kl.GroupConsumer(root, "g", ["t"], poll_interval=5, session_timeout=1)


# ----------------------------------------------------------------- the registry's files


def test_stale_generation_commits_are_rejected(root):
    registry = Registry(root.path, "g")
    a, b = registry.register({"topics": ["t"]}), registry.register({"topics": ["t"]})
    try:
        assert registry.claim("t", 0, a.member.id, {}) == 1
        assert registry.claim("t", 0, b.member.id, {}) is None  # a is live
        assert registry.claim("t", 0, b.member.id, {a.member.id: a.beats + 1}) is None  # a beat since b judged it
        assert registry.claim("t", 0, b.member.id, {a.member.id: a.beats}) == 2  # expired at the beat it still shows
        registry.commit("t", 0, 5, b.member.id, 2)
        with pytest.raises(kl.NotOwner, match="owned by"):
            registry.commit("t", 0, 9, a.member.id, 1)
        assert registry.committed("t", 0).offset == 5
    finally:
        a.close()
        b.close()


def test_many_commits_are_one_append_and_one_fsync_per_topic(root, monkeypatch):
    registry = Registry(root.path, "g")
    for p in range(3):
        registry.claim("t", p, "m", {})
    registry.claim("u", 0, "m", {})
    registry.write_offset("u", 1, 0, "admin")  # u's commits file exists
    events = []
    real_fsync, real_write = os.fsync, os.write

    def write(fd, data):
        events.append(("write", os.readlink(f"/proc/self/fd/{fd}")))
        return real_write(fd, data)

    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(os, "write", write)
    commits = [Commit("t", p, kl.Position(10 * p, p), "m", 1, "id") for p in range(3)] + [Commit("u", 0, kl.Position(7), "m", 1)]
    assert registry.commit_many(commits) == [None] * 4
    monkeypatch.undo()
    t, u = (os.path.join(registry.path, "commits", name) for name in "tu")
    assert events == [("write", t), ("fsync", t), ("fsync", os.path.dirname(t)), ("write", u), ("fsync", u)]  # t: a new file
    assert [registry.committed("t", p).position for p in range(3)] == [(0, 0), (10, 1), (20, 2)]
    assert (registry.committed("t", 1).topic_id, registry.committed("u", 0).offset) == ("id", 7)


def test_many_commits_store_those_their_member_owns_and_leave_no_temporary_files(root):
    registry = Registry(root.path, "g")
    a, b = registry.register({"topics": ["t"]}), registry.register({"topics": ["t"]})
    try:
        for p in range(3):
            registry.claim("t", p, a.member.id, {})
        registry.commit("t", 1, 4, a.member.id, 1)
        assert registry.claim("t", 1, b.member.id, {a.member.id: a.beats}) == 2
        outcomes = registry.commit_many([Commit("t", p, kl.Position(9), a.member.id, 1) for p in range(3)])
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], kl.NotOwner) and "owned by" in str(outcomes[1])
        assert [registry.committed("t", p).offset for p in range(3)] == [9, 4, 9]
        assert sorted(os.listdir(os.path.join(root.path, ".groups", "g", "commits"))) == ["t"]
    finally:
        a.close()
        b.close()


def test_a_member_that_read_nothing_commits_where_it_started_for_the_next_one(root):
    root.create_topic("t", kl.TopicConfig(partitions=3))
    for p in range(3):
        write_each(root, "t", [b"old"], partition=p)
    with kl.GroupConsumer(root, "g", ["t"], start="latest") as first:
        assert list(first.batches()) == []
    for p in range(3):
        write_each(root, "t", [b"new"], partition=p)
    with kl.GroupConsumer(root, "g", ["t"], start="earliest") as later:  # --start names a group's first start only
        assert [r.value for r in iter_all(iter(later))] == [b"new"] * 3


def test_dead_members_registrations_are_cleaned_up(root, tmp_path):
    registry = Registry(root.path, "g")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from kl.registry import Registry; r = Registry({root.path!r}, 'g').register({{'topics': ['t']}});"
            " print(r.member.id, flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    member_id = child.stdout.readline().strip()
    assert [m.id for m in registry.members()] == [member_id]
    child.kill()
    child.wait()
    assert registry.members() == []
    assert os.listdir(os.path.join(registry.path, "ids")) == []


def test_a_commit_is_a_json_line_and_checked(root):
    line = encode_commit(3, Committed(1234, "h:u", 1_700_000_000_000, 7, "Id"), 5)
    assert line.startswith(
        b'{"partition": 3, "offset": 1234, "skip": 7, "topic_id": "Id", "member": "h:u", "generation": 5,'
        b' "time": "2023-11-14T22:13:20.000Z"} '
    )
    assert decode_commit(line[:-1]) == (3, Committed(1234, "h:u", 1_700_000_000_000, 7, "Id"))
    for damaged, reason in [
        (line.replace(b"1234", b"1235"), "its checksum does not match"),
        (line[:-3], "no checksum at its end"),
        (line.replace(b'"skip": 7', b'"skip": -7').rpartition(b" ")[0], "no checksum at its end"),
    ]:
        with pytest.raises(ValueError, match=reason):
            decode_commit(damaged.rstrip(b"\n"))
    with_metadata = Committed(5, "h:u", 1_700_000_000_000, 0, "Id", "m1 ✓\nsecond line")
    line = encode_commit(0, with_metadata, None)
    assert b'"metadata": "m1 \\u2713\\nsecond line"} ' in line and line.count(b"\n") == 1
    assert decode_commit(line[:-1]) == (0, with_metadata)
    assert b"metadata" not in encode_commit(0, Committed(5, "h:u", 1_700_000_000_000), 1)
    assert decode_commit(encode_forgotten(4, "h:u")[:-1]) == (4, None)
    registry = Registry(root.path, "g")
    registry.write_offset("t", 0, 5, "h:u", metadata="kept")
    assert registry.committed("t", 0).metadata == "kept"


def test_an_offset_file_of_an_older_kl_is_read_where_no_line_is_committed(root):
    registry = Registry(root.path, "g")
    legacy = os.path.join(registry.path, "offsets", "t")
    os.makedirs(legacy)
    body = b"offset 1234\nskip 7\ntopic_id Id\nmember h:u\ntime 2023-11-14T22:13:20.000Z\n"
    for p, data in enumerate([body, b"offset 1234\nmember h:u\ntime 2023-11-14T22:13:20.000Z\n"]):  # no id: the topic's
        with open(os.path.join(legacy, str(p)), "wb") as f:
            f.write(data + b"crc32 %08x\n" % zlib.crc32(data))
    assert registry.committed("t", 0) == Committed(1234, "h:u", 1_700_000_000_000, 7, "Id")
    assert registry.committed("t", 1) == Committed(1234, "h:u", 1_700_000_000_000)
    assert registry.partitions("offsets") == [("t", 0), ("t", 1)]
    registry.write_offset("t", 0, 9, "h:u")
    assert registry.committed("t", 0).offset == 9  # a line shadows the file
    body = b"offset 5\nmember h:u\ntime 2023-11-14T22:13:20.000Z\nmetadata [1]\n"
    with open(os.path.join(legacy, "1"), "wb") as f:
        f.write(body + b"crc32 %08x\n" % zlib.crc32(body))
    with pytest.raises(kl.CorruptState, match="an unreadable field: metadata \\[1\\] is not a string"):
        registry.committed("t", 1)
    with open(os.path.join(legacy, "1"), "wb") as f:
        f.write(b"offset 9")
    with pytest.raises(kl.CorruptState, match="damaged committed offset file .*no checksum line at its end"):
        registry.committed("t", 1)


def test_a_damaged_line_is_skipped_and_its_partition_goes_on_from_its_line_before(root, caplog):
    registry = Registry(root.path, "g")
    registry.write_offset("t", 0, 5, "h:u")
    registry.write_offset("t", 1, 6, "h:u")
    registry.write_offset("t", 0, 7, "h:u")
    path = os.path.join(registry.path, "commits", "t")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data.replace(b'"offset": 7', b'"offset": 8'))
    assert (registry.committed("t", 0).offset, registry.committed("t", 1).offset) == (5, 6)
    [warning] = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert warning == f"{path}: a line at byte {data.rindex(b'{')} is unreadable (its checksum does not match): skipped"
    with open(path, "ab") as f:
        f.write(b'{"partition": 1, "offs')  # a writer that died in its append
    registry.write_offset("t", 1, 9, "h:u")
    assert (registry.committed("t", 0).offset, registry.committed("t", 1).offset) == (5, 9)


def test_a_commits_file_is_compacted_to_its_last_lines_once_it_grew(root, monkeypatch):
    monkeypatch.setattr(kl.registry, "COMPACT_AT", 4096)
    registry = Registry(root.path, "g")
    path = os.path.join(registry.path, "commits", "t")
    sizes = []
    for offset in range(200):
        registry.write_offset("t", offset % 4, offset, "h:u")
        sizes.append(os.path.getsize(path))
        if offset == 0:  # what compactions that died left, of t and of a topic t.x
            for name in (".t.999.deadbeef.tmp", ".t.x.999.deadbeef.tmp"):
                open(os.path.join(os.path.dirname(path), name), "wb").close()
    drops = [after for before, after in itertools.pairwise(sizes) if after < before]
    assert max(sizes) <= 4096 + 200 and len(drops) > 3 and max(drops) < 4 * 200  # to one line a partition, again and again
    assert [registry.committed("t", p).offset for p in range(4)] == [196, 197, 198, 199]
    assert sorted(os.listdir(os.path.dirname(path))) == [".t.x.999.deadbeef.tmp", "t"]


@pytest.mark.parametrize("step", range(1, 7))
def test_a_crash_at_every_step_of_a_commit_leaves_the_old_or_the_new_offset(root, step):
    registry = Registry(root.path, "g")
    registry.write_offset("t", 0, 100, "old")
    code = f"""
import os, signal
from kl.log import fsutil
from kl.registry import Registry
calls = 0
def dying(real):
    def call(*a, **k):
        global calls
        calls += 1
        if calls == {step}:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    return call
for name in ("open", "write", "fsync", "rename"):
    setattr(fsutil.os, name, dying(getattr(os, name)))
Registry({root.path!r}, "g").write_offset("t", 0, 200, "new")
"""
    child = subprocess.run([sys.executable, "-c", code])
    assert child.returncode in (0, -signal.SIGKILL)
    assert registry.committed("t", 0).offset in (100, 200)
    if child.returncode == 0:
        assert registry.committed("t", 0).offset == 200


def test_a_deleted_topic_is_let_go(root):
    root.create_topic("a")
    root.create_topic("b")
    produce(root, "a", 10)
    with kl.GroupConsumer(root, "g", pattern="[ab]", poll_interval=0.05, session_timeout=2) as consumer:
        assert len(iter_all(iter(consumer))) == 10
        root.delete_topic("a")
        kl.Producer(root).send("b", b"after")
        assert [r.value for r in iter_all(iter(consumer))] == [b"after"]
        wait_for(lambda: consumer.assignment() == {"b": [0]}, what="a to be let go")


def test_a_member_whose_registration_went_away_joins_again(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 100)
    lost: list[tuple[str, int, str]] = []
    with kl.GroupConsumer(root, "g", ["t"], poll_interval=0.05, session_timeout=2, on_lost=lambda *a: lost.append(a)) as consumer:
        first = consumer.member_id
        assert len(iter_all(iter(consumer))) == 100
        os.unlink(os.path.join(root.path, ".groups", "g", "ids", first))
        wait_for(lambda: consumer.member_id != first and consumer.assignment() == {"t": [0, 1]}, what="a new membership")
        assert lost == []  # it still owned them: it committed and let go, then took them again
        produce(root, "t", 10)
        assert len(iter_all(iter(consumer))) == 10
    assert Registry(root.path, "g").members() == []


def test_a_member_that_cannot_start_leaves_nothing_behind(root, monkeypatch):
    root.create_topic("t")
    produce(root, "t", 5)

    def broken(*args: object) -> None:
        raise kl.StorageError("cannot read: I/O error")

    monkeypatch.setattr(Registry, "committed", broken)
    with pytest.raises(kl.StorageError, match="I/O error"):
        kl.GroupConsumer(root, "g", ["t"])
    monkeypatch.undo()
    assert Registry(root.path, "g").members() == []
    assert Registry(root.path, "g").owner("t", 0).member is None


def test_a_topic_deleted_and_created_again_is_read_afresh(root):
    root.create_topic("t")
    produce(root, "t", 20)
    with kl.GroupConsumer(root, "g", ["t"], poll_interval=0.05, session_timeout=2) as consumer:
        assert len(iter_all(iter(consumer))) == 20
        consumer.commit()
        elsewhere = kl.Root(root.path)  # as another process would
        elsewhere.delete_topic("t")
        elsewhere.create_topic("t", kl.TopicConfig(partitions=2))
        kl.Producer(elsewhere).send_batch("t", [b"new-0"], partition=0)
        kl.Producer(elsewhere).send_batch("t", [b"new-1"], partition=1)
        got = iter_all(iter(consumer), idle=1.0)
        assert {(r.partition, r.value) for r in got} == {(0, b"new-0"), (1, b"new-1")}  # perhaps twice: at least once
        consumer.commit()
    registry = Registry(root.path, "g")
    assert [registry.committed("t", p).offset for p in (0, 1)] == [elsewhere.log("t", p).log_end_offset for p in (0, 1)]


def test_damage_stops_a_member_or_is_stepped_over_with_skip_corrupt(root):
    root.create_topic("t")
    offsets = write_each(root, "t", [b"first", b"second", b"third"])
    flip_byte(active_segment(root, "t"), offsets[2] - 1)  # the last byte of "second"
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        with pytest.raises(kl.CorruptMessage):
            [b.messages for b in consumer.batches(values_only=True)]
    with kl.GroupConsumer(root, "h", ["t"], skip_corrupt=True) as consumer:
        assert [v for b in consumer.batches(values_only=True) for v in b.messages] == [b"first", b"third"]


# ----------------------------------------------------------------- issue 16: committed offsets


def test_a_touched_or_edited_topic_json_keeps_the_group_where_it_was(root):
    """Issue 16, repro 1: touching topic.json dropped every committed offset of a running member."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    with kl.GroupConsumer(root, "g", ["t"], start="latest", poll_interval=0.05, session_timeout=2) as consumer:
        values = produce(root, "t", 100)
        config = os.path.join(root.topic_path("t"), "topic.json")
        later = os.stat(config).st_mtime_ns + 5_000_000_000
        os.utime(config, ns=(later, later))
        with open(config, "rb") as f:
            data = f.read()
        with open(config + ".tmp", "wb") as f:
            f.write(data)
        os.replace(config + ".tmp", config)  # an edit: another file, the same topic
        consumer._poll()  # a coordinator round, now
        assert sorted(r.value.decode() for r in iter_all(iter(consumer))) == sorted(values)


def test_a_topic_deleted_and_created_again_does_not_inherit_the_groups_offsets(root):
    """Issue 16, repro 2: the old offsets outlived the topic and skipped the new one's start."""
    root.create_topic("t")
    produce(root, "t", 100)
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        assert len(iter_all(iter(consumer))) == 100
        consumer.commit()
    root.delete_topic("t")
    assert not os.path.exists(os.path.join(root.path, ".groups", "g", "commits", "t"))
    root.create_topic("t")
    values = produce(root, "t", 300)
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        assert [r.value.decode() for r in iter_all(iter(consumer))] == values
        consumer.commit()
    assert Registry(root.path, "g").committed("t", 0).topic_id == root.topic_id("t")


def test_an_offset_of_an_earlier_creation_counts_as_never_committed(root, caplog):
    root.create_topic("t")
    values = produce(root, "t", 30)
    registry = Registry(root.path, "g")
    registry.write_offset("t", 0, root.log("t", 0).log_end_offset, "old-member", "AnEarlierTopicId000000")
    with kl.GroupConsumer(root, "g", ["t"], start="earliest") as consumer:
        assert [r.value.decode() for r in iter_all(iter(consumer))] == values
    warnings = [r.getMessage() for r in caplog.records if "created again" in r.getMessage()]
    assert len(warnings) == 1 and "group g: the committed offset of t/0 is of a topic t deleted" in warnings[0]
    assert registry.committed("t", 0).topic_id == root.topic_id("t")
    registry.write_offset("t", 0, 0, "kl-of-before-topic-ids")  # no id: of the topic as it is
    with kl.GroupConsumer(root, "g", ["t"], start="latest") as consumer:
        assert len(iter_all(iter(consumer))) == 30


@pytest.mark.parametrize("damage", ["garbage", "out of range"])
def test_an_unusable_offset_under_reset_fail_blocks_its_partition_until_reset(root, damage):
    """Issue 16, repro 3: the first run failed, and its close committed over the damage."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 40)
    registry = Registry(root.path, "g")
    if damage == "garbage":  # an offset file of an older kl
        path = os.path.join(registry.path, "offsets", "t", "0")
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(b"garbage\n")
        error: type[Exception] = kl.CorruptOffset
    else:
        registry.write_offset("t", 0, 10**9, "admin")
        error = kl.OffsetOutOfRange

    def committed() -> object:
        if damage == "garbage":
            with open(path, "rb") as f:
                return f.read()
        return registry.committed("t", 0)

    before = committed()
    for _ in range(2):  # every run, the same
        with kl.GroupConsumer(root, "g", ["t"], reset="fail", auto_commit_interval=0) as consumer:
            stream = iter(consumer)
            messages = []
            for _ in range(3):  # every poll
                with pytest.raises(error) as raised:
                    messages += [r.partition for r in iter_all(stream)]
            assert 0 not in messages
            consumer.commit()
        assert committed() == before
    groups.reset(root, "g", "earliest", topic="t", partition=0)
    with kl.GroupConsumer(root, "g", ["t"], reset="fail") as consumer:
        assert len(iter_all(iter(consumer))) == 40
    assert str(raised.value).count("\n") == 0


def test_a_damaged_offset_file_of_an_older_kl_under_reset_earliest_is_kept_aside_and_reported(root, caplog):
    root.create_topic("t")
    values = produce(root, "t", 30)
    registry = Registry(root.path, "g")
    path = os.path.join(registry.path, "offsets", "t", "0")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"offset 9")
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        assert [r.value.decode() for r in iter_all(iter(consumer))] == values
        consumer.commit()
    with open(path + ".damaged", "rb") as f:
        assert f.read() == b"offset 9"
    [warning] = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert f"{path} is damaged (no checksum line at its end), kept as {path}.damaged; going on from the earliest" in warning
    assert registry.committed("t", 0).offset == root.log("t", 0).log_end_offset


def test_commits_inside_a_compressed_batch_resume_after_the_last_message_handed_out(root):
    """Issue 16, repro 4: a position inside a compressed batch was committed as the batch's start."""
    root.create_topic("t")
    values = [b"%d" % i for i in range(1, 1001)]
    kl.Producer(root, compression="zstd").send_batch("t", values)
    got: list[bytes] = []
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        got += [r.value for _, r in zip(range(7), consumer, strict=False)]
        consumer.commit()
    assert Registry(root.path, "g").committed("t", 0).position == (0, 7)
    for values_only in (False, True, True):  # three runs of kl consume -c 100
        with kl.GroupConsumer(root, "g", ["t"]) as consumer:
            for batch in consumer.batches(values_only=values_only, max_messages=100):
                got += [v if values_only else v.value for v in batch.messages]  # type: ignore[union-attr]
            consumer.commit()
    assert got == values[:307]
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:  # auto-commit of what was consumed, message by message
        stream = iter(consumer)
        got += [next(stream).value for _ in range(5)]
    assert Registry(root.path, "g").committed("t", 0).position == (0, 311)  # the 5th was handed out, not consumed
    with kl.GroupConsumer(root, "g", ["t"]) as consumer:
        got += [v for batch in consumer.batches(values_only=True) for v in batch.messages]  # type: ignore[misc]
    assert got[:311] + got[312:] == values
    assert Registry(root.path, "g").committed("t", 0).position == (root.log("t", 0).log_end_offset, 0)


def committed(registry: Registry) -> kl.Position | None:
    """The position committed for t/0, or None."""
    found = registry.committed("t", 0)
    return None if found is None else found.position


def test_batches_cut_a_compressed_batch_and_auto_commit_what_was_moved_past_on_the_interval(root):
    """Commits that follow the reader: a batch was a whole fetch (1 MiB, or all a compressed
    batch held), and auto-commit waited for the coordinator's next poll."""
    root.create_topic("t")
    values = [b"%04d" % i + b"x" * 96 for i in range(2000)]  # one zstd batch of 200 KB of values
    kl.Producer(root, compression="zstd").send_batch("t", values)
    registry = Registry(root.path, "g")
    slow_polls = {"poll_interval": 30.0, "session_timeout": 60.0, "auto_commit_interval": 0.01}
    with kl.GroupConsumer(root, "g", ["t"], max_bytes=16 << 10, **slow_polls) as member:
        batches = member.batches(values_only=True)
        first, second = next(batches), next(batches)  # moved past the first
        sizes = [len(b.messages) for b in (first, second)]
        assert 160 <= sizes[0] <= 170 and sizes[1] <= 170  # 16 KiB of 100-byte values, not all 2,000
        assert first.messages + second.messages == values[: sum(sizes)]
        wait_for(lambda: committed(registry) == (0, sizes[0]), 20, "a commit inside the batch before the next poll")
    assert registry.committed("t", 0).position == (0, sizes[0])  # close: the second was handed out, not moved past
    with kl.GroupConsumer(root, "g", ["t"]) as member:
        rest = [v for batch in member.batches(values_only=True) for v in batch.messages]
    assert rest == values[sizes[0] :]


def test_auto_commit_follows_a_stream_between_polls(root):
    """With a commit interval below the poll interval, commits came only at each poll."""
    root.create_topic("t")
    kl.Producer(root).send_batch("t", [b"%d" % i for i in range(10)])
    registry = Registry(root.path, "g")
    with kl.GroupConsumer(root, "g", ["t"], poll_interval=30.0, session_timeout=60.0, auto_commit_interval=0.01) as member:
        stream = iter(member)
        records = [next(stream) for _ in range(4)]  # the 4th handed out, the 3rd moved past
        after_third = (records[2].next_offset, 0)
        wait_for(lambda: committed(registry) == after_third, 20, "a commit before the next poll")


def test_claims_and_releases_are_not_fsynced_and_an_owner_record_a_crash_emptied_reads_as_released(root, monkeypatch):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write_each(root, "t", [b"a"], partition=0)
    registry = Registry(root.path, "g")
    registry.claim("t", 1, "m0", {})  # the group's directories made (and fsynced) first
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    generation = registry.claim("t", 0, "m1", {})
    registry.release("t", 0, "m1", generation)
    assert synced == []  # 1,000 partitions joined cost 2,000 fsyncs
    with pytest.raises(kl.NotOwner, match="the partition is released"):
        registry.release("t", 0, "m1", generation)
    registry.claim("t", 0, "m2", {})
    with pytest.raises(kl.NotOwner, match="owned by m2"):
        registry.release("t", 0, "m1", generation)
    registry.commit("t", 1, 0, "m0", 1)
    assert synced  # offsets stay durable
    monkeypatch.undo()
    registry.claim("t", 0, "dead", {})
    with open(os.path.join(root.path, ".groups", "g", "claims", "t"), "r+b") as f:
        f.write(bytes(SLOT))  # what a crash may leave of a record that was never fsynced
    assert (registry.owner("t", 0).member, registry.owner("t", 0).generation) == (None, 0)
    with kl.GroupConsumer(root, "g", ["t"]) as member:
        assert next(iter(member)).value == b"a"
