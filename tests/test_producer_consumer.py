"""The producer and the stateless consumer (SPEC §8-9)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from pathlib import Path

import pytest

import kl
from kl.log import message as m

from conftest import flip_byte, read_all, values_of


@pytest.fixture
def four(root: kl.Root) -> str:
    root.create_topic("four", kl.TopicConfig(partitions=4))
    return "four"


def everything(root: kl.Root, topic: str) -> dict[int, list[kl.Message]]:
    return {p: read_all(root, topic, p) for p in range(root.config(topic).partitions)}


# ----------------------------------------------------------------- send


def test_send_returns_where_the_message_landed(root, topic):
    producer = kl.Producer(root)
    first = producer.send(topic, b"hello")
    second = producer.send(topic, b"world")
    assert first == kl.Appended(topic, 0, 0, 27, 1)
    assert second == kl.Appended(topic, 0, 27, 54, 1)


def test_send_then_fetch(root, topic):
    kl.Producer(root).send(topic, b"hello", key=b"k", timestamp=42)
    (msg,) = kl.Consumer(root).fetch(topic, 0, 0)
    assert msg == kl.Message(0, 28, 42, b"k", b"hello")


def test_send_stamps_the_current_time(root, topic):
    before = time.time_ns() // 1_000_000
    kl.Producer(root).send(topic, b"x")
    after = time.time_ns() // 1_000_000
    (msg,) = kl.Consumer(root).fetch(topic, 0, 0)
    assert before <= msg.timestamp <= after


def test_send_to_an_explicit_partition(root, four):
    kl.Producer(root).send(four, b"x", partition=2)
    assert [len(v) for v in everything(root, four).values()] == [0, 0, 1, 0]


def test_send_to_a_missing_partition_raises_topic_not_found(root, four):
    with pytest.raises(kl.TopicNotFound):
        kl.Producer(root).send(four, b"x", partition=4)


def test_send_an_empty_value(root, topic):
    kl.Producer(root).send(topic, b"")
    assert values_of(read_all(root, topic)) == [b""]


def test_send_with_fsync_is_flushed_on_return(root, topic):
    kl.Producer(root, fsync=True).send(topic, b"x")
    state = root.log(topic, 0).state()
    assert state.flushed_offset == state.log_end_offset


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_send_with_compression_round_trips(root, topic, compression):
    producer = kl.Producer(root, compression=compression)
    producer.send(topic, b"a" * 1000, key=b"k", timestamp=7)
    (msg,) = read_all(root, topic)
    assert (msg.key, msg.value, msg.timestamp) == (b"k", b"a" * 1000, 7)
    (entry,) = root.log(topic, 0).read(0, 1 << 20).entries()
    assert entry.attrs & m.CODEC_MASK == m.CODECS[compression]
    assert entry.size < 200


def test_unknown_compression_raises_invalid_config(root):
    with pytest.raises(kl.InvalidConfig, match="snappy"):
        kl.Producer(root, compression="snappy")


def test_producer_accepts_a_path(tmp_path):
    kl.Root(tmp_path).create_topic("t")
    kl.Producer(tmp_path).send("t", b"x")
    assert values_of(kl.Consumer(str(tmp_path)).fetch("t", 0, 0)) == [b"x"]


# ----------------------------------------------------------------- send_batch


def test_send_batch_appends_in_order(root, topic):
    values = [b"%d" % i for i in range(1000)]
    appended = kl.Producer(root).send_batch(topic, values)
    assert sum(a.count for a in appended) == 1000
    assert values_of(read_all(root, topic)) == values


def test_send_batch_is_chunked_by_batch_bytes(root, topic):
    values = [b"x" * 78] * 100  # 100 bytes framed
    appended = kl.Producer(root, batch_bytes=1000).send_batch(topic, values)
    assert [a.count for a in appended] == [10] * 10
    assert [a.offset for a in appended] == list(range(0, 10_000, 1000))
    assert values_of(read_all(root, topic)) == values


def test_send_batch_of_nothing_appends_nothing(root, topic):
    assert kl.Producer(root).send_batch(topic, []) == []
    assert root.log(topic, 0).log_end_offset == 0


def test_send_batch_with_keys_spreads_by_key(root, four):
    keys = [b"key-%d" % i for i in range(100)]
    values = [b"value-%d" % i for i in range(100)]
    kl.Producer(root).send_batch(four, values, keys=keys)
    got = everything(root, four)
    for p, messages in got.items():
        for msg in messages:
            assert kl.hash_partitioner(msg.key, 4) == p
            assert msg.value == b"value-" + msg.key[4:]
    assert sum(len(v) for v in got.values()) == 100


def test_send_batch_keeps_the_order_of_each_key(root, four):
    keys = [b"k%d" % (i % 7) for i in range(200)]
    values = [b"%d" % i for i in range(200)]
    kl.Producer(root).send_batch(four, values, keys=keys)
    for messages in everything(root, four).values():
        by_key: dict[bytes, list[int]] = {}
        for msg in messages:
            by_key.setdefault(msg.key, []).append(int(msg.value))
        assert all(seq == sorted(seq) for seq in by_key.values())


def test_send_batch_without_keys_goes_to_one_partition(root, four):
    kl.Producer(root).send_batch(four, [b"a", b"b", b"c"])
    sizes = sorted(len(v) for v in everything(root, four).values())
    assert sizes == [0, 0, 0, 3]


def test_a_large_keyless_batch_takes_the_partitions_in_turn(root, four):
    values = [b"%077d" % i for i in range(80)]  # 99 bytes framed: ten per 1000-byte append
    appended = kl.Producer(root, batch_bytes=1000).send_batch(four, values)
    assert [a.count for a in appended] == [10] * 8
    first = appended[0].partition
    assert [a.partition for a in appended] == [(first + i) % 4 for i in range(8)]
    got = everything(root, four)
    for i, a in enumerate(appended):
        chunk = values[10 * i : 10 * i + 10]
        assert values_of(kl.Consumer(root).fetch(four, a.partition, a.offset, a.next_offset - a.offset)) == chunk
    assert sorted(v for messages in got.values() for v in values_of(messages)) == values


def test_a_keyless_batch_with_a_partition_stays_there(root, four):
    appended = kl.Producer(root, batch_bytes=1000).send_batch(four, [b"%077d" % i for i in range(80)], partition=1)
    assert {a.partition for a in appended} == {1}
    assert len(read_all(root, four, 1)) == 80


def test_send_batch_to_an_explicit_partition_with_keys(root, four):
    kl.Producer(root).send_batch(four, [b"a", b"b"], keys=[b"x", b"y"], partition=3)
    assert [(x.key, x.value) for x in read_all(root, four, 3)] == [(b"x", b"a"), (b"y", b"b")]


def test_send_batch_with_mismatched_keys_raises(root, topic):
    with pytest.raises(ValueError, match="2 values but 1 keys"):
        kl.Producer(root).send_batch(topic, [b"a", b"b"], keys=[b"k"])


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_send_batch_with_compression_round_trips(root, topic, compression):
    values = [b"message %d " % i * 5 for i in range(5000)]
    appended = kl.Producer(root, compression=compression).send_batch(topic, values, timestamp=3)
    got = read_all(root, topic)
    assert values_of(got) == values
    assert all(x.timestamp == 3 for x in got)
    assert root.log(topic, 0).log_end_offset < sum(len(v) + 22 for v in values) / 5
    assert sum(a.count for a in appended) == 5000


def test_compressed_batches_stay_within_max_message_bytes(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=4096))
    values = [os.urandom(100) for _ in range(500)]  # incompressible
    kl.Producer(root, compression="zstd").send_batch("small", values)
    assert values_of(read_all(root, "small")) == values
    for entry in root.log("small", 0).read(0, 1 << 30).entries():
        assert entry.size <= 4096


def test_a_compressed_send_of_an_incompressible_message_near_the_limit_is_readable(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=4096))
    value = os.urandom(4096 - m.HEADER_SIZE)
    kl.Producer(root, compression="zstd").send("small", value)
    assert values_of(read_all(root, "small")) == [value]


# ----------------------------------------------------------------- MessageTooLarge


def test_a_message_over_max_message_bytes_is_refused_and_nothing_is_written(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100))
    with pytest.raises(kl.MessageTooLarge, match="101 bytes exceeds max_message_bytes 100 of topic 'small'$"):
        kl.Producer(root).send("small", b"x" * (101 - m.HEADER_SIZE))
    assert root.log("small", 0).log_end_offset == 0


def test_a_message_of_exactly_max_message_bytes_is_accepted(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100))
    kl.Producer(root).send("small", b"x" * (100 - m.HEADER_SIZE))
    assert values_of(read_all(root, "small")) == [b"x" * 78]


def test_the_key_counts_towards_max_message_bytes(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100))
    with pytest.raises(kl.MessageTooLarge):
        kl.Producer(root).send("small", b"x" * 70, key=b"k" * 10)
    with pytest.raises(kl.MessageTooLarge):
        kl.Producer(root).send_batch("small", [b"x" * 70], keys=[b"k" * 10])
    assert root.log("small", 0).log_end_offset == 0


def test_one_message_too_large_in_a_batch_writes_none_of_the_batch(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100, partitions=2))
    values = [b"ok"] * 50 + [b"x" * 200] + [b"ok"] * 50
    with pytest.raises(kl.MessageTooLarge):
        kl.Producer(root, batch_bytes=200).send_batch("small", values)
    keys = [b"a", b"b", b"c"]
    with pytest.raises(kl.MessageTooLarge):
        kl.Producer(root).send_batch("small", [b"1", b"x" * 200, b"2"], keys=keys)
    assert [root.log("small", p).log_end_offset for p in (0, 1)] == [0, 0]


def test_a_compressed_message_too_large_is_refused(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100))
    with pytest.raises(kl.MessageTooLarge):
        kl.Producer(root, compression="zstd").send("small", bytes(1000))
    assert root.log("small", 0).log_end_offset == 0


# ----------------------------------------------------------------- partitioners


def test_a_topics_partitioner_setting_decides_where_keys_go(root):
    root.create_topic("java", kl.TopicConfig(partitions=12, partitioner="murmur2"))
    root.create_topic("rdkafka", kl.TopicConfig(partitions=12))
    keys = [b"user-%d" % i for i in range(100)]
    with kl.Producer(root) as producer:
        for topic, partitioner in (("java", kl.murmur2_partitioner), ("rdkafka", kl.hash_partitioner)):
            appended = [producer.send(topic, b"v", key=key) for key in keys]
            assert [a.partition for a in appended] == [partitioner(key, 12) for key in keys]
            assert [a.partition for a in producer.send_batch(topic, [b"v"], [keys[7]])] == [partitioner(keys[7], 12)]
    assert kl.murmur2_partitioner(b"foobar", 50) == 16  # (-790332482 & 0x7fffffff) % 50, as Java's Utils.toPositive
    assert [kl.murmur2_partitioner(k, 12) for k in keys] != [kl.hash_partitioner(k, 12) for k in keys]
    with kl.Producer(root, partitioner=lambda key, n: n - 1) as producer:  # a partitioner given wins
        assert producer.send("java", b"v", key=b"user-1").partition == 11


def test_the_partitioner_setting_is_written_only_when_murmur2_and_is_checked(root):
    root.create_topic("a", kl.TopicConfig())
    assert "partitioner" not in json.loads((Path(root.path) / "a" / "topic.json").read_text())
    root.alter_topic("a", partitioner="murmur2")
    assert json.loads((Path(root.path) / "a" / "topic.json").read_text())["partitioner"] == "murmur2"
    assert kl.Root(root.path).config("a").partitioner == "murmur2"
    with pytest.raises(kl.InvalidConfig, match="partitioner must be crc32 or murmur2, not 'md5'"):
        root.alter_topic("a", partitioner="md5")
    assert kl.Root(root.path).config("a").partitioner == "murmur2"


def test_hash_partitioner_is_crc32_of_the_key():
    assert zlib.crc32(b"hello") == 907060870
    assert kl.hash_partitioner(b"hello", 10) == 0
    assert kl.hash_partitioner(b"user-42", 8) == 3
    assert kl.hash_partitioner(b"", 5) == 0


def test_hash_partitioner_is_stable_for_every_key():
    for i in range(1000):
        key = b"key-%d" % i
        assert kl.hash_partitioner(key, 7) == zlib.crc32(key) % 7


def test_hash_partitioner_without_a_key_is_random_but_in_range():
    seen = {kl.hash_partitioner(None, 4) for _ in range(400)}
    assert seen == {0, 1, 2, 3}


def test_a_key_always_goes_to_the_same_partition(root, four):
    producer = kl.Producer(root)
    partitions = {producer.send(four, b"v%d" % i, key=b"user-42").partition for i in range(20)}
    assert partitions == {zlib.crc32(b"user-42") % 4}


def test_the_key_to_partition_mapping_is_the_same_in_another_process(root, four):
    import subprocess
    import sys

    code = "import kl; print(kl.hash_partitioner(b'user-42', 4), kl.hash_partitioner(b'\\xff\\x00', 4))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.split()
    assert [int(x) for x in out] == [kl.hash_partitioner(b"user-42", 4), kl.hash_partitioner(b"\xff\x00", 4)]


def test_sends_without_a_key_spread_over_partitions(root, four):
    producer = kl.Producer(root)
    used = {producer.send(four, b"x").partition for _ in range(200)}
    assert used == {0, 1, 2, 3}


def test_a_custom_partitioner_decides(root, four):
    calls = []

    def last_byte(key, partitions):
        calls.append((key, partitions))
        return key[-1] % partitions

    producer = kl.Producer(root, partitioner=last_byte)
    assert producer.send(four, b"v", key=b"\x02").partition == 2
    producer.send_batch(four, [b"a", b"b"], keys=[b"\x01", b"\x07"])
    assert calls[0] == (b"\x02", 4)
    assert [len(v) for v in everything(root, four).values()] == [0, 1, 1, 1]


@pytest.mark.parametrize("bad", [4, -1, "1", None])
def test_a_partitioner_returning_a_bad_partition_raises_invalid_config(root, four, bad):
    producer = kl.Producer(root, partitioner=lambda key, n: bad)
    with pytest.raises(kl.InvalidConfig, match="partitioner returned"):
        producer.send(four, b"x", key=b"k")
    assert all(not v for v in everything(root, four).values())


# ----------------------------------------------------------------- fetch, multifetch, earliest, latest


def test_fetch_of_an_empty_partition_is_empty(root, topic):
    assert list(kl.Consumer(root).fetch(topic, 0, 0)) == []


def test_earliest_and_latest_offsets(root, topic):
    consumer = kl.Consumer(root)
    assert (consumer.earliest_offset(topic, 0), consumer.latest_offset(topic, 0)) == (0, 0)
    kl.Producer(root).send_batch(topic, [b"a", b"b"])
    assert (consumer.earliest_offset(topic, 0), consumer.latest_offset(topic, 0)) == (0, 46)
    assert consumer.offsets_before(topic, 0, kl.LATEST, 1) == [46]
    assert consumer.offsets_before(topic, 0, kl.EARLIEST, 1) == [0]


def test_fetch_from_latest_sees_only_new_messages(root, topic):
    kl.Producer(root).send_batch(topic, [b"old1", b"old2"])
    consumer = kl.Consumer(root)
    start = consumer.latest_offset(topic, 0)
    assert list(consumer.fetch(topic, 0, start)) == []
    kl.Producer(root).send(topic, b"new")
    assert values_of(consumer.fetch(topic, 0, start)) == [b"new"]


def test_fetch_respects_max_bytes_but_returns_at_least_one_message(root, topic):
    kl.Producer(root).send_batch(topic, [b"x" * 100] * 10)
    consumer = kl.Consumer(root)
    assert len(list(consumer.fetch(topic, 0, 0, 250))) == 2
    assert len(list(consumer.fetch(topic, 0, 0, 10))) == 1
    assert len(list(kl.Consumer(root, max_bytes=400).fetch(topic, 0, 0))) == 3


def test_fetch_out_of_range_raises(root, topic):
    kl.Producer(root).send(topic, b"x")
    with pytest.raises(kl.OffsetOutOfRange, match="0 to 23"):
        kl.Consumer(root).fetch(topic, 0, 24)


def test_fetch_mid_message_raises_invalid_offset(root, topic):
    kl.Producer(root).send_batch(topic, [b"hello world"] * 3)
    with pytest.raises(kl.InvalidOffset):
        kl.Consumer(root).fetch(topic, 0, 7)


def test_multifetch_answers_each_request_in_order(root, four):
    producer = kl.Producer(root)
    for p in range(4):
        producer.send_batch(four, [b"p%d-%d" % (p, i) for i in range(3)], partition=p)
    sets = kl.Consumer(root).multifetch([(four, 3, 0, None), (four, 0, 26, None), (four, 1, 0, 40)])
    assert [values_of(s) for s in sets] == [[b"p3-0", b"p3-1", b"p3-2"], [b"p0-1", b"p0-2"], [b"p1-0"]]


def test_multifetch_across_topics(root, four, topic):
    kl.Producer(root).send(topic, b"one")
    kl.Producer(root).send(four, b"two", partition=1)
    sets = kl.Consumer(root).multifetch([(topic, 0, 0, None), (four, 1, 0, None), (four, 2, 0, None)])
    assert [values_of(s) for s in sets] == [[b"one"], [b"two"], []]


def test_multifetch_raises_on_a_bad_request(root, topic):
    with pytest.raises(kl.OffsetOutOfRange):
        kl.Consumer(root).multifetch([(topic, 0, 0, None), (topic, 0, 99, None)])


def test_fetched_values_fast_path_matches_iteration(root, topic):
    kl.Producer(root).send_batch(topic, [b"v%d" % i for i in range(100)])
    kl.Producer(root).send(topic, b"keyed", key=b"k")
    messages = kl.Consumer(root).fetch(topic, 0, 0)
    values, next_offset = messages.values()
    assert values == values_of(messages)
    assert next_offset == root.log(topic, 0).log_end_offset


def test_offset_for_time_and_offset_back_through_the_consumer(root, topic):
    producer = kl.Producer(root)
    for i in range(5):
        producer.send(topic, b"%d" % i, timestamp=100 + i)
    consumer = kl.Consumer(root)
    assert consumer.offset_for_time(topic, 0, 102) == 46
    assert consumer.offset_back(topic, 0, 2) == 69


# ----------------------------------------------------------------- stream


class FakeClock:
    """``time`` for kl.consumer and kl.follow (polling): ``sleep`` advances ``monotonic`` and is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_stream_yields_what_is_there_then_stops_when_idle(root, topic, monkeypatch):
    kl.Producer(root).send_batch(topic, [b"a", b"b"])
    clock = FakeClock()
    monkeypatch.setattr("kl.consumer.time", clock)
    monkeypatch.setattr("kl.follow.time", clock)
    monkeypatch.setattr("kl.follow._libc", lambda: None)  # no inotify: it would wait in real time
    got = list(kl.Consumer(root).stream(topic, 0, 0, idle_timeout=0.5, poll_interval=0.0625))
    assert values_of(got) == [b"a", b"b"]
    assert clock.sleeps == [0.0625] * 8  # polled until idle for the whole timeout, then stopped


