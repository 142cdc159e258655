"""Kafka's records, both ways: a produce's records into the kl message set of one
append, and messages read from the log into a fetch's records.  Both wire generations.

Record batches (magic 2; Produce v3 and later, Fetch v4 and later): a 61-byte header,
then its records::

    base_offset:8 batch_length:4 leader_epoch:4 magic:1 crc:4 attributes:2
    last_offset_delta:4 base_timestamp:8 max_timestamp:8 producer_id:8 producer_epoch:2
    base_sequence:4 record_count:4 records

    record: length:varint attributes:1 timestamp_delta:varlong offset_delta:varint
            key_length:varint key value_length:varint value header_count:varint
            {key_length:varint key value_length:varint value}*

``crc`` is CRC-32C of everything after it; lengths of -1 are null; the records of a batch
whose attributes name a codec (1 gzip, 2 snappy, 3 lz4, 4 zstd) are compressed together.

Message sets (magic 0 and 1; Produce v0-2, Fetch v0-3)::

    message set: {offset:8 message_size:4 message}*
    message:     crc:4 magic:1 attributes:1 [timestamp:8, magic 1] key_length:4 key value_length:4 value

``crc`` is CRC-32 of everything after it; lengths of -1 are null.  The attributes' low
bits name a codec (1 gzip, 2 snappy, 3 lz4): the message is a wrapper whose value is a
compressed inner message set; bit 3 (magic 1) says the log's append time is the
timestamp.  The inner messages of a magic 0 wrapper carry their absolute offsets; those of
a magic 1 wrapper offsets relative to the first (0, 1, ...), and the wrapper the absolute
offset of the last.

Produce: ``batches`` (record batches) and ``message_set_batches`` check and decompress a
partition's records into ``Batch``es, ``kl_messages`` makes those the kl messages of one
append and their count.  kl keeps no offset a producer sends: the log gives each record
the next.

Fetch: ``record_batches`` and ``message_set`` convert a read of the log (a
``MessageSet``, the Kafka offset of its first message, how many of the compressed
batch there to skip) and say where the message of the Kafka offset after their last
record is (a ``Resume``, for the front end's memory of where clients fetch next).

Offsets are Kafka offsets: a record's offset is its message's ordinal in the partition
(``Log.kafka_position``), each inner message of a compressed kl batch has its own, and a
fetch at offset N starts with record N, or with the batch holding it sent from record N
on.  A record batch's ``last_offset_delta`` puts ``base + last_offset_delta + 1`` at the
next message, so a client that resumes after a batch lands exactly on it.
"""

from __future__ import annotations

import struct
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from kl.errors import CorruptMessage, KlError
from kl.log import core, pycore
from kl.log import message as m
from kl.log.config import TopicConfig
from kl.log.messageset import MessageSet
from kl.log.validate import Checked
from kl.net.kafka.errors import INVALID_RECORD, INVALID_TIMESTAMP, MESSAGE_TOO_LARGE, Refused

BATCH = pycore.KAFKA_BATCH
LENGTH_END = pycore.KAFKA_LENGTH_END
CRC_END = pycore.KAFKA_CRC_AT
MAGIC = 2
"""A record batch's magic, at the same byte as a message set's (16)."""
NO_TIMESTAMP = -1
CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
XERIAL = b"\x82SNAPPY\x00"
"""The header of snappy-java's framing (the Java client's snappy), which wraps raw snappy blocks."""

ENTRY = struct.Struct(">qiIBB")
"""offset, message_size, crc, magic, attributes: the start of every entry of a message set."""
LOG_OVERHEAD = 12
"""Bytes of an entry before its message: the offset and the size."""
ENTRY_CRC_END = ENTRY.size - 2
"""Where the bytes an entry's crc covers begin (the magic)."""
TIMESTAMP = struct.Struct(">q")
LENGTH = struct.Struct(">i")
MIN_SIZE = (14, 22)
"""The smallest message_size of magic 0 and 1 (a null key and value)."""
SET_CODECS = {1: "gzip", 2: "snappy", 3: "lz4"}
"""The codecs of magic 0 and 1 (zstd came with magic 2)."""


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


class Resume(NamedTuple):
    """Where the message of Kafka offset ``offset`` is in a read: at byte ``position``,
    after the first ``skip`` messages of the batch there."""

    offset: int
    position: int
    skip: int = 0


# ----------------------------------------------------------------------------- produce: Kafka -> kl


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


