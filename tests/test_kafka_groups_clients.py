"""Today's Kafka clients, unmodified, in consumer groups coordinated by ``kl serve --kafka``
(issue 21, points 1 and 5).

Each member is a process of its own (tests/kafka_driver.py's ``group`` operation, KafkaJS's
driver, kcat ``-G``) printing its assignment as it changes, each message it reads
(partition, offset, value) and each commit; it leaves the group when told ``close`` on
stdin.  Topics are made with kl's API and written by kl's producer, one numbered value a
message, so that what the members read can be checked against what was written: every
message at least once, duplicates only where the protocol allows them.  One daemon serves
the module; each test has its own topics and groups, and runs its clients at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

import kl
from kl.registry import Registry
from kl_cli.main import cli

from kafka_clients import CLIENT_TIMEOUT, DRIVER, KAFKAJS, KCAT, NODE, Client, Daemon, module_fixtures

MODULES = {"confluent": "confluent_kafka", "kafka-python": "kafka", "aiokafka": "aiokafka"}
SESSION_TIMEOUT = 6
"""Seconds: the shortest session the coordinator accepts, where a test waits for one to expire."""

Partition = tuple[str, int]


class Delivery(NamedTuple):
    """One message as a member read it."""

    topic: str
    partition: int
    offset: int
    value: str


# ----------------------------------------------------------------- fixtures


root, daemon, kafkajs, no_client_left = module_fixtures("kafka-groups")


# ----------------------------------------------------------------- members


class Member:
    """A group member's process and what it printed so far: its deliveries, its assignment
    (as its last line about it said), every line in order."""

    def __init__(self, name: str, client: Client) -> None:
        self.name = name
        self.client = client
        self.lines: list[dict[str, Any]] = []
        self.deliveries: list[Delivery] = []
        self.assignment: set[Partition] = set()
        self.ended = False

    def pump(self) -> None:
        """Take in what it printed since (without waiting)."""
        while not self.ended and not self.client.lines.empty():
            raw = self.client.lines.get()
            if raw is None:
                self.ended = True
                self.client.lines.put(None)  # for finish()
                break
            self.client.printed.append(raw)
            try:
                line = json.loads(raw)
            except ValueError:
                raise AssertionError(self.client.report(f"{self.name} printed a line that is not JSON: {raw!r}")) from None
            self.lines.append(line)
            if "value" in line:
                self.deliveries.append(Delivery(line["topic"], line["partition"], line["offset"], line["value"]))
            elif "assignment" in line:
                self.assignment = {(t, p) for t, p in line["assignment"]}

    def values(self) -> set[str]:
        return {d.value for d in self.deliveries}

    def close(self) -> dict[str, Any]:
        """Tell it to leave the group; its last line (``{"closed": N}``) once it exited 0."""
        with contextlib.suppress(BrokenPipeError):  # gone already, after ``count`` messages
            self.client.send("close")
        self.client.finish()
        self.ended = True
        for raw in self.client.printed[len(self.lines) :]:  # what finish() took in
            line = json.loads(raw)
            self.lines.append(line)
            if "value" in line:
                self.deliveries.append(Delivery(line["topic"], line["partition"], line["offset"], line["value"]))
            elif "assignment" in line:
                self.assignment = {(t, p) for t, p in line["assignment"]}
        assert "closed" in self.lines[-1], self.client.report(f"{self.name} did not say it closed")
        return self.lines[-1]


def start(request: pytest.FixtureRequest, daemon: Daemon, client: str, name: str, **spec: Any) -> Member:
    """A member of ``spec["group"]``: ``client`` (a Python client or ``kafkajs``) running the
    drivers' ``group`` operation."""
    spec_file = request.getfixturevalue("tmp_path") / f"{name}.json"
    spec_file.write_text(json.dumps({"bootstrap": daemon.bootstrap, "timeout": 60, "op": "group", **spec}))
    if client == "kafkajs":
        modules = request.getfixturevalue("kafkajs")
        env = {**os.environ, "NODE_PATH": str(modules), "NODE_NO_WARNINGS": "1"}
        return Member(name, Client([str(NODE), str(KAFKAJS / "driver.js"), str(spec_file)], env=env, server_log=daemon.log))
    if find_spec(MODULES[client]) is None:
        pytest.skip(f"{client}: Python module {MODULES[client]} is not installed (pip install -e '.[test]')")
    return Member(name, Client([sys.executable, str(DRIVER), client, str(spec_file)], server_log=daemon.log))


