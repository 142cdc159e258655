"""The fence around NFS appends (``Log._announce``, ``_fence``, ``_check_fence``), on local
files: a writer here is made to take the NFS path, and a holder that lost its lock is
played by a ``Log`` that put up its "append under way" mark and then stopped, or that
writes late through a descriptor it kept.  The real thing, a paused and cut-off host, is
in ``test_nfs_fencing.py``."""

from __future__ import annotations

import os
import zlib

import pytest

import kl
import kl.log.log
from kl.log.messageset import frame
from kl.log.recovery import recover
from kl.log.segment import list_segments, segment_name
from kl.log.state import CRC, MARK_OFFSET, RECORD_V2, SIZE, STATE_FILE, UNKNOWN, PartitionState, StateFile
from kl.log.validate import Checked

from faultlib import append_bytes, fresh_log, read_log

TS = 1_700_000_000_000


@pytest.fixture
def nfs(monkeypatch):
    """Every ``Log`` made from now on takes the NFS path (marks, fences, fsync before publishing)."""
    monkeypatch.setattr(kl.log.log, "mount_of", lambda directory: ("/", "nfs4", "rw,vers=4.2"))


def values(log: kl.Log) -> list[bytes]:
    return [msg.value for msg in read_log(fresh_log(log))]


def send(root: kl.Root, *batch: bytes) -> None:
    producer = kl.Producer(kl.Root(root.path))
    producer.send_batch("t", list(batch), partition=0)
    producer.close()


def stopped_holder(root: kl.Root) -> tuple[kl.Log, int, int]:
    """A writer that took the lock and put up its mark, then stopped (the lock lost):
    its log, a descriptor of the segment it would write, and where it would write."""
    log = fresh_log(root.log("t", 0))
    with log.locked():
        state = log.writable_state()
        fd = os.open(os.path.join(log.directory, segment_name(state.active_base_offset)), os.O_RDWR)
        position = state.log_end_offset - state.active_base_offset
    return log, fd, position


def test_the_next_append_after_a_holder_that_stopped_after_its_mark_starts_a_new_segment(root, nfs):
    root.create_topic("t")
    send(root, b"first-0", b"first-1")
    end = root.log("t", 0).state().log_end_offset
    _, fd, position = stopped_holder(root)
    send(root, b"b-0", b"b-1")
    log = fresh_log(root.log("t", 0))
    assert log.state().active_base_offset == end
    assert [base for base, _ in list_segments(log.directory)] == [0, end]
    os.pwrite(fd, frame([b"late-0", b"late-1"], TS), position)  # the stopped holder wakes and writes
    os.close(fd)
    assert values(log) == [b"first-0", b"first-1", b"b-0", b"b-1"]
    assert [s.size_in_bytes for s in log.segments()] == [end, log.state().log_end_offset - end]
    findings = recover(fresh_log(log), deep=True, dry_run=True).findings
    assert [(f.offset, f.kind) for f in findings] == [(end, "LONG_FILE")]
    assert "written late by a writer that had lost its lock" in findings[0].reason


def test_bytes_past_the_end_of_the_active_segment_make_the_next_append_start_a_new_segment(root, nfs):
    root.create_topic("t")
    send(root, b"first")
    log = fresh_log(root.log("t", 0))
    end = log.state().log_end_offset
    append_bytes(os.path.join(log.directory, segment_name(0)), frame([b"never published"], TS))
    send(root, b"second")
    assert log.state().active_base_offset == end
    assert os.path.getsize(os.path.join(log.directory, segment_name(0))) == end
    assert values(log) == [b"first", b"second"]


def test_a_holder_that_stopped_after_its_mark_on_an_empty_partition_writes_into_a_file_nobody_reads(root, nfs):
    root.create_topic("t")
    _, fd, position = stopped_holder(root)
    assert position == 0
    send(root, b"b-0")
    os.pwrite(fd, frame([b"late-0", b"late-1"], TS), position)
    os.close(fd)
    log = fresh_log(root.log("t", 0))
    assert log.state().active_base_offset == 0
    assert values(log) == [b"b-0"]
    assert recover(fresh_log(log), deep=True, dry_run=True).findings == []


def test_a_finished_append_leaves_no_new_segment_to_the_next(root, nfs):
    root.create_topic("t")
    for i in range(3):
        send(root, b"%d" % i)
    log = fresh_log(root.log("t", 0))
    assert [base for base, _ in list_segments(log.directory)] == [0]
    assert values(log) == [b"0", b"1", b"2"]


def foreign_mark(log: kl.Log) -> None:
    """Another host puts up its mark: it took the partition over."""
    state_file = StateFile(log.state_path, mapped=False)
    try:
        state_file.write_mark(b"\xee" * 16)
    finally:
        state_file.close()


