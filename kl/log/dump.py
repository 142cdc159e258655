"""Message-by-message listing of a segment file (the seed's DumpLogSegments, ``kl dump``).

Works on any segment, damaged or not, kl's or Kafka 0.7's: it lists every message up to
the first one that fails its checks, reports that one with the reason, and stops there.
The checks are ``segment.scan``'s; the bytes are read a megabyte at a time beside it, so
a listing runs near the rate messages are parsed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from kl.errors import CorruptMessage, UnsupportedCodec
from kl.log import core
from kl.log import message as m
from kl.log.messageset import INCOMPLETE, Corruption, Entry, MessageSet, check
from kl.log.segment import SCAN_CHUNK, parse_name

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20
"""Largest message believed when dumping a file outside any topic."""


@dataclass(slots=True)
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
    headers: m.Headers = ()
    """A magic 3 message's headers (its ``value`` None for a null value)."""

    @property
    def valid(self) -> bool:
        return self.problem is None


Template = tuple[bytes, bytes, bytes, bytes, bytes]
"""A line for a plain message: the five texts around its offset, position, size and timestamp."""


class Lines(NamedTuple):
    """The lines for a run of valid uncompressed magic 2 messages without a key."""

    position: int
    """Where the first message starts in the file."""
    text: bytes
    end: int
    """Where the last one ends."""


