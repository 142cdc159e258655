"""The lock layer with real processes: kernel waits, timeouts, hand-overs between threads,
fork, the waiting warning, and ``kl --lock-timeout``.

What the kernel says about a lock file is read from /proc/locks: a process that waits in
the kernel shows there as a blocked ("->") request, one that polls never does.
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import kl
from kl.log import locks

FORK = multiprocessing.get_context("fork")
KL = [sys.executable, "-m", "kl_cli"]

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs Linux's /proc/locks")


# ----------------------------------------------------------------- helpers


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / ".locks" / "t" / "0.lock")


def kernel_locks(path: str) -> list[tuple[int, bool]]:
    """(pid, blocked) for every lock and waiting request the kernel has on ``path``."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            blocked = fields[1] == "->"
            fields = fields[2:] if blocked else fields[1:]
            if fields[0] == "POSIX" and fields[4] == inode:
                found.append((int(fields[3]), blocked))
    return found


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Wait (up to a generous bound, for a loaded machine) until ``condition`` holds."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def _hold(path: str, held, release) -> None:
    lock = locks.lock_for(path)
    lock.acquire(30)
    held.set()
    release.wait(60)
    lock.release()


@contextmanager
def held_elsewhere(path: str) -> Iterator[threading.Event]:
    """Another process holds the lock on ``path`` until the yielded event is set."""
    held, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold, args=(path, held, release))
    holder.start()
    try:
        assert held.wait(30)
        yield release
    finally:
        release.set()
        holder.join(30)
    assert holder.exitcode == 0


def _try_once(path: str) -> None:
    """Exit 0 when the lock can be had at once, 3 when it cannot."""
    try:
        locks.lock_for(path).acquire(0)
    except kl.LockTimeout:
        os._exit(3)
    os._exit(0)


def free_elsewhere(path: str) -> bool:
    """Whether another process could take the lock on ``path`` right now."""
    p = FORK.Process(target=_try_once, args=(path,))
    p.start()
    p.join(30)
    assert p.exitcode in (0, 3)
    return p.exitcode == 0


# ----------------------------------------------------------------- waiting in the kernel


def _wait_counting(path: str, calls, acquired) -> None:
    """Acquire, recording every lockf call kl makes on the way."""
    real = fcntl.lockf

    def counting(fd: int, cmd: int, *args: int) -> object:
        calls.put(cmd)
        return real(fd, cmd, *args)

    fcntl.lockf = counting
    lock = locks.lock_for(path)
    lock.acquire(30)
    acquired.set()
    fcntl.lockf = real
    lock.release()


def test_a_waiting_process_blocks_in_the_kernel_and_gets_the_lock_on_release(path):
    calls, acquired = FORK.Queue(), FORK.Event()
    with held_elsewhere(path) as release:
        waiter = FORK.Process(target=_wait_counting, args=(path, calls, acquired))
        waiter.start()
        eventually(lambda: (waiter.pid, True) in kernel_locks(path), "the waiter's request queued in the kernel")
        assert not acquired.is_set()
        release.set()
        assert acquired.wait(30)
    waiter.join(30)
    assert waiter.exitcode == 0
    # one attempt, then one blocking request that the kernel granted: no polling
    assert [calls.get(timeout=5) for _ in range(2)] == [fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_EX]
    assert calls.empty()


def test_an_uncontended_acquire_is_one_attempt_and_logs_nothing(path, caplog):
    lock = locks.lock_for(path)
    with caplog.at_level(logging.DEBUG, logger="kl"):
        lock.acquire(5)
        assert kernel_locks(path) == [(os.getpid(), False)]
        lock.release()
    assert kernel_locks(path) == []
    assert caplog.records == []


def test_a_timeout_raises_lock_timeout_and_the_given_up_wait_leaves_nothing_held(path):
    lock = locks.lock_for(path)
    with held_elsewhere(path) as release:
        with pytest.raises(kl.LockTimeout, match=r"lock .*0\.lock is held by another process \(waited 0\.2s\)"):
            lock.acquire(0.2)
        release.set()
    eventually(lambda: kernel_locks(path) == [], "the lock and every request on it gone")
    assert free_elsewhere(path)
    lock.acquire(5)
    assert not free_elsewhere(path)
    lock.release()
    assert free_elsewhere(path)


class Taker:
    """A thread that acquires ``lock`` and holds it until ``finish()``."""

    def __init__(self, lock: locks.ProcessLock):
        self.lock, self.got, self._finish = lock, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.lock.acquire(30)
        self.got.set()
        self._finish.wait(60)
        self.lock.release()

    def finish(self) -> None:
        self._finish.set()
        self.thread.join(30)


