"""``kl.log.dump.dump_file``: a message-by-message listing of any segment, clean or damaged,
kl's own or Kafka 0.7's; it stops at the first bad message and says why."""

from __future__ import annotations

import itertools
import shutil
import struct
import tracemalloc
from pathlib import Path

import pytest

import kl
from kl.log import message as m
from kl.log.dump import dump_file
from kl.log.recovery import recover

from faultlib import append_bytes, flip_bit, read_log, shrink_to

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores

TS = 1_700_000_000_000
KAFKA07 = Path(__file__).resolve().parent / "data" / "kafka-0.7" / "MagicByte0-0" / "00000000000000000000.kafka"
NO_FLUSH = kl.TopicConfig(flush_messages=0, flush_ms=0)


def segment(root: kl.Root, *, compression: str | None = None) -> tuple[Path, list[kl.Message]]:
    """Topic "t": a batch of 4 (one keyed), then 3 single messages; its only segment."""
    root.create_topic("t", NO_FLUSH)
    producer = kl.Producer(root, compression=compression)
    producer.send_batch("t", [b"v%d" % i for i in range(4)], keys=[None, b"key1", None, None], partition=0, timestamp=TS)
    for i in range(3):
        producer.send("t", b"single-%d" % i, partition=0, timestamp=TS + 1 + i)
    producer.close()
    log = root.log("t", 0)
    return Path(log.segments()[0].path), read_log(log)


def test_a_clean_segment_lists_every_message(root):
    path, messages = segment(root)
    records = list(dump_file(str(path)))
    assert len(records) == 7
    assert all(r.valid and r.problem is None for r in records)
    assert [r.offset for r in records] == [msg.offset for msg in messages]
    assert [r.position for r in records] == [msg.offset for msg in messages]  # base offset 0
    assert [r.size for r in records] == [msg.next_offset - msg.offset for msg in messages]
    assert sum(r.size for r in records) == path.stat().st_size
    assert {r.magic for r in records} == {m.CURRENT_MAGIC}
    assert {r.codec for r in records} == {"none"}
    assert [(r.timestamp, r.key, r.value) for r in records] == [(msg.timestamp, msg.key, msg.value) for msg in messages]
    assert records[1].key == b"key1" and records[0].key is None


def test_the_base_offset_comes_from_the_file_name_or_the_caller(root, tmp_path):
    path, _ = segment(root)
    renamed = tmp_path / "00000000000000001000.kl"
    shutil.copy(path, renamed)
    assert [r.offset for r in dump_file(str(renamed))][:2] == [1000, 1000 + 24]
    other = tmp_path / "copy.bin"
    shutil.copy(path, other)
    assert list(dump_file(str(other)))[0].offset == 0
    assert list(dump_file(str(other), base_offset=5))[0].offset == 5


def test_a_damaged_segment_is_listed_up_to_the_damage_with_the_reason(root):
    path, messages = segment(root)
    flip_bit(path, (messages[4].offset + 25) * 8)
    records = list(dump_file(str(path)))
    assert [r.valid for r in records] == [True] * 4 + [False]
    assert records[-1].offset == messages[4].offset
    assert records[-1].problem == "checksum mismatch"
    assert records[-1].value is None


def test_a_truncated_segment_says_the_file_ends_inside_a_message(root):
    path, messages = segment(root)
    shrink_to(path, messages[-1].offset + 10)
    records = list(dump_file(str(path)))
    assert len(records) == 7 and not records[-1].valid
    assert records[-1].offset == messages[-1].offset
    assert "file ends inside a message" in records[-1].problem


@pytest.mark.parametrize("tail, reason", [(b"\0" * 100, "bad length 0"), (struct.pack(">iB", 0x7FFFFFFF, 2), "bad length"),
                                          (struct.pack(">iB", 40, 9) + b"x" * 40, "unknown magic 9")])
