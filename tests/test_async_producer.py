"""The async producer (SPEC §8, Kafka's producer.type=async): Producer(linger_ms=...)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

import kl

from conftest import partition_locked_elsewhere, read_all, values_of

pytestmark = pytest.mark.usefixtures("each_core")  # send() is the core's lane (kl.log.pycore.Lane) in async mode

LONG = 600_000
"""A linger (ms) no test waits out: what is sent stays queued until flush() or close()."""


@pytest.fixture
def four(root: kl.Root) -> str:
    root.create_topic("four", kl.TopicConfig(partitions=4))
    return "four"


def numbered(count: int, tag: bytes = b"m") -> list[bytes]:
    return [b"%s%06d" % (tag, i) for i in range(count)]


def everything(root: kl.Root, topic: str) -> dict[int, list[kl.Message]]:
    return {p: read_all(root, topic, p) for p in range(root.config(topic).partitions)}


class Told:
    """An ``on_delivery`` that records what it was told, in order, as (appended, error)."""

    def __init__(self) -> None:
        self.calls: list[tuple[kl.Appended | None, BaseException | None]] = []

    def __call__(self, error: BaseException | None, appended: kl.Appended | None) -> None:
        self.calls.append((appended, error))


# ----------------------------------------------------------------- delivery


def test_send_only_queues_until_flush(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    assert producer.send(topic, b"queued") is None
    assert read_all(root, topic) == []
    producer.flush()
    assert values_of(read_all(root, topic)) == [b"queued"]
    producer.close()


def test_every_message_arrives_once_in_send_order(root, topic):
    values = numbered(20_000)
    with kl.Producer(root, linger_ms=1, batch_size=500) as producer:
        for value in values:
            producer.send(topic, value, partition=0)
    assert values_of(read_all(root, topic)) == values


def test_keyed_messages_go_to_their_key_partition_in_order(root, four):
    keys = [b"k%d" % (i % 7) for i in range(5000)]
    values = numbered(5000)
    with kl.Producer(root, linger_ms=1) as producer:
        for key, value in zip(keys, values, strict=True):
            producer.send(four, value, key=key)
    for p, messages in everything(root, four).items():
        expected = [(k, v) for k, v in zip(keys, values, strict=True) if zlib.crc32(k) % 4 == p]
        assert [(msg.key, msg.value) for msg in messages] == expected


def test_keyless_messages_all_arrive_each_partition_in_order(root, four):
    values = numbered(10_000)
    with kl.Producer(root, linger_ms=0, batch_size=100) as producer:
        for value in values:
            producer.send(four, value)
    got = {p: values_of(messages) for p, messages in everything(root, four).items()}
    assert sorted(v for vs in got.values() for v in vs) == values
    for vs in got.values():
        assert vs == sorted(vs)


def test_mixed_keys_partitions_and_timestamps_keep_order_per_partition(root, four):
    sent: dict[int, list[bytes]] = {p: [] for p in range(4)}
    with kl.Producer(root, linger_ms=LONG) as producer:
        for i, value in enumerate(numbered(3000)):
            if i % 3 == 0:
                producer.send(four, value, partition=i % 4, timestamp=1000 + i)
                sent[i % 4].append(value)
            else:
                key = b"key%d" % (i % 5)
                producer.send(four, value, key=key)
                sent[zlib.crc32(key) % 4].append(value)
    messages = everything(root, four)
    assert {p: values_of(ms) for p, ms in messages.items()} == sent
    stamped = [msg for ms in messages.values() for msg in ms if msg.key is None]
    assert all(msg.timestamp == 1000 + int(msg.value[1:]) for msg in stamped)


def test_messages_without_a_timestamp_are_stamped_when_appended(root, topic):
    before = time.time_ns() // 1_000_000
    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"x")
    after = time.time_ns() // 1_000_000
    (msg,) = read_all(root, topic)
    assert before <= msg.timestamp <= after


def test_compressed_batches_come_back_whole(root, topic):
    values = numbered(3000)
    with kl.Producer(root, linger_ms=LONG, compression="zstd") as producer:
        for value in values:
            producer.send(topic, value, partition=0)
    assert values_of(read_all(root, topic)) == values
    assert root.log(topic, 0).log_end_offset < sum(len(v) + kl.log.message.HEADER_SIZE for v in values) / 4


def test_a_normal_exit_sends_what_is_queued(root, topic):
    code = (
        "import kl\n"
        f"producer = kl.Producer({str(root.path)!r}, linger_ms={LONG})\n"
        f"for i in range(1000): producer.send({topic!r}, b'%04d' % i)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert values_of(read_all(root, topic)) == [b"%04d" % i for i in range(1000)]


# ----------------------------------------------------------------- callbacks


def test_callbacks_get_each_message_offsets(root, four):
    told = Told()
    with kl.Producer(root, linger_ms=LONG) as producer:
        for i in range(300):
            producer.send(four, b"v%d" % i, key=b"k%d" % (i % 3), on_delivery=told)
    messages = {msg.value: msg for ms in everything(root, four).values() for msg in ms}
    assert len(told.calls) == 300
    for appended, error in told.calls:
        assert error is None and appended is not None
        assert appended.count == 1
    landed = {(a.partition, a.offset, a.next_offset) for a, _ in told.calls if a is not None}
    assert landed == {(p, msg.offset, msg.next_offset) for p, ms in everything(root, four).items() for msg in ms}
    assert len(messages) == 300


def test_callbacks_of_a_compressed_batch_get_its_offsets(root, topic):
    told = Told()
    with kl.Producer(root, linger_ms=LONG, compression="gzip") as producer:
        for i in range(50):
            producer.send(topic, b"v%d" % i, on_delivery=told)
    end = root.log(topic, 0).log_end_offset
    assert [call for call in told.calls] == [(kl.Appended(topic, 0, 0, end, 50), None)] * 50


def test_a_callback_that_raises_does_not_stop_the_producer(root, topic, caplog):
    def bad(error, appended):
        raise RuntimeError("callback bug")

    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"a", on_delivery=bad)
        producer.flush()
        producer.send(topic, b"b")
    assert values_of(read_all(root, topic)) == [b"a", b"b"]
    assert "callback bug" in caplog.text


def test_a_callback_may_send_again(root, topic):
    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"first", on_delivery=lambda e, a: producer.send(topic, b"second"))
        producer.flush()
        producer.flush()
    assert values_of(read_all(root, topic)) == [b"first", b"second"]


def test_sync_send_calls_the_callback_too(root, topic):
    told = Told()
    appended = kl.Producer(root).send(topic, b"x", on_delivery=told)
    assert told.calls == [(appended, None)]


# ----------------------------------------------------------------- errors


def test_an_oversize_message_is_refused_by_send_itself(root, topic):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100))
    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"x" * 1000)  # a topic with a larger limit first
        producer.send("small", b"ok")
        with pytest.raises(kl.MessageTooLarge, match="max_message_bytes 100"):
            producer.send("small", b"x" * 100)
        with pytest.raises(kl.MessageTooLarge):
            producer.send("small", b"x" * 50, key=b"k" * 50)
        producer.send("small", b"ok too")
    assert values_of(read_all(root, "small")) == [b"ok", b"ok too"]


def test_an_unknown_topic_is_refused_by_its_first_send(root, topic):
    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"x")
        with pytest.raises(kl.TopicNotFound):
            producer.send("nope", b"x")
    assert values_of(read_all(root, topic)) == [b"x"]


def test_a_deleted_topic_fails_the_next_flush(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    producer.send(topic, b"before")
    producer.flush()
    root.delete_topic(topic)
    producer.send(topic, b"after")
    with pytest.raises(kl.TopicNotFound):
        producer.flush()
    producer.flush()  # told once
    producer.close()


def test_a_deleted_topic_is_told_to_the_callback_instead(root, topic):
    told = Told()
    producer = kl.Producer(root, linger_ms=LONG)
    producer.send(topic, b"before")
    producer.flush()
    root.delete_topic(topic)
    producer.send(topic, b"after", on_delivery=told)
    producer.close()  # does not raise: the callback was told
    ((appended, error),) = told.calls
    assert appended is None and isinstance(error, kl.TopicNotFound)


def test_a_topic_created_again_gets_the_rest(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    producer.send(topic, b"old")
    producer.flush()
    root.delete_topic(topic)
    root.create_topic(topic, kl.TopicConfig(partitions=2, max_message_bytes=100))
    told = Told()
    producer.send(topic, b"new", partition=1)
    producer.send(topic, b"y" * 80, partition=1, on_delivery=told)  # fits the old limit, not the new one
    producer.send(topic, b"newer", partition=1)
    producer.close()
    assert values_of(read_all(root, topic, 1)) == [b"new", b"newer"]
    ((appended, error),) = told.calls
    assert appended is None and isinstance(error, kl.MessageTooLarge)


def test_a_subclass_that_wraps_send_is_called_in_async_mode_too(root, topic):
    class Counting(kl.Producer):
        sent = 0

        def send(self, *args, **kwargs):
            self.sent += 1
            return super().send(*args, **kwargs)

    with Counting(root, linger_ms=LONG) as producer:
        for i in range(5):
            producer.send(topic, b"m%d" % i)
    assert producer.sent == 5
    assert values_of(read_all(root, topic)) == [b"m%d" % i for i in range(5)]


def test_a_run_of_plain_sends_cut_by_a_value_over_the_new_limit_lands_around_it(root, topic):
    """The queued bare values are framed as one run up to the first that no longer fits
    (the topic was created again with a smaller limit): that one fails alone."""
    producer = kl.Producer(root, linger_ms=LONG)
    producer.send(topic, b"old")
    producer.flush()
    root.delete_topic(topic)
    root.create_topic(topic, kl.TopicConfig(max_message_bytes=100))
    for value in [b"a", b"b", b"y" * 80, b"c", b"d"]:
        producer.send(topic, value)
    with pytest.raises(kl.MessageTooLarge):
        producer.flush()
    producer.close()
    assert values_of(read_all(root, topic)) == [b"a", b"b", b"c", b"d"]


def test_plain_sends_to_a_topic_of_format_0_7_are_stored_in_its_format(root):
    root.create_topic("old", kl.TopicConfig(format="0.7"))
    with kl.Producer(root, linger_ms=LONG) as producer:
        for i in range(50):
            producer.send("old", b"m%d" % i)
    got = read_all(root, "old")
    assert values_of(got) == [b"m%d" % i for i in range(50)]
    assert {message.timestamp for message in got} == {None}  # magic 1: no timestamp


def test_a_missing_partition_fails_the_flush(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    producer.send(topic, b"x", partition=3)
    with pytest.raises(kl.TopicNotFound, match="partitions 0 to 0"):
        producer.close()


def test_bad_settings_are_refused(root):
    with pytest.raises(kl.InvalidConfig, match="linger_ms"):
        kl.Producer(root, linger_ms=-1)
    with pytest.raises(kl.InvalidConfig, match="batch_size"):
        kl.Producer(root, linger_ms=1, batch_size=10, queue_size=5)
    with pytest.raises(kl.InvalidConfig, match="queue_timeout"):
        kl.Producer(root, linger_ms=1, queue_timeout=-1)


# ----------------------------------------------------------------- the bounded queue


def test_a_full_queue_raises_queue_full_and_keeps_the_message_out(root, topic):
    producer = kl.Producer(root, linger_ms=LONG, batch_size=10, queue_size=10, queue_timeout=0)
    accepted = []
    with partition_locked_elsewhere(str(root.path), topic, 0):  # the thread waits for the lock
        with pytest.raises(kl.QueueFull, match="10 messages"):
            for value in numbered(1000):
                producer.send(topic, value, partition=0)
                accepted.append(value)
    assert len(accepted) >= 10
    producer.close()
    assert values_of(read_all(root, topic)) == accepted


def test_a_full_queue_makes_send_wait_for_room(root, topic):
    producer = kl.Producer(root, linger_ms=LONG, batch_size=10, queue_size=10)
    values = numbered(100)
    sender = threading.Thread(target=lambda: [producer.send(topic, v, partition=0) for v in values])
    with partition_locked_elsewhere(str(root.path), topic, 0):
        sender.start()
        sender.join(0.5)
        assert sender.is_alive()  # waiting for room
    sender.join()
    producer.close()
    assert values_of(read_all(root, topic)) == values


# ----------------------------------------------------------------- flush, close, threads


def test_close_refuses_further_sends(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    with producer:
        producer.send(topic, b"x")
    with pytest.raises(kl.ProducerClosed):
        producer.send(topic, b"y")
    producer.close()
    assert values_of(read_all(root, topic)) == [b"x"]
    assert not [t for t in threading.enumerate() if t.name == "kl-producer" and t.is_alive()]


def test_flush_or_close_from_a_callback_is_refused(root, topic):
    told = Told()

    def flush_inside(error, appended):
        for verb in (producer.flush, producer.close):
            try:
                verb()
            except RuntimeError as e:
                told(e, None)

    with kl.Producer(root, linger_ms=LONG) as producer:
        producer.send(topic, b"x", on_delivery=flush_inside)
        producer.flush()
        producer.send(topic, b"y")
    assert [str(error) for _, error in told.calls] == ["flush() or close() from a producer callback would wait for itself"] * 2
    assert values_of(read_all(root, topic)) == [b"x", b"y"]


def test_many_threads_send_at_once(root, four):
    producer = kl.Producer(root, linger_ms=1, batch_size=100, queue_size=1000)
    per_thread = 3000

    def sender(n: int) -> None:
        for i in range(per_thread):
            producer.send(four, b"%d:%06d" % (n, i), key=b"%d" % n)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.close()
    got = [msg.value for ms in everything(root, four).values() for msg in ms]
    assert len(got) == 8 * per_thread
    for n in range(8):
        assert [v for v in got if v.startswith(b"%d:" % n)] == [b"%d:%06d" % (n, i) for i in range(per_thread)]


# ----------------------------------------------------------------- processes


def test_a_forked_child_sends_its_own_and_not_the_parents_queue(root, topic):
    producer = kl.Producer(root, linger_ms=LONG)
    for value in numbered(100, b"parent"):
        producer.send(topic, value, partition=0)
    pid = os.fork()
    if pid == 0:  # the child: its own thread, none of the parent's queue
        code = 1
        try:
            for value in numbered(50, b"child"):
                producer.send(topic, value, partition=0)
            producer.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    producer.close()
    got = values_of(read_all(root, topic))
    assert got == numbered(50, b"child") + numbered(100, b"parent")


def test_sigkill_loses_only_queued_messages_and_tears_nothing(root, topic):
    code = (
        "import sys, kl\n"
        f"producer = kl.Producer({str(root.path)!r}, linger_ms=1, batch_size=100)\n"
        "i = 0\n"
        "while True:\n"
        f"    producer.send({topic!r}, b'%08d' % i + b'x' * 200, partition=0)\n"
        "    i += 1\n"
        "    if i % 5000 == 0:\n"
        "        producer.flush()\n"
        "        print(i, flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None
    flushed = 0
    while flushed < 20_000:
        flushed = int(child.stdout.readline())
    child.send_signal(signal.SIGKILL)
    child.wait()
    got = values_of(read_all(root, topic))
    assert len(got) >= flushed
    assert got == [b"%08d" % i + b"x" * 200 for i in range(len(got))]


def test_plain_sends_from_several_threads_land_where_each_asked(root, four):
    """The first thread to send queues bare values after a header; the others must never
    come between a header and its values, whatever partitions they switch between."""
    producer = kl.Producer(root, linger_ms=1, batch_size=50, queue_size=500)
    per_thread = 3000

    def sender(n: int) -> None:
        for i in range(per_thread):
            producer.send(four, b"%d:%06d" % (n, i), partition=(n + i // 100) % 4)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    producer.close()
    got = everything(root, four)
    assert sum(len(ms) for ms in got.values()) == 4 * per_thread
    for partition, messages in got.items():
        for msg in messages:
            n, i = map(int, msg.value.split(b":"))
            assert (n + i // 100) % 4 == partition, f"{msg.value!r} landed in partition {partition}"
    for n in range(4):
        mine = [v for ms in got.values() for v in (m.value for m in ms) if v.startswith(b"%d:" % n)]
        assert sorted(mine) == [b"%d:%06d" % (n, i) for i in range(per_thread)]
