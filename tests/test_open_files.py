"""A bounded number of open files whatever the size of the root (``kl.log.openfiles``):
the commands and the library under a lowered ``ulimit -n``, in subprocesses, on roots of
many more partitions than the limit has descriptors; and a roll's orphan found by its
mark, not by listing the directory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

import kl
from kl.errors import StorageError
from kl.log import locks, openfiles
from kl.log.segment import segment_path

from faultlib import read_log

KL = [sys.executable, "-m", "kl_cli"]


def limited(limit: int):
    """A ``preexec_fn`` lowering the soft and hard limits on open files to ``limit``
    (as ``ulimit -n`` does in a shell: kl cannot raise it back)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def run(args: list[str], limit: int, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(args, input=input, capture_output=True, timeout=300, preexec_fn=limited(limit))


def open_under(path: str) -> list[str]:
    """This process's open files under ``path``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor
            continue
        if target.startswith(path + os.sep):
            found.append(target)
    return found


def values(root: kl.Root, topic: str, partition: int) -> list[bytes | None]:
    return [m.value for m in read_log(root.log(topic, partition))]


def one_message_each(root: kl.Root, topic: str, partitions: int) -> None:
    producer = kl.Producer(root)
    for p in range(partitions):
        producer.send(topic, b"m%d" % p, partition=p)
    producer.close()
    root.close()


def test_a_keyed_produce_into_1000_partitions_under_ulimit_256(root):
    root.create_topic("p", kl.TopicConfig(partitions=1000))
    lines = b"".join(b"k%d v%d\n" % (i, i) for i in range(1, 5001))
    done = run([*KL, "--root", root.path, "produce", "p", "-K", " "], 256, input=lines)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""  # no background flush failed, nothing else to say
    got = sorted(int(v[1:]) for p in range(1000) for v in values(root, "p", p) if v is not None)
    assert got == list(range(1, 5001))


def test_retain_and_recover_over_1000_partitions_under_ulimit_256(root):
    root.create_topic("p", kl.TopicConfig(partitions=1000, retention_ms=3_600_000))
    one_message_each(root, "p", 1000)
    retained = run([*KL, "--root", root.path, "retain"], 256)
    assert retained.returncode == 0, retained.stderr.decode()[-500:]
    assert retained.stdout.decode().count("nothing to delete") == 1000
    recovered = run([*KL, "--root", root.path, "recover"], 256)
    assert recovered.returncode == 0, recovered.stderr.decode()[-500:]
    assert recovered.stdout.decode().count(": ok") == 1000


def test_a_group_consumer_over_a_pattern_of_300_topics_under_ulimit_256(root):
    for t in range(300):
        root.create_topic(f"t{t:03d}")
        one_message_each(root, f"t{t:03d}", 1)
    code = textwrap.dedent(
        f"""
        import kl
        consumer = kl.GroupConsumer(kl.Root({root.path!r}), "g", pattern=r"t\\d+")
        values = set()
        for message in consumer:
            values.add((message.topic, message.value))
            if len(values) == 300:
                break
        consumer.close()
        print(len(values))
        """
    )
    done = run([sys.executable, "-c", code], 256)
    assert done.returncode == 0, done.stderr.decode()[-800:]
    assert done.stdout == b"300\n"


def test_a_mirror_of_300_topics_under_ulimit_256(root, tmp_path):
    """The mirror holds each topic's mirror lock for its whole run: bytes of one file."""
    for t in range(300):
        root.create_topic(f"t{t:03d}")
        one_message_each(root, f"t{t:03d}", 1)
    target = tmp_path / "target"
    done = run([*KL, "mirror", root.path, str(target)], 256)
    assert done.returncode == 0, done.stderr.decode()[-800:]
    copy = kl.Root(target)
    assert [values(copy, f"t{t:03d}", 0) for t in range(300)] == [[b"m0"]] * 300


def test_the_files_kept_open_stay_within_the_budget_and_root_close_closes_them(root, monkeypatch):
    monkeypatch.setattr(openfiles, "budget", lambda: 40)
    monkeypatch.setattr(openfiles, "_budget", 40)
    root.create_topic("p", kl.TopicConfig(partitions=100))
    producer = kl.Producer(root)
    for p in range(100):
        producer.send("p", b"x", partition=p)
        assert len(open_under(root.path)) <= 40 + 4  # the budget, and the hold under way
    assert len(open_under(root.path)) >= 20  # kept, not closed after each append
    producer.close()
    root.close()
    assert open_under(root.path) == []
    producer.send("p", b"y", partition=7)  # reopened as needed
    assert values(root, "p", 7) == [b"x", b"y"]


def test_a_lock_closed_and_its_file_made_again_locks_the_new_file(root):
    """The file a lock reopens is the one at its path now, as another process would lock;
    unless this process already has a lock on that new file (two would drop each other's)."""
    root.create_topic("t")
    producer = kl.Producer(root)
    producer.send("t", b"a", partition=0)
    log = root.log("t", 0)
    log.close_lock_file()
    with open(log.lock_path, "rb"):  # as another process holding the old file would (its inode stays taken)
        os.unlink(log.lock_path)
        open(log.lock_path, "w").close()
        producer.send("t", b"b", partition=0)
        assert locks.lock_for(log.lock_path) is log._lock  # noqa: SLF001
        log.close_lock_file()
        with open(log.lock_path, "rb"):
            os.unlink(log.lock_path)
            open(log.lock_path, "w").close()
            other = locks.lock_for(log.lock_path)  # this process's lock on the newest file
            with pytest.raises(StorageError, match="deleted and created again while in use"):
                producer.send("t", b"c", partition=0)
            assert other is not log._lock  # noqa: SLF001
    assert values(root, "t", 0) == [b"a", b"b"]
    locks._registry.clear()  # noqa: SLF001  (a fresh process would have only the newest)


def test_a_segment_left_by_a_roll_killed_after_its_mark_is_removed_at_the_next_roll(root):
    """A writer killed mid-roll leaves its mark and its new segment, never published;
    another writer appending on past that base removes it when it rolls, with no
    listing of the directory (this handle listed it at its first roll)."""
    root.create_topic("t", kl.TopicConfig(segment_bytes=400, max_message_bytes=200, flush_messages=0, flush_ms=0))
    producer = kl.Producer(root)
    for i in range(6):  # rolls once at least: the handle has listed the directory
        producer.send("t", b"%02d" % i + b"." * 80, partition=0)
    log = root.log("t", 0)
    state = log.state()
    assert state.active_base_offset > 0
    orphan = segment_path(log.directory, state.log_end_offset)
    killed = kl.Root(root.path).log("t", 0)  # another handle, as another process's
    with killed.locked():
        killed.writable_state()
        assert killed._state_file is not None  # noqa: SLF001
        killed._state_file.write_roll_mark(state.log_end_offset)  # noqa: SLF001
        with open(orphan, "wb") as f:
            f.write(b"junk of a roll killed before it published")
    killed.close()
    producer.send("t", b"small", partition=0)  # in the active segment, past the orphan's base
    assert os.path.exists(orphan)
    for i in range(6):
        producer.send("t", b"%02d" % (i + 6) + b"." * 80, partition=0)
    assert not os.path.exists(orphan)
    expected = [b"%02d..." % i for i in range(6)] + [b"small"] + [b"%02d..." % i for i in range(6, 12)]
    assert [v[:5] for v in values(root, "t", 0) if v is not None] == expected
