"""The pure-Python core: the per-message loops of the message format, as reference.

``kl.log._core`` (C, built by ``pip install`` where a compiler is found) holds the same
functions with the same answers for any input; ``kl.log.core`` picks one of the two.  All
read untrusted bytes: a message is used only once its length, magic, checksum and key
length hold (see ``man/kl-format.5``).
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import mmap
import struct
import zlib
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from threading import get_ident

import google_crc32c

from kl.log import message as m

Buffer = bytes | bytearray | memoryview | mmap.mmap
"""What the loops read: the values and keys they return are slices of it (bytes from bytes)."""
MESSAGE = m.Message

_PREFIX = m.PREFIX.unpack_from
_FAST = m.HEADER.unpack_from
_FAST_VALUE = struct.Struct(">iHI8xi").unpack_from
"""length, magic and attrs (as one number), crc and key_length of a magic 2 message."""
_FAST_FIELDS = struct.Struct(">iHIqi").unpack_from
"""The same with the timestamp before the key length."""
_PLAIN = m.CURRENT_MAGIC << 8 | m.CODEC_NONE
_INT64_MAX = (1 << 63) - 1
_INT64_MIN = -(1 << 63)
_INT32_MAX = (1 << 31) - 1
_FIELDS = m.KEY_OFFSET - m.TIMESTAMP_OFFSET
"""Bytes of timestamp and key length at the start of a magic 2 body."""
_SEED = m.CRC_SEEDS[m.CODEC_NONE]

# What check() finds, as numbers (kl.log.messageset.Kind names them).
OK, INCOMPLETE, UNKNOWN_MAGIC, BAD_LENGTH, CHECKSUM, BAD_KEY_LENGTH, BAD_FIELD = range(7)


def check(buf: Buffer, pos: int, end: int, max_message_bytes: int) -> tuple[int, int, int, int, int]:
    """Validate the message at ``pos`` (``buf`` ends at ``end`` for it): ``(problem, size,
    magic, attrs, value)``; ``problem`` is ``OK`` or what is wrong, ``size`` what the
    length claims (0 when the length itself is bad, what is left for ``INCOMPLETE``
    before the magic), ``value`` the bad magic, length or key length named by a problem
    (for ``BAD_FIELD``, the position in the message of the magic 3 field that is wrong)."""
    if end - pos < m.LENGTH_SIZE + 1:
        return INCOMPLETE, end - pos, -1, 0, 0
    length, magic = _PREFIX(buf, pos)
    if magic > m.HEADERS_MAGIC:
        return UNKNOWN_MAGIC, 0, magic, 0, magic
    if not m.MIN_LENGTH[magic] <= length <= max_message_bytes - m.LENGTH_SIZE:
        return BAD_LENGTH, 0, magic, 0, length
    nxt = pos + m.LENGTH_SIZE + length
    if nxt > end:
        return INCOMPLETE, nxt - pos, magic, 0, 0
    if magic == 0:
        attrs, body_at = 0, m.PAYLOAD_OFFSET_V0
        (stored,) = m.CRC_V0.unpack_from(buf, pos + m.CRC_OFFSET_V0)
    else:
        attrs, stored = m.ATTRS_CRC.unpack_from(buf, pos + m.ATTRIBUTES_OFFSET)
        body_at = m.PAYLOAD_OFFSET_V1
    size = nxt - pos
    if m.crc_of(magic, attrs, memoryview(buf)[pos + body_at : nxt]) != stored:
        return CHECKSUM, size, magic, attrs, 0
    if magic >= m.CURRENT_MAGIC:
        (key_length,) = m.TIMESTAMP_KEY_LENGTH.unpack_from(buf, pos + m.TIMESTAMP_OFFSET)[1:]
        if not m.NO_KEY <= key_length <= length - m.MIN_LENGTH[magic]:
            return BAD_KEY_LENGTH, size, magic, attrs, key_length
        if magic == m.HEADERS_MAGIC:
            bad = _bad_field(buf, pos, size, m.KEY_OFFSET + max(key_length, 0), attrs)
            if bad:
                return BAD_FIELD, size, magic, attrs, bad
    return OK, size, magic, attrs, 0


def _bad_field(buf: Buffer, pos: int, size: int, at: int, attrs: int) -> int:
    """Where (from ``pos``) the magic 3 message of ``size`` bytes at ``pos`` whose key
    ends at ``at`` goes wrong after its key: a codec (its attrs, 5: magic 3 is never
    compressed), a value length, header count or header length that does not fit, a
    header key that is not UTF-8, bytes past the last header; 0 when all is well."""
    if attrs & m.CODEC_MASK:
        return m.ATTRIBUTES_OFFSET
    unpack = m.INT32.unpack_from
    (value_length,) = unpack(buf, pos + at)
    if not m.NULL <= value_length <= size - at - 8:
        return at
    at += 4 + max(value_length, 0)
    (count,) = unpack(buf, pos + at)
    if not 0 <= count <= (size - at - 4) // m.HEADER_FIELD_SIZE:
        return at
    at += 4
    for _ in range(count):
        (name_length,) = unpack(buf, pos + at) if size - at >= m.HEADER_FIELD_SIZE else (-1,)
        if not 0 <= name_length <= size - at - m.HEADER_FIELD_SIZE:
            return at
        try:
            bytes(buf[pos + at + 4 : pos + at + 4 + name_length]).decode("utf-8")
        except UnicodeDecodeError:
            return at
        at += 4 + name_length
        (data_length,) = unpack(buf, pos + at)
        if not m.NULL <= data_length <= size - at - 4:
            return at
        at += 4 + max(data_length, 0)
    return at if at != size else 0


def walk(buf: Buffer, pos: int, end: int, max_message_bytes: int) -> tuple[int, int]:
    """Follow valid messages from ``pos``: (where the chain stops, how many it holds).

    It stops at ``end``, at a message that fails its checks or at one cut off by ``end``."""
    crc32, unpack, seed, header, fields_at = zlib.crc32, _FAST, m.CRC_SEEDS, m.HEADER_SIZE, m.TIMESTAMP_OFFSET
    limit, max_length, length_size = end - header, max_message_bytes - m.LENGTH_SIZE, m.LENGTH_SIZE
    magic_now, no_key = m.CURRENT_MAGIC, m.NO_KEY
    count = 0
    while pos < end:
        while pos <= limit:  # magic 2 at the parse rate
            length, magic, attrs, crc, _, klen = unpack(buf, pos)
            nxt = pos + length_size + length
            if (
                magic != magic_now
                or length > max_length
                or not pos + header <= nxt <= end
                or not no_key <= klen <= nxt - pos - header
            ):
                break
            if crc32(buf[pos + fields_at : nxt], seed[attrs]) != crc:
                return pos, count
            pos = nxt
            count += 1
        if pos >= end:
            break
        problem, size, *_ = check(buf, pos, end, max_message_bytes)
        if problem != OK:
            return pos, count
        pos += size
        count += 1
    return pos, count


def recent(buf: Buffer, pos: int, end: int, max_message_bytes: int, count: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Follow valid messages from ``pos`` as ``walk`` does: (where the chain stops, its
    last entries as (position, size, attrs) from the ``count``-th last one that is not
    padding on, or all of them when fewer are not padding).  ``attrs`` is 0 for magic 0."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    kept: deque[tuple[int, int, int]] = deque()
    held, padding = 0, m.ATTR_PADDING
    while pos < end:
        problem, size, _, attrs, _ = check(buf, pos, end, max_message_bytes)
        if problem != OK:
            break
        kept.append((pos, size, attrs))
        if not attrs & padding:
            held += 1
        while held > count or (held == count and kept[0][2] & padding):
            held -= not kept.popleft()[2] & padding
        pos += size
    return pos, list(kept)


def plain_values(buf: bytes, pos: int, max_message_bytes: int) -> tuple[list[bytes], int]:
    """The values of the valid uncompressed magic 2 messages without a key from ``pos``
    on, and where that run stops."""
    out: list[bytes] = []
    append, crc32, unpack, seed, header, fields = out.append, zlib.crc32, _FAST_VALUE, _SEED, m.HEADER_SIZE, _FIELDS
    end = len(buf)
    limit, max_length = end - header, max_message_bytes - m.LENGTH_SIZE
    plain, no_key, length_size, body_at = _PLAIN, m.NO_KEY, m.LENGTH_SIZE, m.TIMESTAMP_OFFSET
    while pos <= limit:
        length, magic_attrs, crc, klen = unpack(buf, pos)
        nxt = pos + length_size + length
        if magic_attrs != plain or klen != no_key or length > max_length or not pos + header <= nxt <= end:
            break
        body = buf[pos + body_at : nxt]
        if crc32(body, seed) != crc:
            break
        append(body[fields:])
        pos = nxt
    return out, pos


def plain_columns(buf: Buffer, pos: int, max_message_bytes: int) -> tuple[bytes, bytes, bytes, int]:
    """The buffer positions, timestamps and key lengths (-1: no key) of the valid
    uncompressed magic 2 messages from ``pos`` on, each column as native 64-bit integers,
    and where that run stops (the Spark source gathers its columns from them)."""
    positions: list[int] = []  # lists take appends faster than arrays; made arrays at the end
    timestamps: list[int] = []
    key_lengths: list[int] = []
    at, stamp, key = positions.append, timestamps.append, key_lengths.append
    end = len(buf)
    crc32, unpack, seed, header = zlib.crc32, _FAST_FIELDS, _SEED, m.HEADER_SIZE
    limit, max_length = end - header, max_message_bytes - m.LENGTH_SIZE
    plain, no_key, length_size, body_at = _PLAIN, m.NO_KEY, m.LENGTH_SIZE, m.TIMESTAMP_OFFSET
    view = memoryview(buf)
    while pos <= limit:
        length, magic_attrs, crc, timestamp, klen = unpack(buf, pos)
        nxt = pos + length_size + length
        if (
            magic_attrs != plain
            or length > max_length
            or not pos + header <= nxt <= end
            or not no_key <= klen <= nxt - pos - header
        ):
            break
        if crc32(view[pos + body_at : nxt], seed) != crc:
            break
        at(pos)
        stamp(timestamp)
        key(klen)
        pos = nxt
    return array("q", positions).tobytes(), array("q", timestamps).tobytes(), array("q", key_lengths).tobytes(), pos


def dump_lines(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    base_position: int,
    max_message_bytes: int,
    template: tuple[bytes, bytes, bytes, bytes, bytes],
) -> tuple[bytes, int]:
    """Lines for the valid uncompressed magic 2 messages without a key from ``pos`` to at
    most ``end``, and where that run stops: each line is ``template``'s five texts around
    four numbers, the message's offset (``base_offset + position``), file position
    (``base_position + position``), size and timestamp.  Raises ``ValueError`` for bases
    whose sums with the buffer's positions pass 2**63 - 1."""
    if not (0 <= base_offset <= _INT64_MAX - end and 0 <= base_position <= _INT64_MAX - end):
        raise ValueError(f"offsets {base_offset} and {base_position} do not fit 63 bits")
    head, after_offset, after_position, after_size, tail = (bytes(part) for part in template)
    out: list[bytes] = []
    append, crc32, unpack, seed, header = out.append, zlib.crc32, _FAST, _SEED, m.HEADER_SIZE
    limit, max_length = end - header, max_message_bytes - m.LENGTH_SIZE
    magic_now, no_key, length_size, body_at = m.CURRENT_MAGIC, m.NO_KEY, m.LENGTH_SIZE, m.TIMESTAMP_OFFSET
    while pos <= limit:
        length, magic, attrs, crc, timestamp, klen = unpack(buf, pos)
        nxt = pos + length_size + length
        if magic != magic_now or attrs or length > max_length or not pos + header <= nxt <= end or klen != no_key:
            break
        if crc32(buf[pos + body_at : nxt], seed) != crc:
            break
        append(
            b"%b%d%b%d%b%d%b%d%b"
            % (head, base_offset + pos, after_offset, base_position + pos, after_position, nxt - pos, after_size, timestamp, tail)
        )
        pos = nxt
    return b"".join(out), pos


