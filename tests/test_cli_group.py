"""``kl consume --group``: members as real processes, committing what they wrote, leaving on signals."""

from __future__ import annotations

import collections
import itertools
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
    assert [m.returncode for m in members] == [0, -signal.SIGINT]
    got = collections.Counter(line for out in outs for line in out.splitlines())
    rest = kl_run(four, "consume", "t", "--group", "g").stdout.splitlines()
    assert sorted([*got, *rest], key=int) == [b"%d" % i for i in range(500)]
    assert max(got.values()) == 1
    assert registry.members() == []


def test_group_options_are_checked(four):
    for args, message in [
        (("t", "--group", "g", "-o", "0"), "--group reads from the group's committed offsets"),
        (("t", "u", "-p", "0"), "--partition picks partitions of one topic"),
        (("t", "--group", ""), "a group id cannot be empty"),
    ]:
        result = kl_run(four, "consume", *args)
        assert result.returncode in (1, 2)
        assert message in result.stderr.decode()
        assert b"Traceback" not in result.stderr
    missing = kl_run(four, "consume", "t", "nope", "--group", "g")
    expected = b"Error: topic 'nope' does not exist in " + four.path.encode()
    assert (missing.returncode, missing.stderr.splitlines()[-1]) == (1, expected)
    assert not os.path.exists(os.path.join(four.path, ".groups", "g", "ids")) or Registry(four.path, "g").members() == []


# ----------------------------------------------------------------- issue 16: committed offsets


def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def line_count(path: str) -> int:
    with open(path, "rb") as f:
        return f.read().count(b"\n")


def test_a_lagging_member_loses_nothing_when_topic_json_is_touched(root, tmp_path):
    """Issue 16, repro 1: 162,551 of 200,000 messages lost after a touch of topic.json."""
    root.create_topic("t")
    out = str(tmp_path / "out")
    args = [*KL, "--root", root.path, "consume", "t", "--group", "g", "--follow", "--start", "latest"]
    with open(out, "wb") as f:
        member = subprocess.Popen(args, stdout=f)
    try:
        wait_until(lambda: Registry(root.path, "g").owner("t", 0).member is not None, "the member to own t/0")
        member.send_signal(signal.SIGSTOP)
        try:
            lines = "".join(f"{i}\n" for i in range(1, 100_001)).encode()
            assert kl_run(root, "produce", "t", input=lines).returncode == 0
            os.utime(os.path.join(root.topic_path("t"), "topic.json"))  # what any edit of its retention does
        finally:
            member.send_signal(signal.SIGCONT)
        wait_until(lambda: line_count(out) >= 100_000, "every message")
        member.send_signal(signal.SIGTERM)
        assert member.wait(timeout=30) == 0
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
    with open(out, "rb") as f:
        assert f.read() == lines
    assert Registry(root.path, "g").committed("t", 0).offset == root.log("t", 0).log_end_offset


def test_a_topic_deleted_and_created_again_is_read_from_its_start(root):
    """Issue 16, repro 2: 2,000 of 3,000 delivered, the first 1,000 skipped silently."""
    root.create_topic("t")
    assert kl_run(root, "produce", "t", input=b"".join(b"old%d\n" % i for i in range(1000))).returncode == 0
    assert len(kl_run(root, "consume", "t", "--group", "g").stdout.splitlines()) == 1000
    assert kl_run(root, "topics", "delete", "t").returncode == 0
    assert kl_run(root, "topics", "create", "t").returncode == 0
    new = b"".join(b"new%d\n" % i for i in range(3000))
    assert kl_run(root, "produce", "t", input=new).returncode == 0
    second = kl_run(root, "consume", "t", "--group", "g")
    assert (second.returncode, second.stdout, second.stderr) == (0, new, b"")


def test_a_damaged_offset_under_reset_fail_fails_every_run_until_reset(root):
    """Issue 16, repro 3: the second run printed all 1,000 messages again, exit 0."""
    root.create_topic("t")
    values = b"".join(b"%d\n" % i for i in range(1000))
    assert kl_run(root, "produce", "t", input=values).returncode == 0
    path = os.path.join(root.path, ".groups", "g", "offsets", "t", "0")  # an offset file of an older kl
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"garbage\n")
    runs = [kl_run(root, "consume", "t", "--group", "g", "--reset", "fail") for _ in range(2)]
    expected = f"Error: damaged committed offset file {path} (no checksum line at its end): reset it with 'kl groups reset'\n"
    assert [(r.returncode, r.stdout, r.stderr.decode()) for r in runs] == [(1, b"", expected)] * 2
    with open(path, "rb") as f:
        assert f.read() == b"garbage\n"
    assert kl_run(root, "groups", "reset", "g", "--to", "earliest").returncode == 0
    after = kl_run(root, "consume", "t", "--group", "g", "--reset", "fail")
    assert (after.returncode, after.stdout) == (0, values)


