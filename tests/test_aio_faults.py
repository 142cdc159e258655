"""kl.aio under the sync API's faults (issue 39): SIGSTOP of a group member past its
session and of a producer holding a partition's append lock, damaged committed offsets,
kill -9 in the middle of a commit; cancellation of an await whose thread waits on a
stopped lock holder.  Real processes, each with its own event loop (tests/aiomember.py);
what is asserted is what the sync tests assert (tests/test_group.py, test_locks.py,
pausedholder.py, the issue-16 tests of test_group.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kl
from kl.aio import AsyncConsumer, AsyncGroupConsumer, AsyncProducer
from kl.log.recovery import recover
from kl.registry import Committed, Registry, encode_commit

from conftest import output_lines, read_all

AIOMEMBER = os.path.join(os.path.dirname(__file__), "aiomember.py")
SESSION = 2.5
"""The session timeout of the members stopped past it: short, for a fast test, and well
above what a busy machine's stalls hold a heartbeat up for."""
GAP = 0.5
"""The longest an event loop may stand still while its awaits wait on faults (a
correctness bound: nothing may block the loop; not a benchmark)."""

STARTED: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_child_outlives_its_test() -> Iterator[None]:
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.send_signal(signal.SIGCONT)
            proc.wait()


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


class Ticker:
    """An asyncio task that ticks every 10 ms: the longest the loop stood still between ticks."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.longest, last = max(self.longest, now - last - 0.01), now

    def stop(self) -> float:
        self._task.cancel()
        return self.longest


class Member:
    """An aiomember.py process (an AsyncGroupConsumer on its own loop) and what it wrote."""

    def __init__(self, root: kl.Root, out: str, *args: str, group: str = "g", topics: str = "t"):
        self.root, self.group, self.out = root, group, out
        self.proc = subprocess.Popen([sys.executable, AIOMEMBER, root.path, group, topics, out, *args])
        STARTED.append(self.proc)
        wait_for(lambda: self.lines("joined") or self.proc.poll() is not None, what="the member to join")
        [(self.id,)] = self.lines("joined")

    def lines(self, kind: str) -> list[list[str]]:
        return output_lines(self.out, kind, {"m": 6, "lost": 3, "committed": 3}.get(kind, 1))

    def received(self) -> list[tuple[float, int, int, int, str]]:
        """(time, partition, offset, next offset, value) of each record handed out."""
        return [(float(t), int(p), int(o), int(n), v) for t, _, p, o, n, v in self.lines("m")]

    def owned(self, topic: str = "t") -> list[int]:
        registry = Registry(self.root.path, self.group)
        return [p for p in range(self.root.config(topic).partitions) if registry.owner(topic, p).member == self.id]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0


def produce(root: kl.Root, topic: str, count: int, batch: int = 100) -> list[str]:
    """Values 0 to count (as text) in batches to the partitions in turn."""
    producer = kl.Producer(root)
    values = [str(i) for i in range(count)]
    for i in range(0, count, batch):
        partition = (i // batch) % root.config(topic).partitions
        producer.send_batch(topic, [v.encode() for v in values[i : i + batch]], partition=partition)
    return values


# ----------------------------------------------------------------- (a) SIGSTOP of a member past its session


def test_an_async_member_stopped_past_its_session_loses_its_partition_to_one_that_reads_on_from_its_commit(root, tmp_path):
    """test_group.py's test_a_member_stopped_past_the_session_timeout_loses_its_partitions,
    both members AsyncGroupConsumers committing each record: b takes the stopped a's
    partition over from a's last commit; a, continued, is told it lost it (on_lost) and
    hands out at most the one record in hand of it until it owns it again."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    produce(root, "t", 400)
    # Fetches of a few records each: a member turns to a partition it was given at once.
    options = ("--session", str(SESSION), "--sleep", "0.05", "--commit-every", "1", "--max-bytes", "256")
    a = Member(root, str(tmp_path / "a.out"), *options)
    b = Member(root, str(tmp_path / "b.out"), *options)
    wait_for(lambda: len(a.owned()) == 1 and len(b.owned()) == 1, what="one each")
    [lost_partition] = a.owned()
    wait_for(lambda: [c for c in a.lines("committed") if int(c[1]) == lost_partition], what="a's first commit of it")
    registry = Registry(root.path, "g")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: is_stopped(a.proc.pid), what="a to stop")
        committed_at_stop = registry.committed("t", lost_partition).offset  # a commits nothing more meanwhile
        a_before = [(o, n) for _, p, o, n, _ in a.received() if p == lost_partition]
        stopped_at = max(t for t, *_ in a.received())
        wait_for(lambda: sorted(b.owned()) == [0, 1], what="b to take the stopped member's partition")
        wait_for(lambda: any(p == lost_partition for _, p, *_ in b.received()), what="b to read it")
    finally:
        a.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: a.lines("lost"), what="a to notice")
    [topic, partition, why] = a.lines("lost")[0]
    assert (topic, int(partition)) == ("t", lost_partition)
    assert "taken over" in why or "rejected" in why
    # b goes on from a's last commit: what a handed out after it (at most the record in
    # hand: a commits each one) comes again, nothing is skipped.
    b_offsets = [o for _, p, o, _, _ in b.received() if p == lost_partition]
    assert b_offsets[0] == committed_at_stop
    assert committed_at_stop in a_before[-1]
    assert b_offsets == sorted(set(b_offsets))
    # Back, a hands out nothing more of it until it claims it again after b let it go.
    wait_for(lambda: sum(len(m.owned()) for m in (a, b)) == 2 and a.owned(), what="a back")
    a.stop()
    b.stop()
    assert registry.committed("t", lost_partition).offset <= root.log("t", lost_partition).log_end_offset
    after = [o for t, p, o, _, _ in a.received() if p == lost_partition and t > stopped_at]
    b_offsets = [o for _, p, o, _, _ in b.received() if p == lost_partition]
    assert not set(after[1:]) & set(b_offsets[:-1]) or after[0] >= max(b_offsets[:-1], default=0)
    assert not b.lines("lost") and not b.lines("rejected")
    [(gap,)] = b.lines("gap")
    assert float(gap) < GAP, f"b's event loop stood still for {gap}s"