def plain_messages(buf: bytes, pos: int, base: int, max_message_bytes: int) -> tuple[list[m.Message], int]:
    """The valid uncompressed magic 2 messages from ``pos`` on, as ``Message`` objects
    at offset ``base + position``, and where that run stops."""
    out: list[m.Message] = []
    append, message = out.append, MESSAGE
    crc32, unpack, seed, header, fields = zlib.crc32, _FAST, _SEED, m.HEADER_SIZE, _FIELDS
    end = len(buf)
    limit, max_length = end - header, max_message_bytes - m.LENGTH_SIZE
    magic_now, no_key, length_size, body_at = m.CURRENT_MAGIC, m.NO_KEY, m.LENGTH_SIZE, m.TIMESTAMP_OFFSET
    while pos <= limit:
        length, magic, attrs, crc, ts, klen = unpack(buf, pos)
        nxt = pos + length_size + length
        if (
            magic != magic_now
            or attrs
            or length > max_length
            or not pos + header <= nxt <= end
            or not no_key <= klen <= nxt - pos - header
        ):
            break
        body = buf[pos + body_at : nxt]
        if crc32(body, seed) != crc:
            break
        if klen < 0:
            append(message(base + pos, base + nxt, ts, None, body[fields:]))
        else:
            append(message(base + pos, base + nxt, ts, body[fields : fields + klen], body[fields + klen :]))
        pos = nxt
    return out, pos