def test_the_default_policy_reports_a_damaged_offset_and_keeps_it_aside(root):
    root.create_topic("t")
    values = b"".join(b"%d\n" % i for i in range(100))
    assert kl_run(root, "produce", "t", input=values).returncode == 0
    path = os.path.join(root.path, ".groups", "g", "offsets", "t", "0")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"garbage\n")
    first = kl_run(root, "consume", "t", "--group", "g")
    assert (first.returncode, first.stdout) == (0, values)
    assert first.stderr.decode() == (
        f"Warning: group g: the committed offset of t/0: {path} is damaged (no checksum line at its end),"
        f" kept as {path}.damaged; going on from the earliest offset 0\n"
    )
    with open(path + ".damaged", "rb") as f:
        assert f.read() == b"garbage\n"
    assert kl_run(root, "consume", "t", "--group", "g").stdout == b""


def test_count_moves_on_inside_a_compressed_batch(root):
    """Issue 16, repro 4: three runs of -c 100 gave the same 100 messages three times."""
    root.create_topic("t")
    assert kl_run(root, "produce", "t", "-z", "zstd", input=b"".join(b"%d\n" % i for i in range(1, 1001))).returncode == 0
    runs = [kl_run(root, "consume", "t", "--group", "g", "-c", "100") for _ in range(3)]
    assert [r.returncode for r in runs] == [0, 0, 0]
    assert b"".join(r.stdout for r in runs) == b"".join(b"%d\n" % i for i in range(1, 301))
    assert kl_run(root, "groups", "export", "g").stdout == b"t 0 0+300\n"


# ----------------------------------------------------------------- commits that follow the reader

PIECE_LINES = (64 << 10) // 101
"""The lines of 100 bytes and a newline in a pipe's buffer, or in one write of ``kl consume --group``."""
REDELIVERY_BOUND = 2 * PIECE_LINES + 400
"""What a member killed -9 behind a slow reader may have written since its last commit: the
write under way and the pipe's buffer, and generously what the reader took in 50 ms
(today's interval: 10 ms) at 800 KB/s.  A whole fetch (1 MiB: 8,665 lines) is four times more."""


def killed_behind_a_slow_reader(root: kl.Root, topic: str, lines: int) -> list[bytes]:
    """What ``kl consume --group g --commit-interval 0.01`` wrote to a reader taking 4 KiB
    every 5 ms, killed -9 once the reader had ``lines`` lines (the rest of the pipe read too;
    a line cut by the kill left out)."""
    args = [*KL, "--root", root.path, "consume", topic, "--group", "g", "--commit-interval", "0.01"]
    member = subprocess.Popen(args, stdout=subprocess.PIPE)
    assert member.stdout is not None
    got = bytearray()
    try:
        while got.count(b"\n") < lines:
            chunk = os.read(member.stdout.fileno(), 4096)
            assert chunk, "the member ended before the kill"
            got += chunk
            time.sleep(0.005)
        member.kill()
        got += member.stdout.read()
    finally:
        member.kill()
        member.wait()
    return bytes(got[: got.rfind(b"\n") + 1]).splitlines()


def test_a_member_killed_behind_a_slow_reader_wrote_again_only_what_followed_its_last_commit(root):
    """Repro: the commit waited for a whole fetch to be written (1 MiB), so 146,237 lines came again."""
    root.create_topic("t")
    values = [b"%07d" % i + b"x" * 93 for i in range(40_000)]
    assert kl_run(root, "produce", "t", input=b"".join(v + b"\n" for v in values)).returncode == 0
    first = killed_behind_a_slow_reader(root, "t", 16_000)  # inside the second fetch of 1 MiB
    assert first == values[: len(first)]
    second = kl_run(root, "consume", "t", "--group", "g")
    assert second.returncode == 0, second.stderr
    rest = second.stdout.splitlines()
    again = len(first) + len(rest) - len(values)
    assert rest == values[-len(rest) :] and 0 <= again <= REDELIVERY_BOUND, (len(first), again)


def test_members_killed_three_times_over_compressed_batches_each_write_again_only_what_followed_their_last_commit(root):
    """Repro: over zstd batches of 50, three kills in a row wrote the same 99,969 messages again."""
    root.create_topic("t")
    values = [b"%07d" % i + b"x" * 93 for i in range(40_000)]
    produced = kl_run(root, "produce", "t", "-z", "zstd", "--batch-size", "50", input=b"".join(v + b"\n" for v in values))
    assert produced.returncode == 0
    runs = [killed_behind_a_slow_reader(root, "t", 6_000) for _ in range(3)]
    last = kl_run(root, "consume", "t", "--group", "g")
    assert last.returncode == 0, last.stderr
    runs.append(last.stdout.splitlines())
    at = 0
    for run, after in itertools.pairwise(runs):
        start = values.index(run[0])
        assert run == values[start : start + len(run)] and start <= at
        again = start + len(run) - values.index(after[0])
        assert 0 <= again <= REDELIVERY_BOUND, [len(r) for r in runs]
        at = start + len(run)
    assert runs[-1][-1] == values[-1]
