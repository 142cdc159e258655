"""Message sets: many messages framed back to back, built and parsed in bulk.

A set read from disk is validated lazily, while it is iterated.  Where a message fails
its checks decides what that means: before the set's ``stable_offset`` (data that was
committed and flushed) it is corruption and raises ``CorruptMessage``; at or past it, it
is a torn tail left by a crash and simply ends the set.  A message cut off by the end
of the buffer always ends the set: the next read starts there.

Compressed batches are one wrapper message whose value is an inner message set.  Every
inner message is reported at the wrapper's offset, and all but the last resume at that
offset too, so a consumer that stops inside a batch gets the whole batch again.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import NamedTuple, cast

from kl.errors import CorruptMessage, Kind, UnsupportedCodec
from kl.log import core
from kl.log import message as m
from kl.log.message import Message


class Corruption(NamedTuple):
    """A problem found by a check or a scan: its kind and a short reason naming values."""

    kind: Kind
    reason: str

    def __str__(self) -> str:
        return self.reason


INCOMPLETE = Kind.INCOMPLETE
Buffer = bytes | bytearray | memoryview | mmap.mmap
"""What a message can be checked in: read bytes, or a file mapped into memory."""
_V1 = struct.Struct(">iBBI")
"""length, magic, attrs and crc of a magic 1 message."""


class Entry(NamedTuple):
    """One stored message as it sits in the file (a wrapper is one entry)."""

    position: int
    size: int
    magic: int
    attrs: int
    problem: Corruption | None
    """None when the message is valid, else why not (kind ``INCOMPLETE`` for a cut-off one).
    ``size`` is what the length field claims (0 when the length itself is bad)."""


_INCOMPLETE = Corruption(INCOMPLETE, INCOMPLETE.value)
_CHECKSUM = Corruption(Kind.CHECKSUM, Kind.CHECKSUM.value)
_KINDS = {
    core.UNKNOWN_MAGIC: Kind.UNKNOWN_MAGIC,
    core.BAD_LENGTH: Kind.BAD_LENGTH,
    core.BAD_KEY_LENGTH: Kind.BAD_KEY_LENGTH,
    core.BAD_FIELD: Kind.BAD_FIELD,
}
"""The problems ``core.check`` finds that name a value (the magic, a length, a field's position)."""


def check(buf: Buffer, pos: int, end: int, max_message_bytes: int, shift: int = 0) -> Entry:
    """Validate the message at ``pos``; nothing is allocated before its length is checked.

    The entry's position is ``pos + shift`` (a file position when ``buf`` starts at ``shift``).
    """
    problem, size, magic, attrs, value = core.check(buf, pos, end, max_message_bytes)
    return Entry(pos + shift, size, magic, attrs, None if problem == core.OK else _problem(problem, value))


def _problem(problem: int, value: int) -> Corruption:
    if problem == core.INCOMPLETE:
        return _INCOMPLETE
    if problem == core.CHECKSUM:
        return _CHECKSUM
    kind = _KINDS[problem]
    return Corruption(kind, f"{kind.value} {value}")


def walk(buf: Buffer, pos: int, end: int, max_message_bytes: int) -> tuple[int, int]:
    """Follow valid messages from ``pos``: (where the chain stops, how many it holds).

    It stops at ``end``, at a message that fails its checks or at one cut off by ``end``.
    """
    return core.walk(buf, pos, end, max_message_bytes)


def count_messages(buf: bytes, max_message_bytes: int) -> int:
    """How many messages ``buf``, whole valid messages only (as ``walk`` found them), holds
    as readers see them: a compressed batch counts its inner messages (decompressed to
    count them), padding none.  Nothing is checked again."""
    unpack, length_size, attrs_at = m.PREFIX.unpack_from, m.LENGTH_SIZE, m.ATTRIBUTES_OFFSET
    special = m.CODEC_MASK | m.ATTR_PADDING
    pos, end, count = 0, len(buf), 0
    while pos < end:
        length, magic = unpack(buf, pos)
        nxt = pos + length_size + length
        if not magic or not buf[pos + attrs_at] & special:
            count += 1
            pos = nxt
            continue
        attrs = buf[pos + attrs_at]
        if attrs & m.CODEC_MASK and not attrs & m.ATTR_PADDING:
            if magic == 1:
                payload = buf[pos + m.PAYLOAD_OFFSET_V1 : nxt]
            else:
                key_length = m.TIMESTAMP_KEY_LENGTH.unpack_from(buf, pos + m.TIMESTAMP_OFFSET)[1]
                payload = buf[pos + m.KEY_OFFSET + max(key_length, 0) : nxt]
            count += count_messages(m.decompress(attrs & m.CODEC_MASK, payload, max_message_bytes), max_message_bytes)
        pos = nxt
    return count


def frame(
    values: Iterable[bytes | None],
    timestamp: int,
    keys: Iterable[bytes | None] | None = None,
    headers: Iterable[m.Headers] | None = None,
) -> bytes:
    """Frame values (and keys, and headers) as messages, all with ``timestamp``: magic 2,
    or magic 3 for a message with headers or a null value (see ``message.encode``); no
    size checks."""
    if headers is not None:
        values = values if isinstance(values, (list, tuple)) else list(values)
        keys = [None] * len(values) if keys is None else keys
        return b"".join([m.encode(v, k, timestamp, m.CODEC_NONE, h) for v, k, h in zip(values, keys, headers, strict=True)])
    if keys is None:
        return core.frame(values if isinstance(values, (list, tuple)) else list(values), timestamp)  # type: ignore[arg-type]
    return b"".join([m.encode(v, k, timestamp) for v, k in zip(values, keys, strict=True)])


def wrap(inner: bytes, codec: int, timestamp: int) -> bytes:
    """One wrapper message holding the compressed ``inner`` set."""
    return m.encode(m.compress(codec, inner), None, timestamp, codec)


def frame_v1(values: Iterable[bytes]) -> bytes:
    """Frame values as magic 1 messages (Kafka 0.7's: no key, no timestamp); no size checks."""
    values = values if isinstance(values, list) else list(values)
    pack, crc32, magic, fixed = _V1.pack, zlib.crc32, m.LEGACY_MAGIC, m.LEGACY_HEADER_SIZE - m.LENGTH_SIZE
    parts: list[bytes] = [b""] * (2 * len(values))
    parts[0::2] = [pack(len(v) + fixed, magic, m.CODEC_NONE, crc32(v)) for v in values]
    parts[1::2] = values
    return b"".join(parts)


def wrap_v1(inner: bytes, codec: int) -> bytes:
    """One magic 1 wrapper holding the compressed ``inner`` set, as Kafka 0.7 wrote it."""
    return m.encode_v1(m.compress(codec, inner), codec)


class MessageSet:
    """A byte range of a partition starting at ``offset``, parsed lazily.

    ``stable_offset`` is the offset below which a bad message is corruption rather than a
    torn tail; ``ends_at_eof`` says the buffer stops where its file does, so a message cut
    off there below ``stable_offset`` is corruption too; ``path`` and ``position`` say
    where the bytes came from, for errors.
    """

    __slots__ = ("buffer", "offset", "stable_offset", "max_message_bytes", "path", "position", "ends_at_eof", "next_offset")

    def __init__(
        self,
        buffer: bytes,
        offset: int = 0,
        *,
        max_message_bytes: int,
        stable_offset: int = 0,
        path: str = "<memory>",
        position: int = 0,
        ends_at_eof: bool = False,
    ):
        self.buffer = buffer
        self.offset = offset
        self.stable_offset = stable_offset
        self.max_message_bytes = max_message_bytes
        self.path = path
        self.position = position
        self.ends_at_eof = ends_at_eof
        self.next_offset = offset
        """Where to read next, once the set has been iterated to its end."""

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the set as read (whole messages)."""
        return len(self.buffer)

    def __iter__(self) -> Iterator[Message]:
        buf, base, limit, pos = self.buffer, self.offset, self.max_message_bytes, 0
        plain_messages = core.plain_messages
        while True:
            run, pos = plain_messages(buf, pos, base, limit)  # the fast path: uncompressed magic 2
            yield from run
            step = self.decode_at(pos)
            if step is None:
                self.next_offset = base + pos
                return
            pos, messages = step
            yield from messages

    def values(self) -> tuple[list[bytes | None], int]:
        """All values in one pass, and the offset to read from next: the consumer's fast
        path.  A null value (magic 3) is None in the list."""
        runs = self.runs()
        out = next(runs)[0]
        for run, _, _, _ in runs:
            out += run
        return out, self.next_offset

    def runs(self) -> Iterator[tuple[list[bytes | None], int, int, bool]]:
        """The values as ``values`` reads them, in runs: (values, buffer position of the
        run, position after it, whether it is one stored message's: a compressed batch's
        values share its offset).  The first run may be empty; ``next_offset`` is set at
        the end."""
        buf, limit, plain_values = self.buffer, self.max_message_bytes, core.plain_values
        run, pos = plain_values(buf, 0, limit)  # uncompressed magic 2 without a key
        yield cast("list[bytes | None]", run), 0, pos, False
        while True:
            step = self.decode_at(pos)
            if step is None:
                self.next_offset = self.offset + pos
                return
            at, (pos, messages) = pos, step
            yield [msg.value for msg in messages], at, pos, True
            run, end = plain_values(buf, pos, limit)
            if run:
                yield cast("list[bytes | None]", run), pos, end, False
            pos = end

    def entries(self) -> Iterator[Entry]:
        """Every stored message with its problem, up to the first bad or cut-off one (included)."""
        pos, end = 0, len(self.buffer)
        while pos < end:
            entry = check(self.buffer, pos, end, self.max_message_bytes)
            yield entry
            if entry.problem is not None:
                return
            pos += entry.size

    def valid_bytes(self) -> int:
        """Bytes from the start that hold complete, valid messages (no exception raised)."""
        pos = 0
        for entry in self.entries():
            if entry.problem is not None:
                break
            pos += entry.size
        return pos

    def decode(self, entry: Entry) -> list[Message]:
        """The messages a valid entry holds: itself, or a compressed batch's inner messages."""
        buf, pos = self.buffer, entry.position
        nxt = pos + entry.size
        offset, next_offset = self.offset + pos, self.offset + nxt
        if entry.magic == 0:
            return [Message(offset, next_offset, None, None, buf[pos + m.PAYLOAD_OFFSET_V0 : nxt])]
        if entry.attrs & m.ATTR_PADDING:
            return []
        codec = entry.attrs & m.CODEC_MASK
        if entry.magic == m.HEADERS_MAGIC:  # never compressed (check refuses a codec)
            return [Message(offset, next_offset, *m.decode_v3(buf, pos))]
        if entry.magic == 1:
            ts, key, value = None, None, buf[pos + m.PAYLOAD_OFFSET_V1 : nxt]
        else:
            ts, klen = m.TIMESTAMP_KEY_LENGTH.unpack_from(buf, pos + m.TIMESTAMP_OFFSET)
            key_end = pos + m.KEY_OFFSET + max(klen, 0)
            key = None if klen < 0 else buf[pos + m.KEY_OFFSET : key_end]
            value = buf[key_end:nxt]
        if codec == m.CODEC_NONE:
            return [Message(offset, next_offset, ts, key, value)]
        return self._inner(entry, codec, value, offset, next_offset)

    def _inner(self, entry: Entry, codec: int, payload: bytes, offset: int, next_offset: int) -> list[Message]:
        def corrupt(reason: str) -> CorruptMessage:
            return CorruptMessage(
                self.path, self.position + entry.position, f"compressed batch: {reason}", offset=offset, kind=Kind.BAD_BATCH
            )

        try:
            inner = m.decompress(codec, payload, self.max_message_bytes)
        except UnsupportedCodec:
            raise
        except ValueError as e:
            raise corrupt(str(e)) from None
        inner_set = MessageSet(inner, max_message_bytes=self.max_message_bytes, stable_offset=len(inner))
        out = []
        for item in inner_set.entries():
            if item.problem is not None:
                raise corrupt(f"inner message at +{item.position}: {item.problem}")
            if item.magic and item.attrs & m.CODEC_MASK:
                raise corrupt(f"inner message at +{item.position} is itself compressed")
            (msg,) = inner_set.decode(item)
            out.append(Message(offset, offset, msg.timestamp, msg.key, msg.value, msg.headers))
        if not out:
            raise corrupt("empty")
        out[-1] = out[-1]._replace(next_offset=next_offset)
        return out

    def plain_run(self, pos: int) -> tuple[bytes, bytes, bytes, int]:
        """The buffer positions, timestamps and key lengths of the valid uncompressed magic
        2 messages from ``pos`` on (each as native 64-bit integers), and where that run
        stops: the columnar readers' fast path (no object per message)."""
        return core.plain_columns(self.buffer, pos, self.max_message_bytes)

    def decode_at(self, pos: int) -> tuple[int, list[Message]] | None:
        """Decode the one message at ``pos`` carefully: where the next one starts and
        what it holds (nothing for padding, a batch's inner messages); None where the set
        ends there.  Raises ``CorruptMessage`` for damage below the stable offset."""
        entry = check(self.buffer, pos, len(self.buffer), self.max_message_bytes)
        if entry.problem is None:
            return pos + entry.size, self.decode(entry)
        problem = entry.problem
        if self.offset + pos >= self.stable_offset or problem.kind is INCOMPLETE and not self.ends_at_eof:
            return None
        reason = "file ends inside a message" if problem.kind is INCOMPLETE else problem.reason
        raise CorruptMessage(self.path, self.position + pos, reason, offset=self.offset + pos, kind=problem.kind)
