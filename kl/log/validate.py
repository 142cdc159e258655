"""A message set fit to append: ``Checked``, its bytes and how many messages they hold.

``Log.append`` takes nothing else (so its type says), so that no caller hands a log
bytes nobody checked or a count that is not theirs (the count numbers the Kafka offsets
the offset index and the state record keep).  The ways to get one: ``validate`` a set received from a client,
which checks every message and counts them; ``walked``, for bytes ``messageset.walk``
found whole and valid (a mirror's copy), which counts them; or ``Checked.framed``, for a
set kl framed itself (a producer's, Kafka records converted), where the caller vouches
for the bytes and the count.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kl.errors import CorruptMessage, InvalidMessageSet, Kind
from kl.log import message as m
from kl.log.config import FORMAT_07, FORMAT_KL
from kl.log.messageset import INCOMPLETE, Buffer, Entry, MessageSet, count_messages


class Checked(NamedTuple):
    """A message set to append and the messages it holds as readers see them (each of a
    compressed batch's, no padding)."""

    data: bytes
    count: int  # type: ignore[assignment]  # shadows tuple.count, as Appended's does

    @classmethod
    def framed(cls, data: bytes, count: int) -> Checked:
        """A set kl framed itself, of ``count`` messages: the caller vouches, nothing is checked."""
        return tuple.__new__(cls, (data, count))


def walked(data: bytes, max_message_bytes: int) -> Checked:
    """``data``, whole valid messages only (as ``messageset.walk`` found them), counted as
    ``Checked`` counts (``messageset.count_messages``); nothing is checked again."""
    return Checked.framed(data, count_messages(data, max_message_bytes))


_READABLE = {
    FORMAT_07: ((0, m.LEGACY_MAGIC), (m.CODEC_NONE, m.CODEC_GZIP)),
    FORMAT_KL: ((m.CURRENT_MAGIC,), (m.CODEC_NONE, m.CODEC_GZIP, m.CODEC_ZSTD)),
}
"""Per topic format: the magics and codecs a received message may have."""


def validate(data: Buffer, format: str, max_message_bytes: int, headers: bool = False) -> Checked:
    """Check a message set received for appending, before any of it is written, and count
    its messages (a compressed batch counts its inner messages).

    Every message must be complete, within ``max_message_bytes``, pass its checksum and
    have a magic and codec the topic's ``format`` stores: magic 0 or 1 and gzip for
    ``"0.7"``, magic 2 and gzip or zstd for ``"kl"``, and magic 3 (headers or a null
    value, never compressed itself) too where the topic has the ``headers`` setting.  A
    compressed batch's inner messages are checked too.  Raises ``InvalidMessageSet``
    naming the position and the problem (an empty set, a partial message at the end
    included).
    """
    if not data:
        raise InvalidMessageSet(0, "empty message set")
    magics, codecs = _READABLE[format]
    if headers and format == FORMAT_KL:
        magics = (m.CURRENT_MAGIC, m.HEADERS_MAGIC)
    received = bytes(data)  # the same object when it is bytes
    messages = MessageSet(received, max_message_bytes=max_message_bytes, stable_offset=len(received), ends_at_eof=True)
    count = 0
    for entry in messages.entries():
        if entry.problem is not None:
            raise InvalidMessageSet(entry.position, _what(messages.buffer, entry, max_message_bytes))
        codec = entry.attrs & m.CODEC_MASK
        if entry.magic not in magics:
            if entry.magic == m.HEADERS_MAGIC and format == FORMAT_KL:
                raise InvalidMessageSet(entry.position, f"magic 3 (headers or a null value) in a topic {_NO_HEADERS}")
            raise InvalidMessageSet(entry.position, f"magic {entry.magic} in a topic of format {format}")
        if entry.attrs & ~m.CODEC_MASK or codec not in codecs:
            what = f"attributes {entry.attrs:#04x} (codec {m.CODEC_NAMES.get(codec, codec)})"
            raise InvalidMessageSet(entry.position, f"{what} in a topic of format {format}")
        if codec == m.CODEC_NONE:
            count += 1
            continue
        try:
            inner = messages.decode(entry)
        except CorruptMessage as e:
            raise InvalidMessageSet(entry.position, e.reason) from None
        legacy = format == FORMAT_07
        if any((msg.timestamp is None) != legacy for msg in inner):  # only magic 2 and 3 have timestamps
            raise InvalidMessageSet(entry.position, f"compressed batch: an inner message's magic is not for format {format}")
        if not headers and any(msg.headers or msg.value is None for msg in inner):
            raise InvalidMessageSet(entry.position, f"compressed batch: an inner message of magic 3 in a topic {_NO_HEADERS}")
        count += len(inner)
    return Checked.framed(received, count)


_NO_HEADERS = "without the headers setting (kl topics alter TOPIC --headers)"


def _what(buf: bytes, entry: Entry, max_message_bytes: int) -> str:
    """What is wrong with a bad entry of a received set, in words."""
    assert entry.problem is not None
    if entry.problem.kind is INCOMPLETE:
        return f"partial message at the end ({len(buf) - entry.position} of {entry.size} bytes)"
    if entry.problem.kind is Kind.BAD_LENGTH:
        (length,) = struct.unpack_from(">i", buf, entry.position)
        if m.LENGTH_SIZE + length > max_message_bytes:
            return f"message of {m.LENGTH_SIZE + length} bytes exceeds max_message_bytes {max_message_bytes}"
    return entry.problem.reason
