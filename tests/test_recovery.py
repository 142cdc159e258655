"""``kl.log.recovery.recover``: what it cuts on its own, what it only reports, what
``repair=True`` does, that ``dry_run`` changes nothing and that a second run is clean."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import kl
import kl.log.recovery
from kl.log.messageset import frame
from kl.log.recovery import recover
from kl.log.segment import list_segments, segment_name
from kl.log.state import STATE_FILE

from faultlib import append_bytes, as_if_rebooted, flip_bit, fresh_log, read_log, shrink_to, snapshot

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores

TS = 1_700_000_000_000
NO_FLUSH = kl.TopicConfig(flush_messages=0, flush_ms=0)
ROLLING = kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_messages=0, flush_ms=0)
"""32-byte messages (10-byte values): 32 to a segment."""


def ten_byte(i: int, tag: bytes = b"m") -> bytes:
    return tag + b"%09d" % i


def make(root: kl.Root, config: kl.TopicConfig = NO_FLUSH, n: int = 10, *, close: bool = True) -> kl.Log:
    root.create_topic("t", config)
    producer = kl.Producer(root)
    for i in range(n):
        producer.send("t", ten_byte(i), partition=0, timestamp=TS + i)
    if close:
        producer.close()
    return root.log("t", 0)


def directory(log: kl.Log) -> Path:
    return Path(log.directory)


def active_path(log: kl.Log) -> Path:
    return directory(log) / segment_name(log.state().active_base_offset)


def test_a_clean_partition_needs_nothing(root):
    log = make(root, ROLLING, 70)
    before = snapshot(log.directory)
    for kw in ({}, {"deep": True}, {"dry_run": True}, {"deep": True, "repair": True}):
        report = recover(fresh_log(log), **kw)
        assert report.findings == [] and report.cut_bytes == 0 and report.cut_messages == 0, kw
    assert snapshot(log.directory) == before
    assert len(read_log(log)) == 70


def test_deep_recover_checks_every_byte(root):
    log = make(root, ROLLING, 70)
    report = recover(fresh_log(log), deep=True)
    assert report.checked_bytes >= 70 * 32


def test_unpublished_bytes_are_cut_and_counted(root):
    log = make(root)
    end = log.state().log_end_offset
    unpublished = frame([b"x1", b"x2", b"x3"], TS)
    append_bytes(active_path(log), unpublished)
    report = recover(fresh_log(log))
    assert report.cut_bytes == len(unpublished)
    assert report.cut_messages == 3
    assert [(f.offset, f.action) for f in report.findings] == [(end, "cut")]
    assert os.path.getsize(active_path(log)) == end == log.state().log_end_offset
    assert not recover(fresh_log(log)).findings


def test_a_torn_last_append_is_cut_back_to_its_start(root):
    log = make(root, n=3)
    start = log.state().log_end_offset
    kl.Producer(root).send_batch("t", [b"a" * 10, b"b" * 10, b"c" * 10], partition=0, timestamp=TS)
    as_if_rebooted(log)
    shrink_to(active_path(log), start + 32 + 5)
    report = recover(fresh_log(log))
    assert report.cut_bytes == 5 and report.cut_messages == 1
    assert report.findings[0].offset == start + 32 and report.findings[0].action == "cut"
    assert log.state().log_end_offset == start + 32
    assert [msg.value for msg in read_log(fresh_log(log))][-1] == b"a" * 10


@pytest.mark.parametrize(
    "damage",
    ["garbage-tail", "torn-last-append", "mid-log-flip", "unpublished-segment", "missing-state"],
)
def test_dry_run_changes_nothing_and_reports_what_it_would_do(root, damage):
    log = make(root, ROLLING, 50)
    log = fresh_log(log)
    state = log.state()
    if damage == "garbage-tail":
        append_bytes(active_path(log), os.urandom(300))
    elif damage == "torn-last-append":
        shrink_to(active_path(log), state.log_end_offset - state.active_base_offset - 3)
    elif damage == "mid-log-flip":
        flip_bit(directory(log) / segment_name(0), 100 * 8)
    elif damage == "unpublished-segment":
        (directory(log) / segment_name(state.log_end_offset + 1000)).write_bytes(frame([b"x"], TS))
    elif damage == "missing-state":
        os.unlink(log.state_path)
    before = snapshot(log.directory)
    for kw in ({}, {"deep": True}, {"deep": True, "repair": True}):
        report = recover(fresh_log(log), dry_run=True, **kw)
        if kw or damage != "mid-log-flip":  # without deep only the tail is checked
            assert report.findings, (damage, kw)
        assert snapshot(log.directory) == before, (damage, kw)
    assert not [p for p in directory(log).iterdir() if ".damaged-" in p.name]


def test_a_segment_past_the_active_one_is_removed(root):
    """A writer killed mid-roll: the new segment exists but was never published."""
    log = make(root, ROLLING, 10)
    end = log.state().log_end_offset
    orphan = directory(log) / segment_name(end)
    orphan.write_bytes(frame([b"unpublished"] * 3, TS))
    assert [msg.value for msg in read_log(fresh_log(log))] == [ten_byte(i) for i in range(10)]
    report = recover(fresh_log(log))
    assert [f.action for f in report.findings] == ["removed"]
    assert report.cut_bytes == orphan.stat().st_size if orphan.exists() else report.cut_bytes > 0
    assert not orphan.exists()
    assert not recover(fresh_log(log)).findings


def test_an_unpublished_segment_never_ends_up_inside_a_closed_segment(root):
    """A writer killed mid-roll leaves segment X; the next writer's append still fits the
    active segment, which grows past X.  The roll that closes that segment removes X
    before it publishes, so X can never lie inside a closed segment's range."""
    log = make(root, ROLLING, 20)  # 640 bytes in segment 0
    x = log.state().log_end_offset
    orphan = directory(log) / segment_name(x)
    orphan.write_bytes(frame([b"UNPUBLISHED-%d" % i for i in range(5)], TS))
    producer = kl.Producer(kl.Root(root.path))
    for i in range(5):
        producer.send("t", ten_byte(i, b"n"), partition=0, timestamp=TS)  # segment 0 grows past x
    producer.send_batch("t", [b"r" * 100] * 4, partition=0, timestamp=TS)  # rolls
    assert not orphan.exists()
    expected = [ten_byte(i) for i in range(20)] + [ten_byte(i, b"n") for i in range(5)] + [b"r" * 100] * 4
    got = [msg.value for msg in read_log(fresh_log(log))]
    assert not [v for v in got if v.startswith(b"UNPUBLISHED")], "readers returned unpublished messages"
    assert got == expected
    assert [msg.value for msg in kl.Consumer(kl.Root(root.path)).stream("t", 0, 0, idle_timeout=0)] == expected
    assert not recover(fresh_log(log), deep=True).findings