def wait(members: list[Member], what: str, done: Callable[[], bool], timeout: float = CLIENT_TIMEOUT) -> None:
    """Take in what the members print until ``done()``; fail after ``timeout`` s (or once
    one of them failed) with what each printed."""
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            m.pump()
        if done():
            return
        gone = [m for m in members if m.ended and m.client.proc.wait() != 0]
        if gone or time.monotonic() > deadline:
            why = f"{what}: {gone[0].name} exited" if gone else f"{what}: not within {timeout:g} s"
            reports = [m.client.report(f"--- {m.name}") for m in members]
            for m in members:
                m.client.kill()
            raise AssertionError("\n".join([why, *reports]))
        time.sleep(0.02)


def shared(members: list[Member], partitions: set[Partition]) -> bool:
    """Whether the members' assignments are disjoint, cover ``partitions``, and each has some."""
    assigned = [p for m in members for p in m.assignment]
    return all(m.assignment for m in members) and len(assigned) == len(set(assigned)) and set(assigned) == partitions


def delivered(members: list[Member]) -> set[str]:
    return set().union(*(m.values() for m in members))


# ----------------------------------------------------------------- kl's side


def create(root: kl.Root, topic: str, partitions: int) -> set[Partition]:
    root.create_topic(topic, kl.TopicConfig(partitions=partitions))
    return {(topic, p) for p in range(partitions)}


def produce(root: kl.Root, topic: str, partitions: int, count: int, first: int = 0) -> set[str]:
    """``count`` numbered values (``topic-N``), round-robin over the partitions, with kl's producer."""
    producer = kl.Producer(root)
    values = [f"{topic}-{i}" for i in range(first, first + count)]
    for i, value in enumerate(values, first):
        producer.send(topic, value.encode(), partition=i % partitions)
    producer.close()
    return set(values)


