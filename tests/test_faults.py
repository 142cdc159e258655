"""Fault injection: torn, zeroed, garbage and bit-flipped tails, mid-log damage, hostile
length fields, and kill -9 of producer processes (leveldb style: small named cases).

The layout every damage case starts from (``layout``): one partition whose active
segment holds set A (5 messages) and set B (5 messages), both flushed, then set C (3
messages, one with a key), the last append, not yet fsynced; then the machine
"reboots" (the state is marked as written in another boot).  So ``stable_offset`` is
where C starts: C is the tail a crash may tear, A and B are committed data.
"""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

import kl
from kl.log import message as m
from kl.log.messageset import MessageSet
from kl.log.recovery import recover
from kl.log.segment import segment_name

from faultlib import (
    OrderChecker,
    append_bytes,
    as_if_rebooted,
    flip_bit,
    fresh_log,
    payload,
    read_log,
    run_kill_trials,
    shrink_to,
    snapshot,
    tail_facts,
    write_at,
)

TS = 1_700_000_000_000
NO_FLUSH = kl.TopicConfig(flush_messages=0, flush_ms=0)
"""Only explicit flushes (``Producer.flush``/``close``): the tests decide what is stable."""


@dataclass
class Layout:
    root: kl.Root
    log: kl.Log
    path: Path
    """The active segment."""
    messages: list[kl.Message]
    """Every message of A, B and C as read before any damage."""
    c_start: int
    c_end: int
    original: dict[str, bytes]

    @property
    def committed(self) -> list[kl.Message]:
        return [msg for msg in self.messages if msg.offset < self.c_start]

    def restore(self) -> None:
        """Put the segment and state back byte for byte (same inodes)."""
        for name, data in self.original.items():
            with open(os.path.join(self.log.directory, name), "r+b") as f:
                f.write(data)
                f.truncate(len(data))

    def fresh(self) -> kl.Log:
        return fresh_log(self.log)


def build(root: kl.Root, *, compression: str | None = None, config: kl.TopicConfig = NO_FLUSH) -> Layout:
    root.create_topic("t", config)
    producer = kl.Producer(root, compression=compression)
    producer.send_batch("t", [b"a%d" % i * (i + 1) for i in range(5)], partition=0, timestamp=TS)
    producer.send_batch("t", [b"b%d" % i * 3 for i in range(5)], partition=0, timestamp=TS + 1)
    producer.close()  # flushes A and B
    c = producer.send_batch("t", [b"c0", b"c1" * 5, b"c2" * 3], keys=[None, b"key", None], partition=0, timestamp=TS + 2)
    log = root.log("t", 0)
    assert log.state().stable_offset == log.state().log_end_offset  # this boot wrote it: all of it is intact
    as_if_rebooted(log)
    state = log.state()
    assert state.stable_offset == c[0].offset == state.last_append_offset
    assert state.flushed_offset == c[0].offset < state.log_end_offset == c[-1].next_offset
    messages = read_log(log)
    assert len(messages) == 13
    directory = Path(log.directory)
    return Layout(root, log, directory / "00000000000000000000.kl", messages, c[0].offset, c[-1].next_offset,
                  snapshot(directory))


@pytest.fixture
def layout(root) -> Layout:
    return build(root)


def values(messages) -> list[bytes]:
    return [msg.value for msg in messages]


def stream_all(root: kl.Root, **kw) -> list[kl.Message]:
    """Everything ``Consumer.stream`` yields from the log start before it goes idle."""
    return list(kl.Consumer(kl.Root(root.path)).stream("t", 0, 0, idle_timeout=0, poll_interval=0.001, **kw))


def report_problems(problems: list[str]) -> None:
    assert not problems, f"{len(problems)} cases failed, e.g.:\n" + "\n".join(problems[:15])


# ----------------------------------------------------------------- torn tails: truncation


def test_truncating_the_last_set_at_every_byte_reads_the_complete_messages_before_it(layout):
    problems = []
    for cut in range(layout.c_start, layout.c_end):
        layout.restore()
        shrink_to(layout.path, cut)
        expected = [msg for msg in layout.messages if msg.next_offset <= cut]
        try:
            got = read_log(layout.fresh())
            streamed = stream_all(layout.root)
        except kl.KlError as e:
            problems.append(f"cut at {cut}: reader raised {e!r}")
            continue
        if got != expected:
            problems.append(f"cut at {cut}: read {values(got)[10:]}, expected {values(expected)[10:]}")
        if values(streamed) != values(expected):
            problems.append(f"cut at {cut}: stream gave {values(streamed)[10:]}")
    report_problems(problems)


