"""Group members stay live: a member stopped while it holds a group lock delays the others by
the session timeout at most; a member whose root is deleted exits with a clear error."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import pytest
from test_group import MEMBER, STARTED, Member, _no_member_outlives_its_test, _owned, wait_for  # noqa: F401 - a fixture

import kl
from kl.log import locks
from kl.registry import SLOT, Registry

from conftest import write_each

SESSION = 2.0
MARGIN = 2.0
"""Seconds allowed on top of the bound (session timeout + 1 s) for a loaded machine."""


def record_locked(path: str, partition: int) -> bool:
    """Whether some process holds the lock on partition ``partition``'s owner record in the
    claims file ``path`` (open file description locks name no process: F_OFD_GETLK)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return locks.locked_elsewhere(fd, path, start=partition * SLOT, length=SLOT)
    finally:
        os.close(fd)


def is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


class BeatWatch:
    """Watches a member's heartbeat from outside: the longest it stood still."""

    def __init__(self, root: kl.Root, group: str, member: str):
        self.registry, self.member = Registry(root.path, group), member
        self.longest = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        beat, since = None, time.monotonic()
        while not self._done.wait(0.05):
            now = time.monotonic()
            found = {m.id: m.beat for m in self.registry.members()}.get(self.member)
            if found != beat:
                beat, since = found, now
            self.longest = max(self.longest, now - since)

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return self.longest


def member(root: kl.Root, name: str, *args: str, ready: str = "joined") -> Member:
    """A member process of group g reading t (writing to NAME.out beside the root), once it
    wrote a ``ready`` line."""
    m = Member.__new__(Member)
    m.out = os.path.join(os.path.dirname(root.path), f"{name}.out")
    m.proc = subprocess.Popen([sys.executable, MEMBER, root.path, "g", "t", m.out, "--session", str(SESSION), *args])
    STARTED.append(m.proc)
    wait_for(lambda: m.lines(ready), what=f"{name}: {ready}")
    return m


@pytest.mark.parametrize("lock", ["claim", "commit", "release", "owns"])
def test_a_member_stopped_holding_a_partition_lock_delays_the_others_by_the_session_timeout_at_most(root, lock):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    registry = Registry(root.path, "g")
    if lock == "claim":  # b owns both; a stops in its first claim, holding a lock b needs to let go
        b = member(root, "b")
        wait_for(lambda: sorted(_owned(root, "g", "t", b)) == [0, 1], what="b to own both")
        a = member(root, "a", "--stop-in", lock, ready="stopping")
    elif lock == "release":  # a owns both; b joins, and a stops giving one of them up to it
        a = member(root, "a", "--stop-in", lock)
        wait_for(lambda: sorted(_owned(root, "g", "t", a)) == [0, 1], what="a to own both")
        b = member(root, "b")
    else:
        a = member(root, "a", "--stop-in", lock, "--arm-on-usr1")
        b = member(root, "b")
        wait_for(lambda: len(_owned(root, "g", "t", a)) == 1 and len(_owned(root, "g", "t", b)) == 1, what="one each")
        a.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: a.lines("armed"), what="a to arm its stop")
        if lock == "commit":  # a stops committing what it read
            write_each(root, "t", [b"first"], partition=_owned(root, "g", "t", a)[0])
        else:  # a, stopped past the session timeout, wakes up and stops checking what it still owns
            # Once a committed its partition, nothing but that check can drop it: stopped in the
            # middle of a poll, a would otherwise finish the poll with a first commit, rejected.
            wait_for(lambda: registry.committed("t", _owned(root, "g", "t", a)[0]), what="a's first commit")
            a.proc.send_signal(signal.SIGSTOP)
            wait_for(lambda: sorted(_owned(root, "g", "t", b)) == [0, 1], what="b to take a's partition")
            a.proc.send_signal(signal.SIGCONT)
    try:
        wait_for(lambda: a.lines("stopping") and is_stopped(a.proc.pid), what="a to stop holding the lock", report=a.out)
        [(_, topic, partition)] = a.lines("stopping")
        assert record_locked(os.path.join(root.path, ".groups", "g", "claims", topic), int(partition))
        [(b_id,)] = b.lines("joined")
        beats = BeatWatch(root, "g", b_id)
        stopped_at = time.monotonic()
        for p in (0, 1):
            write_each(root, "t", [f"after{p}".encode()], partition=p)
        ends = {p: root.log("t", p).log_end_offset for p in (0, 1)}

        def done() -> bool:
            values = {v for *_, v in b.received()}
            committed = [registry.committed("t", p) for p in (0, 1)]
            return {"after0", "after1"} <= values and all(c is not None and c.offset == ends[p] for p, c in enumerate(committed))

        wait_for(done, timeout=60, what="b to deliver and commit every partition")
        took = time.monotonic() - stopped_at
        longest = beats.stop()
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert took <= SESSION + 1 + MARGIN, f"b took {took:.1f}s to deliver and commit both partitions"
    assert longest < SESSION, f"b's heartbeat stood still for {longest:.1f}s"
    assert not b.lines("lost")
    b.stop()


