"""kl.aio: the asyncio producer and consumers on the sync core, locally and through a real
``kl serve``; cancellation at every await, the loop ticking through fsyncs, kill -9."""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import kl
import kl.follow
import kl.serde
from kl.aio import AsyncConsumer, AsyncGroupConsumer, AsyncProducer
from kl.net.remote import RemoteRoot

from conftest import read_all

KL = [sys.executable, "-m", "kl_cli"]


def values(root: kl.Root, topic: str, partition: int = 0) -> list[bytes | None]:
    return [message.value for message in read_all(root, topic, partition)]


def test_sends_append_in_call_order_and_give_their_positions(root, topic):
    async def main() -> list[kl.Appended]:
        async with AsyncProducer(root) as producer:
            appended = await asyncio.gather(*(producer.send(topic, b"%d" % i) for i in range(100)))
            appended.append(await producer.send_and_wait(topic, b"last"))
            await producer.flush()
            return appended

    appended = asyncio.run(main())
    assert values(root, topic) == [b"%d" % i for i in range(100)] + [b"last"]
    assert [a.offset for a in appended] == [m.offset for m in read_all(root, topic)]
    assert all(a.next_offset == b.offset for a, b in zip(appended, appended[1:], strict=False))


def test_keys_partitions_and_headers_pass_through(root):
    root.create_topic("h", kl.TopicConfig(partitions=2, headers=True))

    async def main() -> kl.Appended:
        async with AsyncProducer(root) as producer:
            return await producer.send("h", b"v", key=b"k", partition=1, headers=[("a", b"1")])

    appended = asyncio.run(main())
    [message] = read_all(root, "h", 1)
    assert (appended.partition, message.key, message.value, message.headers) == (1, b"k", b"v", (("a", b"1"),))


def test_a_closed_producer_refuses_sends_and_linger_ms_is_refused(root, topic):
    async def main() -> None:
        producer = AsyncProducer(root)
        await producer.close()
        with pytest.raises(kl.ProducerClosed, match="make a new one"):
            producer.send(topic, b"x")

    asyncio.run(main())
    with pytest.raises(kl.InvalidConfig, match="leave linger_ms unset"):
        AsyncProducer(root, linger_ms=5)


def test_a_send_error_is_raised_by_the_await(root, topic):
    async def main() -> None:
        async with AsyncProducer(root) as producer:
            with pytest.raises(kl.TopicNotFound):
                await producer.send("missing", b"x")

    asyncio.run(main())


@pytest.mark.parametrize("steps", range(0, 60, 3))
def test_a_cancelled_send_is_appended_whole_in_call_order(root, topic, steps):
    """Cancel a task of sends after ``steps`` turns of the loop: every send it called is in
    the log once, in call order, and every position it was told is that message's."""
    called: list[bytes] = []
    told: list[tuple[bytes, kl.Appended]] = []

    async def sends(producer: AsyncProducer) -> None:
        for i in range(1000):
            value = b"%d-%d" % (steps, i)
            sent = producer.send(topic, value)
            called.append(value)
            told.append((value, await sent))

    async def main() -> None:
        async with AsyncProducer(root) as producer:
            task = asyncio.create_task(sends(producer))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await producer.flush()

    asyncio.run(main())
    stored = {m.offset: m.value for m in read_all(root, topic)}
    assert list(stored.values()) == called
    assert all(stored[appended.offset] == value for value, appended in told)
    assert len(called) - len(told) <= 1  # the one whose await was cancelled


def test_the_loop_keeps_ticking_through_fsynced_sends(root, topic):
    """A fsync per send on the producer's thread: a ticker task runs at least once per send."""
    sends = 200

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        async with AsyncProducer(root, fsync=True) as producer:
            for i in range(sends):
                await producer.send(topic, b"%d" % i)
        task.cancel()
        return ticks

    assert asyncio.run(main()) >= sends
    assert len(values(root, topic)) == sends