def test_recover_after_truncating_the_last_set_at_every_byte_keeps_exactly_the_complete_messages(layout):
    problems = []
    for cut in range(layout.c_start, layout.c_end):
        layout.restore()
        shrink_to(layout.path, cut)
        expected = [msg for msg in layout.messages if msg.next_offset <= cut]
        kept = max(msg.next_offset for msg in expected)
        report = recover(layout.fresh())
        state = layout.log.state()
        if report.cut_bytes != cut - kept:
            problems.append(f"cut at {cut}: recover cut {report.cut_bytes} bytes, expected {cut - kept}")
        if state.log_end_offset != kept or os.path.getsize(layout.path) != kept:
            problems.append(
                f"cut at {cut}: after recover log end {state.log_end_offset}, file {os.path.getsize(layout.path)} "
                f"bytes, expected both {kept}"
            )
        if not report.findings or report.unrepaired:
            problems.append(f"cut at {cut}: findings {report.findings}")
        if read_log(layout.fresh()) != expected:
            problems.append(f"cut at {cut}: after recover read {values(read_log(layout.fresh()))[10:]}")
        again = recover(layout.fresh())
        if again.findings:
            problems.append(f"cut at {cut}: a second recover found {again.findings}")
    report_problems(problems)


@pytest.mark.parametrize("into", [0, 1, 4, 5, 21, 22, 23])
def test_the_next_writer_continues_after_the_complete_messages_of_a_truncated_set(layout, into):
    c1 = layout.messages[11]  # the second message of C
    shrink_to(layout.path, c1.offset + into)
    appended = kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0)
    assert appended.offset == c1.offset
    assert values(read_log(layout.fresh())) == values(layout.messages[:11]) + [b"after"]
    assert os.path.getsize(layout.path) == appended.next_offset == layout.log.state().log_end_offset


def test_a_file_shorter_than_the_stable_offset_is_corruption_not_a_torn_tail(layout):
    shrink_to(layout.path, layout.c_start - 3)
    with pytest.raises(kl.CorruptMessage) as e:
        read_log(layout.fresh())
    assert e.value.offset is not None and e.value.offset < layout.c_start
    before = snapshot(layout.log.directory)
    report = recover(layout.fresh())
    assert report.unrepaired and report.cut_bytes == 0
    assert snapshot(layout.log.directory) == before


# ----------------------------------------------------------------- zero-filled and garbage tails


@pytest.mark.parametrize("size", [1, 7, 22, 512, 4096, 8192])
def test_a_zero_filled_tail_past_the_end_is_never_returned_and_recover_cuts_it(layout, size):
    append_bytes(layout.path, b"\0" * size)
    assert read_log(layout.fresh()) == layout.messages
    assert values(stream_all(layout.root)) == values(layout.messages)
    report = recover(layout.fresh())
    assert report.cut_bytes == size
    assert [f.action for f in report.findings] == ["cut"]
    assert snapshot(layout.log.directory) == layout.original
    assert not recover(layout.fresh()).findings


@pytest.mark.parametrize("size", [1, 4096, 8192])
def test_the_next_writer_cuts_a_zero_filled_tail(layout, size):
    append_bytes(layout.path, b"\0" * size)
    appended = kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0)
    assert appended.offset == layout.c_end
    assert values(read_log(layout.fresh())) == values(layout.messages) + [b"after"]
    assert os.path.getsize(layout.path) == appended.next_offset


def test_a_last_append_that_reads_back_as_zeros_is_dropped_whole(layout):
    """ALICE: the file size persisted, the data did not."""
    write_at(layout.path, layout.c_start, b"\0" * (layout.c_end - layout.c_start))
    assert read_log(layout.fresh()) == layout.committed
    assert stream_all(layout.root) == layout.committed
    report = recover(layout.fresh())
    assert report.cut_bytes == layout.c_end - layout.c_start
    assert layout.log.state().log_end_offset == os.path.getsize(layout.path) == layout.c_start
    assert read_log(layout.fresh()) == layout.committed
    assert not recover(layout.fresh()).findings


GARBAGE_SEEDS = list(range(1000, 1012))


