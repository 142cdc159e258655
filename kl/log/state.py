"""A partition's published state: the record that tells readers how far the log goes.

Writers update it in place, under the partition lock, after their data is written;
readers take no lock and read it first, so they never look past ``log_end_offset`` and
never see a message set that is partial or not yet published.  The record carries a
CRC32; a reader that catches it mid-update reads again.  See ``man/kl-format.5``.

The *stable offset* splits the published log in two.  Below it, no crash can have torn
the data, so a bad message there is corruption.  From it to the log end lies what a
power cut or kernel crash may have torn: data that was not yet fsynced when the machine
went down.  Which data that is depends on the boot the record was written in: while the
kernel that wrote it still runs (``boot_id`` is this boot's), everything published is
in its page cache and intact, so the stable offset is the log end; after a reboot (or
when another host wrote it) only what was fsynced is trusted: ``flushed_offset``.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import time
import uuid
import zlib
from collections.abc import Callable
from typing import NamedTuple

from kl.errors import CorruptState, TopicNotFound
from kl.log.fsutil import fsync_dir, open_file

STATE_FILE = "state"
TAG = b"klst"
DELETED_TAG = b"kldl"
"""Written over the record by ``kl topics delete`` so writers holding it open notice."""
VERSION = 5
RECORD = struct.Struct(">4sBQQQQQIQ16s16sqqQ")
RECORD_V4 = struct.Struct(">4sBQQQQQIQ16s16sqq")
"""Version 4 had no producer serial; it is read (serial 0) and rewritten as version 5 by
the next writer."""
RECORD_V3 = struct.Struct(">4sBQQQQQIQ16s16s")
"""Version 3 had no message counts; it is read (counts ``UNKNOWN``) and rewritten by the next
writer."""
RECORD_V2 = struct.Struct(">4sBQQQQQIQ16s")
"""Version 2 had no append token; it is read, and rewritten as version 3 by the next writer."""
RECORD_V1 = struct.Struct(">4sBQQQQQIQ")
"""Version 1 (kl 0.1) had no boot id either."""
CRC = struct.Struct(">I")
SIZE = RECORD.size + CRC.size
SIZE_V1 = RECORD_V1.size + CRC.size
VERSION_OFFSET = 4
NO_BOOT = bytes(16)
NO_TOKEN = bytes(16)
MARK_TAG = b"klmk"
MARK = struct.Struct(">4s16s")
"""The "append under way" mark: tag and the token of the append (``StateFile.write_mark``)."""
MARK_OFFSET = 512
"""Where the mark lies in the state file, past the record (readers read only the record)."""
ROLL_TAG = b"klrl"
ROLL_MARK = struct.Struct(">4sQ")
"""The "roll under way" mark: tag and the base offset of the segment a roll creates."""
ROLL_MARK_OFFSET = 576
"""Where the roll mark lies in the state file, past the append mark."""
_READ_ATTEMPTS = 20
UNKNOWN = -1
"""A message count the record does not carry (one of an older kl, or rebuilt by recovery):
worked out from the segments (``kl.log.offsetindex``)."""


def _boot_id() -> bytes:
    """This kernel's boot id (Linux), or ``NO_BOOT`` where there is none to be had."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return NO_BOOT


BOOT_ID = _boot_id()
"""The boot this process runs in; a record written in it vouches for all it publishes."""