def test_the_consumer_follows_new_messages_and_close_ends_the_wait(root):
    root.create_topic("f", kl.TopicConfig(partitions=2))

    async def main() -> list[tuple[int, bytes | None]]:
        got = []
        async with AsyncConsumer(root, "f") as consumer, AsyncProducer(root) as producer:
            for i in range(10):
                await producer.send("f", b"%d" % i, partition=i % 2)
                record = await consumer.__anext__()
                got.append((record.partition, record.value))
            waiting = asyncio.create_task(consumer.__anext__())
            await asyncio.sleep(0.05)
            await consumer.close()
            with pytest.raises(StopAsyncIteration):
                await waiting
        return got

    assert asyncio.run(main()) == [(i % 2, b"%d" % i) for i in range(10)]


WRITER = "import sys, kl; kl.Producer(sys.argv[1]).send(sys.argv[2], b'from another process')"


def spy_on_readers(loop: asyncio.AbstractEventLoop) -> list[int]:
    """The descriptors ``loop.add_reader`` is given from now on."""
    fds: list[int] = []
    add_reader = loop.add_reader

    def spy(fd, callback, *args):
        fds.append(fd)
        return add_reader(fd, callback, *args)

    loop.add_reader = spy  # type: ignore[method-assign]
    return fds


@pytest.mark.parametrize("member", [False, True], ids=["consumer", "group-member"])
def test_a_caught_up_follower_waits_on_the_loops_reader_with_its_thread_free(root, topic, member):
    """Caught up, the follower waits through ``loop.add_reader`` on the inotify descriptor,
    not on its thread: calls queued on the thread run meanwhile, another process's message
    arrives (a consumer's at once even with a 60 s poll interval, the timer's backstop), and
    ``close`` ends the wait at once."""

    async def readers_reach(count: int, readers: list[int], waiting: asyncio.Task) -> None:
        while len(readers) < count and not waiting.done():
            await asyncio.sleep(0.01)
        assert len(readers) >= count, waiting.result()

    async def main() -> tuple[bytes | None, float]:
        readers = spy_on_readers(asyncio.get_running_loop())
        follower = AsyncGroupConsumer(root, "g", [topic]) if member else AsyncConsumer(root, topic, poll_interval=60)
        async with follower:
            waiting = asyncio.create_task(follower.__anext__())
            await asyncio.wait_for(readers_reach(1, readers, waiting), 30)
            assert os.readlink(f"/proc/self/fd/{readers[0]}") == "anon_inode:inotify"
            await asyncio.wait_for(follower._thread.run(int), 5)  # the thread is not waiting
            subprocess.run([sys.executable, "-c", WRITER, root.path, topic], check=True, timeout=60)
            record = await asyncio.wait_for(waiting, 30)
            waiting = asyncio.create_task(follower.__anext__())
            await asyncio.wait_for(readers_reach(len(readers) + 1, readers, waiting), 30)
            began = time.monotonic()
            await follower.close()
            with pytest.raises(StopAsyncIteration):
                await waiting
            return record.value, time.monotonic() - began

    value, closing = asyncio.run(main())
    assert value == b"from another process"
    assert closing < 10  # not the 60 s poll interval


def test_without_inotify_the_follower_waits_on_the_loops_timer(root, topic, monkeypatch):
    """Where inotify is unavailable (as on NFS) a caught-up follower polls: a timer on the
    loop every poll interval, no reader, and another process's message still arrives."""
    monkeypatch.setattr(kl.follow, "_libc", lambda: None)

    async def main() -> tuple[bytes | None, list[int]]:
        readers = spy_on_readers(asyncio.get_running_loop())
        async with AsyncConsumer(root, topic, poll_interval=0.05) as consumer:
            waiting = asyncio.create_task(consumer.__anext__())
            await asyncio.sleep(0.2)
            subprocess.run([sys.executable, "-c", WRITER, root.path, topic], check=True, timeout=60)
            return (await asyncio.wait_for(waiting, 30)).value, readers

    assert asyncio.run(main()) == (b"from another process", [])