def pause_after_blocking_lockf(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Hold up a blocking lockf once the kernel has granted it: ``granted`` is set then,
    and the call returns when ``resume`` is set."""
    real = fcntl.lockf
    granted, resume = threading.Event(), threading.Event()

    def lockf(fd: int, cmd: int, *args: int) -> object:
        result = real(fd, cmd, *args)
        if cmd == fcntl.LOCK_EX:
            granted.set()
            resume.wait(30)
        return result

    monkeypatch.setattr(fcntl, "lockf", lockf)
    return granted, resume


def assert_held_by_us_alone(path: str) -> None:
    eventually(lambda: (os.getpid(), True) not in kernel_locks(path), "no request of ours left waiting")
    assert kernel_locks(path) == [(os.getpid(), False)]
    assert not free_elsewhere(path)


def test_a_thread_waiting_when_the_given_up_wait_succeeds_gets_the_lock(path):
    lock = locks.lock_for(path)
    with held_elsewhere(path) as release:
        with pytest.raises(kl.LockTimeout):
            lock.acquire(0.1)
        taker = Taker(lock)
        release.set()
        assert taker.got.wait(30)
    try:
        assert_held_by_us_alone(path)
    finally:
        taker.finish()
    assert free_elsewhere(path)


def test_a_given_up_wait_that_succeeds_late_does_not_drop_a_threads_lock(path, monkeypatch):
    """The kernel grants the given-up request; before its helper acts on it another
    thread acquires: the helper must hand the lock over, not release it."""
    lock = locks.lock_for(path)
    granted, resume = pause_after_blocking_lockf(monkeypatch)
    with held_elsewhere(path) as release:
        with pytest.raises(kl.LockTimeout):
            lock.acquire(0.1)
        release.set()
        assert granted.wait(30)
    taker = Taker(lock)
    try:
        eventually(lambda: taker.got.is_set() or lock._wanted, "the thread holding the lock or waiting for it")
        resume.set()
        assert taker.got.wait(30)
        assert_held_by_us_alone(path)
    finally:
        resume.set()
        taker.finish()
    assert free_elsewhere(path)


def test_a_thread_acquiring_while_a_given_up_wait_lets_its_late_lock_go_gets_the_lock(path, monkeypatch):
    """The given-up request is granted with nobody waiting, so its helper lets the lock go;
    a thread that acquires meanwhile must get it after that, not be dropped by it."""
    lock = locks.lock_for(path)
    real = fcntl.lockf
    unlocking, resume = threading.Event(), threading.Event()

    def lockf(fd: int, cmd: int, *args: int) -> object:
        if cmd == fcntl.LOCK_UN and threading.current_thread().name.startswith("kl lock "):
            unlocking.set()
            resume.wait(30)
        return real(fd, cmd, *args)

    monkeypatch.setattr(fcntl, "lockf", lockf)
    with held_elsewhere(path) as release:
        with pytest.raises(kl.LockTimeout):
            lock.acquire(0.1)
        release.set()
        assert unlocking.wait(30)
    taker = Taker(lock)
    try:
        taker.got.wait(0.5)  # where the helper said it was done before it let go, the thread got it here
        resume.set()
        assert taker.got.wait(30)
        assert_held_by_us_alone(path)
    finally:
        resume.set()
        taker.finish()
    assert free_elsewhere(path)


def test_the_next_thread_takes_over_a_given_up_wait(path):
    """One blocking request per lock: a second waiter waits on the first one's."""
    lock = locks.lock_for(path)
    with held_elsewhere(path) as release:
        with pytest.raises(kl.LockTimeout):
            lock.acquire(0.1)
        eventually(lambda: (os.getpid(), True) in kernel_locks(path), "the given-up request still queued")
        got = threading.Event()
        taker = threading.Thread(target=lambda: (lock.acquire(30), got.set()))
        taker.start()
        eventually(lambda: lock._wanted, "the second waiter waiting")
        assert kernel_locks(path).count((os.getpid(), True)) == 1
        release.set()
        assert got.wait(30)
        taker.join(30)
    assert kernel_locks(path) == [(os.getpid(), False)]
    lock.release()
    assert kernel_locks(path) == []


def _hold_for(path: str, held, seconds: float) -> None:
    lock = locks.lock_for(path)
    lock.acquire(30)
    held.set()
    time.sleep(seconds)
    lock.release()


def test_without_threads_a_waiter_tries_every_millisecond(path, monkeypatch):
    """At interpreter shutdown (atexit handlers, Python 3.12+) no thread can be started."""

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    lock = locks.lock_for(path)
    with held_elsewhere(path):
        with pytest.raises(kl.LockTimeout, match="held by another process"):
            lock.acquire(0.1)
        assert [blocked for _, blocked in kernel_locks(path)] == [False]  # the holder's lock; nothing of ours waits
    held = FORK.Event()
    holder = FORK.Process(target=_hold_for, args=(path, held, 0.3))
    holder.start()
    assert held.wait(30)
    lock.acquire(30)
    assert kernel_locks(path) == [(os.getpid(), False)]
    lock.release()
    holder.join(30)
    assert holder.exitcode == 0


# ----------------------------------------------------------------- threads and fork


def test_threads_wait_for_each_other(path):
    lock = locks.lock_for(path)
    lock.acquire(5)
    with pytest.raises(kl.LockTimeout, match=r"held by another thread of this process \(waited 0\.1s\)"):
        threading_result(lambda: lock.acquire(0.1))
    lock.release()
    threading_result(lambda: (lock.acquire(5), lock.release()))


def threading_result(fn: Callable[[], object]) -> None:
    """Run ``fn`` in a thread of its own; re-raise what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if raised:
        raise raised[0]


def _count(path: str, counter: str, threads: int, rounds: int) -> None:
    """``threads`` threads each add 1 to the number in ``counter``, ``rounds`` times,
    read-modify-write under the lock."""

    def add() -> None:
        for _ in range(rounds):
            with locks.locked(path, 30):
                with open(counter) as f:
                    n = int(f.read())
                os.sched_yield()
                with open(counter, "w") as f:
                    f.write(str(n + 1))

    workers = [threading.Thread(target=add) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_threads_of_several_processes_exclude_each_other(path, tmp_path):
    counter = tmp_path / "counter"
    counter.write_text("0")
    procs = [FORK.Process(target=_count, args=(path, str(counter), 3, 100)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert counter.read_text() == "900"
    assert kernel_locks(path) == []


def _child_tries(path: str, parent_lock_id: int) -> None:
    lock = locks.lock_for(path)
    if id(lock) == parent_lock_id:
        os._exit(4)
    try:
        lock.acquire(0.1)
    except kl.LockTimeout as e:
        os._exit(3 if "another process" in str(e) else 5)
    os._exit(0)


def test_a_forked_child_holds_none_of_its_parents_locks(path):
    lock = locks.lock_for(path)
    lock.acquire(5)
    try:
        child = FORK.Process(target=_child_tries, args=(path, id(lock)))
        child.start()
        child.join(30)
        assert child.exitcode == 3  # its own lock, which the parent's holds it from
    finally:
        lock.release()
    child = FORK.Process(target=_child_tries, args=(path, id(lock)))
    child.start()
    child.join(30)
    assert child.exitcode == 0


# ----------------------------------------------------------------- telling the user


def test_waiting_is_logged_once_after_about_a_second(path, caplog):
    lock = locks.lock_for(path)
    with held_elsewhere(path), caplog.at_level(logging.WARNING, logger="kl"):
        with pytest.raises(kl.LockTimeout):
            lock.acquire(1.6)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("kl.log.locks", logging.WARNING, f"waiting for the lock on {path} (held by another process)")
    ]


def test_waiting_for_a_thread_is_logged_once(path, caplog):
    lock = locks.lock_for(path)
    lock.acquire(5)
    try:
        with caplog.at_level(logging.WARNING, logger="kl"), pytest.raises(kl.LockTimeout):
            threading_result(lambda: lock.acquire(1.3))
    finally:
        lock.release()
    assert [r.getMessage() for r in caplog.records] == [
        f"waiting for the lock on {path} (held by another thread of this process)"
    ]


@pytest.fixture
def kl_root(tmp_path: Path) -> str:
    path = str(tmp_path / "root")
    kl.Root(path).create_topic("t")
    return path


def test_kl_produce_says_it_waits_and_goes_on_when_the_lock_is_released(kl_root):
    lock_path = kl.Root(kl_root)._lock_path("t", 0)
    with held_elsewhere(lock_path) as release:
        producer = subprocess.Popen(
            KL + ["--root", kl_root, "--lock-timeout", "60", "produce", "t"],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        producer.stdin.write(b"waited\n")
        producer.stdin.close()
        assert producer.stderr.readline().decode() == (
            f"Warning: waiting for the lock on {lock_path} (held by another process)\n"
        )
        release.set()
        assert (producer.wait(30), producer.stderr.read()) == (0, b"")
    assert [m.value for m in kl.Consumer(kl_root).fetch("t", 0, 0)] == [b"waited"]


@pytest.mark.parametrize("how", ["option", "environment"])
def test_kl_lock_timeout_gives_one_error_line(kl_root, how):
    lock_path = kl.Root(kl_root)._lock_path("t", 0)
    options, env = (["--lock-timeout", "0.5"], {}) if how == "option" else ([], {"KL_LOCK_TIMEOUT": "0.5"})
    with held_elsewhere(lock_path):
        done = subprocess.run(
            KL + ["--root", kl_root, *options, "produce", "t"],
            input=b"x\n",
            capture_output=True,
            env={**os.environ, **env},
            timeout=60,
        )
    assert (done.returncode, done.stdout, done.stderr.decode()) == (
        1,
        b"",
        f"Error: line 1: lock {lock_path} is held by another process (waited 0.5s); 0 lines before it were committed\n",
    )
    assert list(kl.Consumer(kl_root).fetch("t", 0, 0)) == []


def test_kl_lock_timeout_must_be_a_number_of_seconds(kl_root):
    done = subprocess.run(
        KL + ["--root", kl_root, "--lock-timeout", "-1", "produce", "t"], input=b"x\n", capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert "Invalid value for '--lock-timeout'" in done.stderr.decode()
