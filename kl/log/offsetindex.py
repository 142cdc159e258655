"""Kafka offsets: each message's ordinal since its partition began, and where it lies.

kl addresses messages by byte offset; Kafka clients count them (0, 1, 2, ...; a
compressed batch's inner messages each have their own, padding has none).  The published
state carries the count at the active segment's base and at the log end
(``PartitionState.active_base_count``, ``log_end_count``), kept by every append.  A
closed segment's base count is worked out backwards from the active one: the next
segment's base count minus this one's messages; so retention, which deletes the oldest
segments, renumbers nothing.

What a segment holds is counted once, by a scan, and kept in ``<segment file>.index``:
the segment's count, the base count the chain gave it, and a sparse index (a message
start and the messages before it, about one a megabyte) that a lookup scans on from.  As
the time summary (``kl.log.timeindex``) it is a cache, believed only when its checksum
holds and it names the segment as it is now (base offset, size and modification time);
anything else is rebuilt.  A roll also writes one for the new active segment, with its
base count and nothing counted: stale at once, it still says where the active segment's
numbers begin for a state record that recovery rebuilds (``kept_base_count``).  The
format is specified in ``man/kl-format.5`` (OFFSET INDEXES).
"""

from __future__ import annotations

import bisect
import logging
import struct
import sys
import zlib
from array import array
from typing import NamedTuple

from kl.errors import CorruptMessage
from kl.log import message as m
from kl.log.fsutil import remove_file, write_cache
from kl.log.messageset import count_messages, walk
from kl.log.segment import Segment

log = logging.getLogger(__name__)

SUFFIX = ".index"
"""A segment's index is its file name with this added: ``00000000000000000000.kl.index``."""
TAG = b"klix"
VERSION = 1
HEADER = struct.Struct(">4sBQQqqQI")
"""tag, version, base_offset, size_in_bytes, mtime_ns, base_count, messages, entries."""
ENTRY = struct.Struct(">QQ")
"""position in the segment, messages of the segment before it."""
CRC = struct.Struct(">I")
INTERVAL = 1 << 20
"""Bytes of a segment between two index entries, about (a lookup scans at most that)."""
MAX_ENTRIES = 1 << 20
"""More than a segment of the largest size kl allows ever needs (a read rejects the file)."""


class SegmentIndex(NamedTuple):
    """What a closed segment holds, as Kafka offsets count it (the form kept on disk)."""

    base_offset: int
    size_in_bytes: int
    mtime_ns: int
    base_count: int
    """The Kafka offset of the segment's first message, as the chain had it when counted."""
    messages: int
    positions: array
    """Message starts, rising, the first 0: a lookup scans on from the nearest."""
    counts: array
    """The segment's messages before each of ``positions``."""

    def encode(self) -> bytes:
        header = HEADER.pack(TAG, VERSION, *self[:5], len(self.positions))
        pairs = array("q", [0]) * (2 * len(self.positions))
        pairs[0::2], pairs[1::2] = self.positions, self.counts
        if sys.byteorder == "little":
            pairs.byteswap()
        body = pairs.tobytes()
        return header + body + CRC.pack(zlib.crc32(body, zlib.crc32(header)))

    @classmethod
    def decode(cls, data: bytes) -> SegmentIndex | None:
        """The index ``data`` holds, or None when it is short, long, unknown or damaged."""
        if len(data) < HEADER.size + CRC.size:
            return None
        tag, version, base, size, mtime, base_count, count, entries = HEADER.unpack_from(data)
        if tag != TAG or version != VERSION or entries > MAX_ENTRIES:
            return None
        end = HEADER.size + entries * ENTRY.size
        if len(data) != end + CRC.size or CRC.unpack_from(data, end)[0] != zlib.crc32(data[:end]):
            return None
        pairs = array("q", data[HEADER.size : end])
        if sys.byteorder == "little":
            pairs.byteswap()
        return cls(base, size, mtime, base_count, count, pairs[0::2], pairs[1::2])


