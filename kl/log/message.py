"""One message: the on-disk format, its constants, checksums and codecs.

The format is specified in ``man/kl-format.5``; every number here mirrors that page.
All integers are big-endian.  Three versions (the ``magic`` byte) exist and all are read::

    magic 0  length:4 magic:1 crc:4 payload          (Kafka 0.7; crc = CRC32(payload))
    magic 1  length:4 magic:1 attrs:1 crc:4 payload  (Kafka 0.7; crc = CRC32(payload))
    magic 2  length:4 magic:1 attrs:1 crc:4 timestamp:8 key_length:4 key value
             crc = CRC32(magic, attrs, timestamp, key_length, key, value)
    magic 3  length:4 magic:1 attrs:1 crc:4 timestamp:8 key_length:4 key
             value_length:4 value header_count:4 {hkey_length:4 hkey hvalue_length:4 hvalue}*
             crc = CRC32(magic, attrs, everything after the crc)

``length`` counts the bytes after itself.  kl writes magic 2, magic 3 for a message with
headers or a null value (only in topics with the ``headers`` setting), and magic 1 in
topics of format ``0.7`` (Kafka 0.7's, for its clients).
"""

from __future__ import annotations

import datetime
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from kl.errors import InvalidHeaders, UnsupportedCodec

LENGTH_SIZE = 4
MAGIC_OFFSET = 4
ATTRIBUTES_OFFSET = 5
CRC_OFFSET_V0 = 5
PAYLOAD_OFFSET_V0 = 9
CRC_OFFSET = 6
PAYLOAD_OFFSET_V1 = 10
TIMESTAMP_OFFSET = 10
KEY_LENGTH_OFFSET = 18
KEY_OFFSET = 22
HEADER_SIZE = KEY_OFFSET
"""Bytes of a magic 2 message before its key."""

CURRENT_MAGIC = 2
HEADERS_MAGIC = 3
"""What kl writes for a message with headers or a null value."""
HEADERS_HEADER_SIZE = KEY_OFFSET + 8
"""Bytes of a magic 3 message without key, value or headers: magic 2's header, the
value length and the header count."""
HEADER_FIELD_SIZE = 8
"""Bytes of one header without its key and value: the two lengths."""
NULL = -1
"""A magic 3 value length (or a header's value length) that says null."""
LEGACY_MAGIC = 1
"""What kl writes in a topic of format ``0.7``."""
LEGACY_HEADER_SIZE = PAYLOAD_OFFSET_V1
"""Bytes of a magic 1 message before its payload."""
MIN_LENGTH = (5, 6, HEADER_SIZE - LENGTH_SIZE, HEADERS_HEADER_SIZE - LENGTH_SIZE)
"""Smallest valid ``length`` field for magic 0, 1, 2 and 3."""
NO_KEY = -1
MIN_TIMESTAMP = -62135596800000
"""0001-01-01T00:00:00Z in milliseconds: the earliest timestamp kl stores (Python's ``datetime``)."""
MAX_TIMESTAMP = 253402300799999
"""9999-12-31T23:59:59.999Z: the latest one; as Spark's microseconds (int64) both ends fit easily."""

CODEC_MASK = 0x07
CODEC_NONE = 0
CODEC_GZIP = 1
CODEC_SNAPPY = 2
CODEC_LZ4 = 3
CODEC_ZSTD = 4
ATTR_PADDING = 0x08
"""A message ``kl recover --repair`` wrote over damaged bytes to keep later offsets: readers skip it."""
CODECS = {"none": CODEC_NONE, "gzip": CODEC_GZIP, "zstd": CODEC_ZSTD}
CODEC_NAMES = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4", CODEC_ZSTD: "zstd"}

HEADER = struct.Struct(">iBBIqi")
"""length, magic, attrs, crc, timestamp, key_length of a magic 2 message."""
FRAME = struct.Struct(">iHI12s")
"""length, magic and attrs (as one number), crc, then timestamp and key_length packed
once per batch: the same 22 header bytes as ``HEADER``, with fewer fields to pack."""
PREFIX = struct.Struct(">iB")
"""length and magic: the part every version shares."""
ATTRS_CRC = struct.Struct(">BI")
CRC_V0 = struct.Struct(">I")
TIMESTAMP_KEY_LENGTH = struct.Struct(">qi")
INT32 = struct.Struct(">i")

