"""Segment files: naming, listing, and scanning one file message by message."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

from kl.message import HEADER_SIZE
from kl.messageset import INCOMPLETE, Entry, MessageSet, check

SUFFIX = ".kl"
LEGACY_SUFFIX = ".kafka"
NAME_DIGITS = 20
"""Base offsets are zero-padded to 20 digits so that ``ls`` sorts segments numerically."""
SCAN_CHUNK = 1 << 20


def segment_name(base_offset: int) -> str:
    return f"{base_offset:0{NAME_DIGITS}d}{SUFFIX}"


def segment_path(directory: str, base_offset: int) -> str:
    """The segment's path: kl's name, or Kafka 0.7's where only that one exists."""
    path = os.path.join(directory, segment_name(base_offset))
    if not os.path.exists(path):
        legacy = os.path.join(directory, f"{base_offset:0{NAME_DIGITS}d}{LEGACY_SUFFIX}")
        if os.path.exists(legacy):
            return legacy
    return path


def parse_name(name: str) -> int | None:
    """The base offset a segment file name encodes, or None for any other file."""
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix in (SUFFIX, LEGACY_SUFFIX) and len(stem) == NAME_DIGITS and stem.isdigit():
        return int(stem)
    return None


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(base offset, file name) of every segment in ``directory``, oldest first.

    Other files (the state, NFS ``.nfsXXXX`` leftovers, files set aside) are ignored.
    """
    found = []
    with os.scandir(directory) as it:
        for entry in it:
            base = parse_name(entry.name)
            if base is not None:
                found.append((base, entry.name))
    found.sort()
    return found


def scan(fd: int, position: int, end: int, max_message_bytes: int) -> Iterator[Entry]:
    """Every message of the file from ``position`` to ``end``, read in chunks.

    Entries carry file positions; the last one yielded is the first with a problem, if
    any (``INCOMPLETE`` where the file ends inside a message).
    """
    need = SCAN_CHUNK
    while position < end:
        want = min(max(SCAN_CHUNK, need), end - position)
        buf = os.pread(fd, want, position)
        more = len(buf) == want and position + want < end
        walked = 0
        for entry in MessageSet(buf, max_message_bytes=max_message_bytes).entries():
            if entry.problem == INCOMPLETE and more:
                need = entry.size
                break
            yield entry._replace(position=position + entry.position)
            if entry.problem is not None:
                return
            walked += entry.size
        else:
            if not buf:
                return
        position += walked


def resync(fd: int, start: int, expected: int, max_message_bytes: int) -> int | None:
    """The first position from ``start`` that begins the rest of the segment: valid
    messages from there run exactly to ``expected`` (the end of the segment's data), or
    to more damage after which the same holds again.  The next message boundary after
    damage, without giving up the valid messages between two damaged ones."""
    end = min(os.fstat(fd).st_size, expected)
    if end - start < HEADER_SIZE:
        return None
    with mmap.mmap(fd, end, access=mmap.ACCESS_READ) as buf:
        return _resync(buf, start, end, expected, max_message_bytes)


def _resync(buf: mmap.mmap, start: int, end: int, expected: int, max_message_bytes: int) -> int | None:
    for position in range(start, end - HEADER_SIZE + 1):
        chain = position
        while chain < end:
            entry = check(buf, chain, end, max_message_bytes)
            if entry.problem is not None:
                break
            chain += entry.size
        if chain == expected:
            return position
        if chain > position and _resync(buf, chain + 1, end, expected, max_message_bytes) is not None:
            return position
    return None
