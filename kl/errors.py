"""kl's exceptions: one class per condition, each message naming the values involved."""

from __future__ import annotations

import enum


class Kind(enum.Enum):
    """What is wrong with a stored message (or a segment file), in a word."""

    INCOMPLETE = "incomplete message"
    """The buffer or file ends inside the message: torn, or not yet all read."""
    UNKNOWN_MAGIC = "unknown magic"
    BAD_LENGTH = "bad length"
    CHECKSUM = "checksum mismatch"
    BAD_KEY_LENGTH = "bad key length"
    BAD_FIELD = "bad field at byte"
    """A magic 3 message whose value, header or header count length does not fit it, a
    header key that is not UTF-8, or bytes left over (named by its position in the message)."""
    BAD_BATCH = "bad compressed batch"
    SHORT_FILE = "file ends early"
    """A segment file ends before the offset where its data must go on."""
    LONG_FILE = "file runs past its end"
    """A closed segment file holds bytes past the next segment's base offset."""
    UNKNOWN_SEGMENT = "unknown segment"
    """A segment file that the partition's state does not account for."""


class KlError(Exception):
    """Base class of every error kl raises on purpose."""


class InvalidTopicName(KlError):
    """A topic name is not 1-249 characters of [A-Za-z0-9._-], or escapes the root."""


class TopicNotFound(KlError):
    """The topic (or partition) does not exist under the root."""


class TopicRecreated(KlError):
    """The topic being read was deleted and created again (its topic id changed): a
    position in the old one means nothing in the new one."""

    def __init__(self, topic: str, recorded: str, current: str, what: str, remedy: str):
        super().__init__(
            f"topic {topic} was deleted and created again since this {what}"
            f" (its topic id was {recorded}, it is {current} now): {remedy}"
        )
        self.topic, self.recorded, self.current = topic, recorded, current


class TopicExists(KlError):
    """A topic with that name already exists."""


class InvalidConfig(KlError):
    """A topic or client setting is out of range, or a config file is unreadable."""


class ConfigNotAlterable(InvalidConfig):
    """A topic setting that cannot change after creation, or a change that would cut off
    data already stored (fewer partitions, a smaller maximum message size)."""


class OffsetOutOfRange(KlError):
    """An offset is below the log start or beyond the log end."""

    def __init__(self, message: str, *, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(message)
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class InvalidOffset(KlError):
    """An offset inside the log that is not the start of a message."""


class CorruptMessage(KlError):
    """A message before the committed end fails its length or checksum check."""

    def __init__(self, path: str, position: int, reason: str, *, offset: int | None = None, kind: Kind | None = None):
        where = f"offset {offset} ({path} position {position})" if offset is not None else f"{path} position {position}"
        super().__init__(f"corrupt message at {where}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason
        self.offset = offset
        self.kind = kind


class CorruptState(KlError):
    """A partition's state record is unreadable; ``kl recover`` rebuilds it."""


class MessageTooLarge(KlError):
    """A message is larger than the topic's maximum message size."""


class FormatMismatch(KlError):
    """A message the topic's format cannot store: a key or zstd for a Kafka 0.7 topic."""


class InvalidHeaders(KlError):
    """A message's headers are not (str, bytes or None) pairs, or a key cannot be UTF-8."""


class InvalidTimestamp(KlError):
    """A timestamp outside the range kl stores (``message.MIN_TIMESTAMP`` to ``MAX_TIMESTAMP``)."""


class InvalidTime(InvalidConfig):
    """A time or duration written as text that ``kl.timespec`` cannot read."""


class InvalidMessageSet(KlError):
    """A message set received for appending fails a check (see ``kl.log.validate.validate``)."""

    def __init__(self, position: int, reason: str):
        super().__init__(f"invalid message set: {reason} (at position {position})")
        self.position = position
        self.reason = reason


class UnsupportedCodec(KlError):
    """A compressed message uses a codec kl cannot read or write."""


class LockTimeout(KlError):
    """A lock was not acquired within its timeout."""


class StorageError(KlError):
    """The filesystem refused a write, fsync or open (disk full, read-only, I/O error)."""

    def __init__(self, message: str, *, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


class RootNotFound(KlError):
    """The root directory is missing (not mounted?) or is not a directory."""


class QueueFull(KlError):
    """An async producer's queue stayed full for longer than its ``queue_timeout``."""


class ProducerClosed(KlError):
    """A message was sent to an async producer after ``close()``."""


class OutOfOrderSequence(KlError):
    """An idempotent producer's batch does not follow the last one the partition holds of it
    (Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER)."""


class InvalidProducerEpoch(KlError):
    """An idempotent producer's batch carries an older epoch than the partition holds of it:
    a newer instance of the producer took over (Kafka's INVALID_PRODUCER_EPOCH)."""