CRC_SEEDS = tuple(zlib.crc32(bytes((CURRENT_MAGIC, attrs))) for attrs in range(256))
"""CRC32 of the (magic 2, attrs) pair: the running checksum a magic 2 body continues from."""
CRC_SEEDS_V3 = tuple(zlib.crc32(bytes((HEADERS_MAGIC, attrs))) for attrs in range(256))
"""The same for magic 3."""

Headers = tuple[tuple[str, "bytes | None"], ...]
"""A message's headers: (key, value) pairs in order; keys may repeat, a value may be None."""


class Message(NamedTuple):
    """A message as a consumer sees it.

    ``offset`` is where the message (or, inside a compressed batch, its wrapper) starts;
    ``next_offset`` is where to resume after it.  ``timestamp`` is milliseconds since
    the epoch, or None for magic 0 and 1.  ``value`` is None for a null value (a
    tombstone; magic 3 only), ``headers`` the message's headers (magic 3), else ``()``.
    """

    offset: int
    next_offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def timestamp_problem(timestamp: int) -> str | None:
    """Why ``timestamp`` cannot be stored (outside the years 1 to 9999), or None."""
    if MIN_TIMESTAMP <= timestamp <= MAX_TIMESTAMP:
        return None
    return (
        f"timestamp {timestamp} is outside the range kl stores, {MIN_TIMESTAMP} to {MAX_TIMESTAMP} ms since the epoch "
        "(years 1 to 9999, what Spark and Parquet can hold)"
    )


def crc_of(magic: int, attrs: int, body: bytes | memoryview) -> int:
    """The checksum a message of ``magic`` with these ``attrs`` and ``body`` must carry.

    ``body`` is everything after the crc field (the payload for magic 0 and 1).
    """
    if magic == CURRENT_MAGIC:
        return zlib.crc32(body, CRC_SEEDS[attrs])
    if magic == HEADERS_MAGIC:
        return zlib.crc32(body, CRC_SEEDS_V3[attrs])
    return zlib.crc32(body)


