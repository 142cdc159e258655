"""A topic's configuration: the small ``topic.json`` file beside its partitions."""

from __future__ import annotations

import base64
import dataclasses
import itertools
import json
import os
import re
import threading
import uuid
from dataclasses import dataclass

from kl.errors import ConfigNotAlterable, InvalidConfig
from kl.log import openfiles

CONFIG_FILE = "topic.json"
GiB = 1 << 30
MiB = 1 << 20
MIN_MESSAGE_BYTES = 64
FORMAT_KL = "kl"
FORMAT_07 = "0.7"
FORMATS = (FORMAT_KL, FORMAT_07)
"""What a topic's segments store: kl's magic 2 messages in ``.kl`` files, or Kafka
0.7's magic 1 messages (no key, no timestamp) in ``.kafka`` files."""
ALTERABLE = (
    "partitions",
    "segment_bytes",
    "max_message_bytes",
    "flush_messages",
    "flush_ms",
    "retention_ms",
    "retention_bytes",
    "headers",
    "partitioner",
)
"""The settings ``Root.alter_topic`` changes; ``format`` and ``topic_id`` are fixed at creation."""
PARTITIONERS = ("crc32", "murmur2")
"""How kl's producers give keys partitions: CRC-32 (librdkafka's default) or murmur2 (the
Java client's, kafka-python's and Kafka's tools')."""
NO_HEADERS_07 = "a topic of format 0.7 cannot hold headers or null values (Kafka 0.7 messages have neither)"
_TOPIC_ID = re.compile(r"[A-Za-z0-9_-]{22}")


