"""On NFS a writer keeps the state file and the active segment open between two holds of
the partition lock, unlocked (``Log._let_go``), and locks them again at the next hold,
which revalidates them.  Here on local files, a writer made to take the NFS path; the
real thing (other hosts appending between two holds, a holder cut off or paused) is in
test_nfs*.py."""

from __future__ import annotations

import os

import pytest

import kl
import kl.log.log
from kl.errors import LockTimeout
from kl.log import locks
from kl.log.segment import segment_path

from faultlib import fresh_log, read_log


@pytest.fixture
def nfs(monkeypatch):
    """Every ``Log`` made from now on takes the NFS path (marks, fences, fsync before publishing)."""
    monkeypatch.setattr(kl.log.log, "mount_of", lambda directory: ("/", "nfs4", "rw,vers=4.2"))


def open_paths() -> list[str]:
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor
            pass
    return paths


def one_append(root: kl.Root) -> tuple[kl.Producer, kl.log.log.Log, str]:
    """A producer that appended "a" to topic t's partition 0, its log and active segment."""
    root.create_topic("t")
    producer = kl.Producer(root)
    producer.send_batch("t", [b"a"], partition=0)
    log = root.log("t", 0)
    return producer, log, segment_path(log.directory, 0)


def test_between_two_appends_the_files_stay_open_and_another_writer_can_lock_them(root, nfs):
    producer, log, active = one_append(root)
    assert open_paths().count(active) == 1 and open_paths().count(log.state_path) == 1
    for path in (log.state_path, active):  # as another host would, between two holds
        fd = os.open(path, os.O_RDWR)
        try:
            locks.lock_file(fd, path, 0)
        finally:
            os.close(fd)
    producer.send_batch("t", [b"b"], partition=0)
    assert open_paths().count(active) == 1  # the same descriptor, not one more per append
    fd = os.open(active, os.O_RDWR)
    try:
        with pytest.raises(LockTimeout):  # while a hold is on, the kept file is locked again
            with log.locked():
                log.writable_state()
                locks.lock_file(fd, active, 0)
    finally:
        os.close(fd)
    producer.close()
    assert [m.value for m in read_log(fresh_log(log))] == [b"a", b"b"]


def test_a_kept_segment_replaced_between_two_appends_is_left_for_the_new_file(root, nfs):
    producer, log, active = one_append(root)
    with open(active, "rb") as f:
        data = f.read()
    with open(active + ".new", "wb") as f:  # another host replaced the file (as a fence does an empty one)
        f.write(data)
    os.rename(active + ".new", active)
    producer.send_batch("t", [b"b"], partition=0)
    producer.close()
    assert [m.value for m in read_log(fresh_log(log))] == [b"a", b"b"]