def encode(
    value: bytes | None,
    key: bytes | None = None,
    timestamp: int = 0,
    attrs: int = CODEC_NONE,
    headers: Headers | Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """One message, framed and checksummed: magic 2, or magic 3 when it has ``headers``
    or its value is None.  Raises ``InvalidHeaders`` for headers that are not (str,
    bytes or None) pairs, or whose key is not UTF-8."""
    if headers or value is None:
        return encode_v3(value, key, timestamp, attrs, headers)
    if key is None and type(value) is bytes:  # the header packed at once (as frame() does)
        fields = TIMESTAMP_KEY_LENGTH.pack(timestamp, NO_KEY)
        crc = zlib.crc32(value, zlib.crc32(fields, CRC_SEEDS[attrs]))
        return FRAME.pack(len(value) + HEADER_SIZE - LENGTH_SIZE, CURRENT_MAGIC << 8 | attrs, crc, fields) + value
    if key is None:
        body = TIMESTAMP_KEY_LENGTH.pack(timestamp, NO_KEY) + value
    else:
        body = TIMESTAMP_KEY_LENGTH.pack(timestamp, len(key)) + key + value
    return PREFIX.pack(len(body) + 6, CURRENT_MAGIC) + ATTRS_CRC.pack(attrs, zlib.crc32(body, CRC_SEEDS[attrs])) + body


def encode_v3(
    value: bytes | None,
    key: bytes | None,
    timestamp: int,
    attrs: int,
    headers: Headers | Sequence[tuple[str, bytes | None]],
) -> bytes:
    """One magic 3 message (see ``encode``)."""
    if value is not None and type(value) is not bytes:
        value = bytes(value)  # a wide buffer's length in bytes
    pack = INT32.pack
    parts = [TIMESTAMP_KEY_LENGTH.pack(timestamp, NO_KEY if key is None else len(key)), key or b""]
    parts += [pack(NULL), b""] if value is None else [pack(len(value)), value]
    parts.append(pack(len(headers)))
    for header in headers:
        name, data = _header(header)
        parts += (pack(len(name)), name, pack(NULL), b"") if data is None else (pack(len(name)), name, pack(len(data)), data)
    body = b"".join(parts)
    crc = zlib.crc32(body, CRC_SEEDS_V3[attrs])
    return PREFIX.pack(len(body) + 6, HEADERS_MAGIC) + ATTRS_CRC.pack(attrs, crc) + body


def as_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    """``headers`` as a message holds them: a tuple of (str, bytes or None) pairs (a pair
    may be given as a list).  Raises ``InvalidHeaders`` for anything else, and for a key
    that cannot be UTF-8."""
    out = []
    for header in headers or ():
        pair = tuple(header) if isinstance(header, list) else header
        data = _header(pair)[1]  # checks it first
        out.append((pair[0], data))
    return tuple(out)


def _header(header: object) -> tuple[bytes, bytes | None]:
    """A header as it is stored: its key in UTF-8, its value."""
    if not (isinstance(header, tuple) and len(header) == 2 and isinstance(header[0], str)):
        raise InvalidHeaders(f"a header is a (str, bytes or None) pair, not {header!r:.80}")
    name, data = header
    if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidHeaders(f"header {name!r:.80}: its value is bytes or None, not {type(data).__name__}")
    try:
        return name.encode("utf-8"), None if data is None else bytes(data)
    except UnicodeEncodeError:
        raise InvalidHeaders(f"header key {name!r:.80} cannot be written as UTF-8") from None


def decode_v3(buf: bytes, pos: int) -> tuple[int, bytes | None, bytes | None, Headers]:
    """The timestamp, key, value and headers of the magic 3 message at ``pos``, which
    ``check`` found valid (nothing is checked again)."""
    unpack = INT32.unpack_from
    timestamp, key_length = TIMESTAMP_KEY_LENGTH.unpack_from(buf, pos + TIMESTAMP_OFFSET)
    at = pos + KEY_OFFSET + max(key_length, 0)
    key = None if key_length < 0 else buf[pos + KEY_OFFSET : at]
    (value_length,) = unpack(buf, at)
    at += 4
    value = None if value_length < 0 else buf[at : at + value_length]
    at += max(value_length, 0)
    (count,) = unpack(buf, at)
    at += 4
    headers = []
    for _ in range(count):
        (name_length,) = unpack(buf, at)
        name = buf[at + 4 : at + 4 + name_length].decode("utf-8")
        at += 4 + name_length
        (data_length,) = unpack(buf, at)
        at += 4
        headers.append((name, None if data_length < 0 else buf[at : at + data_length]))
        at += max(data_length, 0)
    return timestamp, key, value, tuple(headers)


def framed_size(value: bytes | None, key: bytes | None, headers: Headers | Sequence[tuple[str, bytes | None]] = ()) -> int:
    """The bytes ``encode`` writes for this message."""
    size = HEADER_SIZE + len(key or b"") + len(value or b"")
    if headers or value is None:
        size += HEADERS_HEADER_SIZE - HEADER_SIZE
        size += sum(HEADER_FIELD_SIZE + len(name.encode("utf-8", "surrogatepass")) + len(data or b"") for name, data in headers)
    return size


def encode_v1(value: bytes, attrs: int = CODEC_NONE) -> bytes:
    """One magic 1 message (Kafka 0.7's: no key, no timestamp), framed and checksummed."""
    return PREFIX.pack(len(value) + 6, LEGACY_MAGIC) + ATTRS_CRC.pack(attrs, zlib.crc32(value)) + value


def compress(codec: int, data: bytes) -> bytes:
    """Compress an inner message set with ``codec`` (gzip or zstd)."""
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == CODEC_GZIP:
        compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()
    raise UnsupportedCodec(f"kl cannot write codec {CODEC_NAMES.get(codec, codec)}")


def decompress(codec: int, data: bytes | memoryview, max_size: int) -> bytes:
    """Decompress a wrapper's payload, refusing to produce more than ``max_size`` bytes.

    Raises ``UnsupportedCodec`` for snappy, lz4 and unknown codecs and ``ValueError`` for
    damaged or oversized data.
    """
    if codec == CODEC_ZSTD:
        import zstandard

        try:
            with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
                out = reader.read(max_size + 1)
        except zstandard.ZstdError as e:
            raise ValueError(f"zstd: {e}") from None
    elif codec == CODEC_GZIP:
        d = zlib.decompressobj(47)
        try:
            out = d.decompress(data, max_size + 1)
        except zlib.error as e:
            raise ValueError(f"gzip: {e}") from None
        if not d.eof and len(out) <= max_size:
            raise ValueError("gzip: truncated stream")
    else:
        raise UnsupportedCodec(f"kl cannot read codec {CODEC_NAMES.get(codec, codec)}")
    if len(out) > max_size:
        raise ValueError(f"decompresses to more than {max_size} bytes")
    return out


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def format_iso(ms: int) -> str:
    """A time as ISO 8601 in UTC with milliseconds: ``2026-01-31T14:30:05.250Z`` (outside
    the years 1 to 9999, which ISO 8601 cannot write, the milliseconds as digits)."""
    try:
        return (_EPOCH + datetime.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except OverflowError:
        return str(ms)