@pytest.mark.parametrize("seed", GARBAGE_SEEDS, ids=[f"seed={s}" for s in GARBAGE_SEEDS])
def test_a_random_garbage_tail_is_never_returned_and_recover_cuts_it(layout, seed):
    rng = random.Random(seed)
    garbage = rng.randbytes(rng.randint(1, 8192))
    print(f"garbage tail seed {seed}: {len(garbage)} bytes")
    append_bytes(layout.path, garbage)
    assert read_log(layout.fresh()) == layout.messages
    assert values(stream_all(layout.root)) == values(layout.messages)
    report = recover(layout.fresh())
    assert report.cut_bytes == len(garbage), f"seed {seed}"
    assert snapshot(layout.log.directory) == layout.original
    assert not recover(layout.fresh()).findings


@pytest.mark.parametrize("seed", GARBAGE_SEEDS[:4], ids=[f"seed={s}" for s in GARBAGE_SEEDS[:4]])
def test_random_garbage_over_the_last_append_drops_it_and_recover_cuts_it(layout, seed):
    rng = random.Random(seed)
    garbage = rng.randbytes(layout.c_end - layout.c_start + rng.randint(0, 4096))
    write_at(layout.path, layout.c_start, garbage)
    assert read_log(layout.fresh()) == layout.committed
    report = recover(layout.fresh())
    assert report.cut_bytes == len(garbage), f"seed {seed}"
    assert read_log(layout.fresh()) == layout.committed
    assert not recover(layout.fresh()).findings


@pytest.mark.parametrize("seed", GARBAGE_SEEDS[:4], ids=[f"seed={s}" for s in GARBAGE_SEEDS[:4]])
def test_the_next_writer_cuts_a_garbage_tail(layout, seed):
    rng = random.Random(seed)
    append_bytes(layout.path, rng.randbytes(rng.randint(1, 8192)))
    appended = kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0)
    assert appended.offset == layout.c_end
    assert values(read_log(layout.fresh())) == values(layout.messages) + [b"after"]


def test_valid_messages_past_the_published_end_are_never_adopted(layout):
    """A writer killed between writing and publishing leaves well-formed bytes."""
    unpublished = m.encode(b"never published", None, TS) + m.encode(b"nor this", b"k", TS)
    append_bytes(layout.path, unpublished)
    assert read_log(layout.fresh()) == layout.messages
    assert values(stream_all(layout.root)) == values(layout.messages)
    report = recover(layout.fresh(), dry_run=True)
    assert report.cut_bytes == len(unpublished)
    appended = kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0)
    assert appended.offset == layout.c_end
    assert values(read_log(layout.fresh())) == values(layout.messages) + [b"after"]


# ----------------------------------------------------------------- bit flips


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_every_single_bit_flip_in_the_last_set_drops_only_that_set(root, compression):
    layout = build(root, compression=compression)
    problems = []
    for bit in range(layout.c_start * 8, layout.c_end * 8):
        layout.restore()
        flip_bit(layout.path, bit)
        try:
            got = read_log(layout.fresh())
        except kl.KlError as e:
            problems.append(f"bit {bit}: reader raised {e!r}")
            got = None
        if got is not None and got != layout.committed:
            problems.append(f"bit {bit}: read {len(got)} messages, expected the {len(layout.committed)} before C")
        report = recover(layout.fresh())
        if report.cut_bytes != layout.c_end - layout.c_start or report.unrepaired:
            problems.append(f"bit {bit}: recover cut {report.cut_bytes} bytes, findings {report.findings}")
        elif not 1 <= report.cut_messages <= 3:
            problems.append(f"bit {bit}: recover says it cut {report.cut_messages} messages")
        state = layout.log.state()
        if state.log_end_offset != layout.c_start:
            problems.append(f"bit {bit}: log end {state.log_end_offset} after recover")
    report_problems(problems)


def test_a_bit_flip_in_the_last_set_is_cut_by_the_next_writer(layout):
    flip_bit(layout.path, (layout.c_start + 30) * 8 + 3)
    appended = kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0)
    assert appended.offset == layout.c_start
    assert values(read_log(layout.fresh())) == values(layout.committed) + [b"after"]


MID_LOG_FIELDS = {
    "length": 3,  # low byte of the length
    "magic": 4,
    "attrs": 5,
    "crc": 7,
    "timestamp": 17,
    "key_length": 21,
    "value": 23,
}
"""Byte positions inside message 2 of set A (positions 4 and 5 are magic and attrs)."""