class PartitionState(NamedTuple):
    """Offsets are byte offsets in the partition's stream."""

    log_start_offset: int
    active_base_offset: int
    log_end_offset: int
    flushed_offset: int
    """Everything below it was fsynced."""
    last_append_offset: int
    """Where the latest append began."""
    unflushed_messages: int
    flushed_at_ms: int
    boot_id: bytes = NO_BOOT
    """The boot of the kernel that wrote the record (``NO_BOOT``: unknown)."""
    token: bytes = NO_TOKEN
    """On NFS: the token of the append (or other change under the lock) that wrote the
    record, which its "append under way" mark carried (``NO_TOKEN`` elsewhere)."""
    active_base_count: int = UNKNOWN
    """Messages before the active segment since the partition began: the Kafka offset of
    its first message (a compressed batch counts its inner messages, padding none)."""
    log_end_count: int = UNKNOWN
    """Messages before the log end since the partition began: the Kafka offset the next
    message gets."""
    producer_serial: int = 0
    """The serial of the last published record of the partition's producer journal
    (``kl.log.producers``): idempotent appends count it up, others carry it over."""

    @property
    def stable_offset(self) -> int:
        """Below it a bad message is corruption; from it to the log end, a torn tail."""
        if self.boot_id == BOOT_ID and BOOT_ID != NO_BOOT:
            return self.log_end_offset
        return self.flushed_offset

    @classmethod
    def empty(cls, base_offset: int = 0, count: int = 0) -> PartitionState:
        """A partition holding nothing, beginning at ``base_offset`` with ``count`` messages
        before it (the Kafka offset its first message gets)."""
        now = time.time_ns() // 1_000_000
        return cls(base_offset, base_offset, base_offset, base_offset, base_offset, 0, now, BOOT_ID, NO_TOKEN, count, count)

    def encode(self) -> bytes:
        start, base, end, flushed, last, unflushed, flushed_at, boot, token, base_count, end_count, serial = self  # (not *self)
        record = RECORD.pack(
            TAG, VERSION, start, base, end, flushed, last, unflushed, flushed_at, boot, token, base_count, end_count, serial
        )
        return record + CRC.pack(zlib.crc32(record))

    @classmethod
    def decode(cls, data: bytes, path: str) -> PartitionState:
        """Raises ``CorruptState`` when the record is short, unknown or fails its checksum,
        and ``TopicNotFound`` when it is the deleted mark."""
        version = data[VERSION_OFFSET] if len(data) > VERSION_OFFSET else -1
        layout = {VERSION: RECORD, 4: RECORD_V4, 3: RECORD_V3, 2: RECORD_V2, 1: RECORD_V1}.get(version)
        if layout is None:
            raise CorruptState(f"partition state {path} has unknown version {version}; run 'kl recover'")
        if len(data) < layout.size + CRC.size:
            expected = layout.size + CRC.size
            raise CorruptState(f"partition state {path} is {len(data)} bytes, expected {expected}; run 'kl recover'")
        record = data[: layout.size]
        if CRC.unpack_from(data, layout.size)[0] != zlib.crc32(record):
            raise CorruptState(f"partition state {path} fails its checksum; run 'kl recover'")
        tag, _, *fields = layout.unpack(record)
        if tag == DELETED_TAG:
            raise TopicNotFound(f"partition {os.path.dirname(path)} was deleted")
        if tag != TAG:
            raise CorruptState(f"partition state {path} has unknown tag {tag!r}; run 'kl recover'")
        state = cls(*fields)
        if not state.log_start_offset <= state.active_base_offset <= state.log_end_offset or not (
            state.active_base_count <= state.log_end_count or state.log_end_count == UNKNOWN
        ):
            raise CorruptState(f"partition state {path} has inconsistent offsets {state}; run 'kl recover'")
        return state


def deleted_record() -> bytes:
    """The record that marks a partition deleted."""
    record = RECORD.pack(DELETED_TAG, VERSION, 0, 0, 0, 0, 0, 0, 0, NO_BOOT, NO_TOKEN, UNKNOWN, UNKNOWN, 0)
    return record + CRC.pack(zlib.crc32(record))


def read_state(path: str, revalidate: Callable[[int], None] | None = None) -> PartitionState:
    """Read the published state without the partition lock (re-reading a record caught
    mid-update).  ``revalidate`` is called with the open descriptor first (on NFS: a
    shared lock, the point where the client drops what it cached).

    Raises ``FileNotFoundError`` when it does not exist and ``CorruptState`` when it stays bad.
    """
    attempt = 0
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if revalidate is not None:
                revalidate(fd)
            data = os.pread(fd, SIZE, 0)
        finally:
            os.close(fd)
        try:
            return PartitionState.decode(data, path)
        except CorruptState:
            attempt += 1
            if attempt == _READ_ATTEMPTS:
                raise
            time.sleep(0.001 * attempt)