def new_topic_id() -> str:
    """A fresh topic id: 16 random bytes (a version 4 UUID) in URL-safe base64 without
    padding, the form Kafka shows its topic ids in (KIP-516)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def config_generation(path: str, *, fresh: bool = False) -> int:
    """A number that changes whenever the ``topic.json`` at ``path`` is replaced or
    rewritten (0 while it cannot be opened), for telling cheaply whether to read it
    again.  The file is kept open, one descriptor per path and process, within the
    process's budget of open files (``kl.log.openfiles``): while it is open, linked and
    unchanged a check is one ``fstat``.  ``fresh`` opens the path instead (and keeps
    nothing new open): on NFS, where another host's rename leaves this host's attributes
    stale, that is what revalidates them (close-to-open).  Safe across threads."""
    entry = _watched.get(path)
    if entry is not None and entry[0] >= 0 and not fresh:
        # Every append's check, first without the lock: another thread may close the
        # descriptor meanwhile (EBADF: the locked check below decides) or even reuse its
        # number, but a match of device, inode, size and both times is the same file, unchanged.
        try:
            st = os.fstat(entry[0])
        except OSError:
            pass
        else:  # _signature(st), inline
            if st.st_nlink and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == entry[1]:
                entry[3].used = True
                return entry[2]
    with _watched_lock:
        entry = _watched.get(path)
        kept = -1 if entry is None else entry[0]
        if kept >= 0 and not fresh:
            try:
                st = os.fstat(kept)
            except OSError:
                pass
            else:
                if st.st_nlink and entry is not None and _signature(st) == entry[1]:
                    entry[3].used = True
                    return entry[2]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            _forget(path)
            return 0
        try:
            signature = _signature(os.fstat(fd))
        finally:
            if fresh:
                os.close(fd)
        same = entry is not None and signature == entry[1]
        if fresh:
            fd = kept if same else -1
        if kept >= 0 and kept != fd:
            os.close(kept)
        generation = entry[2] if entry is not None and same else next(_generations)
        keeper = _WatchedFile(path) if entry is None else entry[3]
        keeper.used = True
        _watched[path] = (fd, signature, generation, keeper)
    openfiles.kept(keeper, 1 if fd >= 0 else 0)  # outside the lock: the budget may close other topics' files
    return generation


def forget_config(path: str) -> None:
    """Close what ``config_generation`` keeps open of ``path`` (its topic was deleted)."""
    with _watched_lock:
        _forget(path)


def _forget(path: str) -> None:
    entry = _watched.pop(path, None)
    if entry is not None and entry[0] >= 0:
        os.close(entry[0])
        openfiles.kept(entry[3], 0)


class _WatchedFile:
    """A ``topic.json`` that ``config_generation`` keeps open (an ``openfiles.Keeper``)."""

    __slots__ = ("path", "used")

    def __init__(self, path: str):
        self.path = path
        self.used = True

    def close_idle(self) -> bool:
        """Close the file, keeping what is known of it (the next check opens it again)."""
        if not _watched_lock.acquire(False):
            return False
        try:
            entry = _watched.get(self.path)
            if entry is not None and entry[0] >= 0:
                os.close(entry[0])
                _watched[self.path] = (-1, *entry[1:])
            return True
        finally:
            _watched_lock.release()


def _signature(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


_watched: dict[str, tuple[int, tuple[int, ...], int, _WatchedFile]] = {}
"""``topic.json`` path -> (its open descriptor or -1, its signature then, its generation, its keeper)."""
_watched_lock = threading.Lock()
_generations = itertools.count(1)


def same_creation(recorded: str | None, current: str) -> bool:
    """Whether a position recorded with topic id ``recorded`` belongs to the topic whose id
    is ``current``.  Positions recorded without an id (by a kl before topic ids) count as
    the current creation's, and so do all where the topic has no id (a root kl cannot
    write): one rule for group offsets, Spark checkpoints and load journals."""
    return not recorded or not current or recorded == current


@dataclass(frozen=True)
class TopicConfig:
    """Settings of one topic; the defaults are what ``kl topics create`` writes.

    ``flush_messages`` and ``flush_ms`` bound the data at risk: a partition is fsynced
    once that many messages or milliseconds have gone by since its last flush (0 switches
    a rule off).  Both are checked at each append; a background thread also keeps the
    time rule when a producer goes idle, and a producer closing flushes what it wrote.
    The default, once a second, is Redis's "everysec": a power cut may lose up to about
    a second of acknowledged messages; a killed process loses nothing acknowledged.
    """

    partitions: int = 1
    segment_bytes: int = GiB
    max_message_bytes: int = MiB
    flush_messages: int = 0
    flush_ms: int = 1_000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = 0
    """0 keeps every byte (retention by age only)."""
    format: str = FORMAT_KL
    """``"kl"`` or ``"0.7"`` (see ``FORMATS``); files written before it existed read as kl."""
    headers: bool | None = None
    """Whether the topic may hold magic 3 messages (headers, null values).  Written to
    ``topic.json`` only when true, so that kl versions before magic 3, which refuse a
    config with a setting they do not know, refuse such a topic instead of misreading it
    (or cutting its messages as damage).  None (not written): ``Root.create_topic``
    turns it on for a topic of format kl; read from a file, the topic has no headers."""
    partitioner: str = "crc32"
    """The hash kl's producers partition keys with (see ``PARTITIONERS``).  Written to
    ``topic.json`` only when not ``crc32``, so that kl versions before it refuse such a
    topic (they would put keys in other partitions) and older topics read as ``crc32``."""
    topic_id: str = ""
    """Which creation of the topic this is: written once when the topic is created
    (``new_topic_id``), kept by every edit of the file, by ``kl mirror`` and by import;
    every stored position names it.  Empty only in a config not yet written (and in
    files of kl versions before it, until ``Root.config`` gives them one)."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise InvalidConfig(f"format must be kl or 0.7, not {self.format!r}")
        if self.headers is not None and type(self.headers) is not bool:
            raise InvalidConfig(f"headers must be true or false, not {self.headers!r}")
        if self.headers and self.format == FORMAT_07:
            raise InvalidConfig(NO_HEADERS_07)
        if self.partitioner not in PARTITIONERS:
            raise InvalidConfig(f"partitioner must be crc32 or murmur2, not {self.partitioner!r}")
        if not isinstance(self.topic_id, str) or (self.topic_id and not _TOPIC_ID.fullmatch(self.topic_id)):
            raise InvalidConfig(f"topic_id must be 22 characters of A-Z a-z 0-9 _ -, not {self.topic_id!r}")
        partitions = self.partitions
        if isinstance(partitions, int) and not isinstance(partitions, bool) and not 1 <= partitions <= 10_000:
            raise InvalidConfig(f"partitions must be between 1 and 10000, not {partitions}")
        for name in _WHOLE_NUMBERS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidConfig(f"{name} must be a whole number >= 0, not {value!r}")
        if self.max_message_bytes < MIN_MESSAGE_BYTES:
            raise InvalidConfig(f"max_message_bytes must be at least {MIN_MESSAGE_BYTES}, not {self.max_message_bytes}")
        if self.max_message_bytes > 0x7FFFFFFF:
            raise InvalidConfig(f"max_message_bytes must be below 2 GiB, not {self.max_message_bytes}")
        if self.segment_bytes < self.max_message_bytes:
            raise InvalidConfig(
                f"segment_bytes ({self.segment_bytes}) must be at least max_message_bytes ({self.max_message_bytes})"
            )

    def to_json(self) -> bytes:
        """The config as ``topic.json`` holds it (kl-format(5))."""
        fields = dataclasses.asdict(self)
        if not self.headers:  # a topic without headers stays readable by kl before them
            del fields["headers"]
        if self.partitioner == "crc32":  # and one of crc32 by kl before the setting
            del fields["partitioner"]
        return (json.dumps(fields, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, path: str) -> TopicConfig:
        """The config ``topic.json`` at ``path`` holds.  Raises ``InvalidConfig`` naming the path and the field."""
        try:
            fields = json.loads(data)
            if not isinstance(fields, dict):
                raise ValueError("not an object")
            unknown = sorted(set(fields) - _SETTINGS)
            if unknown:
                raise ValueError(f"unknown settings {', '.join(unknown)}")
            return cls(**fields)
        except (ValueError, TypeError, InvalidConfig) as e:
            raise InvalidConfig(f"topic config {path} is unreadable: {e}") from None

    @classmethod
    def with_overrides(cls, **settings: int | str | None) -> TopicConfig:
        """Defaults, with every setting that is not None replaced."""
        return cls(**{k: v for k, v in settings.items() if v is not None})  # type: ignore[arg-type]

    def same_topic(self, other: TopicConfig) -> bool:
        """Whether ``other`` is a config of the same creation of the topic (an altered one
        included): the same topic id and format."""
        return self.topic_id == other.topic_id and self.format == other.format

    def altered(self, **changes: int) -> TopicConfig:
        """This config with ``changes`` (settings of ``ALTERABLE``) applied.  Partitions and
        ``max_message_bytes`` only grow: fewer partitions would drop stored data, and a
        smaller maximum would make stored messages read as damaged (readers bound each
        length by it).  Raises ``ConfigNotAlterable`` for those and for ``format`` and
        ``topic_id``, ``InvalidConfig`` for unknown settings and values out of range."""
        fixed = sorted(set(changes) - set(ALTERABLE))
        unknown = [name for name in fixed if name not in _SETTINGS]
        if unknown:
            raise InvalidConfig(f"unknown topic setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
        if fixed:
            raise ConfigNotAlterable(f"{', '.join(fixed)} cannot change after a topic is created")
        new = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        for name in ("partitions", "max_message_bytes"):
            old, wanted = getattr(self, name), getattr(new, name)
            if wanted < old:
                raise ConfigNotAlterable(f"{name} can only grow: the topic has {old}, not {wanted}")
        if self.headers and not new.headers:
            raise ConfigNotAlterable("headers cannot be turned off: the topic may hold messages with headers or null values")
        return new

    @property
    def holds_headers(self) -> bool:
        """The topic may hold messages with headers or a null value (magic 3)."""
        return self.headers is True

    @property
    def legacy(self) -> bool:
        """The topic stores Kafka 0.7 messages (format ``"0.7"``)."""
        return self.format == FORMAT_07


_SETTINGS = frozenset(f.name for f in dataclasses.fields(TopicConfig))
_WHOLE_NUMBERS = tuple(f.name for f in dataclasses.fields(TopicConfig) if f.type == "int")
"""The settings that are whole numbers (checked by every config made: one per topic listed)."""