def test_a_bad_tail_is_named_without_allocating(root, tail, reason):
    path, messages = segment(root)
    append_bytes(path, tail)
    tracemalloc.start()
    try:
        records = list(dump_file(str(path)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(records) == 8 and records[-1].offset == messages[-1].next_offset
    assert reason in records[-1].problem
    assert peak < 1 << 20


@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_deep_lists_the_messages_inside_a_compressed_batch(root, codec):
    path, messages = segment(root, compression=codec)
    shallow = list(dump_file(str(path)))
    assert [r.codec for r in shallow] == [codec] * 4  # one wrapper for the batch, one per single send
    assert all(r.inner == [] for r in shallow)
    deep = list(dump_file(str(path), deep=True))
    assert all(r.valid for r in deep)
    batch = deep[0]
    assert [(i.key, i.value, i.timestamp) for i in batch.inner] == [
        (None, b"v0", TS), (b"key1", b"v1", TS), (None, b"v2", TS), (None, b"v3", TS)
    ]
    assert {i.offset for i in batch.inner} == {batch.offset}
    assert [i.value for r in deep for i in r.inner] == [msg.value for msg in messages]


def test_deep_on_a_damaged_compressed_batch_reports_it(root):
    path, _ = segment(root, compression="zstd")
    records = list(dump_file(str(path), deep=True))
    # Damage the compressed payload but keep the wrapper's checksum right, so only decompression fails.
    first = records[0]
    data = bytearray(path.read_bytes())
    body_at = first.position + m.KEY_OFFSET
    data[body_at + 4 : body_at + 8] = b"\xff\xff\xff\xff"
    crc = m.crc_of(2, m.CODEC_ZSTD, bytes(data[first.position + m.TIMESTAMP_OFFSET : first.position + first.size]))
    struct.pack_into(">I", data, first.position + m.CRC_OFFSET, crc)
    path.write_bytes(bytes(data))
    records = list(dump_file(str(path), deep=True))
    assert records[0].problem and "compressed batch" in records[0].problem
    assert [r.valid for r in records[1:]] == [True] * 3


def test_a_repaired_segment_shows_the_padding(root):
    path, messages = segment(root)
    flip_bit(path, (messages[2].offset + 25) * 8)
    recover(root.log("t", 0), deep=True, repair=True)
    records = list(dump_file(str(path)))
    assert all(r.valid for r in records)
    assert [r.codec for r in records].count("padding") == 1
    assert [r.offset for r in records] == [msg.offset for msg in messages]


def test_the_kafka_0_7_sample_segment_lists_100_magic_0_messages():
    assert KAFKA07.is_file(), f"the Kafka 0.7 sample segment is missing: {KAFKA07}"
    records = list(dump_file(str(KAFKA07)))
    assert len(records) == 100
    assert all(r.valid for r in records)
    assert {r.magic for r in records} == {0}
    assert {r.codec for r in records} == {"none"}
    assert all(r.timestamp is None and r.key is None for r in records)
    assert records[0].offset == 0
    assert all(b.offset == a.offset + a.size for a, b in itertools.pairwise(records))
    assert records[-1].offset + records[-1].size == KAFKA07.stat().st_size
    assert all(r.value == b"x" * (r.size - 9) for r in records)


def test_a_damaged_copy_of_the_kafka_0_7_segment_stops_at_the_damage(tmp_path):
    assert KAFKA07.is_file(), f"the Kafka 0.7 sample segment is missing: {KAFKA07}"
    copy = tmp_path / KAFKA07.name
    shutil.copy(KAFKA07, copy)
    copy.chmod(0o644)
    flip_bit(copy, (109 * 50 + 20) * 8)
    records = list(dump_file(str(copy)))
    assert len(records) == 51 and records[-1].offset == 109 * 50
    assert records[-1].problem == "checksum mismatch"


def test_a_segment_of_many_reads_and_a_message_larger_than_one_read_is_listed_whole(root):
    root.create_topic("big", kl.TopicConfig(max_message_bytes=4 << 20, flush_messages=0, flush_ms=0))
    producer = kl.Producer(root)
    producer.send_batch("big", [b"%07d" % i * 8 for i in range(40_000)], partition=0)  # 3.4 MB
    producer.send("big", b"x" * (3 << 19), key=b"large", partition=0)  # 1.5 MiB: more than one read
    producer.send_batch("big", [b"after %d" % i for i in range(1000)], partition=0)
    producer.close()
    log = root.log("big", 0)
    records = list(dump_file(log.segments()[0].path))
    messages = read_log(log)
    assert len(records) == len(messages) == 41_001
    assert all(r.valid for r in records)
    assert [(r.offset, r.size, r.key, r.value) for r in records] == [
        (msg.offset, msg.next_offset - msg.offset, msg.key, msg.value) for msg in messages
    ]
