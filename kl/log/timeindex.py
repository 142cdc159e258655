"""A closed segment's time summary: the largest timestamp in it, kept in a file beside it.

Retention (``kl retain --max-age``) and time lookups (``--from-time``) need each
segment's *newest* message, whatever order the timestamps came in (Kafka's rule).  A
closed segment never changes, so its summary is worked out once, by a scan of its
messages, and kept in ``<segment file>.time``: one fixed record specified in
``man/kl-format.5`` (TIME SUMMARIES), which these numbers mirror.

The file is a cache, never the truth: a summary is believed only when its checksum
holds and it names the segment as it is now (base offset, size and modification
time); anything else (missing, short, damaged, stale) is ignored and rebuilt.  Anyone
may (re)write one: the content depends only on the segment, the write is atomic, and a
reader without write access simply keeps what it worked out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from kl.log.fsutil import remove_file, write_cache
from kl.log.message import Message
from kl.log.segment import parse_name

log = logging.getLogger(__name__)

SUFFIX = ".time"
"""A segment's summary is its file name with this added: ``00000000000000000000.kl.time``."""
TAG = b"kltm"
VERSION = 1
RECORD = struct.Struct(">4sBQQqqQ")
"""tag, version, base_offset, size_in_bytes, mtime_ns, max_timestamp, untimed_messages."""
CRC = struct.Struct(">I")
SIZE = RECORD.size + CRC.size
NO_TIMESTAMP = -(1 << 63)
"""``max_timestamp`` of a segment none of whose messages carries a timestamp."""


class TimeSummary(NamedTuple):
    """What a closed segment's messages say about time."""

    base_offset: int
    size_in_bytes: int
    mtime_ns: int
    """The segment file's modification time when the summary was made."""
    max_timestamp: int
    """The largest timestamp in the segment, or ``NO_TIMESTAMP``."""
    untimed_messages: int
    """Messages without a timestamp (magic 0 and 1)."""

    @property
    def newest(self) -> int | None:
        """The largest timestamp, None when no message carries one."""
        return None if self.max_timestamp == NO_TIMESTAMP else self.max_timestamp

    def encode(self) -> bytes:
        record = RECORD.pack(TAG, VERSION, *self)
        return record + CRC.pack(zlib.crc32(record))

    @classmethod
    def decode(cls, data: bytes) -> TimeSummary | None:
        """The summary ``data`` holds, or None when it is short, long, unknown or damaged."""
        if len(data) != SIZE or CRC.unpack_from(data, RECORD.size)[0] != zlib.crc32(data[: RECORD.size]):
            return None
        tag, version, *fields = RECORD.unpack_from(data)
        if tag != TAG or version != VERSION:
            return None
        return cls(*fields)

    @classmethod
    def of(cls, base_offset: int, size_in_bytes: int, mtime_ns: int, messages: Iterable[Message]) -> TimeSummary:
        """The summary of a segment holding ``messages``."""
        newest, untimed = NO_TIMESTAMP, 0
        for msg in messages:
            ts = msg.timestamp
            if ts is None:
                untimed += 1
            elif ts > newest:
                newest = ts
        return cls(base_offset, size_in_bytes, mtime_ns, newest, untimed)


def summary_path(segment_path: str) -> str:
    return segment_path + SUFFIX


def read(segment_path: str, base_offset: int, size_in_bytes: int, mtime_ns: int) -> TimeSummary | None:
    """The summary kept for the segment as it is now, or None (missing, damaged or stale)."""
    path = summary_path(segment_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.pread(fd, SIZE + 1, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    summary = TimeSummary.decode(data)
    if summary is None:
        log.info("%s: time summary is damaged; rebuilding it", path)
        return None
    if (summary.base_offset, summary.size_in_bytes, summary.mtime_ns) != (base_offset, size_in_bytes, mtime_ns):
        log.info("%s: time summary is stale (%s); rebuilding it", path, summary)
        return None
    return summary


def write(segment_path: str, summary: TimeSummary) -> bool:
    """Keep ``summary`` beside its segment; False when it cannot be written (a reader
    without write access to the root, a full disk: the next run works it out again)."""
    return write_cache(summary_path(segment_path), summary.encode())


def remove(segment_path: str) -> bool:
    """Remove a segment's summary; False when there was none."""
    return remove_file(summary_path(segment_path))


def orphans(directory: str, bases: set[int], names: Iterable[str] | None = None, suffix: str = SUFFIX) -> list[str]:
    """Paths of summaries (or with ``suffix``, of another file kept beside a segment, as
    offset indexes) in ``directory`` whose segment (by base offset) is not in ``bases``;
    ``names``: the directory's entries, when the caller has listed them."""
    if names is None:
        names = []
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
    found = []
    for name in names:
        if name.endswith(suffix) and not name.startswith("."):
            base = parse_name(name[: -len(suffix)])
            if base is not None and base not in bases:
                found.append(os.path.join(directory, name))
    return found