def test_a_follower_waiting_on_the_loop_fails_on_a_topic_created_again(root, topic):
    """As the sync follow does: one line, ``TopicRecreated``, nothing of the new topic handed out."""
    kl.Producer(root).send(topic, b"old")

    async def main() -> bytes | None:
        async with AsyncConsumer(root, topic) as consumer:
            first = (await consumer.__anext__()).value
            waiting = asyncio.create_task(consumer.__anext__())
            await asyncio.sleep(0.2)
            root.delete_topic(topic)
            root.create_topic(topic)
            kl.Producer(root).send(topic, b"new")
            with pytest.raises(kl.TopicRecreated, match="follow it again to read the new one"):
                await asyncio.wait_for(waiting, 30)
            return first

    assert asyncio.run(main()) == b"old"


@pytest.mark.parametrize("member", [False, True], ids=["consumer", "group-member"])
def test_a_cancel_that_comes_as_the_fetch_ends_loses_nothing(root, topic, member):
    """The fetch done, its caller cancelled before it resumed: the next ``__anext__`` has it."""
    kl.Producer(root).send_batch(topic, [b"0", b"1"])

    async def main() -> list[bytes | None]:
        follower = AsyncGroupConsumer(root, "g", [topic]) if member else AsyncConsumer(root, topic)
        async with follower:
            reading = asyncio.create_task(follower.__anext__())
            while follower._next is None or not follower._next.done():
                await asyncio.sleep(0)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            return [(await asyncio.wait_for(follower.__anext__(), 30)).value for _ in range(2)]

    assert asyncio.run(main()) == [b"0", b"1"]


def test_a_cancelled_wait_for_a_message_loses_nothing(root, topic):
    async def main() -> list[bytes | None]:
        got: list[bytes | None] = []
        async with AsyncConsumer(root, topic) as consumer, AsyncProducer(root) as producer:
            for i in range(50):
                sent = producer.send(topic, b"%d" % i)
                try:
                    record = await asyncio.wait_for(consumer.__anext__(), timeout=0.001 * (i % 5))
                    got.append(record.value)
                except asyncio.TimeoutError:
                    pass
                await sent
            while len(got) < 50:
                got.append((await consumer.__anext__()).value)
        return got

    assert asyncio.run(main()) == [b"%d" % i for i in range(50)]


def test_consume_options_pass_through(root, topic):
    kl.Producer(root).send_batch(topic, [b"a", b"b", b"c"])

    async def main() -> list[bytes | None]:
        async with AsyncConsumer(root, topic, max_messages=2) as consumer:
            return [record.value async for record in consumer]

    assert asyncio.run(main()) == [b"a", b"b"]
    with pytest.raises(kl.InvalidConfig, match="neither values_only nor follow"):
        AsyncConsumer(root, topic, values_only=True)


def test_a_group_member_reads_commits_and_a_later_member_goes_on_from_the_commit(root, topic):
    kl.Producer(root).send_batch(topic, [b"%d" % i for i in range(6)])

    async def read(count: int) -> tuple[list[bytes | None], dict[str, list[int]]]:
        got = []
        async with AsyncGroupConsumer(root, "g", [topic], auto_commit=False) as member:
            async for record in member:
                got.append(record.value)
                if len(got) == count:
                    break
            await member.commit()
            return got, member.assignment()

    assert asyncio.run(read(4)) == ([b"0", b"1", b"2", b"3"], {topic: [0]})
    assert asyncio.run(read(2))[0] == [b"4", b"5"]


def test_group_methods_appear_as_coroutines(root, topic):
    async def main() -> None:
        member = AsyncGroupConsumer(root, "g", [topic])
        with pytest.raises(kl.InvalidConfig, match="await start"):
            member.assignment()
        await member.start()
        assert member.member_id == member.member.member_id is not None  # a plain attribute of the sync member
        forwarded = member.create_message_streams
        assert inspect.iscoroutinefunction(forwarded) and forwarded.__doc__ == kl.GroupConsumer.create_message_streams.__doc__
        with pytest.raises(AttributeError, match="no attribute 'nothing_like_this'"):
            member.nothing_like_this  # noqa: B018
        await member.close()
        assert [record async for record in member] == []

    asyncio.run(main())


