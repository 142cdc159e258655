"""A partition's log: segments, roll, binary search, reads, offsets, the published state."""

from __future__ import annotations

import os
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kl
from kl.log import message as m
from kl.log import segment as segment_module
from kl.log.segment import list_segments, parse_name, segment_name
from kl.log.state import STATE_FILE, PartitionState, read_state
from kl.log.validate import Checked

from conftest import (
    active_segment,
    flip_bit,
    flip_byte,
    grow_by,
    partition_dir,
    read_all,
    segment_files,
    shrink_to,
    values_of,
    write,
    write_each,
)
from faultlib import as_if_rebooted, wait_flushed

SMALL = kl.TopicConfig(segment_bytes=128, max_message_bytes=128)
"""Four 32-byte messages (10-byte values) fill a segment."""
SIZE = 32


def ten(root: kl.Root) -> kl.Log:
    """Topic "s" with ten 32-byte messages: segments at 0, 128 and 256; log end 320."""
    root.create_topic("s", SMALL)
    write_each(root, "s", [b"%010d" % i for i in range(10)], timestamp=1000)
    return root.log("s", 0)


def read(log: kl.Log, offset: int, max_bytes: int = 1 << 20) -> list[kl.Message]:
    return list(log.read(offset, max_bytes))


def publish(log: kl.Log, **fields: int) -> None:
    """Rewrite the partition's state record with some fields replaced (as a writer would)."""
    state = read_state(log.state_path)._replace(**fields)
    with open(log.state_path, "r+b") as f:
        f.write(state.encode())


# ----------------------------------------------------------------- segment names


def test_segment_names_are_the_base_offset_padded_to_20_digits():
    assert segment_name(0) == "00000000000000000000.kl"
    assert segment_name(1234) == "00000000000000001234.kl"
    assert len(segment_name(2**63 - 1)) == 23


def test_parse_name_accepts_kl_and_kafka_segments_only():
    assert parse_name("00000000000000001234.kl") == 1234
    assert parse_name("00000000000000001234.kafka") == 1234
    for other in ["state", "topic.json", "1234.kl", "00000000000000001234.kl.tmp", ".nfs000001",
                  "0000000000000000123x.kl", "00000000000000001234.log", "00000000000000001234"]:
        assert parse_name(other) is None, other


def test_list_segments_sorts_numerically_and_ignores_other_files(tmp_path):
    for name in [segment_name(300), segment_name(5), segment_name(40), "state", ".nfs1234", "x.kl"]:
        (tmp_path / name).write_bytes(b"")
    assert list_segments(str(tmp_path)) == [(5, segment_name(5)), (40, segment_name(40)), (300, segment_name(300))]


# ----------------------------------------------------------------- empty partition


def test_a_new_partition_has_one_empty_segment_and_a_state(root, topic):
    assert [p.name for p in segment_files(root, topic)] == ["00000000000000000000.kl"]
    assert (partition_dir(root, topic) / STATE_FILE).exists()
    state = root.log(topic, 0).state()
    assert (state.log_start_offset, state.active_base_offset, state.log_end_offset) == (0, 0, 0)


def test_reading_an_empty_partition_at_zero_is_empty(root, topic):
    assert read(root.log(topic, 0), 0) == []


def test_reading_an_empty_partition_past_zero_is_out_of_range(root, topic):
    with pytest.raises(kl.OffsetOutOfRange, match="holds offsets 0 to 0"):
        read(root.log(topic, 0), 1)


# ----------------------------------------------------------------- roll


def test_segments_roll_when_the_next_append_would_pass_segment_bytes(root):
    log = ten(root)
    assert [(s.base_offset, s.size_in_bytes) for s in log.segments()] == [(0, 128), (128, 128), (256, 64)]
    assert [p.name for p in segment_files(root, "s")] == [segment_name(0), segment_name(128), segment_name(256)]
    assert [os.path.getsize(p) for p in segment_files(root, "s")] == [128, 128, 64]


def test_the_state_names_the_active_segment_and_the_end(root):
    state = ten(root).state()
    assert (state.log_start_offset, state.active_base_offset, state.log_end_offset) == (0, 256, 320)
    assert state.last_append_offset == 288