def test_the_next_roll_removes_a_segment_left_by_a_killed_roll(root):
    log = make(root, ROLLING, 20)
    x = log.state().log_end_offset
    (directory(log) / segment_name(x)).write_bytes(b"")
    producer = kl.Producer(kl.Root(root.path))
    producer.send_batch("t", [b"r" * 100] * 5, partition=0, timestamp=TS)  # rolls, at x
    producer.send_batch("t", [b"s" * 100] * 8, partition=0, timestamp=TS)  # rolls again
    bases = [base for base, _ in list_segments(log.directory)]
    assert bases == [0, x, log.state().active_base_offset]
    assert not recover(fresh_log(log), deep=True).findings


@pytest.mark.parametrize("how", ["missing", "damaged", "short"])
def test_a_lost_state_record_is_rebuilt_from_the_segments(root, how):
    log = make(root, ROLLING, 50)
    expected = [msg.value for msg in read_log(log)]
    state_path = directory(log) / STATE_FILE
    if how == "missing":
        state_path.unlink()
    elif how == "damaged":
        flip_bit(state_path, 80)
    else:
        shrink_to(state_path, 10)
    with pytest.raises((kl.CorruptState, kl.TopicNotFound)):
        fresh_log(log).state()
    report = recover(fresh_log(log))
    assert [f.action for f in report.findings] == ["rebuilt"]
    assert [msg.value for msg in read_log(fresh_log(log))] == expected
    assert not recover(fresh_log(log), deep=True).findings
    kl.Producer(kl.Root(root.path)).send("t", b"after", partition=0)
    assert [msg.value for msg in read_log(fresh_log(log))] == expected + [b"after"]