@pytest.fixture
def served(root, tmp_path: Path):
    """A real ``kl serve --allow-produce`` on the root: its address."""
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*KL, "--root", root.path, "serve", "--port", "0", "--allow-produce"], stderr=err)
    try:
        deadline = time.monotonic() + 120  # a process start: slow on a busy machine
        while not (found := re.search(r"serving \S+ on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, f"kl serve did not start: {log.read_text()}"
            time.sleep(0.05)
        yield f"127.0.0.1:{found[1]}"
    finally:
        proc.kill()
        proc.wait()


def test_the_same_through_a_served_root(root, topic, served):
    async def main() -> tuple[list[kl.Appended], list[bytes | None]]:
        async with AsyncConsumer(RemoteRoot(served), topic, poll_interval=0.02) as consumer:
            async with AsyncProducer(RemoteRoot(served)) as producer:
                appended = await asyncio.gather(*(producer.send(topic, b"%d" % i) for i in range(20)))
            got = []
            async for record in consumer:
                got.append(record.value)
                if len(got) == 20:
                    break
        return appended, got

    appended, got = asyncio.run(main())
    assert got == values(root, topic) == [b"%d" % i for i in range(20)]
    assert [a.offset for a in appended] == [m.offset for m in read_all(root, topic)]


PRODUCER = textwrap.dedent(
    """
    import asyncio, sys
    from kl.aio import AsyncProducer

    async def main():
        async with AsyncProducer(sys.argv[1], fsync=True) as producer:
            for i in range(1_000_000):
                appended = await producer.send("t", b"%d" % i)
                print(appended.offset, i, flush=True)

    asyncio.run(main())
    """
)


def test_what_was_acknowledged_before_kill_9_is_in_the_log(root, topic):
    proc = subprocess.Popen([sys.executable, "-c", PRODUCER, root.path], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    acknowledged = [proc.stdout.readline() for _ in range(50)]
    proc.send_signal(signal.SIGKILL)
    acknowledged += proc.stdout.read().splitlines()
    proc.wait()
    stored = {m.offset: m.value for m in read_all(root, topic)}
    for line in acknowledged:
        offset, i = line.split()
        assert stored[int(offset)] == i
    assert list(stored.values()) == [b"%d" % i for i in range(len(stored))]  # whole messages, in order
    assert len(stored) >= len(acknowledged)


def test_a_cancelled_wait_of_a_group_member_loses_nothing(root, topic):
    async def main() -> list[bytes | None]:
        got: list[bytes | None] = []
        async with AsyncGroupConsumer(root, "g", [topic]) as member, AsyncProducer(root) as producer:
            for i in range(30):
                sent = producer.send(topic, b"%d" % i)
                try:
                    got.append((await asyncio.wait_for(member.__anext__(), timeout=0.001 * (i % 5))).value)
                except asyncio.TimeoutError:
                    pass
                await sent
            while len(got) < 30:
                got.append((await member.__anext__()).value)
        return got

    assert asyncio.run(main()) == [b"%d" % i for i in range(30)]


FOLLOWER = textwrap.dedent(
    """
    import asyncio, sys
    from kl.aio import AsyncConsumer

    async def main():
        async with AsyncConsumer(sys.argv[1], "t") as consumer:
            async for record in consumer:
                print(record.value.decode(), flush=True)
                break

    asyncio.run(main())
    """
)


def test_a_follower_under_asyncio_run_exits_once_closed(root, topic):
    """The follow's thread ends with ``close``: the process exits while the topic stays idle."""
    kl.Producer(root).send(topic, b"first")
    done = subprocess.run([sys.executable, "-c", FOLLOWER, root.path], capture_output=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, b"first\n"), done.stderr


def test_serializers_pass_through_to_the_sync_twins(root, topic):
    async def main() -> list[object]:
        async with AsyncProducer(root, value_serializer=kl.serde.json_serializer) as producer:
            await producer.send(topic, {"id": 1})
            await producer.send(topic, None, key=b"gone")  # a tombstone stays one
        got = []
        async with AsyncConsumer(root, topic, value_deserializer=kl.serde.json_deserializer) as consumer:
            async for record in consumer:
                got.append(record.value)
                if len(got) == 2:
                    break
        return got

    assert asyncio.run(main()) == [{"id": 1}, None]
    assert [m.value for m in kl.Consumer(root).fetch(topic, 0, 0)] == [b'{"id":1}', None]
