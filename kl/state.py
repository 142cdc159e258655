"""A partition's published state: the record that tells readers how far the log goes.

Writers update it in place, under the partition lock, after their data is written;
readers take no lock and read it first, so they never look past ``log_end_offset`` and
never see a message set that is partial or not yet published.  The record carries a
CRC32; a reader that catches it mid-update reads again.  See ``man/kl-format.5``.

``stable_offset`` splits the log in two.  Below it, data was both flushed and followed by
a later append, so a bad message there is corruption.  From it to the log end lies only
what a crash can tear (the last append, and anything not yet fsynced): a bad message
there is a torn tail, which readers stop at and recovery may cut.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from typing import NamedTuple

from kl.errors import CorruptState, TopicNotFound

STATE_FILE = "state"
TAG = b"klst"
DELETED_TAG = b"kldl"
"""Written over the record by ``kl topics delete`` so writers holding it open notice."""
VERSION = 1
RECORD = struct.Struct(">4sBQQQQQIQ")
CRC = struct.Struct(">I")
SIZE = RECORD.size + CRC.size
_READ_ATTEMPTS = 20


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

    @property
    def stable_offset(self) -> int:
        return min(self.flushed_offset, self.last_append_offset)

    @classmethod
    def empty(cls, base_offset: int = 0) -> PartitionState:
        return cls(base_offset, base_offset, base_offset, base_offset, base_offset, 0, time.time_ns() // 1_000_000)

    def encode(self) -> bytes:
        record = RECORD.pack(TAG, VERSION, *self)
        return record + CRC.pack(zlib.crc32(record))

    @classmethod
    def decode(cls, data: bytes, path: str) -> PartitionState:
        """Raises ``CorruptState`` when the record is short, unknown or fails its checksum."""
        if len(data) < SIZE:
            raise CorruptState(f"partition state {path} is {len(data)} bytes, expected {SIZE}")
        record = data[: RECORD.size]
        if CRC.unpack_from(data, RECORD.size)[0] != zlib.crc32(record):
            raise CorruptState(f"partition state {path} fails its checksum")
        tag, version, *fields = RECORD.unpack(record)
        if tag == DELETED_TAG:
            raise TopicNotFound(f"partition {os.path.dirname(path)} was deleted")
        if tag != TAG or version != VERSION:
            raise CorruptState(f"partition state {path} has unknown tag {tag!r} version {version}")
        state = cls(*fields)
        if not state.log_start_offset <= state.active_base_offset <= state.log_end_offset:
            raise CorruptState(f"partition state {path} has inconsistent offsets {state}")
        return state


def deleted_record() -> bytes:
    """The record that marks a partition deleted."""
    record = RECORD.pack(DELETED_TAG, VERSION, 0, 0, 0, 0, 0, 0, 0)
    return record + CRC.pack(zlib.crc32(record))


def read_state(path: str) -> PartitionState:
    """Read the published state without a lock (re-reading a record caught mid-update).

    Opens the file each time so NFS close-to-open consistency gives a fresh copy.
    Raises ``FileNotFoundError`` when it does not exist and ``CorruptState`` when it stays bad.
    """
    attempt = 0
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
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