@pytest.fixture(params=list(MID_LOG_FIELDS), ids=[f"flip-{k}" for k in MID_LOG_FIELDS])
def mid_log_flip(request, layout) -> tuple[Layout, kl.Message]:
    victim = layout.messages[2]
    flip_bit(layout.path, (victim.offset + MID_LOG_FIELDS[request.param]) * 8 + 7)
    return layout, victim


def test_a_mid_log_bit_flip_makes_readers_raise_corrupt_message_naming_the_offset(mid_log_flip):
    layout, victim = mid_log_flip
    got = []
    with pytest.raises(kl.CorruptMessage) as e:
        for msg in layout.fresh().read(0, 1 << 20):
            got.append(msg)
    assert e.value.offset == victim.offset
    assert str(victim.offset) in str(e.value)
    assert got == layout.messages[:2]
    with pytest.raises(kl.CorruptMessage) as e:
        list(kl.Consumer(kl.Root(layout.root.path)).stream("t", 0, 0, idle_timeout=0))
    assert e.value.offset == victim.offset


def test_stream_with_skip_corrupt_skips_only_the_damaged_message(mid_log_flip):
    layout, victim = mid_log_flip
    got = stream_all(layout.root, skip_corrupt=True)
    assert got == [msg for msg in layout.messages if msg.offset != victim.offset]


def test_recover_reports_a_mid_log_bit_flip_and_cuts_nothing_without_repair(mid_log_flip):
    layout, victim = mid_log_flip
    before = snapshot(layout.log.directory)
    for dry_run in (True, False):
        report = recover(layout.fresh(), deep=True, dry_run=dry_run)
        assert [(f.offset, f.action) for f in report.findings] == [(victim.offset, "reported")]
        assert report.unrepaired and report.cut_bytes == 0 and report.cut_messages == 0
        assert snapshot(layout.log.directory) == before
    # The tail check alone does not cut committed data either.
    recover(layout.fresh())
    assert snapshot(layout.log.directory) == before


def test_recover_with_repair_loses_only_the_damaged_message_and_keeps_later_offsets(mid_log_flip):
    layout, victim = mid_log_flip
    report = recover(layout.fresh(), deep=True, repair=True)
    assert [f.offset for f in report.findings] == [victim.offset]
    assert report.findings[0].action.startswith("repaired")
    assert not report.unrepaired
    aside = [p for p in layout.path.parent.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].name.startswith(layout.path.name)
    assert aside[0].read_bytes() != layout.original[layout.path.name]
    assert len(aside[0].read_bytes()) == len(layout.original[layout.path.name])
    expected = [msg for msg in layout.messages if msg.offset != victim.offset]
    assert read_log(layout.fresh()) == expected
    assert stream_all(layout.root) == expected
    assert not recover(layout.fresh(), deep=True).findings
    assert kl.Producer(kl.Root(layout.root.path)).send("t", b"after", partition=0).offset == layout.c_end


def test_a_bit_flip_in_a_closed_segment_is_reported_and_repaired_only_on_request(root):
    root.create_topic("t", kl.TopicConfig(segment_bytes=256, max_message_bytes=128, flush_messages=0, flush_ms=0))
    producer = kl.Producer(root)
    for i in range(20):
        producer.send("t", b"%010d" % i, partition=0, timestamp=TS)
    log = root.log("t", 0)
    messages = read_log(log)
    first = Path(log.segments()[0].path)
    victim = messages[3]
    flip_bit(first, (victim.offset + 25) * 8)
    with pytest.raises(kl.CorruptMessage) as e:
        read_log(fresh_log(log))
    assert e.value.offset == victim.offset
    skipped = list(kl.Consumer(kl.Root(root.path)).stream("t", 0, 0, idle_timeout=0, skip_corrupt=True))
    assert skipped == [msg for msg in messages if msg is not victim]
    before = snapshot(log.directory)
    report = recover(fresh_log(log), deep=True)
    assert [(f.offset, f.action) for f in report.findings] == [(victim.offset, "reported")]
    assert snapshot(log.directory) == before
    report = recover(fresh_log(log), deep=True, repair=True)
    assert report.findings[0].action.startswith("repaired")
    assert read_log(fresh_log(log)) == [msg for msg in messages if msg is not victim]
    assert not recover(fresh_log(log), deep=True).findings


