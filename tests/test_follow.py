"""kl.follow.Watch and following consumers: woken by inotify on local disks, polled elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import kl
import kl.follow
from kl.follow import Watch
from kl.log.log import Log

from conftest import segment_files, values_of

LONG = 30.0
"""A poll interval no test waits out: a wake-up before it came from inotify."""


def sender(root: kl.Root, topic: str, values: list[bytes], *, gap: float = 0.05) -> subprocess.Popen[bytes]:
    """Another process that sends ``values`` to partition 0 one by one, ``gap`` seconds apart."""
    code = (
        "import sys, time, kl\n"
        f"with kl.Producer(kl.Root({str(root.path)!r})) as producer:\n"
        f"    for value in {values!r}:\n"
        f"        time.sleep({gap})\n"
        f"        producer.send({topic!r}, value, partition=0)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def open_fds() -> set[tuple[str, str]]:
    """Each open descriptor and what it is open on."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
    return found


def opened_since(before: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The descriptors of files or inotify instances open now that were not in
    ``before`` (others may have closed meanwhile: objects of earlier tests the garbage
    collector finalizes; sockets and pipes are not what a follow opens, and the threads of
    earlier tests' clients may open them meanwhile)."""
    return {(fd, target) for fd, target in open_fds() - before if not target.startswith(("socket:", "pipe:"))}


def no_inotify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kl.follow, "_libc", lambda: None)


# ----------------------------------------------------------------- Watch


def test_wait_wakes_when_another_process_appends(root, topic):
    log = root.log(topic, 0)
    with Watch(poll_interval=LONG) as watch:
        watch.add(log)
        process = sender(root, topic, [b"new"])
        try:
            assert watch.wait() is True
        finally:
            assert process.wait(30) == 0
    assert log.log_end_offset > 0


def test_wait_without_news_returns_false(root, topic):
    with Watch(poll_interval=LONG) as watch:
        watch.add(root.log(topic, 0))
        assert watch.wait(0.05) is False


def test_wait_sees_a_publish_that_comes_well_after_its_data(root, topic, monkeypatch):
    # The data write wakes the watch while the state still has the old end: it reads again.
    publish = Log.publish
    written = threading.Event()

    def slow_publish(self: Log, state, *, durable: bool) -> None:
        written.set()
        time.sleep(0.2)
        publish(self, state, durable=durable)

    log = root.log(topic, 0)
    with Watch(poll_interval=LONG) as watch:
        watch.add(log)
        monkeypatch.setattr(Log, "publish", slow_publish)
        thread = threading.Thread(target=lambda: kl.Producer(root).send(topic, b"late", partition=0))
        thread.start()
        try:
            assert written.wait(30)
            assert log.log_end_offset == 0  # not yet published
            assert watch.wait() is True
            assert log.log_end_offset > 0
        finally:
            thread.join()


def test_wait_wakes_when_the_segment_rolls(root):
    root.create_topic("small", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512))
    kl.Producer(root).send("small", b"x" * 400, partition=0)
    kl.Producer(root).send("small", b"x" * 400, partition=0)
    log = root.log("small", 0)
    end = log.log_end_offset
    with Watch(poll_interval=LONG) as watch:
        watch.add(log)
        process = sender(root, "small", [b"y" * 400])
        try:
            assert watch.wait() is True
        finally:
            assert process.wait(30) == 0
    assert len(segment_files(root, "small")) == 2
    assert log.log_end_offset > end


def test_wait_wakes_when_the_topic_is_deleted(root, topic):
    with Watch(poll_interval=LONG) as watch:
        watch.add(root.log(topic, 0))
        kl.Root(root.path).delete_topic(topic)
        assert watch.wait() is True


def test_wait_fails_once_the_topic_was_deleted_and_created_again(root, topic):
    other = kl.Root(root.path)
    with Watch(poll_interval=LONG) as watch:
        watch.add(root.log(topic, 0))
        old = root.config(topic).topic_id
        other.delete_topic(topic)
        other.create_topic(topic)
        with kl.Producer(other) as producer:
            producer.send(topic, b"of the new one")
        with pytest.raises(kl.TopicRecreated) as caught:
            watch.wait(1)
    new = other.config(topic).topic_id
    other.close()
    assert str(caught.value) == (
        f"topic {topic} was deleted and created again since this follower started"
        f" (its topic id was {old}, it is {new} now): follow it again to read the new one"
    )


