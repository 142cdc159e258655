"""``Consumer.consume``: the multi-partition read loop ``kl consume`` and ``Consumer.stream`` share."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import kl
from kl.log import message as m

from conftest import flip_byte, values_of

SIZE = m.HEADER_SIZE + 3
"""Bytes of a message of a 3-byte value and no key."""


@pytest.fixture
def three(root: kl.Root) -> str:
    """Topic "three": partition p holds the values p-a and p-b."""
    root.create_topic("three", kl.TopicConfig(partitions=3))
    producer = kl.Producer(root)
    for p in range(3):
        producer.send_batch("three", [b"%d-a" % p, b"%d-b" % p], partition=p)
    return "three"


@pytest.fixture
def damaged(root: kl.Root, topic: str) -> str:
    """Topic "t": one, two, six, each its own append; "two" (offset SIZE) has a flipped byte."""
    with kl.Producer(root) as producer:
        for value in (b"one", b"two", b"six"):
            producer.send(topic, value, partition=0)
    flip_byte(root.log(topic, 0).segments()[0].path, SIZE + m.HEADER_SIZE)
    return topic


def contents(batches) -> list[tuple[int, int, int, list]]:
    return [(b.partition, b.offset, b.next_offset, b.messages) for b in batches]


def test_every_partition_is_read_round_robin_one_fetch_each(root, three):
    batches = list(kl.Consumer(root).consume(three, values_only=True))
    assert contents(batches) == [(p, 0, 2 * SIZE, [b"%d-a" % p, b"%d-b" % p]) for p in range(3)]
    assert {b.topic for b in batches} == {"three"}


def test_small_fetches_take_turns(root, three):
    batches = list(kl.Consumer(root).consume(three, [2, 0], max_bytes=SIZE, values_only=True))
    assert [(b.partition, b.messages) for b in batches] == [(2, [b"2-a"]), (0, [b"0-a"]), (2, [b"2-b"]), (0, [b"0-b"])]


def test_messages_are_message_objects_unless_values_only(root, three):
    [batch] = kl.Consumer(root).consume(three, [1])
    assert batch.messages == [
        kl.Message(0, SIZE, batch.messages[0].timestamp, None, b"1-a"),
        kl.Message(SIZE, 2 * SIZE, batch.messages[1].timestamp, None, b"1-b"),
    ]


def test_the_end_is_the_one_each_partition_had_at_the_start(root, topic):
    kl.Producer(root).send_batch(topic, [b"old", b"dog"])
    batches = kl.Consumer(root).consume(topic, max_bytes=SIZE, values_only=True)
    first = next(batches)
    kl.Producer(root).send(topic, b"new")
    assert [first.messages] + [b.messages for b in batches] == [[b"old"], [b"dog"]]


def test_follow_waits_for_new_messages_until_idle(root, three):
    def later():
        time.sleep(0.2)
        kl.Producer(root).send("three", b"new", partition=1)

    thread = threading.Thread(target=later)
    thread.start()
    got = list(kl.Consumer(root).consume(three, start="latest", follow=True, idle_timeout=2, poll_interval=0.02))
    thread.join()
    assert contents(got) == [
        (1, 2 * SIZE, 3 * SIZE, [kl.Message(2 * SIZE, 3 * SIZE, got[0].messages[0].timestamp, None, b"new")])
    ]


@pytest.mark.parametrize("values_only", [False, True])
def test_max_messages_stops_there_and_next_offset_resumes_after_the_last(root, topic, values_only):
    kl.Producer(root).send_batch(topic, [b"%03d" % i for i in range(10)])
    [batch] = kl.Consumer(root).consume(topic, max_messages=3, values_only=values_only)
    assert (batch.offset, batch.next_offset, values_of(batch.messages) if not values_only else batch.messages) == (
        0,
        3 * SIZE,
        [b"000", b"001", b"002"],
    )
    rest = kl.Consumer(root).consume(topic, start=batch.next_offset, values_only=True)
    assert [v for b in rest for v in b.messages] == [b"%03d" % i for i in range(3, 10)]


def test_max_messages_counts_across_partitions(root, three):
    batches = list(kl.Consumer(root).consume(three, max_messages=3, values_only=True))
    assert [(b.partition, b.messages) for b in batches] == [(0, [b"0-a", b"0-b"]), (1, [b"1-a"])]
    assert list(kl.Consumer(root).consume(three, max_messages=0)) == []


def test_max_messages_inside_a_compressed_batch_resumes_at_the_batch(root, topic):
    kl.Producer(root, compression="zstd").send_batch(topic, [b"a", b"b", b"c"])
    [batch] = kl.Consumer(root).consume(topic, max_messages=2, values_only=True)
    assert (batch.messages, batch.next_offset) == ([b"a", b"b"], 0)


def test_start_earliest_latest_an_offset_or_one_per_partition(root, three):
    consumer = kl.Consumer(root)

    def values(**kwargs) -> list[bytes]:
        return [v for b in consumer.consume(three, values_only=True, **kwargs) for v in b.messages]

    assert values(start="earliest") == [b"0-a", b"0-b", b"1-a", b"1-b", b"2-a", b"2-b"]
    assert values(start="latest") == []
    assert values(partitions=[1], start=SIZE) == [b"1-b"]
    assert values(start={0: SIZE, 1: 2 * SIZE, 2: 0}) == [b"0-b", b"2-a", b"2-b"]


# ----------------------------------------------------------------- end bounds: until and until_time


def stamped(root: kl.Root, topic: str, stamps: list[int], partition: int = 0, *, compression: str | None = None) -> None:
    """One message per stamp, valued by it (``b"%03d"``)."""
    with kl.Producer(root, compression=compression) as producer:
        for ts in stamps:
            producer.send(topic, b"%03d" % ts, partition=partition, timestamp=ts)


def values_read(batches) -> list[bytes]:
    return [v for b in batches for v in (b.messages if isinstance(b.messages[0], bytes) else values_of(b.messages))]


def test_until_stops_before_the_first_message_at_or_past_the_offset(root, topic):
    kl.Producer(root).send_batch(topic, [b"%03d" % i for i in range(5)])
    consumer = kl.Consumer(root)
    assert values_read(consumer.consume(topic, until=2 * SIZE, values_only=True)) == [b"000", b"001"]
    assert values_read(consumer.consume(topic, until=2 * SIZE + 1)) == [b"000", b"001", b"002"]  # 002 starts before it
    assert values_read(consumer.consume(topic, start=SIZE, until=SIZE)) == []
    assert values_read(consumer.consume(topic, until=99 * SIZE, values_only=True)) == [b"%03d" % i for i in range(5)]


def test_until_gives_each_partition_its_own_bound(root, three):
    batches = list(kl.Consumer(root).consume(three, until={0: SIZE, 2: 0}, values_only=True))
    assert [(b.partition, b.messages) for b in batches] == [(0, [b"0-a"]), (1, [b"1-a", b"1-b"])]
    with pytest.raises(kl.InvalidConfig, match=r"an end offset \(5\) is for one partition, not 3"):
        next(kl.Consumer(root).consume(three, until=5))


@pytest.mark.parametrize("values_only", [False, True])
def test_until_time_stops_at_the_first_message_stamped_at_or_after_it_as_offset_for_time_finds(root, topic, values_only):
    stamps = [100, 300, 200, 500, 150, 400]  # producers stamp their own clocks: out of order
    stamped(root, topic, stamps)
    consumer = kl.Consumer(root)
    for until_time in (0, 150, 250, 300, 450, 501):
        got = list(consumer.consume(topic, until_time=until_time, values_only=values_only))
        end = consumer.offset_for_time(topic, 0, until_time)
        assert values_read(got) == [b"%03d" % ts for ts in stamps[: end // SIZE]]
        if got:
            assert got[-1].next_offset == end
    # from --from-time a to --until-time b: exactly the messages between the two points
    got = consumer.consume(topic, start=consumer.offset_for_time(topic, 0, 200), until_time=450, values_only=values_only)
    assert values_read(got) == [b"300", b"200"]


def test_until_time_gives_each_partition_its_own_end(root):
    root.create_topic("two", kl.TopicConfig(partitions=2))
    stamped(root, "two", [1, 2, 3, 9], partition=0)
    stamped(root, "two", [5, 6, 7, 8], partition=1)
    batches = list(kl.Consumer(root).consume("two", until_time=3, values_only=True))
    assert [(b.partition, b.messages) for b in batches] == [(0, [b"001", b"002"])]
    batches = list(kl.Consumer(root).consume("two", until_time=7, values_only=True))
    assert [(b.partition, b.messages) for b in batches] == [(0, [b"001", b"002", b"003"]), (1, [b"005", b"006"])]


def test_until_time_inside_a_compressed_batch_resumes_at_the_batch(root, topic):
    kl.Producer(root, compression="zstd").send_batch(topic, [b"a", b"b", b"c"], timestamp=10)
    kl.Producer(root).send_batch(topic, [b"d"], timestamp=20)
    assert list(kl.Consumer(root).consume(topic, until_time=10)) == []
    [batch] = kl.Consumer(root).consume(topic, until_time=20, values_only=True)
    assert batch.messages == [b"a", b"b", b"c"]


def test_until_ends_a_follow_when_every_partition_reached_its_bound(root, three):
    ends = dict.fromkeys(range(3), 2 * SIZE)
    until = {0: 3 * SIZE, 1: 2 * SIZE + 1, 2: 2 * SIZE}  # partition 2 is at its bound already
    batches = kl.Consumer(root).consume(three, start=ends, until=until, follow=True, values_only=True, poll_interval=0.02)
    producer = kl.Producer(root)
    producer.send_batch("three", [b"0-c", b"0-d"], partition=0)
    assert next(batches) == kl.Batch("three", 0, 2 * SIZE, 3 * SIZE, [b"0-c"])  # 0-d is past the bound
    producer.send("three", b"1-c", partition=1)
    assert [(b.partition, b.messages) for b in batches] == [(1, [b"1-c"])]  # and the follow ends


def test_until_time_ends_a_follow_at_a_later_message_or_when_caught_up_past_the_time(root, three):
    soon = time.time_ns() // 1_000_000 + 300
    ends = dict.fromkeys(range(3), 2 * SIZE)
    batches = kl.Consumer(root).consume(three, start=ends, until_time=soon, follow=True, values_only=True, poll_interval=0.02)
    producer = kl.Producer(root)
    producer.send_batch("three", [b"0-c", b"0-d"], partition=0, timestamp=soon - 1)
    producer.send("three", b"0-e", partition=0, timestamp=soon)
    assert next(batches) == kl.Batch("three", 0, 2 * SIZE, 4 * SIZE, [b"0-c", b"0-d"])
    assert list(batches) == []  # partitions 1 and 2 end, caught up, once the clock passes the time
    assert time.time_ns() // 1_000_000 >= soon


@pytest.mark.parametrize(
    "partitions, start, error",
    [
        (None, 0, "a start offset (0) is for one partition, not 3"),
        (None, {0: 0, 1: 0}, "start gives no offset for partition 2"),
        ([0], "oldest", "start must be earliest, latest, an offset or a mapping of offsets, not 'oldest'"),
    ],
)
def test_a_bad_start_raises_invalid_config(root, three, partitions, start, error):
    with pytest.raises(kl.InvalidConfig) as raised:
        next(kl.Consumer(root).consume(three, partitions, start=start))
    assert str(raised.value) == error


def test_an_offset_past_the_end_raises_even_when_caught_up(root, topic):
    kl.Producer(root).send(topic, b"one")
    with pytest.raises(kl.OffsetOutOfRange):
        next(kl.Consumer(root).consume(topic, start=10_000))


def test_an_offset_inside_a_message_raises(root, topic):
    kl.Producer(root).send(topic, b"one")
    with pytest.raises(kl.InvalidOffset):
        next(kl.Consumer(root).consume(topic, start=3))


@pytest.mark.parametrize("reset, expected", [("earliest", [b"one"]), ("latest", [])])
def test_out_of_range_can_reset_without_follow(root, topic, reset, expected):
    kl.Producer(root).send(topic, b"one")
    got = kl.Consumer(root).consume(topic, start=10_000, reset=reset, values_only=True)
    assert [v for b in got for v in b.messages] == expected


@pytest.mark.parametrize("values_only", [False, True])
def test_the_valid_messages_before_damage_come_first_then_it_raises(root, damaged, values_only):
    batches = kl.Consumer(root).consume(damaged, values_only=values_only)
    first = next(batches)
    assert (first.offset, first.next_offset) == (0, SIZE)
    assert (first.messages if values_only else values_of(first.messages)) == [b"one"]
    with pytest.raises(kl.CorruptMessage) as raised:
        next(batches)
    assert (raised.value.offset, raised.value.reason) == (SIZE, "checksum mismatch")


def test_damage_where_the_read_starts_raises_at_once(root, damaged):
    with pytest.raises(kl.CorruptMessage) as raised:
        next(kl.Consumer(root).consume(damaged, start=SIZE))
    assert raised.value.offset == SIZE


def test_skip_corrupt_steps_over_damage_and_reports_it(root, damaged):
    skipped: list[kl.Skipped] = []
    batches = list(kl.Consumer(root).consume(damaged, values_only=True, skip_corrupt=True, on_skip=skipped.append))
    assert contents(batches) == [(0, 0, SIZE, [b"one"]), (0, 2 * SIZE, 3 * SIZE, [b"six"])]
    assert skipped == [kl.Skipped(damaged, 0, SIZE, 2 * SIZE, "checksum mismatch")]


def test_skip_corrupt_logs_a_warning_without_on_skip(root, damaged, caplog):
    with caplog.at_level(logging.WARNING, logger="kl.consumer"):
        got = [v for b in kl.Consumer(root).consume(damaged, values_only=True, skip_corrupt=True) for v in b.messages]
    assert got == [b"one", b"six"]
    assert caplog.messages == [f"skipped damaged data of {damaged}/0 from offset {SIZE} to {2 * SIZE}: checksum mismatch"]