def dump_file(
    path: str, *, base_offset: int | None = None, deep: bool = False, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> Iterator[DumpRecord]:
    """Every message of the segment at ``path``; the last record is the first bad one, if any.

    ``base_offset`` defaults to the one the file name encodes (0 for other names).
    Raises ``OSError`` when the file cannot be read.
    """
    for record in _listing(path, base_offset, deep, max_message_bytes, published=None, templates=None):
        assert isinstance(record, DumpRecord)
        yield record


def dump_lines(
    path: str,
    *,
    templates: tuple[Template, Template],
    published: int | None = None,
    base_offset: int | None = None,
    deep: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> Iterator[DumpRecord | Lines]:
    """``dump_file``'s records, but each run of valid uncompressed magic 2 messages without
    a key as ``Lines``, made by the core from the first of ``templates`` (the second past
    position ``published``): the common case, at the parse rate.  No run crosses
    ``published``: a reader can mark that end."""
    return _listing(path, base_offset, deep, max_message_bytes, published=published, templates=templates)


def _listing(
    path: str,
    base_offset: int | None,
    deep: bool,
    max_message_bytes: int,
    *,
    published: int | None,
    templates: tuple[Template, Template] | None,
) -> Iterator[DumpRecord | Lines]:
    """The records of the file; with ``templates``, its runs of plain messages as ``Lines``."""
    if base_offset is None:
        base_offset = parse_name(os.path.basename(path)) or 0
    unpack_fields, fields_at, key_at, plain = (
        m.TIMESTAMP_KEY_LENGTH.unpack_from,
        m.TIMESTAMP_OFFSET,
        m.KEY_OFFSET,
        m.CURRENT_MAGIC,
    )
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        file_size = os.fstat(fd).st_size
        fast = templates is not None and 0 <= base_offset < (1 << 63) - file_size  # the core's offsets are int64s
        buf, start, complete, pos = b"", 0, False, 0  # buf: the file from start; complete: to its end
        while pos < file_size:
            if not start <= pos < start + len(buf):
                want = min(SCAN_CHUNK, file_size - pos)
                buf, start = os.pread(fd, want, pos), pos
                complete = len(buf) < want or pos + want >= file_size
            at = pos - start
            if fast:
                assert templates is not None
                past = published is not None and pos >= published
                run_end = len(buf) if published is None or past else min(len(buf), published - start)
                text, stop = core.dump_lines(buf, at, run_end, base_offset + start, start, max_message_bytes, templates[past])
                if stop > at:
                    yield Lines(pos, text, start + stop)
                    pos = start + stop
                    continue
            position, size, magic, attrs, problem = check(buf, at, len(buf), max_message_bytes, start)
            offset = base_offset + position
            if problem is not None and problem.kind is INCOMPLETE and not complete:  # cut by the chunk: read it whole
                want = min(max(SCAN_CHUNK, size), file_size - pos)
                buf, start = os.pread(fd, want, pos), pos
                complete = len(buf) < want or pos + want >= file_size
                continue
            if problem is not None:
                yield _bad(offset, position, size, magic, problem)
                return
            if magic == plain and not attrs:
                timestamp, key_length = unpack_fields(buf, at + fields_at)
                if key_length < 0:
                    yield DumpRecord(offset, position, size, magic, "none", timestamp, None, buf[at + key_at : at + size], None)
                else:
                    value_at = at + key_at + key_length
                    key = buf[at + key_at : value_at]
                    yield DumpRecord(offset, position, size, magic, "none", timestamp, key, buf[value_at : at + size], None)
            else:
                record = _record(buf, at, offset, position, size, magic, attrs)
                if deep and record.codec not in ("none", "padding"):
                    _inner(
                        record,
                        MessageSet(buf, base_offset + start, max_message_bytes=max_message_bytes),
                        Entry(at, size, magic, attrs, None),
                    )
                yield record
            pos += size
    finally:
        os.close(fd)


def _bad(offset: int, position: int, size: int, magic: int, problem: Corruption) -> DumpRecord:
    reason = f"file ends inside a message of {size} bytes" if problem.kind is INCOMPLETE else problem.reason
    return DumpRecord(offset, position, size, magic, "-", None, None, None, reason)


def _codec(attrs: int) -> str:
    if attrs & m.ATTR_PADDING:
        return "padding"
    return m.CODEC_NAMES.get(attrs & m.CODEC_MASK, str(attrs & m.CODEC_MASK))


_CODECS = tuple(_codec(attrs) for attrs in range(256))
"""The codec column for each value of the attributes byte."""


def _record(buf: bytes, at: int, offset: int, position: int, size: int, magic: int, attrs: int) -> DumpRecord:
    """The record of a valid message other than a plain magic 2 one, at ``at`` in ``buf``."""
    if magic == 0:
        return DumpRecord(offset, position, size, magic, "none", None, None, buf[at + m.PAYLOAD_OFFSET_V0 : at + size], None)
    codec = _CODECS[attrs]
    if codec == "padding":
        return DumpRecord(offset, position, size, magic, codec, None, None, None, None)
    if magic == 1:
        return DumpRecord(offset, position, size, magic, codec, None, None, buf[at + m.PAYLOAD_OFFSET_V1 : at + size], None)
    if magic == m.HEADERS_MAGIC:
        timestamp, key, value, headers = m.decode_v3(buf, at)
        return DumpRecord(offset, position, size, magic, codec, timestamp, key, value, None, headers=headers)
    timestamp, key_length = m.TIMESTAMP_KEY_LENGTH.unpack_from(buf, at + m.TIMESTAMP_OFFSET)
    value_at = at + m.KEY_OFFSET + max(key_length, 0)
    key = None if key_length < 0 else buf[at + m.KEY_OFFSET : value_at]
    return DumpRecord(offset, position, size, magic, codec, timestamp, key, buf[value_at : at + size], None)


def _inner(record: DumpRecord, messages: MessageSet, entry: Entry) -> None:
    """List the messages inside the compressed batch ``entry`` of ``messages`` as ``record.inner``."""
    try:
        record.inner = [
            DumpRecord(
                msg.offset,
                record.position,
                len(msg.value or b""),
                m.HEADERS_MAGIC if msg.headers or msg.value is None else m.CURRENT_MAGIC,
                "none",
                msg.timestamp,
                msg.key,
                msg.value,
                None,
                headers=msg.headers,
            )
            for msg in messages.decode(entry)
        ]
    except (CorruptMessage, UnsupportedCodec) as e:
        record.problem = str(e)