def test_an_edited_config_is_the_same_topic_to_a_watch(root, topic):
    path = os.path.join(root.topic_path(topic), "topic.json")
    with Watch(poll_interval=0.05) as watch:
        watch.add(root.log(topic, 0))
        with open(path, "rb") as f:
            data = f.read()
        os.unlink(path)  # a new file (another inode and mtime) with the same topic id
        with open(path, "wb") as f:
            f.write(data)
        assert watch.wait() is False


def test_a_watch_for_a_group_leaves_a_recreated_topic_to_its_coordinator(root, topic):
    other = kl.Root(root.path)
    with Watch(poll_interval=0.05, detect_recreation=False) as watch:
        watch.add(root.log(topic, 0))
        other.delete_topic(topic)
        other.create_topic(topic)
        watch.wait()
    other.close()


def test_a_removed_log_wakes_nobody(root, topic):
    log = root.log(topic, 0)
    with Watch(poll_interval=LONG) as watch:
        watch.add(log)
        watch.remove(log)
        kl.Producer(root).send(topic, b"unseen")
        assert watch.wait(0.1) is False


def test_close_frees_the_inotify_descriptor(root):
    root.create_topic("three", kl.TopicConfig(partitions=3))
    before = open_fds()
    watch = Watch()
    for p in range(3):
        watch.add(root.log("three", p))
    assert len(opened_since(before)) == 1  # one inotify instance for every partition
    watch.close()
    assert not opened_since(before)


def test_a_watch_on_nfs_opens_no_inotify_instance(root, topic, monkeypatch):
    log = root.log(topic, 0)
    monkeypatch.setattr(log, "on_nfs", lambda: True)
    before = open_fds()
    with Watch(poll_interval=0.01) as watch:
        watch.add(log)
        assert not opened_since(before)
        assert watch.wait() is False  # it only says when to poll


def test_running_out_of_inotify_instances_falls_back_to_polling_and_says_so_once(root, topic, monkeypatch, caplog):
    class Exhausted:
        def inotify_init1(self, flags: int) -> int:
            ctypes.set_errno(errno.EMFILE)
            return -1

    monkeypatch.setattr(kl.follow, "_libc", lambda: Exhausted())
    monkeypatch.setattr(kl.follow, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="kl.follow"):
        for _ in range(2):
            with Watch(poll_interval=0.01) as watch:
                watch.add(root.log(topic, 0))
                assert watch.wait() is False
    assert [r.getMessage() for r in caplog.records] == [
        f"inotify_init1 failed ({os.strerror(errno.EMFILE)}): following those partitions by polling"
    ]


def test_a_negative_poll_interval_is_refused():
    with pytest.raises(kl.InvalidConfig, match="poll_interval must be 0 or more seconds, not -1"):
        Watch(poll_interval=-1)


# ----------------------------------------------------------------- following consumers


def test_follow_gets_what_another_process_sends(root, topic):
    values = [b"%d" % i for i in range(5)]
    before = open_fds()
    process = sender(root, topic, values)
    try:
        batches = kl.Consumer(root).consume(topic, follow=True, max_messages=5, idle_timeout=LONG, poll_interval=LONG)
        got = [value for batch in batches for value in batch.messages]
    finally:
        assert process.wait(30) == 0
    assert values_of(got) == values
    assert not opened_since(before)


def test_stream_follows_across_segment_rolls(root):
    root.create_topic("small", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512))
    values = [b"%d" % i + b"x" * 300 for i in range(8)]
    process = sender(root, "small", values, gap=0.02)
    try:
        got = []
        for message in kl.Consumer(root).stream("small", 0, 0, idle_timeout=LONG, poll_interval=LONG):
            got.append(message.value)
            if len(got) == len(values):
                break
    finally:
        assert process.wait(30) == 0
    assert got == values
    assert len(segment_files(root, "small")) > 2


def test_follow_by_polling_still_delivers(root, topic, monkeypatch):
    no_inotify(monkeypatch)
    before = open_fds()
    process = sender(root, topic, [b"a", b"b"])
    try:
        stream = kl.Consumer(root).stream(topic, 0, 0, idle_timeout=LONG, poll_interval=0.01)
        got = [next(stream).value, next(stream).value]
        stream.close()
    finally:
        assert process.wait(30) == 0
    assert got == [b"a", b"b"]
    assert not opened_since(before)


