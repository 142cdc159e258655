"""A partition's byte range as Arrow record batches, built in bulk (needs pyarrow and numpy).

Runs of uncompressed messages are located by one parse loop of the core that records
where each message starts, its timestamp and its key length (``MessageSet.plain_run``);
numpy and Arrow build every column from those and the bytes at once.  Compressed
batches, padding and Kafka 0.7 messages go through the careful decoder, a message at a
time.

Timestamps become Spark's (microseconds, int64).  One outside the range kl stores
(``message.MIN_TIMESTAMP`` to ``MAX_TIMESTAMP``, the years 1 to 9999; older data or
other writers may hold such) fails the read naming its topic, partition and offset,
or as ``bad_timestamps`` says is clamped to the range or read as null: never wrapped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from kl.errors import CorruptMessage, InvalidConfig, InvalidTimestamp, KlError, OffsetOutOfRange
from kl.log import message as m
from kl.log.cursor import Cursor
from kl.log.log import Position
from kl.log.message import Message
from kl.log.messageset import MessageSet
from kl.spark.ranges import DataLoss, Range, log_loss
from kl.topic import Root

log = logging.getLogger(__name__)

READ_BYTES = 8 << 20
"""Bytes read from the partition per record batch."""
BAD_TIMESTAMPS = ("fail", "clamp", "null")
"""What to do with a timestamp outside the years 1 to 9999: fail the read (naming the
message), clamp it to the nearer end of the range, or give null."""

SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("nextOffset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
DDL = "key binary, value binary, topic string, partition int, offset long, nextOffset long, timestamp timestamp"
"""``SCHEMA`` as Spark's DDL: what the ``kl`` source gives."""
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
"""A message's headers as Spark's Kafka source types them: array<struct<key:string,value:binary>>."""
SCHEMA_HEADERS = SCHEMA.append(pa.field("headers", HEADERS_TYPE))
DDL_HEADERS = DDL + ", headers array<struct<key:string,value:binary>>"
"""With ``includeHeaders``: the columns and a last one, ``headers`` (null for a message
without headers, as Spark's Kafka source gives it)."""