def frame(values: Sequence[bytes], timestamp: int) -> bytes:
    """Frame ``values`` as magic 2 messages without a key, all with ``timestamp``; no size checks."""
    pack, crc32, plain = m.FRAME.pack, zlib.crc32, _PLAIN
    fields = m.TIMESTAMP_KEY_LENGTH.pack(timestamp, m.NO_KEY)
    seed = zlib.crc32(fields, _SEED)
    fixed = m.HEADER_SIZE - m.LENGTH_SIZE
    parts: list[bytes] = [b""] * (2 * len(values))
    parts[0::2] = [pack(len(v) + fixed, plain, crc32(v, seed), fields) for v in values]
    parts[1::2] = values
    return b"".join(parts)


MAX_VALUE = (1 << 31) - 1 - (m.HEADER_SIZE - m.LENGTH_SIZE)
"""The largest value a message without a key can hold (its length field is an int32)."""


def frame_values(
    values: list, pos: int, timestamp: int, max_message_bytes: int, piece_bytes: int
) -> tuple[list[tuple[bytes, int]], int]:
    """Frame the run of values from ``values[pos]`` that are bytes and fit a message of
    ``max_message_bytes`` as messages without a key, all with ``timestamp``, in pieces of
    at most ``piece_bytes`` (a lone larger message is a piece of its own): the pieces
    with their message counts, and the index where the run stops (the end, or the first
    value that is not bytes or too large)."""
    if not 0 <= pos <= len(values):
        raise ValueError(f"frame_values: position {pos} outside the {len(values)} values")
    run = values[pos:]
    kinds = list(map(type, run))
    if kinds.count(bytes) != len(kinds):
        run = run[: next(i for i, kind in enumerate(kinds) if kind is not bytes)]
    sizes = list(map(len, run))
    largest = min(max_message_bytes - m.HEADER_SIZE, MAX_VALUE)
    if sizes and max(sizes) > largest:
        cut = next(i for i, size in enumerate(sizes) if size > largest)
        run, sizes = run[:cut], sizes[:cut]
    return [(frame(run[a:b], timestamp), b - a) for a, b in chunks(sizes, piece_bytes)], pos + len(run)


