"""The defects found by attacking the core (issue "Harden the core"), one named case each:
H1 silent loss of fsynced data, H2 a repair that never ends, M1-M9 and the smaller ones.
Each case failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kl
from kl.log import locks
from kl.log import message as m
from kl.log import segment as segment_module
from kl.log.importer import ImportRefused, import_topic
from kl.log.messageset import frame
from kl.log.recovery import recover
from kl.log.segment import segment_name
from kl.log.state import CRC, RECORD_V1, SIZE_V1, PartitionState

from conftest import KAFKA07_SEGMENT
from faultlib import append_bytes, as_if_rebooted, flip_bit, fresh_log, read_log, shrink_to, wait_flushed, write_at

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores

KL = [sys.executable, "-m", "kl_cli"]
TS = 1_700_000_000_000


def kl_cli(root: kl.Root, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "KL_ROOT": root.path}
    return subprocess.run(KL + list(args), input=input, env=env, capture_output=True, timeout=120, check=False)


def seq(n: int) -> bytes:
    return b"".join(b"%d\n" % i for i in range(1, n + 1))


def segment0(root: kl.Root, topic: str, partition: int = 0) -> Path:
    return Path(root.path) / topic / str(partition) / segment_name(0)


# ----------------------------------------------------------------- H1: fsynced data is never cut


@pytest.mark.parametrize("rebooted", [False, True], ids=["same-boot", "after-reboot"])
def test_h1_a_flipped_byte_in_fsynced_data_is_corruption_and_the_next_produce_cuts_nothing(root, rebooted):
    assert kl_cli(root, "topics", "create", "f").returncode == 0
    assert kl_cli(root, "produce", "f", input=seq(1000)).returncode == 0
    if rebooted:
        as_if_rebooted(root.log("f", 0))
    path = segment0(root, "f")
    size = path.stat().st_size
    write_at(path, size // 2, bytes([path.read_bytes()[size // 2] ^ 0xFF]))
    consumed = kl_cli(root, "consume", "f")
    assert consumed.returncode == 1
    assert consumed.stderr.decode().startswith("Error: corrupt message at offset ")
    good_before = consumed.stdout.splitlines()
    assert good_before == [b"%d" % i for i in range(1, len(good_before) + 1)] and 400 < len(good_before) < 600
    skipped = kl_cli(root, "consume", "f", "--skip-corrupt")
    assert skipped.returncode == 0
    assert len(skipped.stdout.splitlines()) == 999  # only the damaged message is skipped
    assert skipped.stderr.decode().count("skipped damaged data") == 1
    dry = kl_cli(root, "recover", "--deep", "--dry-run")
    assert dry.returncode == 3 and dry.stdout.startswith(b"f/0: found: offset ") and b"cut" not in dry.stdout
    assert kl_cli(root, "produce", "f", input=b"1001\n").returncode == 0
    assert path.stat().st_size == size + m.HEADER_SIZE + len(b"1001")  # nothing cut, the new line appended
    again = kl_cli(root, "consume", "f", "--skip-corrupt")
    assert len(again.stdout.splitlines()) == 1000


def test_h1_recover_counts_the_messages_it_cuts(root):
    root.create_topic("t", kl.TopicConfig(flush_ms=0))
    kl.Producer(root).send_batch("t", [b"%d" % i for i in range(1000)], partition=0, timestamp=TS)
    log = root.log("t", 0)
    as_if_rebooted(log)  # the one append was never fsynced: a crash may have torn it
    path = segment0(root, "t")
    flip_bit(path, path.stat().st_size // 2 * 8)
    report = recover(fresh_log(log), dry_run=True)
    assert report.cut_messages == 1000  # the whole (torn) append, every message of it counted


# ----------------------------------------------------------------- H2: repair always finishes


SMALL = kl.TopicConfig(segment_bytes=10_000, max_message_bytes=4096, flush_ms=0)


def small_topic(root: kl.Root) -> tuple[kl.Log, list[kl.Message]]:
    root.create_topic("t", SMALL)
    producer = kl.Producer(root)
    for i in range(20):
        producer.send_batch("t", [b"%05d" % (i * 100 + j) * 20 for j in range(60)], partition=0, timestamp=TS)
    producer.close()
    log = root.log("t", 0)
    return log, read_log(log)


def copies(log: kl.Log) -> list[str]:
    return [n for n in os.listdir(log.directory) if ".damaged-" in n]


def test_h2_a_closed_segment_cut_short_is_padded_up_to_the_next_base_in_one_run(root):
    log, messages = small_topic(root)
    first = Path(log.directory) / segment_name(0)
    expected = first.stat().st_size
    shrink_to(first, 6699)
    report = recover(fresh_log(log), deep=True, repair=True)
    assert len(copies(log)) == 1
    assert first.stat().st_size == expected
    assert all(f.action.startswith("repaired") for f in report.findings)
    assert recover(fresh_log(log), deep=True).findings == []
    kept = read_log(fresh_log(log))
    assert [msg for msg in messages if msg.next_offset <= 6699 or msg.offset >= expected] == kept


def test_h2_ten_kilobytes_zeroed_are_padded_with_messages_within_the_limit(root):
    log, messages = small_topic(root)
    first = Path(log.directory) / segment_name(0)
    write_at(first, 100, bytes(first.stat().st_size - 100))  # the rest of a ~10 KB segment
    report = recover(fresh_log(log), deep=True, repair=True)
    assert len(copies(log)) == 1 and len(report.findings) == 1
    assert "padding messages" in report.findings[0].action
    assert all(
        entry.size <= SMALL.max_message_bytes
        for entry in segment_module.scan(os.open(first, os.O_RDONLY), 0, first.stat().st_size, SMALL.max_message_bytes)
    )
    assert recover(fresh_log(log), deep=True).findings == []


def test_h2_megabytes_zeroed_in_a_big_segment_with_the_defaults(root):
    root.create_topic("t")
    kl.Producer(root).send_batch("t", [b"x" * 200] * 50_000, partition=0, timestamp=TS)  # 11 MB
    log = root.log("t", 0)
    path = segment0(root, "t")
    write_at(path, 3_000_000, bytes(4 << 20))
    report = recover(fresh_log(log), deep=True, repair=True)
    assert len(copies(log)) == 1 and [f.action[:8] for f in report.findings] == ["repaired"]
    assert recover(fresh_log(log), deep=True).findings == []
    assert len(read_log(fresh_log(log), max_bytes=1 << 20)) < 50_000


# ----------------------------------------------------------------- M1: a rebuilt state steps past damage


def test_m1_a_damaged_state_and_damage_in_the_segment_lose_no_valid_message(root):
    root.create_topic("t", kl.TopicConfig(flush_ms=0))
    producer = kl.Producer(root)
    for i in range(10):
        producer.send_batch("t", [b"%04d" % (i * 100 + j) for j in range(100)], partition=0, timestamp=TS)
    producer.close()
    log = root.log("t", 0)
    messages = read_log(log)
    flip_bit(log.state_path, 20 * 8)
    flip_bit(segment0(root, "t"), (messages[455].offset + 25) * 8)  # a value byte
    report = recover(fresh_log(log), deep=True, repair=True)
    assert [f.kind for f in report.findings] == ["STATE", "CHECKSUM"]
    assert report.cut_bytes == 0
    assert read_log(fresh_log(log)) == messages[:455] + messages[456:]


# ----------------------------------------------------------------- M2: resync points are proven


def forged_value() -> bytes:
    """A value that holds well-formed kl messages ending exactly at its own end."""
    return frame([b"FORGED-1", b"FORGED-2"], TS)


def test_m2_skipping_a_damaged_message_never_delivers_messages_forged_inside_its_value(root):
    root.create_topic("t")
    producer = kl.Producer(root)
    producer.send_batch("t", [b"before", forged_value(), b"after"], partition=0, timestamp=TS)
    producer.close()
    log = root.log("t", 0)
    outer = read_log(log)[1]
    flip_bit(segment0(root, "t"), (outer.offset + m.TIMESTAMP_OFFSET) * 8)  # the checksum fails, the length holds
    got = list(kl.Consumer(root).stream("t", 0, 0, idle_timeout=0, skip_corrupt=True))
    assert [msg.value for msg in got] == [b"before", b"after"]
    recover(fresh_log(log), deep=True, repair=True)
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"before", b"after"]


def test_m2_a_resync_inside_garbage_is_accepted_only_when_it_chains_to_the_segment_end(root):
    root.create_topic("t", kl.TopicConfig(max_message_bytes=4096))
    producer = kl.Producer(root)
    producer.send_batch("t", [b"a" * 50] * 5, partition=0, timestamp=TS)
    producer.close()
    log = root.log("t", 0)
    messages = read_log(log)
    # The second message's length is destroyed and its value holds one forged message
    # followed by garbage: the forged one chains nowhere, so it must not be taken.
    forged = frame([b"FORGED"], TS)
    start = messages[1].offset
    write_at(
        segment0(root, "t"), start, b"\xff\xff\xff\xff" + forged + b"\x01" * (messages[1].next_offset - start - 4 - len(forged))
    )
    got = [msg.value for msg in kl.Consumer(root).stream("t", 0, 0, idle_timeout=0, skip_corrupt=True)]
    assert got == [b"a" * 50] * 4


# ----------------------------------------------------------------- M3: a recreated topic is looked up afresh


def test_m3_a_long_lived_producer_follows_a_topic_deleted_and_created_again(root):
    root.create_topic("t", kl.TopicConfig(partitions=1, max_message_bytes=1 << 20))
    producer = kl.Producer(root)
    producer.send("t", b"x" * 100_000)
    other = kl.Root(root.path)
    other.delete_topic("t")
    other.create_topic("t", kl.TopicConfig(partitions=3, max_message_bytes=1000, segment_bytes=4096))
    with pytest.raises(kl.MessageTooLarge):
        producer.send("t", b"x" * 100_000)
    assert [p.log_end_offset for p in other.describe("t").partitions] == [0, 0, 0]
    sent = producer.send_batch("t", [b"y"] * 300)
    assert {a.partition for a in sent} <= {0, 1, 2}
    assert sum(len(read_log(other.log("t", p))) for p in range(3)) == 300
    assert all(s.size_in_bytes <= 4096 for p in range(3) for s in other.log("t", p).segments())
    producer.close()


# ----------------------------------------------------------------- M6: a replaced state file is noticed


def test_m6_a_writer_notices_a_state_file_rebuilt_by_recover(root, monkeypatch):
    monkeypatch.setattr("kl.log.log.RECHECK_SECONDS", 0.0)
    root.create_topic("t")
    writer = kl.Producer(root)
    writer.send("t", b"a", partition=0)
    log = root.log("t", 0)
    os.unlink(log.state_path)
    assert [f.kind for f in recover(fresh_log(log)).findings] == ["STATE"]
    writer.send("t", b"b", partition=0)
    kl.Producer(kl.Root(root.path)).send("t", b"c", partition=0)  # another writer cuts nothing
    assert [msg.value for msg in read_log(fresh_log(log))] == [b"a", b"b", b"c"]


# ----------------------------------------------------------------- M7: bytes past the next base


def test_m7_zero_bytes_past_a_closed_segments_end_are_cut_and_a_second_deep_run_is_clean(root):
    log, messages = small_topic(root)
    first = Path(log.directory) / segment_name(0)
    append_bytes(first, bytes(3000))
    assert [f.action for f in recover(fresh_log(log), deep=True).findings] == ["cut"]
    assert recover(fresh_log(log), deep=True).findings == []
    assert read_log(fresh_log(log)) == messages


# ----------------------------------------------------------------- M9: importing existing data


def kafka_partition(tmp_path: Path) -> Path:
    directory = tmp_path / "source" / "MagicByte0-0"
    directory.mkdir(parents=True)
    (directory / KAFKA07_SEGMENT.name).write_bytes(KAFKA07_SEGMENT.read_bytes())
    return directory


def test_m9_recover_never_cuts_a_kafka_07_file_copied_into_a_partition(root, tmp_path):
    root.create_topic("t")
    source = KAFKA07_SEGMENT.read_bytes()
    log = root.log("t", 0)
    copied = Path(log.directory) / KAFKA07_SEGMENT.name
    copied.write_bytes(source)
    report = recover(fresh_log(log))
    assert [f.action for f in report.findings] == ["reported"] and "second segment file" in report.findings[0].reason
    os.unlink(Path(log.directory) / segment_name(0))
    report = recover(fresh_log(log))
    assert [f.action for f in report.findings] == ["reported"] and "kl topics import" in report.findings[0].reason
    assert copied.read_bytes() == source


def test_m9_import_adopts_a_kafka_07_partition_and_appends_after_it(root, tmp_path):
    [imported] = import_topic(root, "k", [str(kafka_partition(tmp_path))])
    assert (imported.segments, imported.log_start_offset, imported.log_end_offset) == (1, 0, 10900)
    consumer = kl.Consumer(root)
    assert len(read_log(root.log("k", 0))) == 100
    kl.Producer(root).send("k", b"new", partition=0)
    assert [s.base_offset for s in root.log("k", 0).segments()] == [0, 10900]
    assert consumer.fetch("k", 0, 10900).values()[0] == [b"new"]
    assert recover(fresh_log(root.log("k", 0)), deep=True).findings == []


def test_m9_import_refuses_damaged_or_discontinuous_files_and_changes_nothing(root, tmp_path):
    source = kafka_partition(tmp_path)
    flip_bit(source / KAFKA07_SEGMENT.name, 5000 * 8)
    with pytest.raises(ImportRefused, match="checksum mismatch at offset"):
        import_topic(root, "k", [str(source)])
    assert not os.path.exists(os.path.join(root.path, "k"))
    gap = tmp_path / "gap"
    gap.mkdir()
    (gap / segment_name(0)).write_bytes(frame([b"a"], TS))
    (gap / segment_name(100)).write_bytes(frame([b"b"], TS))
    with pytest.raises(ImportRefused, match="ends at offset 23, but the next segment begins at 100"):
        import_topic(root, "k", [str(gap)])
    root.create_topic("busy")
    kl.Producer(root).send("busy", b"x")
    (source / KAFKA07_SEGMENT.name).write_bytes(KAFKA07_SEGMENT.read_bytes())
    with pytest.raises(ImportRefused, match="not empty"):
        import_topic(root, "busy", [str(source)])


# ----------------------------------------------------------------- the smaller ones


def test_a_symlinked_segment_is_refused_alike_by_readers_writers_and_recover(root, tmp_path):
    root.create_topic("t")
    kl.Producer(root).send("t", b"a", partition=0)
    log = root.log("t", 0)
    elsewhere = tmp_path / "elsewhere.kl"
    os.rename(segment0(root, "t"), elsewhere)
    os.symlink(elsewhere, segment0(root, "t"))
    with pytest.raises(kl.StorageError, match="symbolic link"):
        kl.Consumer(kl.Root(root.path)).fetch("t", 0, 0)
    with pytest.raises(kl.StorageError, match="symbolic link"):
        kl.Producer(kl.Root(root.path)).send("t", b"b", partition=0)
    report = recover(fresh_log(log), dry_run=True)
    assert [f.reason for f in report.findings] == ["segment file is a symbolic link"]


def test_dry_runs_take_no_lock_and_create_nothing(root):
    root.create_topic("t")
    kl.Producer(root).send("t", b"a", partition=0)
    locks_dir = Path(root.path) / ".locks"
    for path in sorted(locks_dir.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    locks_dir.rmdir()
    assert kl_cli(root, "recover", "--deep", "--dry-run").returncode == 0
    assert kl_cli(root, "retain", "--dry-run").returncode == 0
    assert not locks_dir.exists()


def test_an_idle_producer_is_flushed_in_the_background_within_flush_ms(root):
    root.create_topic("t", kl.TopicConfig(flush_ms=200))
    producer = kl.Producer(root)
    producer.send("t", b"a", partition=0)  # the rule was checked at this append: not due yet
    log = root.log("t", 0)
    state = log.state()
    assert state.flushed_offset < state.log_end_offset
    for _ in range(100):  # up to 10 s on a loaded machine; the rule says 200 ms
        if log.state().flushed_offset == state.log_end_offset:
            break
        time.sleep(0.1)
    assert log.state().flushed_offset == state.log_end_offset


def test_the_flush_policy_fsyncs_outside_the_lock(root, monkeypatch):
    """The thread that fsyncs does not hold the partition's lock (the appending thread may
    still hold it then: the flush runs beside it)."""
    root.create_topic("t", kl.TopicConfig(flush_messages=1, flush_ms=0))
    log = root.log("t", 0)
    lock = locks.lock_for(log.lock_path)
    holders: set[int] = set()
    held_during_fsync = []
    real_fsync, real_acquire, real_release = os.fsync, type(lock).acquire, type(lock).release

    def acquire(self, timeout: float) -> None:
        real_acquire(self, timeout)
        if self is lock:
            holders.add(threading.get_ident())

    def release(self) -> None:
        if self is lock:
            holders.discard(threading.get_ident())
        real_release(self)

    def fsync(fd: int) -> None:
        path = os.path.realpath(f"/proc/self/fd/{fd}")
        if path.startswith(log.directory) and path.endswith(".kl"):
            held_during_fsync.append(threading.get_ident() in holders)
        real_fsync(fd)

    monkeypatch.setattr(type(lock), "acquire", acquire)
    monkeypatch.setattr(type(lock), "release", release)
    monkeypatch.setattr(os, "fsync", fsync)
    kl.Producer(root).send("t", b"a", partition=0)
    assert wait_flushed(log)
    assert held_during_fsync == [False]


def test_a_writer_trusts_what_another_writer_of_this_boot_published(root, monkeypatch):
    root.create_topic("t", kl.TopicConfig(flush_ms=0))
    kl.Producer(root).send_batch("t", [b"x" * 200] * 20_000, partition=0)  # 4 MB, never fsynced
    read_bytes = []
    real_pread = os.pread
    monkeypatch.setattr(segment_module.os, "pread", lambda fd, n, pos: read_bytes.append(n) or real_pread(fd, n, pos))
    kl.Producer(kl.Root(root.path)).send("t", b"next", partition=0)  # a new process's first append
    assert sum(read_bytes) == 0


def test_a_version_1_state_record_is_read_and_upgraded_by_the_next_writer(root):
    root.create_topic("t")
    kl.Producer(root).send("t", b"a", partition=0)
    log = root.log("t", 0)
    state = log.state()
    record = RECORD_V1.pack(b"klst", 1, *state[:7])
    with open(log.state_path, "wb") as f:
        f.write(record + CRC.pack(__import__("zlib").crc32(record)))
    assert os.path.getsize(log.state_path) == SIZE_V1
    fresh = kl.Root(root.path)
    assert fresh.log("t", 0).state().log_end_offset == state.log_end_offset
    kl.Producer(fresh).send("t", b"b", partition=0)
    assert fresh.log("t", 0).state().boot_id == PartitionState.empty().boot_id
    assert [msg.value for msg in read_log(fresh.log("t", 0))] == [b"a", b"b"]


def test_offset_back_scans_each_segment_once(root, monkeypatch):
    root.create_topic("t", kl.TopicConfig(flush_ms=0))  # no background flush opening the segment meanwhile
    kl.Producer(root).send_batch("t", [b"%d" % i for i in range(20_000)], partition=0)
    log = root.log("t", 0)
    opened = []
    real_open = segment_module.Segment.open.__func__
    monkeypatch.setattr(
        segment_module.Segment, "open", classmethod(lambda cls, *a, **k: opened.append(a[0]) or real_open(cls, *a, **k))
    )
    offset = log.offset_back(10_000)
    assert len([path for path in opened if path.startswith(root.path)]) == 1  # (other tests' logs flush meanwhile)
    assert len(read_log(log, offset)) == 10_000


def test_recover_removes_what_an_interrupted_import_left(root):
    root.create_topic("t")
    log = root.log("t", 0)
    leftover = Path(log.directory) / ".import-0123456789ab"
    leftover.write_bytes(b"half a copy")
    assert [f.action for f in recover(fresh_log(log), dry_run=True).findings] == ["would remove"]
    assert [f.action for f in recover(fresh_log(log)).findings] == ["removed"]
    assert not leftover.exists()


def _send_and_wait_for_the_background_flush(path: str, out) -> None:
    root = kl.Root(path)
    kl.Producer(root).send("t", b"from the child", partition=0)
    log = root.log("t", 0)
    for _ in range(100):
        state = log.state()
        if state.flushed_offset == state.log_end_offset:
            out.send(True)
            return
        time.sleep(0.1)
    out.send(False)


def test_the_background_flush_works_in_a_forked_child(root):
    import multiprocessing

    root.create_topic("t", kl.TopicConfig(flush_ms=200))
    kl.Producer(root).send("t", b"from the parent", partition=0)  # the parent's flusher is running
    parent_end, child_end = multiprocessing.get_context("fork").Pipe()
    child = multiprocessing.get_context("fork").Process(
        target=_send_and_wait_for_the_background_flush, args=(root.path, child_end)
    )
    child.start()
    assert parent_end.recv() is True
    child.join(30)
    assert child.exitcode == 0


@pytest.mark.parametrize("what", ["partition", "locks", "topic-locks"])
def test_a_symlinked_partition_or_lock_directory_is_refused_by_every_command(root, tmp_path, what):
    root.create_topic("t")
    kl.Producer(root).send("t", b"a", partition=0)
    link = {
        "partition": Path(root.path) / "t" / "0",
        "locks": Path(root.path) / ".locks",
        "topic-locks": Path(root.path) / ".locks" / "t",
    }[what]
    moved = tmp_path / "moved"
    os.rename(link, moved)
    os.symlink(moved, link)
    for args, code in ((["consume", "t"], 1), (["produce", "t"], 1), (["recover"], 1), (["retain"], 1)):
        done = kl_cli(root, *args, input=b"b\n")
        assert done.returncode == code, (args, done.stderr)
        assert f"{link} is a symbolic link" in (done.stdout + done.stderr).decode(), args  # recover/retain: the report