def test_stream_waits_for_new_messages(root, topic):
    def later():
        time.sleep(0.2)
        kl.Producer(root).send(topic, b"late")

    thread = threading.Thread(target=later)
    thread.start()
    got = list(kl.Consumer(root).stream(topic, 0, 0, idle_timeout=2, poll_interval=0.02))  # room for a slow send
    thread.join()
    assert values_of(got) == [b"late"]


def test_stream_resets_its_idle_clock_on_each_message(root, topic):
    producer = kl.Producer(root)

    def trickle():
        for i in range(5):
            time.sleep(0.3)
            producer.send(topic, b"%d" % i)

    thread = threading.Thread(target=trickle)
    thread.start()
    # Longer than each gap, with room for a slow send; shorter than all five.
    got = list(kl.Consumer(root).stream(topic, 0, 0, idle_timeout=1, poll_interval=0.01))
    thread.join()
    assert values_of(got) == [b"0", b"1", b"2", b"3", b"4"]


def test_stream_from_latest_skips_the_backlog(root, topic):
    kl.Producer(root).send_batch(topic, [b"old"] * 3)
    consumer = kl.Consumer(root)
    stream = consumer.stream(topic, 0, consumer.latest_offset(topic, 0), idle_timeout=0.5, poll_interval=0.01)
    kl.Producer(root).send(topic, b"new")
    assert values_of(stream) == [b"new"]