def test_follow_on_nfs_is_polled_and_delivers(root, topic, monkeypatch):
    monkeypatch.setattr(Log, "on_nfs", lambda self: True)
    process = sender(root, topic, [b"a", b"b"])
    try:
        batches = kl.Consumer(root).consume(topic, follow=True, max_messages=2, idle_timeout=LONG, poll_interval=0.01)
        got = [value for batch in batches for value in batch.messages]
    finally:
        assert process.wait(30) == 0
    assert values_of(got) == [b"a", b"b"]


@pytest.mark.parametrize("new", [[b"n%d" % i for i in range(6)], [b"n"], [b"nnnn"]])
def test_a_follower_in_the_middle_of_a_backlog_reads_nothing_of_a_topic_created_again(root, new):
    root.create_topic("t")
    with kl.Producer(root) as producer:
        producer.send_batch("t", [b"m0", b"m1", b"m2"])
    follower = kl.Consumer(root).consume("t", follow=True, poll_interval=LONG)
    assert values_of(next(follower).messages) == [b"m0", b"m1", b"m2"]  # then it is held at its yield
    other = kl.Root(root.path)
    other.delete_topic("t")
    other.create_topic("t")
    with kl.Producer(other) as producer:  # after the old end, after nothing, and inside a message
        producer.send_batch("t", new)
    other.close()
    with pytest.raises(kl.TopicRecreated):
        next(follower)
    follower.close()


IN_POLL = {"x86_64": {"7", "219"}}.get(os.uname().machine)
"""/proc/PID/syscall's numbers for a process stopped inside ``poll`` (or the restart of one)."""


def stop_while_it_waits(process: subprocess.Popen[bytes]) -> None:
    """SIGSTOP ``process`` inside ``Watch.wait``'s poll (not between two reads)."""
    deadline = time.monotonic() + 30
    while True:
        process.send_signal(signal.SIGSTOP)
        time.sleep(0.01)
        with open(f"/proc/{process.pid}/syscall", encoding="ascii") as f:
            if f.read().split()[0] in IN_POLL:
                return
        process.send_signal(signal.SIGCONT)
        assert time.monotonic() < deadline, "the follower never waited"


@pytest.mark.skipif(IN_POLL is None, reason="the poll system call's number is known for x86_64 only")
def test_a_follower_stopped_while_its_topic_is_deleted_and_created_again_fails_and_reads_nothing_of_the_new(root):
    root.create_topic("t")
    with kl.Producer(root) as producer:
        producer.send_batch("t", [b"m0", b"m1", b"m2"])
    follower = subprocess.Popen(
        [sys.executable, "-m", "kl_cli", "--root", root.path, "consume", "t", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follower.stdout is not None
        assert [follower.stdout.readline() for _ in range(3)] == [b"m0\n", b"m1\n", b"m2\n"]
        stop_while_it_waits(follower)
        other = kl.Root(root.path)
        old = other.config("t").topic_id
        other.delete_topic("t")
        other.create_topic("t")
        with kl.Producer(other) as producer:
            producer.send_batch("t", [b"n%d" % i for i in range(6)])  # byte 3 x 6 is a message boundary of both
        new = other.config("t").topic_id
        other.close()
        follower.send_signal(signal.SIGCONT)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert (follower.returncode, out) == (1, b"")
    assert err.decode() == (
        f"Error: topic t was deleted and created again since this follower started (its topic id was {old},"
        f" it is {new} now): follow it again to read the new one\n"
    )


def test_idle_timeout_ends_a_follow_woken_by_inotify(root, topic):
    kl.Producer(root).send(topic, b"old")
    before = open_fds()
    got = list(kl.Consumer(root).stream(topic, 0, 0, idle_timeout=0.2, poll_interval=LONG))
    assert values_of(got) == [b"old"]
    assert not opened_since(before)


def test_a_follow_left_early_frees_its_descriptor(root, topic):
    kl.Producer(root).send(topic, b"one")
    before = open_fds()
    stream = kl.Consumer(root).stream(topic, 0, 0)
    assert next(stream).value == b"one"
    assert len(opened_since(before)) == 1
    stream.close()
    assert not opened_since(before)