def frame_records(
    data: bytes,
    pos: int,
    delimiter: bytes,
    keep: bool,
    timestamp: int,
    max_message_bytes: int,
    piece_bytes: int,
    piece_count: int,
) -> tuple[list[tuple[bytes, int, int]], int, bool]:
    """Frame the records of ``data[pos:]``, each ended by ``delimiter`` (kept at the end of
    its value with ``keep``), as magic 2 messages without a key, all with ``timestamp``,
    in pieces of at most ``piece_bytes`` framed bytes and ``piece_count`` messages (0: no
    limit; a piece holds one message at least): ``(pieces, stop, blocked)``, each piece
    ``(framed, count, end)`` with ``end`` where its last record ends in ``data``; ``stop``
    is where the records stop: at an unterminated rest, or at a record whose message would
    pass ``max_message_bytes`` (``blocked``)."""
    records = data[pos:].split(delimiter)
    records.pop()  # the unterminated rest (b"" after a final delimiter)
    length = len(delimiter)
    if keep:
        records = [record + delimiter for record in records]
    sizes = list(map(len, records))
    limit = min(max_message_bytes - m.HEADER_SIZE, MAX_VALUE)
    blocked = bool(sizes) and max(sizes) > limit
    if blocked:
        del records[next(i for i, size in enumerate(sizes) if size > limit) :]
        del sizes[len(records) :]
    header, extra = m.HEADER_SIZE, 0 if keep else length
    pieces: list[tuple[bytes, int, int]] = []
    start, count, framed, end = 0, 0, 0, pos
    for i, size in enumerate(sizes):
        if count and (framed + header + size > piece_bytes or count == piece_count):
            pieces.append((frame(records[start:i], timestamp), count, end))
            start, count, framed = i, 0, 0
        count += 1
        framed += header + size
        end += size + extra
    if count:
        pieces.append((frame(records[start:], timestamp), count, end))
    return pieces, end, blocked


