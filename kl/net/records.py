"""Kafka's record batches (magic 2), the unit today's Kafka protocol carries messages in.

A batch is a 61-byte header, then its records::

    base_offset:8 batch_length:4 leader_epoch:4 magic:1 crc:4 attributes:2
    last_offset_delta:4 base_timestamp:8 max_timestamp:8 producer_id:8 producer_epoch:2
    base_sequence:4 record_count:4 records

    record: length:varint attributes:1 timestamp_delta:varlong offset_delta:varint
            key_length:varint key value_length:varint value header_count:varint
            {key_length:varint key value_length:varint value}*

``crc`` is CRC-32C of everything after it; lengths of -1 are null; the records of a batch
whose attributes name a codec (1 gzip, 2 snappy, 3 lz4, 4 zstd) are compressed together.

kl's offsets are byte offsets, and they fit: a record's offset is its kl message's, the
batch's ``last_offset_delta`` puts ``base + last_offset_delta + 1`` at the next message,
so a client that resumes after a batch lands exactly on the next message.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import NamedTuple

from kl.errors import KlError
from kl.log import core, pycore

BATCH = pycore.KAFKA_BATCH
LENGTH_END = pycore.KAFKA_LENGTH_END
CRC_END = pycore.KAFKA_CRC_AT
MAGIC = 2
NO_TIMESTAMP = -1
CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
XERIAL = b"\x82SNAPPY\x00"
"""The header of snappy-java's framing (the Java client's snappy), which wraps raw snappy blocks."""


class InvalidRecords(KlError):
    """Record batches a client sent are malformed, corrupt or of a kind kl does not store."""


class Record(NamedTuple):
    """One record as a producer sent it; ``timestamp`` is absolute (-1: none, the log's
    append time is its)."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class Batch(NamedTuple):
    """A checked batch: its idempotence fields, how many records, their timestamps' base
    (or that the log's append time is theirs) and its body, decompressed."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    size: int
    """How many records."""
    base_timestamp: int
    append_time: bool
    body: memoryview

    def records(self) -> list[Record]:
        """The records, each checked.  Raises ``InvalidRecords``."""
        try:
            found = pycore.read_records(self.body, self.size)
        except ValueError as e:  # a cut or overlong varint, a length past the record
            raise InvalidRecords(f"a record batch is malformed: {e}") from None
        out = []
        for ts_delta, key, value, fields in found:
            headers = []
            for name, header_value in fields:
                if name is None:
                    raise InvalidRecords("a header's key is null")
                try:
                    headers.append((name.decode(), header_value))
                except UnicodeDecodeError:
                    raise InvalidRecords(f"a header's key is not UTF-8: {name[:40]!r}") from None
            timestamp = NO_TIMESTAMP if self.append_time else self.base_timestamp + ts_delta
            out.append(Record(timestamp, key, value, tuple(headers)))
        return out


# ----------------------------------------------------------------------------- writing


Row = tuple[int, "int | None", "bytes | None", "bytes | None", "Sequence[tuple[str, bytes | None]]"]
"""A record to send: offset, timestamp, key, value, headers."""


def batch(records: Sequence[Row], next_offset: int) -> bytes:
    """One uncompressed batch of ``records``, offsets rising; ``next_offset`` is where the
    next message starts (``last_offset_delta`` points just before it).  A timestamp of
    None (Kafka 0.7's messages) is sent as -1.  The messages a fetch finds in runs of
    plain ones go by ``core.kafka_batch`` instead."""
    base = records[0][0]
    stamps = [NO_TIMESTAMP if row[1] is None else row[1] for row in records]
    base_ts = stamps[0]
    data = b"".join(
        pycore.kafka_record(ts - base_ts, offset - base, key, value, headers)
        for (offset, _, key, value, headers), ts in zip(records, stamps, strict=True)
    )
    return pycore.kafka_header(base, data, len(records), next_offset - 1 - base, base_ts, max(stamps)) + data


# ----------------------------------------------------------------------------- reading


def batches(data: bytes | memoryview, max_records: int, max_bytes: int) -> list[Batch]:
    """The batches in a produce request's records, each checked (sizes, magic, crc,
    varints) and decompressed: at most ``max_records`` records and ``max_bytes``
    decompressed in all.  Raises ``InvalidRecords`` naming the problem."""
    view = memoryview(data)
    out: list[Batch] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < BATCH.size:
            raise InvalidRecords(f"a record batch is cut short at byte {pos}: {len(view) - pos} bytes left")
        (_, length, _, magic, crc, attrs, _, base_ts, _, pid, epoch, seq, count) = BATCH.unpack_from(view, pos)
        end = pos + LENGTH_END + length
        if length < BATCH.size - LENGTH_END or end > len(view):
            raise InvalidRecords(f"record batch at byte {pos} claims {length} bytes, {len(view) - pos - LENGTH_END} are there")
        if magic != MAGIC:
            raise InvalidRecords(f"record batch at byte {pos} has magic {magic}: kl takes magic 2 (produce v3 or newer)")
        if core.crc32c(view[pos + CRC_END : end]) != crc:
            raise InvalidRecords(f"record batch at byte {pos} fails its CRC-32C check")
        if attrs & (TRANSACTIONAL | CONTROL):
            raise InvalidRecords("kl has no transactions: transactional and control batches are refused")
        if not 0 < count <= max_records:
            raise InvalidRecords(f"record batch at byte {pos} holds {count} records (1 to {max_records} taken)")
        body = view[pos + BATCH.size : end]
        codec = attrs & CODEC_MASK
        if codec:
            body = memoryview(decompress(codec, body, max_bytes))
            max_bytes -= len(body)
        out.append(Batch(pid, epoch, seq, count, base_ts, bool(attrs & LOG_APPEND_TIME), body))
        max_records -= count
        pos = end
    if not out:
        raise InvalidRecords("the request holds no record batch")
    return out


class _TooLarge(Exception):
    """Decompressing would pass the limit."""


def decompress(codec: int, data: memoryview, limit: int) -> bytes:
    """A batch's records, decompressed (gzip, snappy raw or xerial-framed, lz4 frame,
    zstd); more than ``limit`` bytes is refused before they are all made."""
    try:
        if codec == 1:
            inflater = zlib.decompressobj(47)
            out = inflater.decompress(data, limit + 1)
            if not inflater.eof and len(out) <= limit:
                raise InvalidRecords("gzip data is cut short")
        elif codec == 4:
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out = reader.read(limit + 1)
        elif codec == 2:
            out = _xerial(data, limit) if bytes(data[:8]) == XERIAL else _snappy(data, limit)
        elif codec == 3:
            out = _lz4(data, limit)
        else:
            raise InvalidRecords(f"unknown compression codec {codec}")
        if len(out) > limit:
            raise _TooLarge
    except InvalidRecords:
        raise
    except _TooLarge:
        raise InvalidRecords(f"a {CODECS[codec]} batch decompresses to more than {limit} bytes") from None
    except Exception as e:  # each codec's library has its own error types
        raise InvalidRecords(f"{CODECS.get(codec, codec)} data does not decompress: {e}") from None
    return out


def _lz4(data: memoryview, limit: int) -> bytes:
    import cramjam

    buffer = bytearray(min(limit, 256 * len(data)) + 1)  # lz4 expands at most ~255 times
    try:
        return bytes(memoryview(buffer)[: cramjam.lz4.decompress_into(data, buffer)])
    except cramjam.DecompressionError as e:
        if len(buffer) > limit and "whole buffer" in str(e):  # cramjam's words for "out of room"
            raise _TooLarge from None
        raise


def _snappy(data: memoryview, room: int) -> bytes:
    import cramjam

    if cramjam.snappy.decompress_raw_len(data) > room:
        raise _TooLarge
    return bytes(cramjam.snappy.decompress_raw(data))


def _xerial(data: memoryview, limit: int) -> bytes:
    """snappy-java's framing: a 16-byte header, then blocks each led by its int32 size."""
    out = []
    pos = 16
    total = 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        if pos > len(data) or pos + size > len(data):
            raise InvalidRecords("snappy-java block cut short")
        out.append(_snappy(data[pos : pos + size], limit - total))
        total += len(out[-1])
        pos += size
    return b"".join(out)
