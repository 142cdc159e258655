"""Several topics and several partitions without a group (``kl consume a b``, ``-p 0 -p 2``,
``Consumer.consume([...])``), and ``kl produce -k KEY``: one key for a whole run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner, Result
from test_serve import Running

import kl
from kl.producer import hash_partitioner
from kl_cli.main import cli

from conftest import write

KL = [sys.executable, "-m", "kl_cli"]


def run(root: kl.Root, *args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--root", root.path, *args], input=input, env={"KL_ROOT": None}, catch_exceptions=False)


def ok(root: kl.Root, *args: str, input: bytes | None = None) -> list[str]:
    """Run kl, assert it succeeded quietly; its stdout lines."""
    result = run(root, *args, input=input)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout.splitlines()


def usage_error(root: kl.Root, *args: str) -> str:
    result = run(root, *args)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    return result.stderr.splitlines()[-1]


@pytest.fixture
def ab(root: kl.Root) -> kl.Root:
    """Topic ``a`` (two partitions: a0-0, a0-1 in 0; a1-0 in 1) and ``b`` (one: b0-0 to b0-2)."""
    root.create_topic("a", kl.TopicConfig(partitions=2))
    root.create_topic("b")
    write(root, "a", [b"a0-0", b"a0-1"])
    write(root, "a", [b"a1-0"], partition=1)
    write(root, "b", [b"b0-0", b"b0-1", b"b0-2"])
    return root


# ----------------------------------------------------------------- several topics


def test_several_topics_without_a_group_read_every_partition_in_order(ab):
    lines = ok(ab, "consume", "a", "b", "--format", "{topic}/{partition} {value}")
    assert lines == ["a/0 a0-0", "a/0 a0-1", "a/1 a1-0", "b/0 b0-0", "b/0 b0-1", "b/0 b0-2"]


def test_a_topic_named_twice_is_read_once(ab):
    assert ok(ab, "consume", "b", "b") == ["b0-0", "b0-1", "b0-2"]


def test_several_topics_take_the_last_n_of_each_partition(ab):
    assert ok(ab, "consume", "a", "b", "-o", "-1") == ["a0-1", "a1-0", "b0-2"]


def test_several_topics_as_json_name_their_topic(ab):
    rows = [json.loads(line) for line in ok(ab, "consume", "b", "a", "--json", "-c", "4")]
    assert [(r["topic"], r["partition"], r["value"]) for r in rows] == [
        ("b", 0, "b0-0"),
        ("b", 0, "b0-1"),
        ("b", 0, "b0-2"),
        ("a", 0, "a0-0"),
    ]


def test_several_topics_follow_interleaves_them_as_messages_come(ab):
    """Each line is read before the next message is written to the other topic; the last
    message of each partition, read first, shows the follower started."""
    proc = subprocess.Popen(
        [*KL, "--root", ab.path, "consume", "a", "b", "-o", "-1", "-f", "-c", "7", "--format", "{topic} {value}"],
        stdout=subprocess.PIPE,
    )
    timer = threading.Timer(60, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        assert sorted(proc.stdout.readline() for _ in range(3)) == [b"a a0-1\n", b"a a1-0\n", b"b b0-2\n"]
        for topic, value in [("b", b"1"), ("a", b"2"), ("b", b"3"), ("a", b"4")]:
            write(ab, topic, [value])
            assert proc.stdout.readline() == topic.encode() + b" " + value + b"\n"
        assert proc.wait(timeout=60) == 0
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()


def test_several_topics_through_a_server(ab):
    running = Running(ab)
    try:
        server = f"127.0.0.1:{running.address[1]}"
        lines = ok(ab, "consume", "b", "a", "--server", server, "-o", "-1", "--format", "{topic}/{partition} {value}")
        assert lines == ["b/0 b0-2", "a/0 a0-1", "a/1 a1-0"]
    finally:
        running.stop()


def test_a_missing_topic_among_several_is_an_error(ab):
    result = run(ab, "consume", "a", "nope")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"Error: topic 'nope' does not exist in {ab.path}\n"


def test_library_consumes_several_topics(ab):
    consumer = kl.Consumer(ab)
    batches = list(consumer.consume(["b", "a"], values_only=True))
    assert [(b.topic, b.partition, b.messages) for b in batches] == [
        ("b", 0, [b"b0-0", b"b0-1", b"b0-2"]),
        ("a", 0, [b"a0-0", b"a0-1"]),
        ("a", 1, [b"a1-0"]),
    ]
    start = {("a", 1): 0, ("b", 0): consumer.position_back("b", 0, 1)}
    picked = consumer.consume(["a", "b"], [("a", 1), ("b", 0)], start=start, values_only=True)
    assert [(b.topic, b.messages) for b in picked] == [("a", [b"a1-0"]), ("b", [b"b0-2"])]
    with pytest.raises(kl.InvalidConfig, match="a .topic, partition. pair of them, not 1"):
        list(consumer.consume(["a", "b"], [1]))
    with pytest.raises(kl.InvalidConfig, match=r"start gives no offset for partition \('b', 0\)"):
        list(consumer.consume(["a", "b"], start={("a", 0): 0, ("a", 1): 0}))


# ----------------------------------------------------------------- several -p


def test_partition_repeated_reads_each_one_named(ab):
    ab.create_topic("three", kl.TopicConfig(partitions=3))
    for p in range(3):
        write(ab, "three", [b"p%d" % p], partition=p)
    assert ok(ab, "consume", "three", "-p", "2", "-p", "0") == ["p2", "p0"]
    assert ok(ab, "consume", "three", "-p", "1", "-p", "1") == ["p1"]


def test_partition_with_several_topics_is_refused(ab):
    assert usage_error(ab, "consume", "a", "b", "-p", "0") == (
        "Error: --partition picks partitions of one topic: with several topics every partition is read"
    )


def test_a_byte_offset_with_several_partitions_is_refused(ab):
    assert usage_error(ab, "consume", "a", "-p", "0", "-p", "1", "-o", "0") == (
        "Error: an offset is for one partition, not 2"
    )
    assert ok(ab, "consume", "a", "-p", "1", "-o", "0") == ["a1-0"]


# ----------------------------------------------------------------- produce -k


def test_produce_key_gives_every_message_the_key(root):
    root.create_topic("k", kl.TopicConfig(partitions=4))
    ok(root, "produce", "k", "-k", "user-7", input=b"one\ntwo\nthree\n")
    partition = hash_partitioner(b"user-7", 4)
    assert ok(root, "consume", "k", "--format", "{partition} {key} {value}") == [
        f"{partition} user-7 one",
        f"{partition} user-7 two",
        f"{partition} user-7 three",
    ]


def test_produce_key_with_a_partition_goes_there(root):
    root.create_topic("k", kl.TopicConfig(partitions=4))
    ok(root, "produce", "k", "--key", "x", "-p", "3", input=b"v\n")
    assert ok(root, "consume", "k", "-p", "3", "-K", "=") == ["x=v"]


@pytest.mark.parametrize(
    "args, error",
    [
        (["-k", "x", "-K", " "], "Error: --key-delimiter, --key cannot be used together"),
        (["-k", "x", "--json"], "Error: --json, --key cannot be used together"),
    ],
)
def test_produce_key_with_a_key_from_the_input_is_refused(root, args, error):
    root.create_topic("k")
    assert usage_error(root, "produce", "k", *args) == error