def message_set_batches(data: bytes | memoryview, max_records: int, max_bytes: int) -> list[Batch]:
    """The records of a produce's message set (every message checked, wrappers
    decompressed) as one batch without a producer id, or the record batches of a set of
    magic 2 (see ``batches``, which Kafka's brokers before 4 took in these versions too):
    at most ``max_records`` records and ``max_bytes`` decompressed.  Raises
    ``InvalidRecords`` naming the problem; a set cut short is one."""
    view = memoryview(data)
    if len(view) > ENTRY.size and view[ENTRY.size - 2] == MAGIC:
        return batches(view, max_records, max_bytes)
    found: list[tuple[int, bytes | None, bytes | None]] = []
    for timestamp, attrs, key, value, pos in _set_messages(view, 0):
        if attrs & LOG_APPEND_TIME:
            timestamp = -1  # stamped when appended
        codec = attrs & CODEC_MASK
        if not codec:
            found.append((timestamp, key, value))
            continue
        if codec not in SET_CODECS:
            raise InvalidRecords(f"the message at byte {pos} names codec {codec}: magic 0 and 1 take gzip, snappy and lz4")
        if value is None:
            raise InvalidRecords(f"the {SET_CODECS[codec]} wrapper at byte {pos} has a null value")
        inner = memoryview(decompress(codec, memoryview(value), max_bytes))
        max_bytes -= len(inner)
        if not inner:
            raise InvalidRecords(f"the {SET_CODECS[codec]} wrapper at byte {pos} holds no message")
        for inner_ts, inner_attrs, inner_key, inner_value, at in _set_messages(inner, pos):
            if inner_attrs & CODEC_MASK:
                raise InvalidRecords(f"the wrapper at byte {pos} holds a compressed message (at its byte {at})")
            found.append((-1 if attrs & LOG_APPEND_TIME else inner_ts, inner_key, inner_value))
        if len(found) > max_records:
            raise InvalidRecords(f"the message set holds more than {max_records} records")
    if not found:
        raise InvalidRecords("the request holds no message")
    base = found[0][0]
    body = b"".join(pycore.kafka_record(ts - base, i, key, value) for i, (ts, key, value) in enumerate(found))
    return [Batch(-1, -1, -1, len(found), base, False, memoryview(body))]


def _set_messages(view: memoryview, at: int) -> Iterator[tuple[int, int, bytes | None, bytes | None, int]]:
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
        if zlib.crc32(view[pos + ENTRY_CRC_END : end]) != crc:
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


def kl_messages(found: list[Batch], topic: str, config: TopicConfig) -> Checked:
    """kl's messages for the batches' records and how many, every one checked against
    the topic (one append): most through ``core.kafka_records``, the rest record by
    record, which says what is wrong.  Raises ``InvalidRecords``, and ``Refused`` for
    what the topic does not take."""
    if config.legacy:
        raise Refused(INVALID_RECORD, "this topic is in Kafka 0.7's format: write to it with a Kafka 0.7 client")
    now = int(time.time() * 1000)
    parts = []
    count = 0
    for batch in found:
        try:
            fast = core.kafka_records(
                batch.body, batch.size, batch.base_timestamp, now if batch.append_time else -1, now, config.max_message_bytes
            )
        except ValueError as e:
            raise InvalidRecords(f"a record batch is malformed: {e}") from None
        if fast is not None:
            parts.append(fast[0])
            count += fast[1]
            continue
        for record in batch.records():
            parts.append(_kl_message(record, topic, config, now))
            count += 1
    return Checked.framed(b"".join(parts), count)


def _kl_message(record: Record, topic: str, config: TopicConfig, now: int) -> bytes:
    """The kl message of one record, checked against the topic.  Raises ``Refused``."""
    if (record.value is None or record.headers) and not config.holds_headers:
        raise Refused(
            INVALID_RECORD,
            f"topic {topic} was created without headers and cannot hold headers or null values: allow them "
            f"with kl topics alter {topic} --headers (kl versions before headers then refuse the topic)",
        )
    timestamp = now if record.timestamp == NO_TIMESTAMP else record.timestamp
    problem = m.timestamp_problem(timestamp)
    if problem is not None:
        raise Refused(INVALID_TIMESTAMP, problem)
    data = m.encode(record.value, record.key, timestamp, m.CODEC_NONE, record.headers)
    if len(data) > config.max_message_bytes:
        raise Refused(
            MESSAGE_TOO_LARGE, f"a message of {len(data)} bytes is over the topic's max_message_bytes, {config.max_message_bytes}"
        )
    return data


# ----------------------------------------------------------------------------- fetch: kl -> Kafka