class Skip(NamedTuple):
    """Damaged bytes a read stepped over (``skipCorrupt``)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    reason: str


def read_range(
    root: Root,
    r: Range,
    *,
    skip_corrupt: bool = False,
    fail_on_data_loss: bool = True,
    on_skip: Callable[[Skip], None] | None = None,
    on_loss: Callable[[DataLoss], None] | None = None,
    read_bytes: int = READ_BYTES,
    bad_timestamps: str = "fail",
    headers: bool = False,
) -> Iterator[pa.RecordBatch]:
    """The messages of ``r`` as record batches of ``SCHEMA`` (``SCHEMA_HEADERS`` with
    ``headers``), in offset order.  A null value is a null.

    Damage raises ``CorruptMessage`` naming the topic, partition and offset, or with
    ``skip_corrupt`` is stepped over and reported to ``on_skip`` (default: a logged
    warning).  Data deleted by retention since the read was planned raises
    ``DataLoss``, or without ``fail_on_data_loss`` is reported to ``on_loss`` and the
    read goes on from the log start.  A timestamp outside the years 1 to 9999 raises
    ``InvalidTimestamp`` naming the message, or is clamped or made null as
    ``bad_timestamps`` ("fail", "clamp", "null") says.
    """
    check_bad_timestamps(bad_timestamps)

    def lost(error: OffsetOutOfRange, to: int) -> None:
        if error.offset >= error.log_start_offset:  # not deleted: the log ends before it
            raise error
        loss = DataLoss(r.topic, r.partition, error.offset, min(to, r.end))
        if fail_on_data_loss:
            raise loss from None
        (on_loss or log_loss)(loss)

    def skipped(offset: int, next_offset: int, reason: str) -> None:
        (on_skip or _log_skip)(Skip(r.topic, r.partition, offset, next_offset, reason))

    log_ = root.log(r.topic, r.partition)
    cursor = Cursor(log_, Position(r.start), reset="earliest", skip_corrupt=skip_corrupt, on_skip=skipped, on_loss=lost)
    while (offset := cursor.position.offset) < r.end:
        try:
            batch, damage = cursor.read_with(
                min(read_bytes, r.end - offset), lambda found: _columns(found, r, bad_timestamps, headers)
            )
            if damage is not None:
                cursor.damaged(damage)
        except CorruptMessage as e:
            raise CorruptMessage(
                e.path, e.position, f"{e.reason} (topic {r.topic!r} partition {r.partition})", offset=e.offset, kind=e.kind
            ) from None
        if batch is not None and batch.num_rows:
            yield batch
        if cursor.position.offset == offset and batch is None:
            raise KlError(
                f"topic {r.topic!r} partition {r.partition}: nothing readable at offset {offset}, before the planned end {r.end}"
            )


def check_bad_timestamps(policy: str) -> str:
    """``policy`` when it is one of ``BAD_TIMESTAMPS``; else raises ``InvalidConfig``."""
    if policy not in BAD_TIMESTAMPS:
        raise InvalidConfig(f"bad timestamps must be one of {', '.join(BAD_TIMESTAMPS)}, not {policy!r}")
    return policy


def _columns(messages: MessageSet, r: Range, bad_timestamps: str, headers: bool) -> tuple[pa.RecordBatch | None, int]:
    """The set's messages as one record batch (with ``headers``, their column last), and
    the offset after the last one."""
    pieces: list[pa.RecordBatch] = []
    slow: list[Message] = []
    pos, end = 0, len(messages.buffer)
    while pos < end:
        positions, timestamps, key_lengths, stop = messages.plain_run(pos)
        if len(positions):
            if slow:
                pieces.append(_from_messages(slow, r, bad_timestamps, headers))
                slow = []
            pieces.append(_from_plain(messages, (positions, timestamps, key_lengths), stop, r, bad_timestamps, headers))
        pos = stop
        if pos >= end:
            break
        step = messages.decode_at(pos)
        if step is None:
            break
        pos, decoded = step
        slow.extend(decoded)
    if slow:
        pieces.append(_from_messages(slow, r, bad_timestamps, headers))
    next_offset = messages.offset + pos
    if not pieces:
        return None, next_offset
    if len(pieces) == 1:
        return pieces[0], next_offset
    return pa.Table.from_batches(pieces).combine_chunks().to_batches()[0], next_offset


def _from_plain(
    messages: MessageSet, run: tuple[bytes, bytes, bytes], stop: int, r: Range, bad_timestamps: str, headers: bool
) -> pa.RecordBatch:
    """Columns of a run of uncompressed magic 2 messages (their positions, timestamps and
    key lengths from the core): keys and values taken out of the bytes by Arrow (``_pieces``)."""
    data = np.frombuffer(messages.buffer, dtype=np.uint8)
    starts, timestamps, key_lengths = (np.frombuffer(column, dtype=np.int64) for column in run)
    n = len(starts)
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = starts[1:]
    ends[-1] = stop
    key_starts = starts + m.KEY_OFFSET
    value_starts = key_starts + np.maximum(key_lengths, 0)
    pieces = _pieces(data, starts, key_starts, value_starts, stop)
    values = pieces.take(pa.array(np.arange(2, 3 * n, 3)))
    has_key = key_lengths >= 0
    if not has_key.any():
        keys = pa.nulls(n, pa.binary())
    else:
        keys = pieces.take(pa.array(np.arange(1, 3 * n, 3)))
        if not has_key.all():
            validity = pa.py_buffer(np.packbits(has_key, bitorder="little"))
            keys = pa.Array.from_buffers(pa.binary(), n, [validity, *keys.buffers()[1:]])
    base = messages.offset
    return pa.RecordBatch.from_arrays(
        [
            keys,
            values,
            pa.repeat(pa.scalar(r.topic, pa.string()), n),
            pa.repeat(pa.scalar(r.partition, pa.int32()), n),
            pa.array(starts + base),
            pa.array(ends + base),
            _timestamps(timestamps, None, starts + base, r, bad_timestamps),
            *([pa.nulls(n, HEADERS_TYPE)] if headers else []),  # magic 2: none
        ],
        schema=SCHEMA_HEADERS if headers else SCHEMA,
    )


def _pieces(data: np.ndarray, starts: np.ndarray, key_starts: np.ndarray, value_starts: np.ndarray, stop: int) -> pa.Array:
    """The run's bytes, unchanged, seen as a binary array of 3 rows per message (its
    header, its key, its value): messages lie back to back, so these pieces tile the
    bytes and one offsets array describes them all.  ``take`` then copies out keys or
    values in one call."""
    lo, n = int(starts[0]), len(starts)
    offsets = np.empty(3 * n + 1, dtype=np.int32)  # a read is under 2 GiB: messages are
    offsets[0::3] = np.append(starts, stop) - lo
    offsets[1::3] = key_starts - lo
    offsets[2::3] = value_starts - lo
    return pa.Array.from_buffers(pa.binary(), 3 * n, [None, pa.py_buffer(offsets), pa.py_buffer(data[lo:stop])])


def _from_messages(messages: list[Message], r: Range, bad_timestamps: str, headers: bool) -> pa.RecordBatch:
    """Columns of messages decoded one at a time (compressed batches, Kafka 0.7 messages,
    magic 3)."""
    n = len(messages)
    missing = np.array([msg.timestamp is None for msg in messages], dtype=bool)
    stamps = np.array([msg.timestamp or 0 for msg in messages], dtype=np.int64)
    offsets = np.array([msg.offset for msg in messages], dtype=np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([msg.key for msg in messages], pa.binary()),
            pa.array([msg.value for msg in messages], pa.binary()),
            pa.repeat(pa.scalar(r.topic, pa.string()), n),
            pa.repeat(pa.scalar(r.partition, pa.int32()), n),
            pa.array([msg.offset for msg in messages], pa.int64()),
            pa.array([msg.next_offset for msg in messages], pa.int64()),
            _timestamps(stamps, missing if missing.any() else None, offsets, r, bad_timestamps),
            *([_headers(messages)] if headers else []),
        ],
        schema=SCHEMA_HEADERS if headers else SCHEMA,
    )


def _headers(messages: list[Message]) -> pa.Array:
    """The messages' headers as a list of (key, value) structs each, null without any."""
    return pa.array([[{"key": k, "value": v} for k, v in msg.headers] if msg.headers else None for msg in messages], HEADERS_TYPE)


def _timestamps(ms: np.ndarray, missing: np.ndarray | None, offsets: np.ndarray, r: Range, policy: str) -> pa.Array:
    """Milliseconds as Spark's timestamps (``missing``: none given), those outside the
    range kl stores failed, clamped or made null as ``policy`` says."""
    bad = (ms < m.MIN_TIMESTAMP) | (ms > m.MAX_TIMESTAMP)
    if missing is not None:
        bad &= ~missing
    if bad.any():
        if policy == "fail":
            i = int(np.argmax(bad))
            problem = m.timestamp_problem(int(ms[i]))
            raise InvalidTimestamp(
                f"topic {r.topic!r} partition {r.partition} offset {int(offsets[i])}: {problem}; "
                "read it with kl load --bad-timestamps clamp or null (the kl source's option badTimestamps)"
            )
        if policy == "clamp":
            ms = np.clip(ms, m.MIN_TIMESTAMP, m.MAX_TIMESTAMP)
        else:
            missing = bad if missing is None else missing | bad
    return pa.array(ms * 1000, pa.int64(), mask=missing).cast(pa.timestamp("us", tz="UTC"))


def _log_skip(skip: Skip) -> None:
    log.warning("skipped damaged data of %s/%d from offset %d to %d: %s", *skip)