class StateFile:
    """A writer's handle on a partition's state record, used under the partition lock.

    On local disks the record is mapped, so reading it costs no system call (it is
    written with ``pwrite``, see ``write``).  On NFS (``mapped`` false) it is opened with ``O_DIRECT``: every read and write
    goes to the server, past this host's page cache, which is what the "append under
    way" mark (``read_marked``, ``write_mark``) needs to fence a writer that lost its
    lock.  An older, shorter record is lengthened on opening so that the current one
    fits.  Raises ``FileNotFoundError`` when the file is missing and ``CorruptState``
    when it is short.
    """

    __slots__ = ("path", "fd", "_map")

    def __init__(self, path: str, *, mapped: bool):
        self.path = path
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            self.fd = os.open(path, flags if mapped else flags | os.O_DIRECT)
        except OSError as e:  # a file system without direct I/O (tmpfs)
            if e.errno != errno.EINVAL:
                raise
            self.fd = os.open(path, flags)
        self._map: mmap.mmap | None = None
        try:
            size = os.fstat(self.fd).st_size
            if size < SIZE:
                if size < SIZE_V1:
                    raise CorruptState(f"partition state {path} is {size} bytes; run 'kl recover'")
                PartitionState.decode(self._pread(SIZE, 0), path)
                os.ftruncate(self.fd, SIZE)
            if mapped:
                self._map = mmap.mmap(self.fd, SIZE)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"StateFile({self.path!r})"

    def _pread(self, size: int, position: int) -> bytes:
        try:
            return os.pread(self.fd, size, position)
        except OSError as e:
            if e.errno != errno.EINVAL or not self._buffered():
                raise
            return os.pread(self.fd, size, position)

    def _pwrite(self, data: bytes, position: int) -> None:
        try:
            written = os.pwrite(self.fd, data, position)
        except OSError as e:
            if e.errno != errno.EINVAL or not self._buffered():
                raise
            written = os.pwrite(self.fd, data, position)
        if written != len(data):
            raise OSError(errno.EIO, "short write")

    def _buffered(self) -> bool:
        """Turn direct I/O off (a local file system that wants it aligned); False when it was off."""
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        if not flags & os.O_DIRECT:
            return False
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        return True

    def read(self) -> bytes:
        """The record's raw bytes (decode them with ``PartitionState.decode``)."""
        return self._map[:SIZE] if self._map is not None else self._pread(SIZE, 0)

    def read_marked(self) -> tuple[bytes, bytes | None]:
        """The record's raw bytes and the token of the "append under way" mark (None
        when there is none), in one read."""
        data = self._pread(MARK_OFFSET + MARK.size, 0)
        mark = data[MARK_OFFSET:]
        if len(mark) == MARK.size and mark.startswith(MARK_TAG):
            return data[:SIZE], MARK.unpack(mark)[1]
        return data[:SIZE], None

    def write_mark(self, token: bytes) -> None:
        """Write the "append under way" mark carrying ``token``, through to the server."""
        self._pwrite(MARK.pack(MARK_TAG, token), MARK_OFFSET)

    def read_roll_mark(self) -> int | None:
        """The base offset the last roll put up before creating its segment (None: no roll yet)."""
        data = self._pread(ROLL_MARK.size, ROLL_MARK_OFFSET)
        if len(data) == ROLL_MARK.size and data.startswith(ROLL_TAG):
            return int(ROLL_MARK.unpack(data)[1])
        return None

    def write_roll_mark(self, base_offset: int) -> None:
        """Put up the roll mark for a segment at ``base_offset`` (before it is created)."""
        self._pwrite(ROLL_MARK.pack(ROLL_TAG, base_offset), ROLL_MARK_OFFSET)

    def write(self, raw: bytes) -> None:
        """Write an encoded record in place (not durable until ``fsync``), with one
        ``pwrite`` even where the file is mapped: a write within one page is done whole
        or not at all when the writer is killed, while a copy into the mapping can be
        cut off by kill -9 halfway (a torn record, ``CorruptState`` for every reader)."""
        self._pwrite(raw, 0)

    def fsync(self) -> None:
        os.fsync(self.fd)

    def unlinked(self) -> bool:
        """The file was removed or replaced since it was opened."""
        return os.fstat(self.fd).st_nlink == 0

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def write_state(path: str, state: PartitionState) -> None:
    """Write a whole record in place (the file created if missing), durably: for
    recovery and imports, which set the state rather than append to the log."""
    fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        raw = state.encode()
        if os.pwrite(fd, raw, 0) != len(raw):
            raise OSError(errno.EIO, "short write")
        if os.fstat(fd).st_size < SIZE:  # (a longer file keeps its "append under way" mark)
            os.ftruncate(fd, SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(path))