# ----------------------------------------------------------------- (b) SIGSTOP of a producer holding the append lock

PAUSED_PRODUCER = textwrap.dedent(
    """
    import asyncio, signal, sys, threading
    import kl, kl.log, kl.log.segment
    from kl.aio import AsyncProducer

    root, step, stop_at, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sending = [-1]

    def hook(cls, name, before):
        real = getattr(cls, name)
        def hooked(*args, **kwargs):
            if before and sending[0] == stop_at:
                stop()
            result = real(*args, **kwargs)
            if not before and sending[0] == stop_at:
                stop()
            return result
        setattr(cls, name, hooked)

    def stop():
        sending[0] = -1
        print("stopping", flush=True)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # this thread, holding the lock, stops at once

    if step == "lock":  # the partition lock taken, nothing read or written yet
        hook(kl.log.Log, "writable_state", before=True)
    else:  # the message written to the segment, not yet published
        hook(kl.log.segment.Segment, "append", before=False)

    async def main():
        async with AsyncProducer(root) as producer:
            for i in range(total):
                sending[0] = i
                appended = await producer.send("t", b"a-%d" % i, partition=0)
                print("acked", appended.offset, i, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("end", ["SIGCONT", "kill -9"])
@pytest.mark.parametrize("step", ["lock", "write"])
def test_an_async_producer_stopped_holding_the_append_lock_blocks_others_as_a_sync_one_does(root, step, end):
    """A child's AsyncProducer stops (SIGSTOP) in its 4th send, holding partition 0's lock:
    other producers of this process, sync and async, wait for the lock for their
    ``lock_timeout`` and then raise the same ``LockTimeout``; partition 1 is not held up;
    the loop ticks on; an await cancelled while its thread waits for the lock returns at
    once and its send is appended later.  Continued or killed, the child leaves a log of
    whole messages in order holding everything acknowledged, each waiter's message once."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    stop_at, total = 3, 6
    child = subprocess.Popen(
        [sys.executable, "-c", PAUSED_PRODUCER, root.path, step, str(stop_at), str(total)], stdout=subprocess.PIPE
    )
    STARTED.append(child)
    assert child.stdout is not None
    said = [child.stdout.readline() for _ in range(stop_at + 1)]
    assert said[-1] == b"stopping\n", said
    wait_for(lambda: is_stopped(child.pid), what="the child to stop")
    impatient = kl.Root(root.path, lock_timeout=0.3)

    with pytest.raises(kl.LockTimeout) as sync_error:
        kl.Producer(impatient).send("t", b"sync-impatient", partition=0)
    assert "is held by another process (waited 0.3s)" in str(sync_error.value)

    waiter_done = threading.Event()

    def sync_waiter() -> None:  # a patient sync producer: waits for the lock, then appends
        kl.Producer(kl.Root(root.path, lock_timeout=60)).send("t", b"sync-waiter", partition=0)
        waiter_done.set()

    async def main() -> tuple[float, float]:
        ticker = Ticker()
        async with AsyncProducer(impatient) as producer:
            with pytest.raises(kl.LockTimeout) as async_error:
                await producer.send("t", b"async-impatient", partition=0)
            assert str(async_error.value) == str(sync_error.value)
            assert (await producer.send("t", b"other partition", partition=1)).partition == 1  # not held up
        waiter = threading.Thread(target=sync_waiter)
        waiter.start()
        async with AsyncProducer(kl.Root(root.path, lock_timeout=60)) as producer:
            sent = producer.send("t", b"async-cancelled", partition=0)
            began = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(sent, 0.2)  # the thread behind it waits for the stopped holder
            cancelled_after = time.monotonic() - began
            assert not waiter_done.is_set()
            child.send_signal(signal.SIGCONT if end == "SIGCONT" else signal.SIGKILL)
            if end == "kill -9":
                child.send_signal(signal.SIGCONT)  # (a stopped process dies once continued)
            await producer.flush()  # the cancelled send was appended meanwhile
        await asyncio.to_thread(waiter.join)
        return cancelled_after, ticker.stop()

    cancelled_after, longest = asyncio.run(main())
    assert cancelled_after < 0.2 + GAP, f"the cancelled await returned after {cancelled_after:.2f}s"
    assert longest < GAP, f"the event loop stood still for {longest:.2f}s"
    said += child.stdout.read().splitlines(keepends=True)
    child.wait()
    assert child.returncode == (0 if end == "SIGCONT" else -signal.SIGKILL)
    acked = {int(i): int(offset) for _, offset, i in (line.split() for line in said if line.startswith(b"acked "))}
    assert sorted(acked) == list(range(total if end == "SIGCONT" else stop_at))
    stored = [(m.offset, m.value) for m in read_all(root, "t", 0)]
    values = [v for _, v in stored]
    mine = [v for v in values if v.startswith(b"a-")]
    assert mine == [b"a-%d" % i for i in range(len(mine))]  # the child's, whole and in order
    assert all(dict(stored)[offset] == b"a-%d" % i for i, offset in acked.items())  # each where it was told
    assert len(mine) == (total if end == "SIGCONT" else stop_at)  # the killed one's unpublished send is not adopted
    assert sorted(set(values) - set(mine)) == [b"async-cancelled", b"sync-waiter"]
    assert len(values) == len(mine) + 2
    assert [m.value for m in read_all(root, "t", 1)] == [b"other partition"]
    report = recover(root.log("t", 0), deep=True, dry_run=True)
    assert [(f.kind, f.reason) for f in report.findings] == []


# ----------------------------------------------------------------- (c) damaged committed offsets

PER_PARTITION = 20


def commits_path(root: kl.Root, group: str) -> str:
    return os.path.join(Registry(root.path, group).path, "commits", "t")


def legacy_path(root: kl.Root, group: str) -> str:
    return os.path.join(Registry(root.path, group).path, "offsets", "t", "0")


def next_offsets(root: kl.Root, partition: int) -> list[int]:
    """Where each message of the partition starts, and the log end."""
    messages = read_all(root, "t", partition)
    return [m.offset for m in messages] + [messages[-1].next_offset]


def damage(root: kl.Root, group: str, kind: str) -> None:
    """Group ``group``'s committed offsets of t, damaged as ``kind`` says: t/1 committed
    after its 10th message; t/0 after its 5th, then after its 8th, that second commit
    damaged (or the first, or everything, as ``kind`` says)."""
    registry = Registry(root.path, group)
    zero, one = next_offsets(root, 0), next_offsets(root, 1)
    registry.write_offset("t", 1, one[10], "old-member")
    if kind in ("garbage offset file", "damaged offset file"):  # an offset file of an older kl
        path = legacy_path(root, group)
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(b"garbage\n" if kind == "garbage offset file" else b"offset 9")
        return
    if kind == "out of range":
        registry.write_offset("t", 0, 10**9, "admin")
        return
    registry.write_offset("t", 0, zero[5], "old-member")
    path = commits_path(root, group)
    if kind == "damaged line":
        registry.write_offset("t", 0, zero[8], "old-member")
        with open(path, "rb") as f:
            data = f.read()
        last = data.rindex(b"{")
        changed = data[last:].replace(b'"offset": %d' % zero[8], b'"offset": %d' % (zero[8] + 1))
        assert changed != data[last:]
        with open(path, "wb") as f:  # the last line's offset changed: its checksum fails
            f.write(data[:last] + changed)
    elif kind == "torn line":  # a writer that died in its append
        line = encode_commit(0, Committed(zero[8], "dead-member", 1_700_000_000_000), 1)
        with open(path, "ab") as f:
            f.write(line[: len(line) // 2])
    elif kind == "deleted":
        os.unlink(path)
    elif kind == "truncated":
        os.truncate(path, 0)
    else:
        raise AssertionError(kind)


DAMAGES = [
    # kind, reset, where t/0 and t/1 go on from (message numbers) or the error every poll raises
    ("garbage offset file", "fail", (kl.CorruptOffset, "no checksum line at its end")),
    ("garbage offset file", "earliest", (0, 10)),
    ("damaged offset file", "latest", (PER_PARTITION, 10)),
    ("damaged line", "fail", (5, 10)),
    ("torn line", "fail", (5, 10)),
    ("deleted", "fail", (0, 0)),
    ("truncated", "fail", (0, 0)),
    ("out of range", "fail", (kl.OffsetOutOfRange, "outside the log")),
    ("out of range", "earliest", (0, 10)),
]

Outcome = tuple[list[tuple[int, int, str]], list[tuple[str, str]], list[str], dict[str, object]]
"""What a member did: records handed out (partition, offset, value), the errors its polls
raised (class, message), the warnings logged, and the group's files afterwards."""


def files_of(root: kl.Root, group: str) -> dict[str, object]:
    registry = Registry(root.path, group)
    legacy = legacy_path(root, group)
    state: dict[str, object] = {"offsets": os.listdir(os.path.dirname(legacy)) if os.path.isdir(os.path.dirname(legacy)) else []}
    if os.path.exists(legacy):
        with open(legacy, "rb") as f:
            state["legacy"] = f.read()
    else:
        for p in (0, 1):
            found = registry.committed("t", p)
            state[f"t/{p}"] = None if found is None else found.position
    return state


def ends(root: kl.Root) -> list[int]:
    return [root.log("t", p).log_end_offset for p in (0, 1)]


def run_sync(root: kl.Root, group: str, reset: str, caplog: pytest.LogCaptureFixture) -> Outcome:
    caplog.clear()
    got: list[tuple[int, int, str]] = []
    errors: list[tuple[str, str]] = []
    with kl.GroupConsumer(root, group, ["t"], reset=reset, auto_commit=False, poll_interval=0.05, session_timeout=2) as member:
        stream = iter(member)
        while len(errors) < 3 and [member.position("t", p).offset for p in (0, 1)] != ends(root):
            try:
                record = stream.poll(10)
            except kl.KlError as e:
                errors.append((type(e).__name__, str(e)))
                continue
            assert record is not None, "no record for 10 s"
            got.append((record.partition, record.offset, record.value.decode()))
        member.commit()
    return got, errors, warnings(caplog), files_of(root, group)


async def run_async(root: kl.Root, group: str, reset: str, caplog: pytest.LogCaptureFixture) -> Outcome:
    caplog.clear()
    got: list[tuple[int, int, str]] = []
    errors: list[tuple[str, str]] = []
    options: dict[str, Any] = {"reset": reset, "auto_commit": False, "poll_interval": 0.05, "session_timeout": 2}
    async with AsyncGroupConsumer(root, group, ["t"], **options) as member:
        while len(errors) < 3 and [(await member.position("t", p)).offset for p in (0, 1)] != ends(root):
            try:
                record = await asyncio.wait_for(member.__anext__(), 10)
            except kl.KlError as e:
                errors.append((type(e).__name__, str(e)))
                continue
            got.append((record.partition, record.offset, record.value.decode()))
        await member.commit()
    return got, errors, warnings(caplog), files_of(root, group)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("kl")]


def same_outcome(sync: Outcome, aio: Outcome) -> bool:
    def named(outcome: Outcome, group: str) -> str:
        return repr(outcome).replace(f"/.groups/{group}/", "/.groups/G/").replace(f"group {group}", "group G")

    return named(sync, "sync") == named(aio, "aio")


@pytest.mark.parametrize(("kind", "reset", "expected"), DAMAGES)
def test_damaged_committed_offsets_take_an_async_member_where_they_take_a_sync_one(root, caplog, kind, reset, expected):
    """Issue 16's damage (a garbage or torn offset file of an older kl, a damaged or torn
    line of a commits file, the file deleted or emptied, an offset out of the log) under
    each reset policy: an AsyncGroupConsumer hands out the same records, raises the same
    errors with the same messages, logs the same warnings and leaves the same files as a
    GroupConsumer; meanwhile its loop ticks on and an AsyncConsumer follows another topic."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    root.create_topic("f")
    for p in (0, 1):
        kl.Producer(root).send_batch("t", [b"%d-%d" % (p, i) for i in range(PER_PARTITION)], partition=p)
    for group in ("sync", "aio"):
        damage(root, group, kind)
    caplog.set_level(logging.WARNING, logger="kl")
    sync = run_sync(root, "sync", reset, caplog)

    async def main() -> tuple[Outcome, float]:
        ticker = Ticker()
        async with AsyncConsumer(root, "f") as follower:
            following = asyncio.create_task(follower.__anext__())
            try:
                aio = await run_async(root, "aio", reset, caplog)
            except BaseException:
                following.cancel()
                raise
            await asyncio.to_thread(kl.Producer(root).send, "f", b"alive")
            assert (await asyncio.wait_for(following, 10)).value == b"alive"
        return aio, ticker.stop()

    aio, longest = asyncio.run(main())
    assert same_outcome(sync, aio), f"sync: {sync}\nasync: {aio}"
    assert longest < GAP, f"the event loop stood still for {longest:.2f}s"
    got, errors, _, _ = aio
    if isinstance(expected[0], type):  # t/0 blocked: every poll raises, nothing is committed over the damage
        error, reason = expected
        assert len(errors) == 3 and all(name == error.__name__ and reason in message for name, message in errors)
        assert "kl groups reset" in errors[0][1] or error is kl.OffsetOutOfRange
        assert not any(p == 0 for p, _, _ in got)
    else:
        for p, first in enumerate(expected):
            values = [v for q, _, v in got if q == p]
            assert values == [f"{p}-{i}" for i in range(first, PER_PARTITION)], (p, values)
        assert errors == []
        assert aio[3]["t/0"] == aio[3]["t/1"] == (root.log("t", 0).log_end_offset, 0)


def test_an_async_member_goes_on_after_an_error_as_the_sync_one_does(root):
    """A value deserializer raises for one message.  The sync member's poll raises it
    once and hands out the next message; the async member does the same (a failed poll
    is not kept as the one under way), and closes cleanly."""
    root.create_topic("t")
    kl.Producer(root).send_batch("t", [b"1", b"bad", b"3"])

    def deserializer(data: bytes | None) -> bytes | None:
        if data == b"bad":
            raise ValueError("a bad value")
        return data

    options: dict[str, Any] = {"value_deserializer": deserializer, "poll_interval": 0.05, "session_timeout": 2}
    sync: list[object] = []
    with kl.GroupConsumer(root, "sync", ["t"], **options) as member:
        stream = iter(member)
        for _ in range(3):
            try:
                sync.append(stream.poll(10).value)  # type: ignore[union-attr]
            except ValueError as e:
                sync.append(str(e))
    assert sync == [b"1", "a bad value", b"3"]

    async def main() -> list[object]:
        got: list[object] = []
        member = AsyncGroupConsumer(root, "aio", ["t"], **options)
        try:
            for _ in range(3):
                try:
                    got.append((await asyncio.wait_for(member.__anext__(), 10)).value)
                except ValueError as e:
                    got.append(str(e))
        finally:
            await member.close()
        return got

    assert asyncio.run(main()) == sync


def test_an_async_member_answers_a_commit_after_close_as_the_sync_one_does(root):
    """A member closed by a signal handler while its consuming task is between records
    (aiomember.py's first SIGTERM handler did that) and then asked to commit."""
    root.create_topic("t")
    kl.Producer(root).send_batch("t", [b"1", b"2"])
    sync = kl.GroupConsumer(root, "sync", ["t"], auto_commit=False)
    record = next(iter(sync))
    sync.close()
    assert sync.commit() is None
    with pytest.raises(kl.NotOwner, match="not owned by this member"):
        sync.commit({("t", 0): record.next_offset})

    async def main() -> None:
        member = AsyncGroupConsumer(root, "aio", ["t"], auto_commit=False)
        record = await member.__anext__()
        await member.close()
        assert await member.commit() is None
        with pytest.raises(kl.NotOwner, match="not owned by this member"):
            await member.commit({("t", 0): record.next_offset})

    asyncio.run(main())


# ----------------------------------------------------------------- (d) kill -9 in the middle of a commit


@pytest.mark.parametrize("step", ["torn", "written", "synced"])
def test_a_member_killed_in_the_middle_of_a_commit_leaves_a_whole_position_the_next_one_starts_from(root, tmp_path, step):
    """An AsyncGroupConsumer in a child commits each record; in its 10th commit it is
    killed (SIGKILL) half-way through writing the commit's line, after writing it, or
    after its fsync.  The committed position is then the 9th commit's (torn) or the 10th's,
    and the next member starts exactly there; its commits after the torn line count."""
    root.create_topic("t")
    values = [b"%d" % i for i in range(30)]
    kl.Producer(root).send_batch("t", values)
    out = str(tmp_path / "dying.out")
    member = subprocess.Popen(
        [sys.executable, AIOMEMBER, root.path, "g", "t", out, "--commit-every", "1", "--die-in-commit", step, "--die-at", "10"]
    )
    STARTED.append(member)
    assert member.wait(60) == -signal.SIGKILL
    with open(out, encoding="utf-8") as f:
        lines = f.read().splitlines()
    committed_lines = [int(line.split()[3]) for line in lines if line.startswith("committed ")]
    [dying] = [int(line.split()[1]) for line in lines if line.startswith("dying ")]
    assert len(committed_lines) == 9
    with open(commits_path(root, "g"), "rb") as f:
        assert f.read().endswith(b"\n") == (step != "torn")  # the fault happened where it was meant to
    boundaries = next_offsets(root, 0)
    registry = Registry(root.path, "g")
    committed = registry.committed("t", 0)
    assert committed is not None and committed.position == (committed_lines[-1] if step == "torn" else dying, 0)
    assert committed.offset in boundaries  # whole: a message's start

    async def next_member() -> list[tuple[int, bytes | None]]:
        got = []
        async with AsyncGroupConsumer(root, "g", ["t"], auto_commit=False) as member:
            async for record in member:
                got.append((record.offset, record.value))
                if record.next_offset == boundaries[-1]:
                    break
            await member.commit()
        return got

    got = asyncio.run(next_member())
    first = boundaries.index(committed.offset)
    assert got == list(zip(boundaries[first:-1], values[first:], strict=True))
    assert registry.committed("t", 0).position == (boundaries[-1], 0)
    with kl.GroupConsumer(root, "g", ["t"]) as later:
        assert list(later.batches()) == []