def test_a_group_member_whose_root_is_deleted_exits_with_one_line_within_a_poll_interval(root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write_each(root, "t", [b"one"])
    member = subprocess.Popen(
        [sys.executable, "-m", "kl_cli", "--root", root.path, "consume", "t", "--group", "g", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    STARTED.append(member)
    assert member.stdout is not None
    assert member.stdout.readline() == b"one\n"
    os.rename(root.path, tmp_path / "trash")  # as ``rm -r`` does, at once
    gone = time.monotonic()
    _, err = member.communicate(timeout=60)
    took = time.monotonic() - gone
    shutil.rmtree(tmp_path / "trash")
    assert (member.returncode, err.decode()) == (1, f"Error: root {root.path} does not exist (is it mounted?)\n")
    assert took < 0.5 + MARGIN, f"the member took {took:.1f}s to notice"  # its poll interval (0.5 s), and then some
    assert not os.path.exists(root.path), "the member created the root again"


def test_a_member_stopped_in_the_middle_of_its_poll_takes_no_live_member_for_expired_when_it_wakes_up(root, monkeypatch):
    """A member that stood still between the start of its poll and its reading of the
    members (SIGSTOP, a hung host: what the stopped-holder test does to a, stopped in its
    ownership check) counts the others' heartbeats as seen when it read them, not when its
    poll began: else its next poll, at once on waking, expired every member that had not
    beaten again since and took their partitions (CI: b, live, lost t/0 to a that way)."""
    clock = [1000.0]
    monkeypatch.setattr(kl.group, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep))
    root.create_topic("t", kl.TopicConfig(partitions=2))
    registry = Registry(root.path, "g")
    # The clock stands still: the coordinator threads do not poll by themselves (and, their
    # locks held here, could not); the test drives each poll.
    a = kl.GroupConsumer(root, "g", ["t"], poll_interval=1.0, session_timeout=SESSION)
    b = kl.GroupConsumer(root, "g", ["t"], poll_interval=1.0, session_timeout=SESSION)
    assert a.member_id is not None and b.member_id is not None
    try:
        with a._lock, b._lock:
            for member in (a, b, a, b):
                member._poll()
            owners = {p: registry.owner("t", p).member for p in (0, 1)}
            assert set(owners.values()) == {a.member_id, b.member_id}, owners
            mine = a.assignment()["t"]
            members = a.registry.members

            def stopped_after_its_poll_began() -> list[kl.registry.Member]:
                clock[0] += 3 * SESSION  # a stands still; b beats on meanwhile, as it polls
                assert b._registration is not None
                b._registration.beat()
                return members()

            a.registry.members = stopped_after_its_poll_began  # type: ignore[method-assign]
            a._poll()  # woken up: sees b's heartbeat moved
            a.registry.members = members  # type: ignore[method-assign]
            a._poll()  # at once (its poll interval counts from before it stood still): b has not beaten since
            assert {p: registry.owner("t", p).member for p in (0, 1)} == owners
            assert a.assignment() == {"t": mine}
            assert a._expired_now == {}
    finally:
        a.close()
        b.close()