def crc32c(data: Buffer, crc: int = 0) -> int:
    """CRC-32C (Castagnoli: Kafka's record batches, iSCSI) of ``data``, continuing from
    ``crc`` (the result for the bytes before it) as ``zlib.crc32`` does; by google-crc32c
    (its C extension where its wheel has one: ``google_crc32c.implementation``)."""
    if not 0 <= crc <= 0xFFFFFFFF:
        raise ValueError(f"crc must be a 32-bit value, not {crc}")
    return google_crc32c.extend(crc, data if type(data) is bytes else bytes(data))


def murmur2(data: Buffer) -> int:
    """Kafka's murmur2 of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``: the
    hash the Java client's default partitioner gives keys), as the signed 32-bit int Java
    returns."""
    data = bytes(data)
    length = len(data)
    m = 0x5BD1E995
    h = 0x9747B28C ^ length
    for (k,) in struct.iter_unpack("<I", data[: length & ~3]):
        k = k * m & 0xFFFFFFFF
        k = (k ^ k >> 24) * m & 0xFFFFFFFF
        h = (h * m & 0xFFFFFFFF) ^ k
    rest = length & 3
    if rest:
        tail = data[length & ~3 :]
        if rest == 3:
            h ^= tail[2] << 16
        if rest >= 2:
            h ^= tail[1] << 8
        h = (h ^ tail[0]) * m & 0xFFFFFFFF
    h = (h ^ h >> 13) * m & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


OFFSET, NEXT_OFFSET, TIMESTAMP, TIMESTAMP_ISO, TIMESTAMP_JSON, KEY, VALUE, KEYED, KEY_JSON, VALUE_JSON = range(10)
HEADERS, HEADERS_JSON = 10, 11
"""The fields ``render`` writes: offsets and timestamps in decimal (a missing timestamp
empty, or ``null`` in JSON), the timestamp in ISO 8601 (``message.format_iso``), the key
and value as they are (missing: empty), the key only when there is one (KEYED: nothing,
not even its suffix, without), and ``"key": ...`` / ``"value": ...`` as JSON members: a
string when the bytes are UTF-8, else ``"key_b64": "..."``, or null.  HEADERS is kcat's
``%h``: ``k1=v1,k2=v2`` (a null value without its ``=``), HEADERS_JSON ``, "headers":
[{"key": "k1", "value": "v1"}, ...]`` (each value a JSON member as above), or nothing
when the message has no headers."""


def _json_member(name: bytes, data: bytes | None) -> bytes:
    if data is None:
        return b'"%b": null' % name
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return b'"%b_b64": "%b"' % (name, base64.b64encode(data))
    return b'"%b": %b' % (name, json.dumps(text, ensure_ascii=False).encode("utf-8"))


def _headers_text(headers: m.Headers) -> bytes:
    return b",".join(name.encode("utf-8") if data is None else b"%b=%b" % (name.encode("utf-8"), data) for name, data in headers)


def _headers_json(headers: m.Headers) -> bytes:
    if not headers:
        return b""
    members = [b"{%b, %b}" % (_json_member(b"key", name.encode("utf-8")), _json_member(b"value", data)) for name, data in headers]
    return b', "headers": [%b]' % b", ".join(members)