def test_stream_out_of_range_fails_by_default(root, topic):
    with pytest.raises(kl.OffsetOutOfRange):
        list(kl.Consumer(root).stream(topic, 0, 5, idle_timeout=0.1))


@pytest.mark.parametrize("reset, expected", [("earliest", [b"a", b"b"]), ("latest", [])])
def test_stream_out_of_range_can_reset(root, topic, reset, expected):
    kl.Producer(root).send_batch(topic, [b"a", b"b"])
    got = list(kl.Consumer(root).stream(topic, 0, 10_000, idle_timeout=0.1, poll_interval=0.01, reset=reset))
    assert values_of(got) == expected


def test_stream_rejects_an_unknown_reset_policy(root, topic):
    with pytest.raises(kl.InvalidConfig, match="reset"):
        next(kl.Consumer(root).stream(topic, 0, 0, reset="oldest"))


def test_stream_resumes_inside_a_compressed_batch_without_loss(root, topic):
    producer = kl.Producer(root, compression="zstd")
    producer.send_batch(topic, [b"%d" % i for i in range(10)])
    producer.send_batch(topic, [b"%d" % i for i in range(10, 20)])
    consumer = kl.Consumer(root)
    seen, offset = [], 0
    for msg in consumer.stream(topic, 0, 0, idle_timeout=0.1, poll_interval=0.01):
        seen.append(msg.value)
        offset = msg.next_offset
        if len(seen) == 13:
            break
    rest = list(consumer.stream(topic, 0, offset, idle_timeout=0.1, poll_interval=0.01))
    assert seen[:13] == [b"%d" % i for i in range(13)]
    assert values_of(rest) == [b"%d" % i for i in range(10, 20)]  # the batch again, nothing lost