def test_a_writer_that_finds_another_hosts_mark_before_publishing_publishes_nothing_and_fails_for_good(root, nfs, monkeypatch):
    root.create_topic("t")
    send(root, b"first")
    log = fresh_log(root.log("t", 0))
    before = log.state()
    real_fsync = kl.Log.fsync

    def fsync(self, segment):
        foreign_mark(self)  # while this host's data goes out, another host takes over
        real_fsync(self, segment)

    monkeypatch.setattr(kl.Log, "fsync", fsync)
    with pytest.raises(kl.StorageError, match="lost its lock on the partition.*another host took it over"):
        log.append(Checked.framed(frame([b"stale"], TS), 1))
    monkeypatch.setattr(kl.Log, "fsync", real_fsync)
    assert fresh_log(log).state() == before
    with pytest.raises(kl.StorageError, match="no further appends through this handle"):
        log.append(Checked.framed(frame([b"again"], TS), 1))
    send(root, b"next")  # another writer goes on, in a new segment
    assert fresh_log(log).state().active_base_offset == before.log_end_offset
    assert values(log) == [b"first", b"next"]


def test_a_writer_whose_record_changed_while_it_put_up_its_mark_writes_nothing(root, nfs, monkeypatch):
    root.create_topic("t")
    send(root, b"first")
    log = fresh_log(root.log("t", 0))
    before = log.state()
    real_write_mark = StateFile.write_mark

    def write_mark(self, token):  # another host published between this writer's read and its mark
        os.pwrite(self.fd, before._replace(flushed_at_ms=1).encode(), 0)
        real_write_mark(self, token)

    monkeypatch.setattr(StateFile, "write_mark", write_mark)
    with pytest.raises(kl.StorageError, match="another host took it over"):
        log.append(Checked.framed(frame([b"stale"], TS), 1))
    monkeypatch.setattr(StateFile, "write_mark", real_write_mark)
    assert os.path.getsize(os.path.join(log.directory, segment_name(0))) == before.log_end_offset
    assert values(log) == [b"first"]


def test_the_published_record_carries_the_token_of_the_mark(root, nfs):
    root.create_topic("t")
    send(root, b"first")
    log = fresh_log(root.log("t", 0))
    with open(log.state_path, "rb") as f:
        data = f.read()
    state = PartitionState.decode(data, log.state_path)
    assert state.token != bytes(16)
    assert data[MARK_OFFSET : MARK_OFFSET + 4] == b"klmk" and data[MARK_OFFSET + 4 : MARK_OFFSET + 20] == state.token


def test_local_disks_put_up_no_mark(root):
    root.create_topic("t")
    send(root, b"first")
    log = root.log("t", 0)
    assert os.path.getsize(os.path.join(log.directory, STATE_FILE)) == SIZE
    assert log.state().token == bytes(16)


@pytest.mark.parametrize("on_nfs", [False, True])
def test_a_version_2_state_record_is_read_and_upgraded_by_the_next_writer(root, monkeypatch, on_nfs):
    if on_nfs:
        monkeypatch.setattr(kl.log.log, "mount_of", lambda directory: ("/", "nfs4", "rw"))
    root.create_topic("t")
    send(root, b"a")
    log = fresh_log(root.log("t", 0))
    state = log.state()
    record = RECORD_V2.pack(b"klst", 2, *state[:8])
    with open(log.state_path, "wb") as f:
        f.write(record + CRC.pack(zlib.crc32(record)))
    assert fresh_log(log).state() == state._replace(token=bytes(16), active_base_count=UNKNOWN, log_end_count=UNKNOWN)
    assert fresh_log(log).counted().log_end_count == 1  # a reader counts what it lacks
    send(root, b"b")
    with open(log.state_path, "rb") as f:
        assert f.read()[4] == kl.log.state.VERSION
    assert fresh_log(log).state().log_end_count == 2
    assert fresh_log(log).state().active_base_offset == 0  # a version 2 record has no mark: nothing unfinished
    assert values(log) == [b"a", b"b"]


def test_a_writer_that_lost_its_lock_removes_no_segment_past_the_active_one_when_it_rolls(root, nfs):
    root.create_topic("t")
    send(root, b"first")
    log = fresh_log(root.log("t", 0))
    end = log.state().log_end_offset
    taken_over = os.path.join(log.directory, segment_name(end))
    with log.locked():
        state = log.writable_state()
        foreign_mark(log)  # another host took over, and began a segment at the log end
        with open(taken_over, "wb") as f:
            f.write(frame([b"b-0"], TS))
        with pytest.raises(kl.StorageError, match="another host took it over"):
            log._write_rolled(state, frame([b"stale"], TS), True)
    with open(taken_over, "rb") as f:
        assert f.read() == frame([b"b-0"], TS)