_RENDERED: tuple[Callable[[m.Message], bytes], ...] = (
    lambda msg: b"%d" % msg.offset,
    lambda msg: b"%d" % msg.next_offset,
    lambda msg: b"" if msg.timestamp is None else b"%d" % msg.timestamp,
    lambda msg: b"" if msg.timestamp is None else m.format_iso(msg.timestamp).encode(),
    lambda msg: b"null" if msg.timestamp is None else b"%d" % msg.timestamp,
    lambda msg: msg.key or b"",
    lambda msg: msg.value or b"",
    lambda msg: msg.key or b"",  # KEYED: render leaves the field out without a key
    lambda msg: _json_member(b"key", msg.key),
    lambda msg: _json_member(b"value", msg.value),
    lambda msg: _headers_text(msg.headers),
    lambda msg: _headers_json(msg.headers),
)


def render(messages: Sequence[m.Message], program: Sequence[bytes | tuple[int, bytes]]) -> bytes:
    """Each message written out by ``program``: its items in turn, each a text (bytes) or a
    field (one of ``OFFSET`` ... ``VALUE_JSON``) with the text that follows it.  Raises
    ``ValueError`` for a field that is not one and ``TypeError`` for an item of another
    kind (the compiled core also for a message that is not a ``Message`` of ints and bytes)."""
    steps: list[tuple[Callable[[m.Message], bytes] | None, bytes, bool]] = []
    for item in program:
        if isinstance(item, bytes):
            steps.append((None, item, False))
        elif isinstance(item, tuple) and len(item) == 2 and type(item[0]) is int and isinstance(item[1], bytes):
            if not 0 <= item[0] < len(_RENDERED):
                raise ValueError(f"render: no field {item[0]}")
            steps.append((_RENDERED[item[0]], item[1], item[0] == KEYED))
        else:
            raise TypeError(f"render: an item is bytes or (field, bytes), not {item!r:.100}")
    out: list[bytes] = []
    append = out.append
    for msg in messages:
        for field, text, keyed in steps:
            if field is None:
                append(text)
            elif not (keyed and msg.key is None):
                append(field(msg))
                append(text)
    return b"".join(out)


VARINT_MAX_BYTES = 10
"""The longest varint: 64 bits in groups of 7."""