def record_batches(messages: MessageSet, kafka_offset: int, skip: int) -> tuple[bytes, Resume | None]:
    """Fetch v4+'s records: ``messages`` (read from the log, the first at Kafka offset
    ``kafka_offset``) as record batches, after the first ``skip`` messages of the batch
    at their start: runs of plain messages converted by ``core.kafka_batch``, each other
    message (a compressed batch, Kafka 0.7's) through ``batch``.  With where the next
    Kafka offset's message is (None: nothing served)."""
    buf, limit = messages.buffer, messages.max_message_bytes
    parts: list[bytes] = []
    pos = 0
    while True:
        if not skip:
            run, count, stop = core.kafka_batch(buf, pos, kafka_offset, limit)
            if run:
                parts.append(run)
                pos, kafka_offset = stop, kafka_offset + count
        step = _decoded(messages, pos, bool(parts))
        if step is None:
            break
        after, group = step
        rows = [(kafka_offset + i, msg.timestamp, msg.key, msg.value, msg.headers) for i, msg in enumerate(group) if i >= skip]
        if rows:
            parts.append(batch(rows, kafka_offset + len(group)))
        kafka_offset += len(group)
        skip = 0
        pos = after
    if not parts:
        return b"", None
    return b"".join(parts), Resume(kafka_offset, pos)


def message_set(messages: MessageSet, kafka_offset: int, skip: int, max_bytes: int, version: int) -> tuple[bytes, Resume | None]:
    """Fetch v0-3's records: ``messages`` as ``record_batches`` takes them, as a message
    set of magic 0 (v0-1) or 1 (v2-3), without headers, which magic 0 and 1 cannot hold
    (as Kafka's down-conversion drops them); a gzip kl batch as a gzip wrapper of its
    records (from the one after ``skip`` on), a batch of a codec those clients cannot
    read (zstd) as plain messages.  At most ``max_bytes``, but a first message larger
    goes whole in v3 (KIP-74) and in v0-2 as its first ``max_bytes`` bytes, which
    clients of that time report as a message larger than their fetch size, as Kafka's
    brokers answered them.  With where the next Kafka offset's message is (None:
    nothing served whole)."""
    parts: list[bytes] = []
    size = 0
    resume = None
    for data, after in _entries(messages, kafka_offset, skip, 0 if version <= 1 else 1):
        if size + len(data) > max_bytes:
            if not parts and version <= 2:
                return data[:max_bytes], None
            if parts:
                break
        parts.append(data)
        size += len(data)
        resume = after
    return b"".join(parts), None if resume is None else Resume(*resume)


def _entries(messages: MessageSet, kafka_offset: int, skip: int, magic: int) -> Iterator[tuple[bytes, tuple[int, int, int]]]:
    """The message set entries of ``messages`` as ``message_set`` takes them, each with
    where the Kafka offset after it is.  Runs of plain messages are read from their
    columns (``MessageSet.plain_run``), the others decoded; a gzip batch becomes one
    wrapper."""
    buf = messages.buffer
    pos = 0
    served = False
    while True:
        if not skip:
            positions, stamps, key_lengths = (array("q", column) for column in messages.plain_run(pos)[:3])
            for at, stamp, length in zip(positions, stamps, key_lengths, strict=True):
                value_at = at + m.KEY_OFFSET + max(length, 0)
                end = at + m.LENGTH_SIZE + int.from_bytes(buf[at : at + m.LENGTH_SIZE], "big")
                key = None if length < 0 else bytes(buf[at + m.KEY_OFFSET : value_at])
                data = message(kafka_offset, magic, stamp, key, bytes(buf[value_at:end]))
                kafka_offset += 1
                pos = end
                served = True
                yield data, (kafka_offset, pos, 0)
        step = _decoded(messages, pos, served)
        if step is None:
            return
        after, group = step
        if len(group) > skip and _codec(buf, pos) == m.CODEC_GZIP:
            data = wrapper(kafka_offset + skip, magic, m.CODEC_GZIP, group[skip:])
            served = True
            yield data, (kafka_offset + len(group), after, 0)
        else:
            for i in range(skip, len(group)):
                msg = group[i]
                data = message(kafka_offset + i, magic, msg.timestamp, msg.key, msg.value)
                served = True
                yield data, (kafka_offset + i + 1, *((pos, i + 1) if i + 1 < len(group) else (after, 0)))
        kafka_offset += len(group)
        skip = 0
        pos = after


def _decoded(messages: MessageSet, pos: int, served: bool) -> tuple[int, list[m.Message]] | None:
    """``messages.decode_at(pos)``; None at damage too once some records are ``served``
    (the next fetch, from there, says what is wrong)."""
    try:
        return messages.decode_at(pos)
    except CorruptMessage:
        if served:
            return None
        raise


def _codec(buf: bytes, pos: int) -> int:
    """The codec of the kl message at ``pos`` (magic 0 has none)."""
    return buf[pos + m.ATTRIBUTES_OFFSET] & m.CODEC_MASK if buf[pos + m.MAGIC_OFFSET] else m.CODEC_NONE


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


# ----------------------------------------------------------------------------- codecs


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