class Counted:
    """One segment's messages counted so far, in memory: the active segment's grows with
    the log (``extend``); a closed one's is whole (``of``, ``index``)."""

    __slots__ = ("base_offset", "base_count", "size_in_bytes", "count", "positions", "counts", "mtime_ns")

    def __init__(self, base_offset: int, base_count: int):
        self.base_offset = base_offset
        self.base_count = base_count
        self.size_in_bytes = 0
        """How far it is counted: a message boundary."""
        self.count = 0
        """The segment's messages up to ``size_in_bytes``."""
        self.positions = array("q")
        self.counts = array("q")
        self.mtime_ns: int | None = None
        """A closed segment's modification time when it was counted (None while active)."""

    @classmethod
    def of(cls, index: SegmentIndex) -> Counted:
        counted = cls(index.base_offset, index.base_count)
        counted.size_in_bytes, counted.count = index.size_in_bytes, index.messages
        counted.positions, counted.counts = index.positions, index.counts
        return counted

    def index(self, mtime_ns: int) -> SegmentIndex:
        return SegmentIndex(
            self.base_offset, self.size_in_bytes, mtime_ns, self.base_count, self.count, self.positions, self.counts
        )

    def extend(self, segment: Segment, end: int) -> None:
        """Count on up to position ``end``.  Raises ``CorruptMessage`` where valid messages
        stop before it."""
        if end <= self.size_in_bytes:
            return
        limit = segment.max_message_bytes

        def follow(buf: bytes, at: int) -> int:
            stop = walk(buf, 0, len(buf), limit)[0]
            if not self.positions or at - self.positions[-1] >= INTERVAL:
                self.positions.append(at)
                self.counts.append(self.count)
            self.count += count_messages(buf[:stop], limit)
            return stop

        reached = segment.chained(self.size_in_bytes, end, follow)
        if reached < end:
            self.size_in_bytes = reached
            raise CorruptMessage(segment.path, reached, "no message to count starts here", offset=segment.base_offset + reached)
        self.size_in_bytes = end

    def find(self, segment: Segment, *, count: int | None = None, position: int | None = None) -> tuple[int, int]:
        """Within what is counted: (position, skip) of the segment's message number
        ``count`` (skip: how many of the compressed batch there come first; the counted
        end past the last), or (``position``, the messages before it) for a message start.
        Scans on from the nearest index entry."""
        keys, wanted = (self.counts, count) if count is not None else (self.positions, position)
        assert wanted is not None
        i = bisect.bisect_right(keys, wanted) - 1
        at, before = (self.positions[i], self.counts[i]) if i >= 0 else (0, 0)
        limit = segment.max_message_bytes
        found: list[tuple[int, int]] = []

        def follow(buf: bytes, start: int) -> int:
            nonlocal before
            pos, size = 0, len(buf)
            while pos + m.LENGTH_SIZE <= size:
                if position is not None and start + pos >= position:
                    found.append((start + pos, before))
                    return 0
                stop = pos + m.LENGTH_SIZE + int.from_bytes(buf[pos : pos + m.LENGTH_SIZE], "big")
                if stop > size or walk(buf, pos, stop, limit)[0] != stop:
                    return pos  # cut off by the chunk (read again whole), or damaged
                k = message_count(buf[pos:stop], limit)
                if count is not None and before + k > count:
                    found.append((start + pos, count - before))
                    return 0
                before += k
                pos = stop
            return pos

        end = segment.chained(at, self.size_in_bytes, follow)
        if found:
            return found[0]
        if count is not None:
            return end, count - before
        return end, before


def complete(index: SegmentIndex) -> bool:
    """Whether its entries cover the segment (one a roll wrote has none)."""
    return bool(index.positions) and index.positions[-1] + 2 * INTERVAL >= index.size_in_bytes


def index_path(segment_path: str) -> str:
    return segment_path + SUFFIX


def read(segment_path: str, base_offset: int, size_in_bytes: int, mtime_ns: int | None) -> SegmentIndex | None:
    """The index kept for the segment as it is now, or None (missing, damaged or stale);
    ``mtime_ns`` None: of any modification time (a copy's, ``kl topics import``)."""
    path = index_path(segment_path)
    data = _contents(path)
    if data is None:
        return None
    index = SegmentIndex.decode(data)
    if index is None:
        log.info("%s: offset index is damaged; rebuilding it", path)
        return None
    if (index.base_offset, index.size_in_bytes) != (base_offset, size_in_bytes) or mtime_ns not in (None, index.mtime_ns):
        log.info("%s: offset index is stale; rebuilding it", path)
        return None
    return index


def kept_base_count(segment_path: str, base_offset: int) -> int | None:
    """The base count an index kept for the segment at ``base_offset`` says, stale or not
    (the active segment's, written when it was rolled to), or None (missing, damaged,
    of another segment, unknown)."""
    data = _contents(index_path(segment_path))
    index = None if data is None else SegmentIndex.decode(data)
    if index is None or index.base_offset != base_offset or index.base_count < 0:
        return None
    return index.base_count


def _contents(path: str) -> bytes | None:
    """An index file's bytes (one byte past the largest index: a longer file reads as
    damaged), or None where it cannot be read."""
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(HEADER.size + MAX_ENTRIES * ENTRY.size + CRC.size + 1)
    except OSError:
        return None


def keep_base_count(segment_path: str, base_offset: int, base_count: int) -> bool:
    """Keep the base count of the active segment at ``base_offset`` in an index of it
    with no messages (stale as soon as it grows, but it says where its numbers begin,
    for a state record that is lost); False when it cannot be written."""
    return write(segment_path, SegmentIndex(base_offset, 0, 0, base_count, 0, array("q"), array("q")))


def write(segment_path: str, index: SegmentIndex) -> bool:
    """Keep ``index`` beside its segment, not durably (a cache: after a crash it is rebuilt);
    False when it cannot be written (a reader without write access, a full disk)."""
    return write_cache(index_path(segment_path), index.encode(), durable=False)


def remove(segment_path: str) -> bool:
    """Remove a segment's index; False when there was none."""
    return remove_file(index_path(segment_path))


def segment_count(segment: Segment, end: int) -> int:
    """How many Kafka offsets the messages of ``segment`` below position ``end`` take.
    Raises ``CorruptMessage`` where they cannot be counted."""
    counted = Counted(segment.base_offset, 0)  # (its base count does not matter here)
    counted.extend(segment, end)
    return counted.count


def message_count(message: bytes, max_message_bytes: int) -> int:
    """How many Kafka offsets one valid message takes: its inner messages when it is a
    compressed batch, none when it is padding, else one."""
    if not message[m.MAGIC_OFFSET] or not message[m.ATTRIBUTES_OFFSET] & (m.CODEC_MASK | m.ATTR_PADDING):
        return 1
    return count_messages(message, max_message_bytes)