def varint(value: int) -> bytes:
    """``value`` (a signed 64-bit integer) as Kafka's record batches write it: zigzag
    (0, -1, 1, -2, ... become 0, 1, 2, 3, ...), then 7 bits a byte, low first, the top bit
    set on every byte but the last.  Raises ``OverflowError`` outside the int64 range."""
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise OverflowError(f"varint: {value} does not fit 64 bits")
    n = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` of ``buf`` (see ``varint``) and where it ends.  Raises
    ``ValueError`` when ``pos`` is outside ``buf``, the buffer ends inside the varint, or
    it runs past 10 bytes or 64 bits (input from the network is hostile)."""
    view = memoryview(buf).cast("B")
    if not 0 <= pos <= len(view):
        raise ValueError(f"read_varint: position {pos} outside a buffer of {len(view)} bytes")
    n = shift = 0
    for at in range(pos, min(len(view), pos + VARINT_MAX_BYTES)):
        byte = view[at]
        if shift == 63 and byte > 1:
            break
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (n >> 1) ^ -(n & 1), at + 1
        shift += 7
    else:
        if len(view) - pos < VARINT_MAX_BYTES:
            raise ValueError(f"read_varint: the buffer ends inside the varint at {pos}")
    raise ValueError(f"read_varint: the varint at {pos} runs past 64 bits")


KAFKA_BATCH = struct.Struct(">qiiBIhiqqqhii")
"""A Kafka record batch's header: base_offset, batch_length, leader_epoch, magic, crc,
attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
base_sequence, record_count (kl.net.kafka.records describes the format)."""
KAFKA_LENGTH_END = 12
"""Bytes of a batch up to and including its batch_length, which counts the bytes after it."""
KAFKA_CRC_AT = 21
"""Where the bytes a batch's CRC-32C covers begin (its attributes)."""


def kafka_header(base: int, records: bytes, count: int, last_delta: int, base_ts: int, max_ts: int) -> bytes:
    """The header of an uncompressed Kafka record batch of ``count`` records (their bytes),
    its checksum included: no producer id, leader epoch 0, create time."""
    header = KAFKA_BATCH.pack(
        base, KAFKA_BATCH.size - KAFKA_LENGTH_END + len(records), 0, 2, 0, 0, last_delta, base_ts, max_ts, -1, -1, -1, count
    )
    checksum = crc32c(records, crc32c(memoryview(header)[KAFKA_CRC_AT:]))
    return header[: KAFKA_CRC_AT - 4] + checksum.to_bytes(4, "big") + header[KAFKA_CRC_AT:]


def kafka_record(
    ts_delta: int, offset_delta: int, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] = ()
) -> bytes:
    """One record of a Kafka record batch, its length first (no attributes; None: null)."""
    fields = [b"\0", varint(ts_delta), varint(offset_delta), _kafka_field(key), _kafka_field(value), varint(len(headers))]
    for name, header_value in headers:
        fields.append(_kafka_field(name.encode()))
        fields.append(_kafka_field(header_value))
    body = b"".join(fields)
    return varint(len(body)) + body


def _kafka_field(data: bytes | None) -> bytes:
    return b"\x01" if data is None else varint(len(data)) + data


def kafka_batch(buf: Buffer, pos: int, base: int, max_message_bytes: int) -> tuple[bytes, int, int]:
    """The valid uncompressed magic 2 messages from ``pos`` on (the run ``plain_columns``
    finds) as one Kafka record batch, the first record at Kafka offset ``base`` and each
    next one at the next: (the batch, or b"" when no message at ``pos`` is plain, how many
    records it holds, and where the run stops).  The run stops early where a timestamp
    is more than int64 away from the first's (a field a batch cannot hold: the next
    batch's)."""
    columns = plain_columns(buf, pos, max_message_bytes)
    positions, stamps, key_lengths = (array("q", column) for column in columns[:3])
    stop = columns[3]
    if not positions:
        return b"", 0, stop
    base_ts = stamps[0]
    parts = []
    for i, (at, stamp, klen) in enumerate(zip(positions, stamps, key_lengths, strict=True)):
        length = int.from_bytes(buf[at : at + 4], "big") + m.LENGTH_SIZE
        if not _INT64_MIN <= stamp - base_ts <= _INT64_MAX:
            stop = at
            break
        value_at = at + m.HEADER_SIZE + max(klen, 0)
        key = None if klen < 0 else bytes(buf[at + m.HEADER_SIZE : value_at])
        parts.append(kafka_record(stamp - base_ts, i, key, bytes(buf[value_at : at + length])))
    records = b"".join(parts)
    max_ts = max(stamps[: len(parts)])
    batch = kafka_header(base, records, len(parts), len(parts) - 1, base_ts, max_ts) + records
    return batch, len(parts), stop


RawRecord = tuple[int, bytes | None, bytes | None, list[tuple[bytes | None, bytes | None]]]
"""A Kafka record as ``read_records`` finds it: timestamp delta, key, value, headers."""


def read_records(body: Buffer, count: int) -> list[RawRecord]:
    """The ``count`` records of a Kafka record batch's (decompressed) body, which they
    must fill exactly: (timestamp delta, key, value, headers), null fields None.  Raises
    ``ValueError`` naming what is malformed (varints, lengths)."""
    view = memoryview(body).cast("B")
    out = []
    pos = 0
    for i in range(count):
        length, pos = read_varint(view, pos)
        end = pos + length
        if length < 6 or end > len(view):
            raise ValueError(f"record {i} claims {length} bytes, {len(view) - pos} are left")
        ts_delta, at = read_varint(view, pos + 1)  # after the attributes, unused
        _, at = read_varint(view, at)  # the offset delta: kl gives each message its own offset
        key, at = _record_field(view, at, end, i)
        value, at = _record_field(view, at, end, i)
        n, at = read_varint(view, at)
        if not 0 <= n <= end - at:
            raise ValueError(f"record {i} claims {n} headers")
        headers = []
        for _ in range(n):
            name, at = _record_field(view, at, end, i)
            header_value, at = _record_field(view, at, end, i)
            headers.append((name, header_value))
        if at != end:
            raise ValueError(f"record {i} holds {end - at} bytes past its fields")
        out.append((ts_delta, key, value, headers))
        pos = end
    if pos != len(view):
        raise ValueError(f"{len(view) - pos} bytes follow the batch's {count} records")
    return out


def _record_field(view: memoryview, pos: int, end: int, i: int) -> tuple[bytes | None, int]:
    length, pos = read_varint(view, pos)
    if length == -1:
        return None, pos
    if not 0 <= length <= end - pos:
        raise ValueError(f"record {i} has a field of length {length} with {end - pos} bytes left")
    return bytes(view[pos : pos + length]), pos + length


def kafka_records(
    body: Buffer, count: int, base_ts: int, append_ts: int, now: int, max_message_bytes: int
) -> tuple[bytes, int] | None:
    """The records of a batch's body (see ``read_records``) as kl's magic 2 messages, and
    how many: each stamped ``append_ts`` when that is not -1, else ``base_ts`` plus its
    delta, and ``now`` when that is -1 (no timestamp).  None when a record is not simply a
    message kl writes (headers, a null value, a timestamp kl does not store, more than
    ``max_message_bytes``): the caller looks closer.  Raises ``ValueError`` as
    ``read_records`` does."""
    out = []
    for delta, key, value, headers in read_records(body, count):
        timestamp = append_ts if append_ts != -1 else base_ts + delta
        if timestamp == -1:
            timestamp = now
        if value is None or headers or not m.MIN_TIMESTAMP <= timestamp <= m.MAX_TIMESTAMP:
            return None
        message = m.encode(value, key, timestamp)
        if len(message) > max_message_bytes:
            return None
        out.append(message)
    return b"".join(out), len(out)


class Lane:
    """The async producer's fast lane: ``send`` with its signature, queueing a bare value
    (bytes) when the message is plain (no key, timestamp, callback, on_delivery or headers),
    goes where the last one ``aim`` named (``topic`` the same object, ``partition`` equal), fits
    ``room`` and comes from ``owner``'s thread; then ``slow(value)`` once ``queue`` holds
    more than ``wake_at``.  Anything else is ``general``'s, with the same arguments."""

    __slots__ = ("queue", "slow", "general", "topic", "partition", "room", "owner", "wake_at")

    def __init__(self, queue: list, slow: Callable[[bytes], object], general: Callable[..., None]):
        self.queue, self.slow, self.general = queue, slow, general
        self.topic: object = _UNAIMED
        self.partition: int | None = None
        self.room = -1
        self.owner: int | None = None
        self.wake_at = -1

    def aim(self, topic: str, partition: int | None, room: int) -> None:
        """Where the owner's next plain sends go, and the largest value that needs no check."""
        self.topic, self.partition, self.room = topic, partition, room

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        callback: Callable | None = None,
        headers: object = (),
        on_delivery: Callable | None = None,
    ) -> None:
        if (
            topic is self.topic
            and key is None
            and timestamp is None
            and callback is None
            and on_delivery is None
            and (headers is None or (type(headers) is tuple and not headers))
            and type(value) is bytes
            and len(value) <= self.room
            and (partition is self.partition or (type(partition) is int and partition == self.partition))
            and get_ident() == self.owner
        ):
            queue = self.queue
            queue.append(value)
            if len(queue) > self.wake_at:
                self.slow(value)
            return None
        if on_delivery is not None:
            return self.general(topic, value, key, partition, timestamp, callback, headers, on_delivery)
        return self.general(topic, value, key, partition, timestamp, callback, headers)


_UNAIMED = object()
"""A lane's topic before its first ``aim``: no topic is this object."""


def chunks(sizes: list[int], limit: int) -> Iterable[tuple[int, int]]:
    """(start, stop) index ranges of messages of ``sizes`` (less their headers) whose
    framed size stays within ``limit`` (a lone message larger than it is a chunk of its
    own).  A helper of this module's and the producer's, not a core function."""
    payload_ends = list(itertools.accumulate(sizes))  # the headers are added only where bisect looks

    def end(i: int) -> int:
        return payload_ends[i] + (i + 1) * m.HEADER_SIZE

    count, start, consumed = len(payload_ends), 0, 0
    while start < count:
        stop = max(bisect.bisect_right(range(count), consumed + limit, lo=start, key=end), start + 1)
        yield start, stop
        consumed, start = end(stop - 1), stop