def test_a_closed_segment_shorter_than_the_next_base_is_reported_by_a_shallow_and_a_deep_check(root):
    log = make(root, ROLLING, 70)
    messages = read_log(log)
    first = directory(log) / segment_name(0)
    shrink_to(first, first.stat().st_size - 10)
    before = snapshot(log.directory)
    for deep in (False, True):
        report = recover(fresh_log(log), deep=deep)
        assert [(f.action, f.kind) for f in report.findings] == [("reported", "SHORT_FILE" if not deep else "INCOMPLETE")]
        assert report.findings[0].path == str(first)
    assert snapshot(log.directory) == before
    report = recover(fresh_log(log), deep=True, repair=True)
    assert report.findings[0].action.startswith("repaired: 32 bytes padded")
    assert first.stat().st_size == 1024  # padded up to the next segment's base
    assert not recover(fresh_log(log), deep=True).findings
    assert read_log(fresh_log(log)) == messages[:31] + messages[32:]


def test_zero_bytes_past_a_closed_segments_end_are_cut(root):
    log = make(root, ROLLING, 70)
    messages = read_log(log)
    first = directory(log) / segment_name(0)
    append_bytes(first, bytes(100))
    report = recover(fresh_log(log), deep=True)
    assert [(f.action, f.kind, f.reason) for f in report.findings] == [
        ("cut", "LONG_FILE", "100 zero bytes past the segment's end 1024")
    ]
    assert first.stat().st_size == 1024
    assert not recover(fresh_log(log), deep=True).findings
    assert read_log(fresh_log(log)) == messages


@pytest.mark.parametrize("deep", [False, True])
def test_late_bytes_of_a_fenced_writer_past_a_closed_segments_end_are_reported_as_such_and_cut(root, deep):
    log = make(root, ROLLING, 70)
    messages = read_log(log)
    first = directory(log) / segment_name(0)
    late = frame([b"late-1", b"late-2"], TS)
    append_bytes(first, late)
    assert read_log(fresh_log(log)) == messages  # never served
    expected = f"{len(late)} bytes past the segment's end 1024, written late by a writer that had lost its lock (never served)"
    report = recover(fresh_log(log), deep=deep, dry_run=True)
    assert [(f.action, f.kind, f.reason) for f in report.findings] == [("would cut", "LONG_FILE", expected)]
    assert first.stat().st_size == 1024 + len(late)
    report = recover(fresh_log(log), deep=deep)
    assert [(f.offset, f.action, f.reason) for f in report.findings] == [(1024, "cut", expected)]
    assert report.cut_bytes == len(late)
    assert first.stat().st_size == 1024
    assert not recover(fresh_log(log), deep=True).findings
    assert read_log(fresh_log(log)) == messages


def test_repairing_two_damaged_messages_loses_only_those_two(root):
    log = make(root, n=20)
    messages = read_log(log)
    path = active_path(log)
    flip_bit(path, (messages[3].offset + 25) * 8)
    flip_bit(path, (messages[12].offset + 25) * 8)
    report = recover(fresh_log(log), deep=True)
    assert report.findings[0].offset == messages[3].offset
    assert {f.action for f in report.findings} == {"reported"}
    report = recover(fresh_log(log), deep=True, repair=True)
    assert not recover(fresh_log(log), deep=True).findings, "a second run after repair still finds damage"
    assert read_log(fresh_log(log)) == [msg for i, msg in enumerate(messages) if i not in (3, 12)]