def test_an_append_larger_than_the_rest_of_a_segment_starts_a_new_one(root):
    root.create_topic("s", SMALL)
    write_each(root, "s", [b"x" * 10])
    write(root, "s", [b"y" * 10] * 4)  # 128 bytes: does not fit behind the first 32
    assert [(s.base_offset, s.size_in_bytes) for s in root.log("s", 0).segments()] == [(0, 32), (32, 128)]


def test_a_batch_is_never_split_across_segments(root):
    root.create_topic("s", SMALL)
    for _ in range(5):
        write(root, "s", [b"z" * 10] * 3)
    sizes = [s.size_in_bytes for s in root.log("s", 0).segments()]
    assert sizes == [96, 96, 96, 96, 96]
    assert len(read_all(root, "s")) == 15


def test_size_in_bytes_adds_up_the_segments(root):
    assert ten(root).size_in_bytes() == 320


def test_rolled_segments_are_read_back_in_order(root):
    ten(root)
    got = read_all(root, "s")
    assert values_of(got) == [b"%010d" % i for i in range(10)]
    assert [x.offset for x in got] == list(range(0, 320, SIZE))


# ----------------------------------------------------------------- binary search boundaries


@pytest.mark.parametrize("base", [0, 128, 256])
def test_read_at_exactly_a_segment_base(root, base):
    got = read(ten(root), base)
    assert got[0].offset == base
    assert got[0].value == b"%010d" % (base // SIZE)


@pytest.mark.parametrize("last", [96, 224])
def test_read_of_the_last_message_of_a_closed_segment(root, last):
    got = read(ten(root), last)
    assert [(x.offset, x.next_offset) for x in got] == [(last, last + SIZE)]
    assert got[0].value == b"%010d" % (last // SIZE)


def test_a_read_stops_at_the_end_of_its_segment(root):
    got = read(ten(root), 64)
    assert [x.offset for x in got] == [64, 96]


def test_read_after_the_last_message_of_a_segment_continues_in_the_next(root):
    log = ten(root)
    (last,) = read(log, 96)
    assert read(log, last.next_offset)[0].offset == 128


def test_read_at_the_log_end_is_empty(root):
    log = ten(root)
    assert read(log, 320) == []
    assert log.read(320, 100).values() == ([], 320)


def test_read_of_the_last_message_of_the_log(root):
    got = read(ten(root), 288)
    assert [(x.offset, x.next_offset, x.value) for x in got] == [(288, 320, b"0000000009")]


def test_every_message_boundary_reads_back_its_own_message(root):
    log = ten(root)
    for i, offset in enumerate(range(0, 320, SIZE)):
        first = read(log, offset, 1)[0]
        assert (first.offset, first.value) == (offset, b"%010d" % i)


def test_a_reader_with_a_stale_segment_list_finds_new_segments(root):
    log = ten(root)
    assert read(log, 0)  # caches the segment list
    other = kl.Root(root.path)
    write_each(other, "s", [b"%010d" % i for i in range(10, 20)])
    assert read(log, 320)[0].value == b"0000000010"
    assert read(log, 512)[0].value == b"0000000016"
    assert [s.base_offset for s in log.segments()] == [0, 128, 256, 384, 512]


# ----------------------------------------------------------------- out of range and mid-message


def test_offset_above_the_end_is_out_of_range_naming_the_range(root):
    log = ten(root)
    with pytest.raises(kl.OffsetOutOfRange) as e:
        read(log, 321)
    assert "offset 321" in str(e.value) and "0 to 320" in str(e.value)
    assert (e.value.offset, e.value.log_start_offset, e.value.log_end_offset) == (321, 0, 320)


def test_negative_offset_is_out_of_range(root):
    with pytest.raises(kl.OffsetOutOfRange, match="offset -1 is out of range"):
        read(ten(root), -1)


def test_offset_below_the_log_start_is_out_of_range_naming_the_range(root):
    log = ten(root)
    os.unlink(os.path.join(log.directory, segment_name(0)))
    publish(log, log_start_offset=128)
    with pytest.raises(kl.OffsetOutOfRange) as e:
        read(log, 64)
    assert "offset 64" in str(e.value) and "128 to 320" in str(e.value)
    assert (e.value.log_start_offset, e.value.log_end_offset) == (128, 320)
    assert read(log, 128)[0].value == b"0000000004"
    assert [s.base_offset for s in log.segments()] == [128, 256]


def test_a_segment_deleted_under_a_reader_is_out_of_range(root):
    log = ten(root)
    assert read(log, 0)
    publish(log, log_start_offset=128)
    os.unlink(os.path.join(log.directory, segment_name(0)))
    with pytest.raises(kl.OffsetOutOfRange):
        read(log, 32)


def test_every_mid_message_offset_is_an_invalid_offset(root):
    log = ten(root)
    boundaries = set(range(0, 321, SIZE))
    for offset in range(320):
        if offset in boundaries:
            continue
        with pytest.raises(kl.InvalidOffset) as e:
            read(log, offset)
        assert f"offset {offset} is not the start of a message" in str(e.value)


def test_invalid_offset_names_the_nearest_messages(root):
    with pytest.raises(kl.InvalidOffset, match="nearest messages start at 160 and 192"):
        read(ten(root), 170)


def test_mid_message_offset_with_a_plausible_header_is_invalid(root):
    root.create_topic("p")
    # value bytes that look like the start of a long magic 0 message
    value = struct.pack(">iB", 5000, 0) + bytes(100)
    write_each(root, "p", [value] * 3)
    log = root.log("p", 0)
    for offset in [m.HEADER_SIZE, 1, 2, 3, 4]:
        with pytest.raises(kl.InvalidOffset):
            read(log, offset)
        with pytest.raises(kl.InvalidOffset):
            read(log, offset, 10)


def test_mid_message_offsets_in_a_large_segment_are_invalid(root):
    root.create_topic("big")
    write(root, "big", [b"v" * 300] * 2000)
    log = root.log("big", 0)
    for offset in [1, 5, 100, 323, 322 * 1000 + 7, 322 * 2000 - 1]:
        with pytest.raises(kl.InvalidOffset):
            read(log, offset, 64)


# ----------------------------------------------------------------- max_bytes


def test_max_bytes_returns_only_complete_messages(root):
    log = ten(root)
    assert [x.offset for x in read(log, 0, 70)] == [0, 32]
    assert [x.offset for x in read(log, 0, 64)] == [0, 32]
    assert [x.offset for x in read(log, 0, 63)] == [0]


def test_a_message_bigger_than_max_bytes_is_returned_whole(root, topic):
    big = os.urandom(200_000)
    write_each(root, topic, [big, b"after"])
    log = root.log(topic, 0)
    for max_bytes in [0, 1, 4, 5, 22, 1000]:
        got = read(log, 0, max_bytes)
        assert [x.value for x in got] == [big], max_bytes


def test_a_big_message_in_a_closed_segment_is_returned_whole(root):
    root.create_topic("b", kl.TopicConfig(segment_bytes=4096, max_message_bytes=4096))
    write_each(root, "b", [b"a" * 3000, b"b" * 3000, b"c" * 3000])
    log = root.log("b", 0)
    assert [s.base_offset for s in log.segments()] == [0, 3022, 6044]
    assert values_of(read(log, 3022, 10)) == [b"b" * 3000]
    assert values_of(read(log, 0, 1)) == [b"a" * 3000]


# ----------------------------------------------------------------- the published state


def test_bytes_past_the_published_end_are_invisible_to_readers(root, topic):
    write_each(root, topic, [b"a", b"b"])
    grow_by(active_segment(root, topic), m.encode(b"unpublished"))
    log = root.log(topic, 0)
    assert log.log_end_offset == 46
    assert values_of(read_all(root, topic)) == [b"a", b"b"]
    with pytest.raises(kl.OffsetOutOfRange):
        read(log, 46 + 1)


def test_a_reader_reads_only_below_the_published_end(root, topic):
    write_each(root, topic, [b"a", b"b", b"c"])
    log = root.log(topic, 0)
    publish(log, log_end_offset=46, last_append_offset=23, flushed_offset=46)
    assert values_of(read(log, 0)) == [b"a", b"b"]
    assert read(log, 46) == []


def test_the_state_record_round_trips():
    state = PartitionState(1, 2, 3, 4, 5, 6, 7)
    assert PartitionState.decode(state.encode(), "x") == state
    assert state.stable_offset == 4


@pytest.mark.parametrize("position", range(0, 60, 7))
def test_a_damaged_state_record_is_corrupt_state(position):
    data = bytearray(PartitionState(0, 0, 10, 10, 0, 1, 1).encode())
    data[position] ^= 0x01
    with pytest.raises(kl.CorruptState):
        PartitionState.decode(bytes(data), "x")


def test_a_short_state_record_is_corrupt_state():
    with pytest.raises(kl.CorruptState, match="bytes, expected"):
        PartitionState.decode(PartitionState.empty().encode()[:-1], "x")


def test_a_state_with_inconsistent_offsets_is_corrupt_state():
    with pytest.raises(kl.CorruptState, match="inconsistent"):
        PartitionState.decode(PartitionState(10, 5, 20, 0, 0, 0, 0).encode(), "x")


def test_a_reader_of_a_damaged_state_file_gets_corrupt_state(root, topic):
    write_each(root, topic, [b"a"])
    flip_byte(partition_dir(root, topic) / STATE_FILE, 10)
    with pytest.raises(kl.CorruptState):
        root.log(topic, 0).read(0, 100)


def test_a_missing_partition_is_topic_not_found(root, topic):
    log = root.log(topic, 0)
    shutil.rmtree(log.directory)
    with pytest.raises(kl.TopicNotFound):
        log.read(0, 100)


def test_a_missing_state_says_run_kl_recover(root, topic):
    write_each(root, topic, [b"a"])
    log = root.log(topic, 0)
    os.unlink(log.state_path)
    with pytest.raises(kl.CorruptState, match="state .* is missing; run 'kl recover'"):
        log.read(0, 100)
    with pytest.raises(kl.CorruptState, match="run 'kl recover'"):
        kl.Producer(restarted(root)).send(topic, b"b", partition=0)


def test_a_damaged_state_says_run_kl_recover(root, topic):
    log = root.log(topic, 0)
    flip_byte(log.state_path, 10)
    with pytest.raises(kl.CorruptState, match="run 'kl recover'"):
        log.read(0, 100)


# ----------------------------------------------------------------- corruption and torn tails


def test_damage_in_a_closed_segment_is_corrupt_message(root):
    log = ten(root)
    flip_byte(segment_files(root, "s")[0], 40)  # inside the second message
    assert read(log, 0, 32)[0].value == b"0000000000"
    with pytest.raises(kl.CorruptMessage) as e:
        read(log, 0)
    assert e.value.offset == 32
    assert e.value.path.endswith(segment_name(0))
    with pytest.raises(kl.CorruptMessage):
        read(log, 32)


def test_every_bit_flip_in_a_closed_segment_is_reported_never_skipped(root):
    log = ten(root)
    path = segment_files(root, "s")[0]
    for bit in range(SIZE * 8, 2 * SIZE * 8):  # every bit of the second message
        flip_bit(path, bit)
        try:
            got = read(log, 0)
            assert values_of(got) == [b"0000000000"], bit
            with pytest.raises((kl.CorruptMessage, kl.InvalidOffset)):
                read(log, SIZE)
        except kl.CorruptMessage as e:
            assert e.offset == SIZE, bit
        finally:
            flip_bit(path, bit)
    assert len(read(log, 0)) == 4


def test_damage_below_the_stable_offset_of_the_active_segment_is_corrupt_message(root, topic):
    kl.Producer(root, fsync=True).send_batch(topic, [b"a", b"b"], partition=0)
    kl.Producer(root, fsync=True).send(topic, b"c", partition=0)
    log = root.log(topic, 0)
    as_if_rebooted(log)
    assert log.state().stable_offset == log.state().flushed_offset == 69
    flip_byte(active_segment(root, topic), 30)
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        read(log, 0)


def test_in_the_boot_that_wrote_it_all_published_data_is_intact_so_damage_is_corruption(root, topic):
    write(root, topic, [b"a", b"b", b"c"])  # one append, not fsynced
    log = root.log(topic, 0)
    assert log.state().flushed_offset == 0
    assert log.state().stable_offset == log.state().log_end_offset == 69
    flip_byte(active_segment(root, topic), 46 + 22)
    with pytest.raises(kl.CorruptMessage, match="offset 46 .*checksum mismatch"):
        read(log, 0)
    kl.Producer(restarted(root)).send(topic, b"d", partition=0)  # the next writer cuts nothing
    assert os.path.getsize(active_segment(root, topic)) == 92


def test_damage_in_the_last_append_is_a_torn_tail_after_a_reboot(root, topic):
    write_each(root, topic, [b"a", b"b", b"c"])
    log = root.log(topic, 0)
    as_if_rebooted(log)
    assert log.state().stable_offset <= 46
    flip_byte(active_segment(root, topic), 46 + 22)
    assert values_of(read(log, 0)) == [b"a", b"b"]


def test_a_segment_shorter_than_its_published_end_reads_as_a_torn_tail_after_a_reboot(root, topic):
    write_each(root, topic, [b"a", b"b", b"c"])
    as_if_rebooted(root.log(topic, 0))
    shrink_to(active_segment(root, topic), 50)
    assert values_of(read(root.log(topic, 0), 0)) == [b"a", b"b"]


def test_a_segment_shorter_than_its_published_end_in_the_boot_that_wrote_it_is_corrupt(root, topic):
    write_each(root, topic, [b"a", b"b", b"c"])
    shrink_to(active_segment(root, topic), 50)
    with pytest.raises(kl.CorruptMessage, match="file ends"):
        read(root.log(topic, 0), 0)


def test_a_segment_shorter_than_its_flushed_end_is_corrupt(root, topic):
    kl.Producer(root, fsync=True).send_batch(topic, [b"a", b"b", b"c"], partition=0)
    kl.Producer(root, fsync=True).send(topic, b"d", partition=0)
    shrink_to(active_segment(root, topic), 30)
    with pytest.raises(kl.CorruptMessage):
        read(root.log(topic, 0), 0)


def restarted(root: kl.Root) -> kl.Root:
    """A fresh handle on the same root, as a new process would open it."""
    return kl.Root(root.path, lock_timeout=root.lock_timeout)


def test_the_next_append_cuts_a_torn_tail_left_by_a_crashed_writer(root, topic):
    write_each(root, topic, [b"a", b"b"])
    grow_by(active_segment(root, topic), m.encode(b"half written")[:-5])
    write_each(restarted(root), topic, [b"c"])
    assert values_of(read_all(root, topic)) == [b"a", b"b", b"c"]
    assert [x.offset for x in read_all(root, topic)] == [0, 23, 46]
    assert os.path.getsize(active_segment(root, topic)) == 69


def test_a_writer_that_did_not_see_the_crash_still_writes_at_the_published_end(root, topic):
    write_each(root, topic, [b"a", b"b"])
    grow_by(active_segment(root, topic), m.encode(b"half written")[:-5])
    write_each(root, topic, [b"c"])
    assert values_of(read_all(root, topic)) == [b"a", b"b", b"c"]
    assert root.log(topic, 0).log_end_offset == 69
    write_each(restarted(root), topic, [b"d"])
    assert values_of(read_all(root, topic)) == [b"a", b"b", b"c", b"d"]
    assert os.path.getsize(active_segment(root, topic)) == 92


def test_the_next_append_does_not_adopt_an_unpublished_message(root, topic):
    write_each(root, topic, [b"a"])
    grow_by(active_segment(root, topic), m.encode(b"never published"))
    write_each(restarted(root), topic, [b"b"])
    assert values_of(read_all(root, topic)) == [b"a", b"b"]


def test_the_next_append_cuts_garbage_past_the_end(root, topic):
    write_each(root, topic, [b"a"])
    grow_by(active_segment(root, topic), os.urandom(1000))
    write_each(restarted(root), topic, [b"b"])
    assert values_of(read_all(root, topic)) == [b"a", b"b"]
    assert root.log(topic, 0).log_end_offset == 46
    assert os.path.getsize(active_segment(root, topic)) == 46


def test_the_next_append_after_a_lost_tail_continues_from_the_valid_end(root, topic):
    write_each(root, topic, [b"a", b"b", b"c"])
    as_if_rebooted(root.log(topic, 0))
    shrink_to(active_segment(root, topic), 50)  # c lost in a crash before it was flushed
    write_each(restarted(root), topic, [b"d"])
    got = read_all(root, topic)
    assert values_of(got) == [b"a", b"b", b"d"]
    assert got[-1].offset == 46


def test_an_append_refuses_a_segment_shorter_than_its_flushed_end(root, topic):
    kl.Producer(root, fsync=True).send_batch(topic, [b"a", b"b"], partition=0)
    kl.Producer(root, fsync=True).send(topic, b"c", partition=0)
    shrink_to(active_segment(root, topic), 10)
    with pytest.raises(kl.CorruptMessage, match="kl recover"):
        write_each(restarted(root), topic, [b"d"])


def test_a_small_read_of_a_large_unflushed_active_segment_does_not_scan_it_all(root, monkeypatch):
    root.create_topic("u", kl.TopicConfig(flush_messages=0, flush_ms=0))  # flushing off: nothing is stable
    write(root, "u", [b"x" * 200] * 250_000)  # 55 MB in the active segment
    log = root.log("u", 0)
    as_if_rebooted(log)
    assert log.state().stable_offset == 0
    read_bytes = []
    real_pread = os.pread
    monkeypatch.setattr(segment_module.os, "pread", lambda fd, n, pos: read_bytes.append(n) or real_pread(fd, n, pos))
    for offset in (0, 222 * 100_000, log.log_end_offset - 222):
        assert len(read(log, offset, 1000)) >= 1
    assert 0 < sum(read_bytes) < 2 << 20  # the last append (256 KiB) is checked whole, not the 55 MB


# ----------------------------------------------------------------- flush policy


def test_fsync_flushes_the_state(root, topic):
    kl.Producer(root, fsync=True).send(topic, b"a", partition=0)
    state = root.log(topic, 0).state()
    assert state.flushed_offset == state.log_end_offset == 23
    assert state.unflushed_messages == 0


def test_flush_messages_triggers_a_flush(root):
    root.create_topic("f", kl.TopicConfig(flush_messages=3, flush_ms=0))
    write_each(root, "f", [b"a", b"b"])
    assert root.log("f", 0).state().flushed_offset == 0
    assert root.log("f", 0).state().unflushed_messages == 2
    write_each(root, "f", [b"c"])  # due: the flusher fsyncs in the background
    assert wait_flushed(root.log("f", 0))
    assert root.log("f", 0).state().flushed_offset == 69


def test_no_flush_policy_leaves_data_unflushed_until_flush(root):
    root.create_topic("f", kl.TopicConfig(flush_messages=0, flush_ms=0))
    log = root.log("f", 0)
    log.append(Checked.framed(m.encode(b"a"), 1))
    assert log.state().flushed_offset == 0
    log.flush()
    assert log.state().flushed_offset == 23


def test_producer_close_flushes(root):
    root.create_topic("f", kl.TopicConfig(flush_messages=0, flush_ms=0))
    with kl.Producer(root) as producer:
        producer.send("f", b"a")
        assert root.log("f", 0).state().flushed_offset == 0
    assert root.log("f", 0).state().flushed_offset == 23


def test_a_roll_flushes_the_closed_segment(root):
    log = ten(root)
    state = log.state()
    assert state.flushed_offset >= state.active_base_offset


# ----------------------------------------------------------------- offsets by time and count


def timed(root: kl.Root) -> kl.Log:
    """Ten messages in segments at 0, 128, 256, stamped 1000, 1010, ... 1090."""
    root.create_topic("s", SMALL)
    for i in range(10):
        kl.Producer(root).send("s", b"%010d" % i, partition=0, timestamp=1000 + 10 * i)
    return root.log("s", 0)


def test_offsets_before_earliest_and_latest(root):
    log = timed(root)
    assert log.offsets_before(kl.EARLIEST, 1) == [0]
    assert log.offsets_before(kl.LATEST, 1) == [320]
    assert log.offsets_before(kl.LATEST, 0) == []


def test_offsets_before_gives_segment_starts_newest_first(root):
    log = timed(root)
    assert log.offsets_before(1000, 10) == [0]
    assert log.offsets_before(1039, 10) == [0]
    assert log.offsets_before(1040, 10) == [128, 0]
    assert log.offsets_before(1085, 10) == [256, 128, 0]
    assert log.offsets_before(1085, 2) == [256, 128]


def test_offsets_before_a_time_older_than_the_log_is_empty(root):
    assert timed(root).offsets_before(999, 10) == []


def test_offsets_before_a_time_after_the_whole_log_includes_the_log_end(root):
    # the docstring: "the log end is included when the whole log is" (Kafka 0.7 does this too)
    assert timed(root).offsets_before(10**13, 10) == [320, 256, 128, 0]


def test_offsets_before_of_an_empty_partition(root, topic):
    log = root.log(topic, 0)
    assert log.offsets_before(kl.LATEST, 5) == [0]
    assert log.offsets_before(kl.EARLIEST, 5) == [0]
    assert log.offsets_before(10**13, 5) in ([], [0])


def test_offset_for_time_finds_the_first_message_at_or_after(root):
    log = timed(root)
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(1000) == 0
    assert log.offset_for_time(1001) == 32
    assert log.offset_for_time(1040) == 128
    assert log.offset_for_time(1041) == 160
    assert log.offset_for_time(1090) == 288
    assert log.offset_for_time(1091) == 320


def test_offset_for_time_of_an_empty_partition_is_its_end(root, topic):
    assert root.log(topic, 0).offset_for_time(12345) == 0


def test_offset_back_counts_messages_from_the_end(root):
    log = timed(root)
    assert log.offset_back(1) == 288
    assert log.offset_back(3) == 224
    assert log.offset_back(6) == 128  # across a segment boundary
    assert log.offset_back(10) == 0
    assert log.offset_back(1000) == 0


def test_offset_back_zero_is_the_log_end(root):
    assert timed(root).offset_back(0) == 320


def test_offset_back_reads_a_compressed_batch_whole(root, topic):
    write(root, topic, [b"a", b"b"])
    write(root, topic, [b"c", b"d", b"e"], compression="zstd")
    log = root.log(topic, 0)
    assert log.offset_back(1) == 46
    assert log.offset_back(3) == 46
    assert log.offset_back(4) == 23


def test_position_back_skips_the_first_messages_of_a_compressed_batch(root, topic):
    write(root, topic, [b"a", b"b"])
    write(root, topic, [b"c", b"d", b"e"], compression="zstd")
    log = root.log(topic, 0)
    assert log.position_back(1) == kl.Position(46, skip=2)
    assert log.position_back(3) == kl.Position(46, skip=0)
    assert log.position_back(4) == kl.Position(23, skip=0)
    assert log.position_back(0) == kl.Position(log.log_end_offset)


def test_offset_back_of_an_empty_partition(root, topic):
    assert root.log(topic, 0).offset_back(5) == 0


# ----------------------------------------------------------------- read after append (property)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.lists(st.binary(max_size=60), min_size=1, max_size=8), min_size=1, max_size=12),
    codec=st.sampled_from([None, "zstd", "gzip"]),
    data=st.data(),
)
def test_read_after_append_returns_what_was_appended(tmp_path_factory, batches, codec, data):
    root = kl.Root(tmp_path_factory.mktemp("r"))
    root.create_topic("p", kl.TopicConfig(segment_bytes=512, max_message_bytes=512))
    producer = kl.Producer(root, compression=codec)
    for values in batches:
        producer.send_batch("p", values, partition=0)
    expected = [v for values in batches for v in values]
    assert values_of(read_all(root, "p", max_bytes=data.draw(st.integers(1, 700)))) == expected
    log = root.log("p", 0)
    boundaries = [x.offset for x in read_all(root, "p")]
    start = data.draw(st.sampled_from(boundaries))
    got = read(log, start, data.draw(st.integers(0, 700)))
    assert got and got[0].offset == start
