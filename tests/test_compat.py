"""Reading a real Kafka 0.7 segment (magic 0), in memory and as part of a kl partition.

The file ships in ``tests/data`` (see its README); these tests fail (not skip) when it is
missing.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kl
from kl.log.segment import list_segments, segment_name
from kl.log.state import STATE_FILE, PartitionState

from conftest import KAFKA07_SEGMENT, flipped, partition_dir, read_all, values_of

COUNT = 100
SIZE = 109  # length 4 + magic 1 + crc 4 + 100-byte payload
PAYLOAD = b"x" * 100


@pytest.fixture(scope="module")
def kafka_bytes() -> bytes:
    assert KAFKA07_SEGMENT.is_file(), f"the Kafka 0.7 sample segment is missing: {KAFKA07_SEGMENT}"
    return KAFKA07_SEGMENT.read_bytes()


def kafka_set(data: bytes, offset: int = 0, **kw) -> kl.MessageSet:
    return kl.MessageSet(data, offset, max_message_bytes=1 << 20, **kw)


def import_closed_segment(root: kl.Root, topic: str, data: bytes) -> None:
    """Make the Kafka file the first (closed) segment of partition 0 and start an empty
    active kl segment where it ends, publishing that in the state record."""
    directory = partition_dir(root, topic)
    os.unlink(directory / segment_name(0))
    (directory / "00000000000000000000.kafka").write_bytes(data)
    (directory / segment_name(len(data))).write_bytes(b"")
    end = len(data)
    state = PartitionState(0, end, end, end, end, 0, time.time_ns() // 1_000_000)
    (directory / STATE_FILE).write_bytes(state.encode())
    root.forget(topic)


# ----------------------------------------------------------------- in memory


def test_the_sample_is_100_messages_of_109_bytes(kafka_bytes):
    assert len(kafka_bytes) == COUNT * SIZE


def test_kl_reads_every_message_of_a_kafka_07_segment(kafka_bytes):
    messages = list(kafka_set(kafka_bytes))
    assert len(messages) == COUNT
    assert [x.offset for x in messages] == list(range(0, COUNT * SIZE, SIZE))
    assert [x.next_offset for x in messages] == list(range(SIZE, COUNT * SIZE + 1, SIZE))
    assert values_of(messages) == [PAYLOAD] * COUNT
    assert all(x.key is None and x.timestamp is None for x in messages)


def test_the_payloads_are_the_bytes_in_the_file(kafka_bytes):
    for msg in kafka_set(kafka_bytes):
        assert kafka_bytes[msg.offset + 9 : msg.next_offset] == msg.value


def test_the_values_fast_path_reads_a_kafka_07_segment(kafka_bytes):
    assert kafka_set(kafka_bytes).values() == ([PAYLOAD] * COUNT, COUNT * SIZE)


def test_every_stored_message_is_magic_0_and_valid(kafka_bytes):
    entries = list(kafka_set(kafka_bytes).entries())
    assert len(entries) == COUNT
    assert {(e.magic, e.size, e.problem) for e in entries} == {(0, SIZE, None)}
    assert kafka_set(kafka_bytes).valid_bytes() == len(kafka_bytes)


def test_offsets_start_at_the_segment_base(kafka_bytes):
    messages = list(kafka_set(kafka_bytes, 5_000_000))
    assert (messages[0].offset, messages[-1].next_offset) == (5_000_000, 5_000_000 + COUNT * SIZE)


def test_a_kafka_07_segment_cut_anywhere_yields_the_complete_messages(kafka_bytes):
    for cut in range(len(kafka_bytes) - 3 * SIZE, len(kafka_bytes) + 1):
        assert len(list(kafka_set(kafka_bytes[:cut]))) == cut // SIZE, cut


@settings(max_examples=300)
@given(st.integers(0, COUNT * SIZE * 8 - 1))
def test_a_bit_flip_in_a_kafka_07_segment_never_changes_a_message(kafka_bytes, bit):
    damaged = flipped(kafka_bytes, bit)
    try:
        messages = list(kafka_set(damaged, stable_offset=len(damaged)))
    except kl.CorruptMessage:
        return
    assert len(messages) < COUNT
    assert values_of(messages) == [PAYLOAD] * len(messages)


# ----------------------------------------------------------------- inside a kl partition


def test_segment_listing_accepts_the_kafka_suffix(kafka_bytes, tmp_path):
    shutil.copy(KAFKA07_SEGMENT, tmp_path)
    (tmp_path / segment_name(len(kafka_bytes))).write_bytes(b"")
    assert list_segments(str(tmp_path)) == [
        (0, "00000000000000000000.kafka"),
        (len(kafka_bytes), segment_name(len(kafka_bytes))),
    ]


def test_a_kafka_07_segment_copied_into_a_partition_is_read(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    messages = read_all(root, "legacy")
    assert len(messages) == COUNT
    assert [x.offset for x in messages] == list(range(0, COUNT * SIZE, SIZE))
    assert values_of(messages) == [PAYLOAD] * COUNT


def test_a_partition_with_a_kafka_07_segment_is_described(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    (info,) = root.describe("legacy").partitions
    assert info == kl.PartitionInfo(0, 2, 0, COUNT * SIZE, COUNT * SIZE)


def test_appends_follow_an_imported_kafka_07_segment(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    appended = kl.Producer(root).send("legacy", b"new in kl")
    assert appended.offset == COUNT * SIZE
    messages = read_all(root, "legacy")
    assert values_of(messages) == [PAYLOAD] * COUNT + [b"new in kl"]
    assert messages[-1].timestamp is not None


def test_fetch_inside_an_imported_kafka_07_segment(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    consumer = kl.Consumer(root)
    assert [x.offset for x in consumer.fetch("legacy", 0, 50 * SIZE, 3 * SIZE)] == [50 * SIZE, 51 * SIZE, 52 * SIZE]
    assert [x.offset for x in consumer.fetch("legacy", 0, 99 * SIZE)] == [99 * SIZE]
    with pytest.raises(kl.InvalidOffset):
        consumer.fetch("legacy", 0, 50 * SIZE + 9)


def test_a_damaged_imported_kafka_07_segment_is_corrupt(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", flipped(kafka_bytes, (10 * SIZE + 50) * 8))
    consumer = kl.Consumer(root)
    assert len(list(consumer.fetch("legacy", 0, 0, 10 * SIZE))) == 10
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        list(consumer.fetch("legacy", 0, 10 * SIZE))


def test_a_truncated_imported_kafka_07_segment_is_corrupt(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    os.truncate(partition_dir(root, "legacy") / "00000000000000000000.kafka", len(kafka_bytes) - 50)
    with pytest.raises(kl.CorruptMessage, match="file ends"):
        list(kl.Consumer(root).fetch("legacy", 0, 99 * SIZE))


def test_offset_back_counts_kafka_07_messages(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    assert kl.Consumer(root).offset_back("legacy", 0, 3) == 97 * SIZE


def test_offsets_before_skips_a_segment_without_timestamps(root, kafka_bytes):
    root.create_topic("legacy")
    import_closed_segment(root, "legacy", kafka_bytes)
    kl.Producer(root).send("legacy", b"stamped", timestamp=5000)
    assert kl.Consumer(root).offsets_before("legacy", 0, kl.EARLIEST, 1) == [0]
    assert kl.Consumer(root).offset_for_time("legacy", 0, 5000) == COUNT * SIZE


# ----------------------------------------------------------------- adopting a Kafka 0.7 partition with recover


def adopt_with_recover(root: kl.Root, topic: str) -> None:
    """What a user would do: put the Kafka files in an empty partition, run recovery."""
    from kl.log.recovery import recover

    directory = partition_dir(root, topic)
    for name in os.listdir(directory):
        os.unlink(directory / name)
    shutil.copy(KAFKA07_SEGMENT, directory)
    recover(root.log(topic, 0))
    root.forget(topic)


def test_recover_rebuilds_the_state_of_a_partition_holding_a_kafka_07_segment(root, kafka_bytes):
    root.create_topic("legacy")
    adopt_with_recover(root, "legacy")
    state = root.log("legacy", 0).state()
    assert (state.log_start_offset, state.log_end_offset) == (0, COUNT * SIZE)


def test_a_kafka_07_partition_adopted_with_recover_is_read(root, kafka_bytes):
    root.create_topic("legacy")
    adopt_with_recover(root, "legacy")
    assert values_of(read_all(root, "legacy")) == [PAYLOAD] * COUNT


def test_a_kafka_07_partition_adopted_with_recover_takes_appends(root, kafka_bytes):
    root.create_topic("legacy")
    adopt_with_recover(root, "legacy")
    appended = kl.Producer(root).send("legacy", b"new in kl")
    assert appended.offset == COUNT * SIZE
    assert values_of(read_all(root, "legacy")) == [PAYLOAD] * COUNT + [b"new in kl"]
    assert KAFKA07_SEGMENT.read_bytes() == (partition_dir(root, "legacy") / KAFKA07_SEGMENT.name).read_bytes()
