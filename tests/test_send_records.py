"""``Producer.send_records``: the records of a buffer split and framed by the core in one
pass (``kl produce``'s path), on each core."""

from __future__ import annotations

import pytest

import kl
from kl.log import message as m

from conftest import read_all, values_of

pytestmark = pytest.mark.usefixtures("each_core")


def everything(root: kl.Root, topic: str) -> list[list[bytes]]:
    return [values_of(read_all(root, topic, p)) for p in range(root.config(topic).partitions)]


def test_whole_records_are_appended_and_the_rest_is_left(root, topic):
    data = b"a\nbb\n\nccc\nunterminated"
    with kl.Producer(root) as producer:
        appended, took = producer.send_records(topic, data, partition=0)
    assert took == data.index(b"unterminated")
    assert [a.count for a in appended] == [4] and appended[0].partition == 0
    assert everything(root, topic) == [[b"a", b"bb", b"", b"ccc"]]
    assert all(msg.timestamp is not None and msg.key is None for msg in read_all(root, topic))


def test_the_delimiter_can_be_kept_and_longer_than_a_byte(root, topic):
    with kl.Producer(root) as producer:
        _, took = producer.send_records(topic, b"x--y----z-", b"--", keep_delimiter=True, partition=0)
    assert took == 8
    assert everything(root, topic) == [[b"x--", b"y--", b"--"]]


def test_nothing_whole_appends_nothing(root, topic):
    with kl.Producer(root) as producer:
        assert producer.send_records(topic, b"no delimiter", partition=0) == ([], 0)
        assert producer.send_records(topic, b"", partition=0) == ([], 0)
    assert everything(root, topic) == [[]]


def test_appends_take_the_partitions_in_turn_from_first_within_batch_bytes_and_max_records(root):
    root.create_topic("four", kl.TopicConfig(partitions=4))
    records = [b"%03d" % i for i in range(20)]
    with kl.Producer(root, batch_bytes=5 * (m.HEADER_SIZE + 3)) as producer:
        appended, took = producer.send_records("four", b"\n".join(records) + b"\n", first=2, max_records=4)
    assert took == 20 * 4
    assert [(a.partition, a.count) for a in appended] == [(2, 4), (3, 4), (0, 4), (1, 4), (2, 4)]
    got = everything(root, "four")
    assert sorted(v for part in got for v in part) == records
    assert got[2] == records[0:4] + records[16:20]


def test_a_record_too_large_stops_the_records_before_it_and_alone_raises(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=64))
    big = b"x" * (64 - m.HEADER_SIZE + 1)
    data = b"fits\n" + big + b"\nnever\n"
    with kl.Producer(root) as producer:
        appended, took = producer.send_records("small", data, partition=0)
        assert took == 5 and sum(a.count for a in appended) == 1
        with pytest.raises(kl.MessageTooLarge):
            producer.send_batch("small", [big], partition=0)
    assert everything(root, "small") == [[b"fits"]]


def test_a_kafka_07_topic_gets_magic_1_messages(root):
    root.create_topic("old", kl.TopicConfig(format="0.7", max_message_bytes=64))
    with kl.Producer(root) as producer:
        appended, took = producer.send_records("old", b"a\nbb\n" + b"y" * (64 - m.HEADER_SIZE + 1) + b"\n", partition=0)
    assert took == 5 and [a.count for a in appended] == [2]
    messages = read_all(root, "old")
    assert values_of(messages) == [b"a", b"bb"] and all(msg.timestamp is None for msg in messages)


def test_compressed_appends_hold_the_records(root, topic):
    with kl.Producer(root, compression="zstd") as producer:
        appended, _ = producer.send_records(topic, b"".join(b"r%d\n" % i for i in range(1000)), partition=0)
    assert sum(a.count for a in appended) == 1000
    assert everything(root, topic) == [[b"r%d" % i for i in range(1000)]]