def test_stream_follows_across_segment_rolls(root):
    root.create_topic("s", kl.TopicConfig(segment_bytes=128, max_message_bytes=128))
    producer = kl.Producer(root)
    for i in range(20):
        producer.send("s", b"%010d" % i)
    got = list(kl.Consumer(root).stream("s", 0, 0, idle_timeout=0.1, poll_interval=0.01, max_bytes=50))
    assert values_of(got) == [b"%010d" % i for i in range(20)]


def damaged(root: kl.Root, topic: str) -> int:
    """one, two, six, each its own append, "two" with a flipped byte; its offset."""
    with kl.Producer(root) as producer:
        offsets = [producer.send(topic, value, partition=0).offset for value in (b"one", b"two", b"six")]
    flip_byte(root.log(topic, 0).segments()[0].path, offsets[1] + m.HEADER_SIZE)
    return offsets[1]


def test_stream_yields_the_messages_before_damage_then_raises(root, topic):
    offset = damaged(root, topic)
    got = []
    with pytest.raises(kl.CorruptMessage) as raised:
        for msg in kl.Consumer(root).stream(topic, 0, 0, idle_timeout=0.1, poll_interval=0.01):
            got.append(msg.value)
    assert (got, raised.value.offset) == ([b"one"], offset)


def test_stream_skip_corrupt_logs_and_goes_on(root, topic, caplog):
    offset = damaged(root, topic)
    with caplog.at_level(logging.WARNING, logger="kl.consumer"):
        got = list(kl.Consumer(root).stream(topic, 0, 0, idle_timeout=0.1, poll_interval=0.01, skip_corrupt=True))
    assert values_of(got) == [b"one", b"six"]
    assert caplog.messages == [f"skipped damaged data of {topic}/0 from offset {offset} to {2 * offset}: checksum mismatch"]