def test_repair_keeps_the_original_damaged_segment(root):
    log = make(root, n=20)
    messages = read_log(log)
    path = active_path(log)
    flip_bit(path, (messages[5].offset + 25) * 8)
    damaged = path.read_bytes()
    recover(fresh_log(log), deep=True, repair=True)
    aside = [p for p in path.parent.iterdir() if p.name.startswith(path.name + ".damaged-")]
    assert [p.read_bytes() for p in aside] == [damaged]
    assert [base for base, _ in list_segments(log.directory)] == [0]  # not taken for a segment


def test_a_second_repair_does_not_overwrite_the_first_copy_aside(root, monkeypatch):
    monkeypatch.setattr(kl.log.recovery.time, "strftime", lambda fmt, *a: "20240101T000000")  # both runs in one second
    log = make(root, n=20)
    messages = read_log(log)
    path = active_path(log)
    flip_bit(path, (messages[5].offset + 25) * 8)
    first_damage = path.read_bytes()
    recover(fresh_log(log), deep=True, repair=True)
    flip_bit(path, (messages[9].offset + 25) * 8)
    second_damage = path.read_bytes()
    recover(fresh_log(log), deep=True, repair=True)
    kept = sorted(p.read_bytes() for p in path.parent.iterdir() if ".damaged-" in p.name)
    assert kept == sorted([first_damage, second_damage])


def test_repair_where_nothing_valid_follows_pads_to_the_log_end_and_keeps_a_copy(root):
    log = make(root, n=6)
    messages = read_log(log)
    end = log.state().log_end_offset
    path = active_path(log)
    flip_bit(path, (messages[4].offset + 25) * 8)  # committed
    shrink_to(path, messages[5].offset + 20)  # and the file cut: no valid chain follows
    assert recover(fresh_log(log), deep=True).unrepaired
    report = recover(fresh_log(log), deep=True, repair=True)
    assert report.findings[0].action.startswith("repaired")
    assert [p for p in path.parent.iterdir() if ".damaged-" in p.name]
    assert read_log(fresh_log(log)) == messages[:4]
    assert log.state().log_end_offset == end == os.path.getsize(path)  # no offset handed out is taken back
    assert not recover(fresh_log(log), deep=True).findings


def test_recover_runs_safely_beside_a_producer_and_a_consumer(root):
    log = make(root, ROLLING, 10)
    stop = threading.Event()
    errors: list[BaseException] = []
    sent: list[bytes] = []

    def produce():
        producer = kl.Producer(kl.Root(root.path))
        try:
            i = 0
            while not stop.is_set():
                value = ten_byte(i, b"p")
                producer.send("t", value, partition=0, timestamp=TS)
                sent.append(value)
                i += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def consume():
        try:
            for _ in kl.Consumer(kl.Root(root.path)).stream("t", 0, 0, idle_timeout=0.3, poll_interval=0.001):
                pass
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        for _ in range(30):
            report = recover(fresh_log(log), deep=True)
            assert not report.findings, report.findings
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert [msg.value for msg in read_log(fresh_log(log))] == [ten_byte(i) for i in range(10)] + sent


def test_a_reporter_hears_of_each_finding_as_it_is_made(root):
    log = make(root, n=20)
    messages = read_log(log)
    path = active_path(log)
    flip_bit(path, (messages[3].offset + 25) * 8)
    flip_bit(path, (messages[12].offset + 25) * 8)
    heard: list[kl.log.recovery.Finding] = []
    report = recover(fresh_log(log), deep=True, reporter=heard.append)
    assert heard == report.findings and [f.offset for f in heard] == [messages[3].offset, messages[12].offset]
