"""Message-by-message listing of a segment file (the seed's DumpLogSegments, ``kl dump``).

Works on any segment, damaged or not, kl's or Kafka 0.7's: it lists every message up to
the first one that fails its checks, reports that one with the reason, and stops there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from kl import message as m
from kl.errors import CorruptMessage, UnsupportedCodec
from kl.messageset import INCOMPLETE, MessageSet
from kl.segment import parse_name, scan

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
"""Largest message believed when dumping a file outside any topic."""


@dataclass
class DumpRecord:
    """One stored message; ``problem`` is None when it is valid."""

    offset: int
    position: int
    size: int
    magic: int
    codec: str
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    problem: str | None
    inner: list[DumpRecord] = field(default_factory=list)
    """With ``deep``, the messages inside a compressed batch."""

    @property
    def valid(self) -> bool:
        return self.problem is None


def dump_file(
    path: str, *, base_offset: int | None = None, deep: bool = False, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> Iterator[DumpRecord]:
    """Every message of the segment at ``path``; the last record is the first bad one, if any.

    ``base_offset`` defaults to the one the file name encodes (0 for other names).
    """
    if base_offset is None:
        base_offset = parse_name(os.path.basename(path)) or 0
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        for entry in scan(fd, 0, size, max_message_bytes):
            offset = base_offset + entry.position
            if entry.problem is not None:
                problem = entry.problem.reason
                if entry.problem.kind is INCOMPLETE:
                    problem = f"file ends inside a message of {entry.size} bytes"
                yield DumpRecord(offset, entry.position, entry.size, entry.magic, "-", None, None, None, problem)
                return
            data = os.pread(fd, entry.size, entry.position)
            yield _record(data, entry.position, offset, entry.magic, entry.attrs, deep, max_message_bytes)
    finally:
        os.close(fd)


def _record(data: bytes, position: int, offset: int, magic: int, attrs: int, deep: bool, limit: int) -> DumpRecord:
    messages = MessageSet(data, offset, max_message_bytes=limit)
    entry = next(messages.entries())
    codec = m.CODEC_NAMES.get(attrs & m.CODEC_MASK, str(attrs & m.CODEC_MASK)) if magic else "none"
    if attrs & m.ATTR_PADDING:
        return DumpRecord(offset, position, len(data), magic, "padding", None, None, None, None)
    timestamp = key = value = None
    if magic == m.CURRENT_MAGIC:
        timestamp, key_length = m.TIMESTAMP_KEY_LENGTH.unpack_from(data, m.TIMESTAMP_OFFSET)
        key = None if key_length < 0 else data[m.KEY_OFFSET : m.KEY_OFFSET + key_length]
        value = data[m.KEY_OFFSET + max(key_length, 0) :]
    else:
        value = data[m.PAYLOAD_OFFSET_V0 if magic == 0 else m.PAYLOAD_OFFSET_V1 :]
    record = DumpRecord(offset, position, len(data), magic, codec, timestamp, key, value, None)
    if deep and codec != "none":
        try:
            record.inner = [
                DumpRecord(msg.offset, position, len(msg.value), m.CURRENT_MAGIC, "none", msg.timestamp, msg.key, msg.value, None)
                for msg in messages.decode(entry)
            ]
        except (CorruptMessage, UnsupportedCodec) as e:
            record.problem = str(e)
    return record
