"""``kl consume --group``: members as real processes, committing what they wrote, leaving on signals."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import pytest

import kl
from kl.registry import Registry

KL = [sys.executable, "-m", "kl_cli"]


def kl_run(root: kl.Root, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*KL, "--root", root.path, *args], input=input, capture_output=True, timeout=60)


def produce(root: kl.Root, topic: str, first: int, count: int) -> list[bytes]:
    values = [b"%d" % i for i in range(first, first + count)]
    producer = kl.Producer(root)
    for i in range(0, count, 50):
        producer.send_batch(topic, values[i : i + 50])
    return values


@pytest.fixture
def four(root: kl.Root) -> kl.Root:
    root.create_topic("t", kl.TopicConfig(partitions=4))
    root.create_topic("u", kl.TopicConfig(partitions=2))
    return root


def test_a_group_reads_each_message_once_across_runs_and_topics(four):
    values = produce(four, "t", 0, 1000) + produce(four, "u", 1000, 500)
    first = kl_run(four, "consume", "t", "u", "--group", "g", "--count", "777")
    assert first.returncode == 0, first.stderr
    second = kl_run(four, "consume", "t", "u", "--group", "g")
    assert (second.returncode, second.stderr) == (0, b"")
    got = first.stdout.splitlines() + second.stdout.splitlines()
    assert len(first.stdout.splitlines()) == 777
    assert sorted(got, key=int) == values
    assert kl_run(four, "consume", "t", "u", "--group", "g").stdout == b""
    other = kl_run(four, "consume", "t", "u", "--group", "other", "--json")
    assert len(other.stdout.splitlines()) == 1500
    assert Registry(four.path, "g").members() == []


def test_sigterm_commits_what_was_written_and_leaves(four):
    produce(four, "t", 0, 200)
    members = [
        subprocess.Popen([*KL, "--root", four.path, "consume", "t", "--group", "g", "--follow"], stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    registry = Registry(four.path, "g")
    try:
        deadline = time.monotonic() + 30
        while len(registry.members()) < 2 or sum(registry.owner("t", p).member is not None for p in range(4)) < 4:
            assert time.monotonic() < deadline, "the members did not share the partitions"
            time.sleep(0.05)
        produce(four, "t", 200, 300)
        time.sleep(0.5)
        members[0].send_signal(signal.SIGTERM)
        members[1].send_signal(signal.SIGINT)
        outs = [m.communicate(timeout=30)[0] for m in members]
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait()
    assert [m.returncode for m in members] == [0, 130]
    got = collections.Counter(line for out in outs for line in out.splitlines())
    rest = kl_run(four, "consume", "t", "--group", "g").stdout.splitlines()
    assert sorted([*got, *rest], key=int) == [b"%d" % i for i in range(500)]
    assert max(got.values()) == 1
    assert registry.members() == []


def test_group_options_are_checked(four):
    for args, message in [
        (("t", "--group", "g", "-o", "0"), "--group reads from the group's committed offsets"),
        (("t", "u"), "several topics are read together only by a group"),
        (("t", "--group", "../g"), "invalid group name"),
    ]:
        result = kl_run(four, "consume", *args)
        assert result.returncode in (1, 2)
        assert message in result.stderr.decode()
        assert b"Traceback" not in result.stderr
    missing = kl_run(four, "consume", "t", "nope", "--group", "g")
    expected = b"Error: topic 'nope' does not exist in " + four.path.encode()
    assert (missing.returncode, missing.stderr.splitlines()[-1]) == (1, expected)
    assert not os.path.exists(os.path.join(four.path, ".groups", "g", "ids")) or Registry(four.path, "g").members() == []