def test_damage_in_unflushed_data_before_the_last_append_ends_the_data_there(root):
    """Past the stable offset but before the last append: a crash may have torn it too."""
    root.create_topic("t", NO_FLUSH)
    producer = kl.Producer(root)
    producer.send_batch("t", [b"a%d" % i for i in range(3)], partition=0, timestamp=TS)
    producer.close()
    producer.send_batch("t", [b"b%d" % i for i in range(3)], partition=0, timestamp=TS)  # unflushed
    producer.send_batch("t", [b"c%d" % i for i in range(3)], partition=0, timestamp=TS)  # the last append
    log = root.log("t", 0)
    as_if_rebooted(log)
    messages = read_log(log)
    assert log.state().stable_offset == messages[3].offset
    flip_bit(Path(log.segments()[0].path), (messages[4].offset + 23) * 8)
    assert read_log(fresh_log(log)) == messages[:4]
    assert stream_all(root) == messages[:4]
    report = recover(fresh_log(log))
    assert not report.unrepaired and report.cut_bytes == messages[-1].next_offset - messages[4].offset
    assert read_log(fresh_log(log)) == messages[:4]
    assert not recover(fresh_log(log), deep=True).findings


# ----------------------------------------------------------------- hostile length fields

SMALL_MAX = 4096
HOSTILE_LENGTHS = {"zero": 0, "below-magic-header": 5, "below-header": 17, "huge": 0x7FFFFFFF, "negative": -1}


def hostile(length: int, value: bytes = b"x" * 30) -> bytes:
    """A magic 2 message whose length field says ``length`` (checksum of the real body)."""
    return struct.pack(">i", length) + m.encode(value, None, TS)[4:]


class ReadTracker:
    """Records the size of every os.pread/os.read: none may be larger than the file or
    the topic's max_message_bytes, whatever a length field says."""

    def __init__(self, monkeypatch):
        self.largest = 0
        pread, read = os.pread, os.read

        def tracked_pread(fd, n, offset):
            self.largest = max(self.largest, n)
            return pread(fd, n, offset)

        def tracked_read(fd, n):
            self.largest = max(self.largest, n)
            return read(fd, n)

        monkeypatch.setattr(os, "pread", tracked_pread)
        monkeypatch.setattr(os, "read", tracked_read)


@pytest.fixture
def small_layout(root) -> Layout:
    return build(root, config=kl.TopicConfig(max_message_bytes=SMALL_MAX, flush_messages=0, flush_ms=0))


def bounded(fn):
    """Run ``fn`` under tracemalloc; returns (result or exception, peak bytes allocated)."""
    tracemalloc.start()
    try:
        try:
            result = fn()
        except kl.KlError as e:
            result = e
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("length", HOSTILE_LENGTHS.values(), ids=HOSTILE_LENGTHS.keys())
def test_a_hostile_length_past_the_end_is_ignored_without_allocating(small_layout, monkeypatch, length):
    layout = small_layout
    append_bytes(layout.path, hostile(length))
    tracker = ReadTracker(monkeypatch)
    got, peak = bounded(lambda: read_log(layout.fresh()))
    assert got == layout.messages
    report, peak_recover = bounded(lambda: recover(layout.fresh()))
    assert report.cut_bytes == len(hostile(length))
    assert max(peak, peak_recover) < 1 << 20
    assert tracker.largest <= max(os.path.getsize(layout.path), SMALL_MAX), tracker.largest


@pytest.mark.parametrize("length", HOSTILE_LENGTHS.values(), ids=HOSTILE_LENGTHS.keys())
def test_a_hostile_length_in_the_last_append_drops_it_without_allocating(small_layout, monkeypatch, length):
    layout = small_layout
    write_at(layout.path, layout.messages[11].offset, struct.pack(">i", length))
    tracker = ReadTracker(monkeypatch)
    got, peak = bounded(lambda: read_log(layout.fresh()))
    assert got == layout.committed
    report, peak_recover = bounded(lambda: recover(layout.fresh()))
    assert report.cut_bytes == layout.c_end - layout.c_start
    assert max(peak, peak_recover) < 1 << 20
    assert tracker.largest <= max(os.path.getsize(layout.path), SMALL_MAX), tracker.largest