def kl_cli(root: kl.Root, *argv: str) -> str:
    result = CliRunner().invoke(cli, ["--root", str(root.path), *argv], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def described(root: kl.Root, group: str) -> dict[Partition, dict[str, Any]]:
    """``kl groups describe --json GROUP``'s partitions."""
    answer = json.loads(kl_cli(root, "groups", "describe", "--json", group))
    return {(p["topic"], p["partition"]): p for p in answer["partitions"]}


def kafka_committed(root: kl.Root, shown: dict[str, Any]) -> int | None:
    """The Kafka offset of a committed position ``kl groups describe --json`` shows."""
    if shown["committed"] is None:
        return None
    return root.log(shown["topic"], shown["partition"]).kafka_offset(shown["committed"], shown["skip"])


def read_up(root: kl.Root, group: str, partitions: set[Partition]) -> None:
    """The group's committed offset of each partition is its log end, its lag 0."""
    shown = described(root, group)
    assert set(shown) == partitions, shown
    for partition, p in shown.items():
        assert (p["committed"], p["lag_messages"]) == (p["log_end_offset"], 0), (partition, p)


class Watch:
    """A thread reading a group's committed offsets every few milliseconds: ``backwards``
    lists each time one was seen lower than before."""

    def __init__(self, root: kl.Root, group: str, partitions: set[Partition]) -> None:
        self.registry = Registry(str(root.path), group)
        self.partitions = sorted(partitions)
        self.seen: dict[Partition, int] = {}
        self.backwards: list[tuple[Partition, int, int]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.005):
            for topic, partition in self.partitions:
                committed = self.registry.committed(topic, partition)
                if committed is None:
                    continue
                before = self.seen.get((topic, partition), -1)
                if committed.offset < before:
                    self.backwards.append(((topic, partition), before, committed.offset))
                self.seen[topic, partition] = max(before, committed.offset)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


class Writer:
    """A thread writing numbered values (``TOPIC-N``) round-robin over the topic's partitions
    with kl's producer, one every 10 ms, until stopped; ``written`` lists them."""

    def __init__(self, root: kl.Root, topic: str, partitions: int) -> None:
        self.root, self.topic, self.partitions = root, topic, partitions
        self.written: list[str] = []
        self.writing = threading.Event()
        self.writing.set()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        producer = kl.Producer(self.root)
        while self.writing.is_set():
            value = f"{self.topic}-{len(self.written)}"
            producer.send(self.topic, value.encode(), partition=len(self.written) % self.partitions)
            self.written.append(value)
            time.sleep(0.01)
        producer.close()

    def stop(self) -> set[str]:
        """Stop writing; what was written."""
        self.writing.clear()
        self.thread.join()
        return set(self.written)


def unconfirmed(m: Member) -> set[tuple[str, int, int]]:
    """The messages ``m`` read (topic, partition, offset) whose commit it did not see taken
    (it commits each message as it reads it)."""
    return {
        (line["topic"], line["partition"], line["offset"])
        for line, after in zip(m.lines, [*m.lines[1:], {}], strict=True)
        if "value" in line and "committed" not in after
    }


def read_twice(members: list[Member]) -> set[tuple[str, int, int]]:
    """The messages (topic, partition, offset) the members read more than once between them;
    none more than twice."""
    read = Counter((d.topic, d.partition, d.offset) for m in members for d in m.deliveries)
    assert max(read.values()) <= 2, [at for at, n in read.items() if n > 2]
    return {at for at, n in read.items() if n > 1}


def until_rejoined(stopped: Member, continued_at: int) -> list[dict[str, Any]]:
    """What a stopped member printed once continued (its lines from ``continued_at`` on)
    until the group assigned it partitions again: a commit it had sent before it stopped,
    answered after, left out."""
    since = stopped.lines[continued_at:]
    if since and "committed" in since[0] and "value" in stopped.lines[continued_at - 1]:
        since = since[1:]
    return since[: next(i for i, line in enumerate(since) if line.get("why") == "assign")]


# ----------------------------------------------------------------- failures


def test_four_confluent_members_one_killed_one_stopped_past_its_session_deliver_every_message(request, daemon, root) -> None:
    """Four confluent-kafka members over eight partitions while kl's producer writes, each
    committing every message it reads.  One is killed (SIGKILL), one stopped (SIGSTOP) until
    the two others own every partition, then continued: it has lost its partitions (librdkafka
    finds its session over, or the coordinator tells it), none of its commits is taken until
    it has joined again, and it does.  Every message is read; a message read twice was read
    by the killed or the stopped member without its commit confirmed; no committed offset
    ever goes back."""
    topic = group = "chaos"
    partitions = create(root, topic, 8)
    writer = Writer(root, topic, 8)
    watch = Watch(root, group, partitions)
    try:
        spec = {"group": group, "topics": [topic], "commit": "each", "session_timeout": SESSION_TIMEOUT}
        members = [start(request, daemon, "confluent", f"member-{i}", **spec) for i in range(4)]
        killed, stopped, rest = members[0], members[1], members[2:]
        wait(members, "four members share the partitions", lambda: shared(members, partitions))
        wait(members, "each member reads", lambda: all(len(m.deliveries) >= 3 for m in members))

        killed.client.kill()
        os.kill(stopped.client.proc.pid, signal.SIGSTOP)
        time.sleep(0.2)  # what they printed reaches the pipes
        for m in (killed, stopped):
            m.pump()
        stopped_at = len(stopped.lines)
        wait(rest, "the two others own every partition", lambda: shared(rest, partitions), SESSION_TIMEOUT + 20)
        taken_over = len(delivered(rest))
        wait(rest, "the two others read on", lambda: len(delivered(rest)) > taken_over + 8)

        os.kill(stopped.client.proc.pid, signal.SIGCONT)
        back = [stopped, *rest]
        wait(back, "the stopped member loses its partitions", lambda: any(
            "assignment" in line and line["why"] in ("revoke", "lost") for line in stopped.lines[stopped_at:]
        ))  # fmt: skip
        wait(back, "three members share the partitions", lambda: shared(back, partitions))
        written = writer.stop()
        wait(back, "every message read", lambda: delivered(members) >= written)
        for m in back:
            m.close()
    finally:
        writer.stop()
        watch.stop()

    assert delivered(members) == written
    twice = read_twice(members)
    assert twice <= unconfirmed(killed) | unconfirmed(stopped), (twice, unconfirmed(killed), unconfirmed(stopped))
    back_again = until_rejoined(stopped, stopped_at)
    assert not [line for line in back_again if "committed" in line], back_again
    assert watch.backwards == []
    # the healthy members' commits were all taken
    for m in rest:
        assert not [line for line in m.lines if "commit_error" in line], m.lines
    read_up(root, group, partitions)


def test_a_member_stopped_past_its_session_has_its_commits_refused(request, daemon, root) -> None:
    """A group of two kafka-python members and one of two aiokafka members, each committing
    every message it reads while kl's producer writes: one member of each is stopped
    (SIGSTOP) until the other owns every partition, then continued.  What it reads before it
    sees its session is over it cannot commit (the coordinator answers UNKNOWN_MEMBER_ID or
    ILLEGAL_GENERATION); then it joins again and the two share the partitions.  Every
    message is read; a message read twice was read once without its commit taken; no
    committed offset ever goes back."""
    topic = "fenced"
    partitions = create(root, topic, 4)
    writer = Writer(root, topic, 4)
    clients = ("kafka-python", "aiokafka")
    watches = [Watch(root, f"fenced-{c}", partitions) for c in clients]
    try:
        spec = {"topics": [topic], "commit": "each", "session_timeout": SESSION_TIMEOUT}
        pairs = [[start(request, daemon, c, f"fenced-{c}-{i}", group=f"fenced-{c}", **spec) for i in range(2)] for c in clients]
        everyone = [m for pair in pairs for m in pair]
        wait(everyone, "each pair shares the partitions", lambda: all(shared(pair, partitions) for pair in pairs))
        wait(everyone, "each member reads", lambda: all(len(m.deliveries) >= 3 for m in everyone))
        for stopped, _ in pairs:
            os.kill(stopped.client.proc.pid, signal.SIGSTOP)
        time.sleep(0.2)  # what they printed reaches the pipes
        for stopped, _ in pairs:
            stopped.pump()
        marks = [len(stopped.lines) for stopped, _ in pairs]
        others = [other for _, other in pairs]
        wait(
            others,
            "the others own every partition",
            lambda: all(o.assignment == partitions for o in others),
            SESSION_TIMEOUT + 20,
        )
        taken_over = [len(o.deliveries) for o in others]
        wait(
            others, "the others read on", lambda: all(len(o.deliveries) > n + 8 for o, n in zip(others, taken_over, strict=True))
        )
        for stopped, _ in pairs:
            os.kill(stopped.client.proc.pid, signal.SIGCONT)
        wait(everyone, "each pair shares the partitions again", lambda: all(
            shared(pair, partitions) and any(line.get("why") == "assign" for line in pair[0].lines[mark:])
            for pair, mark in zip(pairs, marks, strict=True)
        ))  # fmt: skip
        written = writer.stop()
        wait(everyone, "every message read", lambda: all(delivered(pair) >= written for pair in pairs))
        for m in everyone:
            m.close()
    finally:
        writer.stop()
        for w in watches:
            w.stop()

    for c, (stopped, other), mark, watch in zip(clients, pairs, marks, watches, strict=True):
        assert delivered([stopped, other]) == written, stopped.name
        twice = read_twice([stopped, other])
        assert twice <= unconfirmed(stopped) | unconfirmed(other), (stopped.name, twice)
        back_again = until_rejoined(stopped, mark)
        assert not [line for line in back_again if "committed" in line], back_again
        assert watch.backwards == [], stopped.name
        refused = [line["commit_error"] for line in back_again if "commit_error" in line]
        if c == "kafka-python":  # aiokafka says CommitFailedError, whichever the coordinator's code
            assert all("UnknownMemberId" in e or "IllegalGeneration" in e for e in refused), refused
        read_up(root, f"fenced-{c}", partitions)


# ----------------------------------------------------------------- assignors


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_confluent_assignor_shares_the_partitions_and_rebalances_when_a_member_leaves(request, daemon, root, assignor) -> None:
    """Three confluent-kafka members with librdkafka's ``assignor`` get disjoint partitions
    of six, shaped as the assignor makes them; when one leaves (close()), the two others
    share all six, and read every message between them."""
    topic = group = f"assignor-{assignor}"
    partitions = create(root, topic, 6)
    values = produce(root, topic, 6, 24)
    spec = {"group": group, "topics": [topic], "assignor": assignor, "commit": "each"}
    members = [start(request, daemon, "confluent", f"{assignor}-{i}", **spec) for i in range(3)]
    wait(members, "three members share the partitions", lambda: shared(members, partitions))
    before = [sorted(p for _, p in m.assignment) for m in members]
    if assignor == "range":
        assert sorted(before) == [[0, 1], [2, 3], [4, 5]]
    elif assignor == "roundrobin":
        assert sorted(before) == [[0, 3], [1, 4], [2, 5]]
    else:
        assert sorted(map(len, before)) == [2, 2, 2]
    wait(members, "every message read", lambda: delivered(members) >= values)

    members[0].close()
    rest = members[1:]
    marks = [len(m.lines) for m in rest]
    wait(rest, "two members share the partitions", lambda: shared(rest, partitions))
    after = [sorted(p for _, p in m.assignment) for m in rest]
    if assignor == "range":
        assert sorted(after) == [[0, 1, 2], [3, 4, 5]]
    elif assignor == "roundrobin":
        assert sorted(after) == [[0, 2, 4], [1, 3, 5]]
    else:  # sticky and cooperative: each keeps its own, none is revoked
        assert all(set(b) < set(a) for b, a in zip(before[1:], after, strict=True)), (before, after)
        assert not [line for m, mark in zip(rest, marks, strict=True) for line in m.lines[mark:] if line.get("why") == "revoke"]
    more = produce(root, topic, 6, 12, first=24)
    wait(rest, "what came after read", lambda: delivered(rest) >= more)
    for m in rest:
        m.close()
    read_up(root, group, partitions)


# ----------------------------------------------------------------- subscriptions


def test_regex_subscription_takes_the_matching_topics_only(request, daemon, root) -> None:
    """confluent-kafka, kafka-python and aiokafka subscribed to ``^rx-.*`` (each its own
    group) are assigned the partitions of the two matching topics, not the third's, and
    read exactly the messages of those two."""
    matching = create(root, "rx-a", 2) | create(root, "rx-b", 1)
    create(root, "not-rx", 1)
    values = produce(root, "rx-a", 2, 6) | produce(root, "rx-b", 1, 3)
    produce(root, "not-rx", 1, 3)
    members = [start(request, daemon, c, c, group=f"rx-{c}", pattern="^rx-.*") for c in MODULES]
    wait(members, "every member reads both topics", lambda: all(m.values() >= values for m in members))
    for m in members:
        assert m.assignment == matching, (m.name, m.assignment)
        m.close()
        assert m.values() == values, m.name


# ----------------------------------------------------------------- commits


RESUMES = [(c, commit, f"resume-{c}-{commit}") for c in MODULES for commit in ("auto", "end")]
"""(client, commit, group) of each group that resumes."""


def test_a_new_member_resumes_exactly_at_the_committed_offsets(request, daemon, root) -> None:
    """Each Python client in a group of its own, committing automatically (``auto``) or by
    hand (``end``): a member reads ten messages and closes; more are written; a new member
    of the group starts at the offsets committed (as ``kl groups describe`` shows them) and
    reads the rest, nothing twice, nothing missed; then the group's lag is 0."""
    topic = "resume"
    partitions = create(root, topic, 3)
    first = produce(root, topic, 3, 30)
    groups = [g for _, _, g in RESUMES]
    spec = {"topics": [topic], "count": 10}
    readers = [start(request, daemon, c, f"{g}-1", group=g, commit=commit, **spec) for c, commit, g in RESUMES]
    wait(readers, "each reads ten", lambda: all(len(m.deliveries) == 10 for m in readers))
    for m in readers:
        assert m.close()["closed"] == 10
    committed = {g: described(root, g) for g in groups}
    for m, g in zip(readers, groups, strict=True):
        last = {}
        for d in m.deliveries:
            last[d.topic, d.partition] = d.offset
        for partition, offset in last.items():
            shown = kafka_committed(root, committed[g][partition])
            assert shown == offset + 1, (g, partition, shown, offset)

    second = produce(root, topic, 3, 15, first=30)
    spec = {"topics": [topic]}
    resumed = [start(request, daemon, c, f"{g}-2", group=g, commit=commit, **spec) for c, commit, g in RESUMES]
    wait(resumed, "each reads the rest", lambda: all(len(m.deliveries) >= 35 for m in resumed))
    for m in resumed:
        m.close()
    for before, after, g in zip(readers, resumed, groups, strict=True):
        assert before.values() | after.values() == first | second, g
        assert len(before.deliveries) + len(after.deliveries) == 45, (g, before.deliveries, after.deliveries)
        starts = {}
        for d in after.deliveries:
            starts.setdefault((d.topic, d.partition), d.offset)
        for partition, offset in starts.items():
            shown = kafka_committed(root, committed[g][partition])
            assert offset == (shown if shown is not None else 0), (g, partition, offset, shown)
        read_up(root, g, partitions)
    text = kl_cli(root, "groups", "describe", groups[0])
    for p in range(3):
        end = described(root, groups[0])[topic, p]["log_end_offset"]
        assert any(line.split()[:6] == [topic, str(p), "-", str(end), str(end), "0"] for line in text.splitlines()), text


# ----------------------------------------------------------------- every client


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "kafkajs"])
def test_a_group_of_two_reads_everything(request, daemon, root, client) -> None:
    """Two members of one group (KafkaConsumer(group_id=...).subscribe, AIOKafkaConsumer,
    KafkaJS's consumer.subscribe and run) share four partitions and read every message written
    once they do, each once; their commits leave the group's lag at 0."""
    topic = group = f"pair-{client}"
    partitions = create(root, topic, 4)
    members = [start(request, daemon, client, f"{client}-{i}", group=group, topics=[topic]) for i in range(2)]
    wait(members, "two members share the partitions", lambda: shared(members, partitions))
    values = produce(root, topic, 4, 40)
    wait(members, "every message read", lambda: delivered(members) >= values)
    for m in members:
        m.close()
    assert sorted(d.value for m in members for d in m.deliveries) == sorted(values)
    read_up(root, group, partitions)


def test_kcat_balanced_consumer_reads_everything(daemon, root) -> None:
    """``kcat -G GROUP TOPIC -o beginning -e``: librdkafka's balanced consumer reads every
    message of four partitions, exits at their end, and its commits leave the lag at 0."""
    if KCAT is None:
        pytest.skip("kcat is not installed (scripts/test installs Debian's kcat as root)")
    topic = group = "kcat-group"
    partitions = create(root, topic, 4)
    values = produce(root, topic, 4, 40)
    argv = [KCAT, "-b", daemon.bootstrap, "-G", group, topic, "-o", "beginning", "-e", "-f", "%t %p %o %s\\n"]
    printed = Client(argv, server_log=daemon.log).finish().decode().splitlines()
    assert sorted(line.split()[3] for line in printed) == sorted(values)
    read_up(root, group, partitions)
