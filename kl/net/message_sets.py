"""Kafka's message sets (magic 0 and 1), what Produce v0-2 and Fetch v0-3 carry::

    message set: {offset:8 message_size:4 message}*
    message:     crc:4 magic:1 attributes:1 [timestamp:8, magic 1] key_length:4 key value_length:4 value

``crc`` is CRC-32 of everything after it; lengths of -1 are null.  The attributes' low
bits name a codec (1 gzip, 2 snappy, 3 lz4): the message is a wrapper whose value is a
compressed inner message set; bit 3 (magic 1) says the log's append time is the
timestamp.  The inner messages of a magic 0 wrapper carry their absolute offsets; those of
a magic 1 wrapper offsets relative to the first (0, 1, ...), and the wrapper the absolute
offset of the last.  kl keeps no offset a producer sends (it gives each record the next).

A produce's set is read into one ``records.Batch`` of its records, so that they are
checked and stored as those of a record batch are; a fetch's answer is made of
``message`` and ``wrapper``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

from kl.log import message as m
from kl.log import pycore
from kl.net import records
from kl.net.records import InvalidRecords

ENTRY = struct.Struct(">qiIBB")
"""offset, message_size, crc, magic, attributes: the start of every entry."""
LOG_OVERHEAD = 12
"""Bytes of an entry before its message: the offset and the size."""
CRC_END = ENTRY.size - 2
"""Where the bytes the crc covers begin (the magic)."""
TIMESTAMP = struct.Struct(">q")
LENGTH = struct.Struct(">i")
MIN_SIZE = (14, 22)
"""The smallest message_size of magic 0 and 1 (a null key and value)."""
CODEC_MASK = 0x07
CODECS = {1: "gzip", 2: "snappy", 3: "lz4"}
"""The codecs of magic 0 and 1 (zstd came with magic 2)."""
LOG_APPEND_TIME = 0x08
RECORD_BATCH_MAGIC = 2
"""The magic byte of a record batch, at the same place as a message set's (byte 16)."""


def batches(data: bytes | memoryview, max_records: int, max_bytes: int) -> list[records.Batch]:
    """The records of a produce's message set (every message checked, wrappers
    decompressed) as one batch without a producer id, or the record batches of a set of
    magic 2 (see ``records.batches``, which Kafka's brokers before 4 took in these
    versions too): at most ``max_records`` records and ``max_bytes`` decompressed.
    Raises ``InvalidRecords`` naming the problem; a set cut short is one."""
    view = memoryview(data)
    if len(view) > ENTRY.size and view[ENTRY.size - 2] == RECORD_BATCH_MAGIC:
        return records.batches(view, max_records, max_bytes)
    found: list[tuple[int, bytes | None, bytes | None]] = []
    for timestamp, attrs, key, value, pos in _messages(view, 0):
        if attrs & LOG_APPEND_TIME:
            timestamp = -1  # stamped when appended
        codec = attrs & CODEC_MASK
        if not codec:
            found.append((timestamp, key, value))
            continue
        if codec not in CODECS:
            raise InvalidRecords(f"the message at byte {pos} names codec {codec}: magic 0 and 1 take gzip, snappy and lz4")
        if value is None:
            raise InvalidRecords(f"the {CODECS[codec]} wrapper at byte {pos} has a null value")
        inner = memoryview(records.decompress(codec, memoryview(value), max_bytes))
        max_bytes -= len(inner)
        if not inner:
            raise InvalidRecords(f"the {CODECS[codec]} wrapper at byte {pos} holds no message")
        for inner_ts, inner_attrs, inner_key, inner_value, at in _messages(inner, pos):
            if inner_attrs & CODEC_MASK:
                raise InvalidRecords(f"the wrapper at byte {pos} holds a compressed message (at its byte {at})")
            found.append((-1 if attrs & LOG_APPEND_TIME else inner_ts, inner_key, inner_value))
        if len(found) > max_records:
            raise InvalidRecords(f"the message set holds more than {max_records} records")
    if not found:
        raise InvalidRecords("the request holds no message")
    base = found[0][0]
    body = b"".join(pycore.kafka_record(ts - base, i, key, value) for i, (ts, key, value) in enumerate(found))
    return [records.Batch(-1, -1, -1, len(found), base, False, memoryview(body))]


def _messages(view: memoryview, at: int) -> Iterator[tuple[int, int, bytes | None, bytes | None, int]]:
    """(timestamp, or -1, attributes, key, value, byte) of each message of a set, checked;
    ``at`` is where the set sits in the request (for the errors' words)."""
    pos = 0
    while pos < len(view):
        where = at + pos
        if len(view) - pos < ENTRY.size:
            raise InvalidRecords(f"a message set is cut short at byte {where}: {len(view) - pos} bytes left")
        _, size, crc, magic, attrs = ENTRY.unpack_from(view, pos)
        end = pos + LOG_OVERHEAD + size
        if magic not in (0, 1):
            raise InvalidRecords(f"the message at byte {where} has magic {magic}: a message set takes magic 0 and 1")
        if size < MIN_SIZE[magic] or end > len(view):
            raise InvalidRecords(f"the message at byte {where} claims {size} bytes, {len(view) - pos - LOG_OVERHEAD} are there")
        if zlib.crc32(view[pos + CRC_END : end]) != crc:
            raise InvalidRecords(f"the message at byte {where} fails its CRC-32 check")
        field = pos + ENTRY.size
        timestamp = -1
        if magic == 1:
            (timestamp,) = TIMESTAMP.unpack_from(view, field)
            field += TIMESTAMP.size
        key, field = _field(view, field, end, where)
        value, field = _field(view, field, end, where)
        if field != end:
            raise InvalidRecords(f"the message at byte {where} holds {end - field} bytes past its value")
        yield timestamp, attrs, key, value, where
        pos = end


def _field(view: memoryview, pos: int, end: int, where: int) -> tuple[bytes | None, int]:
    if end - pos < LENGTH.size:
        raise InvalidRecords(f"the message at byte {where} ends inside a length")
    (length,) = LENGTH.unpack_from(view, pos)
    pos += LENGTH.size
    if length == -1:
        return None, pos
    if not 0 <= length <= end - pos:
        raise InvalidRecords(f"the message at byte {where} has a field of length {length} with {end - pos} bytes left")
    return bytes(view[pos : pos + length]), pos + length


def message(offset: int, magic: int, timestamp: int | None, key: bytes | None, value: bytes | None, attrs: int = 0) -> bytes:
    """One entry of a fetch's message set (a timestamp of None, Kafka 0.7's messages,
    as -1; magic 0 has none)."""
    fields = [bytes((magic, attrs))]
    if magic:
        fields.append(TIMESTAMP.pack(-1 if timestamp is None else timestamp))
    for data in (key, value):
        fields += (LENGTH.pack(-1),) if data is None else (LENGTH.pack(len(data)), data)
    body = b"".join(fields)
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


def wrapper(offset: int, magic: int, codec: int, inner: list[m.Message]) -> bytes:
    """One entry compressed with ``codec`` holding ``inner``, the first at Kafka offset
    ``offset`` and the others at the next ones, numbered as the module says; its
    timestamp (magic 1) is the newest inner one's, as Kafka's."""
    relative = 0 if magic == 1 else offset
    body = b"".join(message(relative + i, magic, msg.timestamp, msg.key, msg.value) for i, msg in enumerate(inner))
    newest = max((msg.timestamp for msg in inner if msg.timestamp is not None), default=None)
    return message(offset + len(inner) - 1, magic, newest, None, m.compress(codec, body), codec)