@pytest.mark.parametrize("length", HOSTILE_LENGTHS.values(), ids=HOSTILE_LENGTHS.keys())
def test_a_hostile_length_mid_log_is_corrupt_message_without_allocating(small_layout, monkeypatch, length):
    layout = small_layout
    victim = layout.messages[3]
    write_at(layout.path, victim.offset, struct.pack(">i", length))
    tracker = ReadTracker(monkeypatch)
    got, peak = bounded(lambda: read_log(layout.fresh(), max_bytes=1 << 16))
    assert isinstance(got, kl.CorruptMessage) and got.offset == victim.offset
    assert "length" in got.reason or "checksum" in got.reason
    got, peak_small = bounded(lambda: list(layout.fresh().read(victim.offset, 10)))
    assert isinstance(got, kl.CorruptMessage) and got.offset == victim.offset
    report, peak_recover = bounded(lambda: recover(layout.fresh(), deep=True))
    assert [(f.offset, f.action) for f in report.findings] == [(victim.offset, "reported")]
    assert max(peak, peak_small, peak_recover) < 1 << 20
    assert tracker.largest <= max(os.path.getsize(layout.path), SMALL_MAX), tracker.largest


@pytest.mark.parametrize("length", HOSTILE_LENGTHS.values(), ids=HOSTILE_LENGTHS.keys())
def test_a_hostile_length_in_memory_is_rejected_without_allocating(length):
    good = m.encode(b"ok", None, TS)
    data = good + hostile(length)
    committed = MessageSet(data, 0, max_message_bytes=SMALL_MAX, stable_offset=len(data), ends_at_eof=True)
    got, peak = bounded(lambda: list(committed))
    assert isinstance(got, kl.CorruptMessage) and got.offset == len(good)
    tail = MessageSet(data, 0, max_message_bytes=SMALL_MAX, stable_offset=len(good))
    got, peak_tail = bounded(lambda: list(tail))
    assert values(got) == [b"ok"]
    assert max(peak, peak_tail) < 1 << 16


# ----------------------------------------------------------------- kill -9 of producers

KILL_TRIALS = 200


def test_kill_9_of_producers_loses_nothing_acknowledged(tmp_path):
    """Producers killed at random moments while appending; a reader tails throughout."""
    report = run_kill_trials(tmp_path, KILL_TRIALS, seed=int(os.environ.get("KL_KILL_SEED", "20240607")))
    print("\n" + report.summary())
    assert not report.problems, report.summary()
    assert report.trials == KILL_TRIALS and report.killed == report.producers
    assert report.acked_messages > 0 and report.reader_messages == report.final_messages
    # The trials must have produced the damage the rules are about, or they proved nothing.
    assert report.kills_with_torn_tail > 0, "no kill left a torn tail"
    assert report.orphan_segments > 0, "no kill left an unpublished segment behind a roll"


def test_the_order_checker_catches_what_the_harness_relies_on():
    """The kill -9 harness is only as good as its checks: show they fire."""
    ok = [kl.Message(i * 10, i * 10 + 10, TS, None, payload((1, 0, 0, i), 3)) for i in range(3)]
    checker = OrderChecker()
    for msg in ok:
        checker.check(msg)
    assert not checker.problems and checker.count == 3
    for bad in (
        [ok[0], ok[0]._replace(value=ok[0].value[:-1] + b"\0")],  # checksum
        [ok[1], ok[0]],  # offsets back
        [ok[0], ok[0]._replace(value=payload((1, 0, 5, 0), 3))],  # repeated offset, not a batch continuation
        [ok[0], ok[1]._replace(offset=0, value=payload((1, 0, 0, 2), 3))],  # a batch's messages out of order
        [ok[0], ok[1], ok[1]._replace(offset=40)],  # an id twice
    ):
        checker = OrderChecker()
        for msg in bad:
            checker.check(msg)
        assert checker.problems, bad


def test_the_harness_counts_torn_tails_and_unpublished_segments(root):
    """What the kill -9 test asserts happened must be what ``tail_facts`` measures."""
    root.create_topic("t", NO_FLUSH)
    end = kl.Producer(root).send("t", b"published", partition=0).next_offset
    log = root.log("t", 0)
    assert tail_facts(log.directory) == (0, 0)
    append_bytes(Path(log.directory) / segment_name(0), b"torn")
    assert tail_facts(log.directory) == (4, 0)
    (Path(log.directory) / segment_name(end + 4)).write_bytes(b"")  # a roll killed before it published
    assert tail_facts(log.directory) == (4, 1)
