"""Copying topics from a root or a server into another root, offset for offset (``kl mirror``).

Each partition's message sets are copied byte for byte: every offset in the target is
the source's.  The source is read as a Kafka 0.7 fetch reads (bytes up to a size or
the end of a segment file, perhaps ending inside a message); only the complete,
checksummed messages of a read are appended, through the target's normal append
protocol (lock, tail repair, publish).  Segment files roll at their own places in the
target; offsets do not depend on them.  Kafka offsets are copied too: a target partition
starts with the source's count at the offset it starts at, so each message has the
source's Kafka offset (a source that cannot tell, a Kafka 0.7 broker or a ``kl serve``
older than protocol version 3, counts from 0 where the copy starts).

The target's published log end is the only bookmark: a copy killed at any moment goes
on from there, with no duplicate and no gap.  A killed mirror loses nothing it
appended; after a power cut the target keeps what its flush policy made durable
(recovery cuts the rest) and the next run copies the rest again.  A mirror holds the
target topic's mirror lock (a byte of ``ROOT/.locks/.mirror``, see ``locks.Slots``) while it copies, so two
mirrors never write one topic; a local producer writing to a mirrored topic is caught
at its next append (the offset it got is not the source's) and reported.

Each copied topic records the creation of the source's topic it copies (its topic id) in
``TARGET/TOPIC/mirror.json``; a topic the mirror creates also gets the source's id as
its own.  A source topic of another creation (deleted and created again) is refused
(``TopicRecreated``), or with ``recreate`` the copy is deleted and made afresh; a read
of a local source is checked against the id before it is appended, one of a server
each time its topics are listed.  A target without a record whose id is not the
source's (made by a mirror before topic ids) is checked by its bytes, then recorded.

What is checked before copying a partition (``Diverged`` names the offset), for every
topic before the target is changed (created, grown, recorded):

* the source and the target topic have the same partition count (a target with fewer
  partitions is grown to the source's count, through ``Root.alter_topic``; one with more
  is refused) and format, and the target's messages may be as large as the source's;
* the target does not end beyond the source's end;
* the target's last ``TAIL_CHECK_BYTES`` (from where both hold data) equal the
  source's bytes at the same offsets;
* the source's next bytes, at the target's end, are whole valid messages.

A target that ends below the source's log start (retention deleted what it still
needs) is refused (``SourceGap``); an empty target starts at the source's log start,
with its Kafka offset.  A target whose Kafka offset at its end is not the source's
(copied by a kl that did not copy them, or its state record rebuilt by ``kl recover``)
is renumbered to the source's (``Log.renumber``, logged).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kl.errors import (
    CorruptMessage,
    CorruptState,
    InvalidConfig,
    KlError,
    OffsetOutOfRange,
    RootNotFound,
    TopicNotFound,
    TopicRecreated,
)
from kl.follow import Watch
from kl.log import locks
from kl.log.config import CONFIG_FILE, FORMAT_07, TopicConfig
from kl.log.fsutil import storage_error, write_atomic
from kl.log.log import EARLIEST, LATEST, Log
from kl.log.messageset import INCOMPLETE, check, walk
from kl.log.validate import walked
from kl.net import wire
from kl.topic import LOCKS_DIR, Root, validate_name

log = logging.getLogger(__name__)

FETCH_BYTES = 4 << 20
"""Bytes asked for per read (capped by the target's segment size)."""
ROUND_BYTES = 64 << 20
"""Bytes copied from one partition before the next partition's turn."""
TAIL_CHECK_BYTES = 64 << 10
"""How much of the target's tail is compared with the source before copying."""
POLL_SECONDS = 0.5
MIRROR_SLOTS = ".mirror"
"""The file under ``ROOT/.locks`` whose bytes are the topics' mirror locks (a name no
topic can have: none starts with a dot)."""
MIRROR_RECORD = "mirror.json"
"""In a target topic's directory: which creation of the source's topic it copies."""


class Diverged(KlError):
    """The target partition is not a copy of the source's (the message names the offset)."""


class SourceGap(KlError):
    """The source no longer holds the offsets the target needs next (retention deleted them)."""


class SameRoot(KlError):
    """The source and the target are the same root: there is nothing to copy, and a
    run would only seem to have done it."""


class MirrorBusy(KlError):
    """Another mirror is copying into the same target topic."""


@dataclass
class PartitionCopy:
    """What a run copied into one partition."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int
    bytes: int = 0
    messages: int = 0


# ------------------------------------------------------------------ sources


class Source(Protocol):
    """Where a mirror reads from."""

    name: str

    def topics(self) -> list[str]:
        """The topics there are, sorted."""
        ...

    def config(self, topic: str) -> TopicConfig:
        """The topic's settings (its ``topic_id``: the creation there is now, "" when the
        source has no ids); raises ``TopicNotFound``."""
        ...

    def refresh(self) -> None:
        """Look again: ``topics`` and ``config`` answer as of now."""
        ...

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, log end) of a partition."""
        ...

    def kafka_offset(self, topic: str, partition: int, offset: int) -> int | None:
        """The Kafka offset of the message at ``offset`` (a message start, or the log end:
        the next message's); None where the source cannot tell.  Raises ``OffsetOutOfRange``."""
        ...

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes at ``offset`` (empty at the log end), perhaps ending inside
        a message, never past one segment file.  Raises ``OffsetOutOfRange``."""
        ...

    def wait(self, partitions: list[tuple[str, int]], timeout: float, stop: threading.Event) -> None:
        """Return when one of ``partitions`` may have grown, ``stop`` is set, or after ``timeout`` seconds."""
        ...

    def close(self) -> None: ...


def read_raw(log: Log, offset: int, max_bytes: int) -> bytes:
    """The bytes of a local partition at ``offset`` as a fetch sees them (see ``Log.span``)."""
    found = log.span(offset, max_bytes)
    if found is None:
        return b""
    segment, position, size = found
    with segment:
        return segment.read(position, size)


class LocalSource:
    """A root directory on this host."""

    def __init__(self, root: Root):
        self.root = root
        self.name = root.path
        self._watch: Watch | None = None
        self._watched: set[Log] = set()
        self._seen: dict[str, tuple[tuple[int, ...], TopicConfig]] = {}
        """Topic -> the signature of its ``topic.json`` and the config read from it."""

    def topics(self) -> list[str]:
        return self.root.topics()

    def config(self, topic: str) -> TopicConfig:
        """As on disk now: a ``stat`` of ``topic.json``, read again when it changed (a
        topic created again also reopens its logs)."""
        path = os.path.join(self.root.topic_path(topic), CONFIG_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return self.root.read_config(topic)  # the root's own error, or a topic created just now
        except OSError as e:
            raise storage_error(e, "read", path) from None
        signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        seen = self._seen.get(topic)
        if seen is None or seen[0] != signature:
            config = self.root.read_config(topic)
            if seen is not None and not config.same_topic(seen[1]):
                self.root.forget(topic)
            self._seen[topic] = seen = signature, config
        return seen[1]

    def refresh(self) -> None:
        pass  # every config() looks

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        state = self.root.log(topic, partition).state()
        return state.log_start_offset, state.log_end_offset

    def kafka_offset(self, topic: str, partition: int, offset: int) -> int | None:
        return self.root.log(topic, partition).kafka_offset(offset)

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        return read_raw(self.root.log(topic, partition), offset, max_bytes)

    def wait(self, partitions: list[tuple[str, int]], timeout: float, stop: threading.Event) -> None:
        """Woken by inotify where it works (see ``kl.follow``); ``stop`` is seen within ``timeout``."""
        if self._watch is None:
            self._watch = Watch(poll_interval=timeout, detect_recreation=False)  # the mirror checks the ids
        logs = []
        for topic, partition in partitions:
            with contextlib.suppress(KlError):  # deleted: the next read says so
                logs.append(self.root.log(topic, partition))
        for stale in self._watched - set(logs):
            self._watch.remove(stale)
        for found in logs:
            self._watch.add(found)
        self._watched = set(logs)
        if not stop.is_set():
            self._watch.wait(timeout)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self.root.close()


class RemoteSource:
    """A ``kl serve`` (kl's TOPICS gives the topics and their settings) or a Kafka 0.7
    broker (no such request: topics are named, and ``partitions`` says how many each has);
    ``tls`` and ``sasl`` are ``RemoteRoot``'s (a kl serve only, then)."""

    def __init__(
        self,
        address: str,
        *,
        partitions: int | None = None,
        timeout: float = 30.0,
        tls: ssl.SSLContext | None = None,
        sasl: wire.Login | tuple[str, str, str] | None = None,
    ):
        self.name = address
        self.partitions = partitions
        try:
            self.conn = wire.Connection(address, timeout=timeout, tls=tls, sasl=sasl)
            self.kl = True
        except (wire.ProtocolError, wire.NetworkError):  # a Kafka 0.7 broker closes a connection on an unknown type
            if tls is not None or sasl is not None:
                raise
            self.conn = wire.Connection(address, timeout=timeout, hello=False)
            self.kl = False
        self._configs: dict[str, TopicConfig] | None = None

    def _call(self, kind: int, body: bytes, what: str) -> memoryview:
        """The payload of a request's answer; an error raises what it names (a Kafka 0.7
        broker's bare code raises ``OffsetOutOfRange`` or ``ServerError`` naming ``what``)."""
        self.conn.send(kind, body)
        code, payload = self.conn.receive()
        if code == wire.NO_ERROR:
            return payload
        if self.kl:
            wire.raise_error(code, payload)
        if code == wire.OFFSET_OUT_OF_RANGE:
            raise OffsetOutOfRange(f"{self.name}: {what}: offset out of range", offset=-1, log_start_offset=-1, log_end_offset=-1)
        raise wire.ServerError(f"{self.name}: {what}: error code {code}")

    def _topic_configs(self) -> dict[str, TopicConfig]:
        if self._configs is None:
            if not self.kl:
                raise InvalidConfig(f"{self.name} is a Kafka 0.7 broker, which cannot list its topics: name them")
            reader = wire.Reader(self._call(wire.TOPICS, b"", "list topics"))
            configs = {}
            for _ in range(reader.int32()):
                name = reader.string()
                configs[name] = TopicConfig.from_json(reader.string().encode(), f"{self.name} topic {name}")
            self._configs = configs
        return self._configs

    def topics(self) -> list[str]:
        return sorted(self._topic_configs())

    def refresh(self) -> None:
        self._configs = None

    def config(self, topic: str) -> TopicConfig:
        if self.kl:
            found = self._topic_configs().get(topic)
            if found is None:
                raise TopicNotFound(f"topic {topic!r} is not served by {self.name}")
            return found
        if self.partitions is None:
            raise InvalidConfig(f"{self.name} is a Kafka 0.7 broker, which cannot say how many partitions {topic!r} has")
        return kafka07_config(self.partitions)

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        start, end = (self._offset(topic, partition, when) for when in (EARLIEST, LATEST))
        return start, end

    def _offset(self, topic: str, partition: int, when: int) -> int:
        body = wire.offsets_body(topic, partition, when, 1)
        reader = wire.Reader(self._call(wire.OFFSETS, body, f"offsets of {topic}/{partition}"))
        if reader.int32() != 1:
            raise wire.ProtocolError(f"{self.name} gave no offset for {topic}/{partition}")
        return reader.int64()

    def kafka_offset(self, topic: str, partition: int, offset: int) -> int | None:
        """KAFKA_OFFSET; None from a Kafka 0.7 broker or a server of protocol version 2 or less."""
        if not self.kl or self.conn.version < 3:
            return None
        body = wire.partition_int64_body(topic, partition, offset)
        return wire.Reader(self._call(wire.KAFKA_OFFSET, body, f"Kafka offset of {topic}/{partition} at {offset}")).int64()

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        fetch = wire.Fetch(topic, partition, offset, max_bytes)
        return bytes(self._call(wire.FETCH, wire.fetch_body(fetch), f"fetch {topic}/{partition} at {offset}"))

    def wait(self, partitions: list[tuple[str, int]], timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)

    def close(self) -> None:
        self.conn.close()


def kafka07_config(partitions: int) -> TopicConfig:
    """The settings of a topic copied from a Kafka 0.7 broker: kl's defaults, in 0.7's format."""
    return TopicConfig(partitions=partitions, format=FORMAT_07)


def open_source(
    spec: str,
    *,
    partitions: int | None = None,
    timeout: float = 30.0,
    tls: ssl.SSLContext | None = None,
    sasl: wire.Login | tuple[str, str, str] | None = None,
) -> Source:
    """``HOST:PORT`` of a server (unless a directory has that name), else a root directory;
    ``tls`` and ``sasl`` are ``RemoteSource``'s."""
    host, sep, port = spec.rpartition(":")
    if sep and host and port.isdigit() and not os.path.isdir(spec):
        return RemoteSource(spec, partitions=partitions, timeout=timeout, tls=tls, sasl=sasl)
    if tls is not None or sasl is not None:
        raise InvalidConfig(f"{spec} is a root, not a server's HOST:PORT: TLS and SASL are for a server")
    return LocalSource(Root(spec))


# ------------------------------------------------------------------ the mirror


def _same_directory(a: str, b: str) -> bool:
    """Whether two paths name one directory (by inode where both exist: a bind mount or a
    hard-to-see symlink too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _message_at(log: Log, offset: int) -> int:
    """The offset of the message of ``log`` that holds the byte at ``offset`` (a scan of its segment)."""
    base = max(s.base_offset for s in log.segments() if s.base_offset <= offset)
    with log.open_segment(base) as segment:
        return base + segment.boundary(offset - base)[0]


@dataclass
class _Partition:
    topic: str
    partition: int
    log: Log
    max_message_bytes: int
    fetch_bytes: int
    copy: PartitionCopy


@dataclass
class _Plan:
    """What ``Mirror.discover`` does to a topic of the target once every topic passed its checks."""

    topic: str
    wanted: TopicConfig
    """The source's config; its topic id names the creation copied."""
    config: TopicConfig | None
    """The target's; None: the topic is created (after deleting the old one, with ``drop``)."""
    partitions: range
    """The partitions to copy from now on."""
    numbers: dict[int, tuple[int, int]]
    """Target partitions -> (offset, the source's Kafka offset there): an empty one starts
    there (the source's log start), one that holds messages is renumbered at its end."""
    drop: bool = False
    record: bool = False
    """Write ``MIRROR_RECORD``: the target copies the source's creation ``wanted.topic_id``."""


class Mirror:
    """Copies ``topics`` (all of the source's when None) from ``source`` into ``target``.

    With ``recreate``, a topic of the target that copies another creation of the source's
    topic (deleted and created again there) is deleted and copied afresh; without, it is
    refused (``TopicRecreated``).  Not thread-safe; one ``Mirror`` per target topic at a
    time (others get ``MirrorBusy``).
    """

    def __init__(
        self,
        source: Source,
        target: Root,
        topics: list[str] | None = None,
        *,
        fetch_bytes: int = FETCH_BYTES,
        recreate: bool = False,
        on_progress: Callable[[PartitionCopy], None] | None = None,
    ):
        if isinstance(source, LocalSource) and _same_directory(source.root.path, target.path):
            raise SameRoot(f"{source.root.path} and {target.path} are the same root: a root cannot be mirrored onto itself")
        self.source = source
        self.target = target
        self.named = [validate_name(t) for t in topics] if topics else None
        self.fetch_bytes = fetch_bytes
        self.recreate = recreate
        self.on_progress = on_progress
        self.follow = False
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._ids: dict[str, str] = {}
        """Topic being copied -> the source's topic id of the creation copied ("": none known)."""
        self._held: dict[str, int] = {}
        """Topic -> the slot of its mirror lock, held."""
        self._slots: locks.Slots | None = None
        """The target's mirror locks, looked up at the first."""
        self._dropped: list[PartitionCopy] = []
        self._skipped: dict[str, str] = {}
        """Topic skipped while following -> why, as logged last."""

    @property
    def copies(self) -> list[PartitionCopy]:
        """What was copied so far, per partition, sorted (a topic no longer copied included)."""
        done = self._dropped + [p.copy for p in self._partitions.values()]
        return sorted(done, key=lambda c: (c.topic, c.partition))

    def run(
        self, *, follow: bool = False, stop: threading.Event | None = None, poll: float = POLL_SECONDS
    ) -> list[PartitionCopy]:
        """Copy until every partition reaches the source's end (with ``follow``: until
        ``stop`` is set, seen within ``poll`` seconds, picking up new data, partitions
        added to the source and, when no topics were named, new topics; a topic deleted
        or created again in the source is then logged and skipped, or with ``recreate``
        copied afresh, and the others go on).  Returns what was copied per partition.
        Raises ``Diverged``, ``SourceGap``, ``TopicRecreated``, ``MirrorBusy`` and the usual
        ``KlError``s; a refusal before copying writes nothing into the target."""
        stop = stop or threading.Event()
        self.follow = follow
        try:
            self.discover(first=True)
            while not stop.is_set():
                if not self.copy_round(stop) and not follow:
                    break
                if follow and not stop.is_set():
                    self.source.wait(list(self._partitions), poll, stop)
                    if not stop.is_set():
                        self.discover()
            for p in self._partitions.values():
                p.log.flush()
        finally:
            self.close()
        return self.copies

    def close(self) -> None:
        for topic in list(self._held):
            self._unlock(topic)

    def discover(self, *, first: bool = False) -> None:
        """Check each topic not copied yet (missing ones are created in the target), the
        partitions added to a topic's source since, and that the source's topics are
        still the creations copied; then, once all passed, change the target as they
        need.  Later than ``first``, a topic that fails for being deleted or created
        again is skipped (see ``run``)."""
        self.source.refresh()
        names = self.named if self.named is not None else self.source.topics()
        for topic in sorted(set(self._ids) - set(names)):
            self._skip(topic, TopicNotFound(f"topic {topic!r} was deleted from {self.source.name}"))
        plans = []
        for topic in names:
            try:
                plan = self._check(topic)
            except (TopicRecreated, TopicNotFound) as e:
                if (first or not self.follow) and (self.named is not None or isinstance(e, TopicRecreated)):
                    raise
                self._skip(topic, e)
                continue
            if plan is not None:
                plans.append(plan)
        for plan in plans:
            self._apply(plan)

    def _check(self, topic: str) -> _Plan | None:
        """What the topic needs (None: nothing), after every check that involves no write."""
        wanted = self.source.config(topic)
        if topic in self._ids:
            try:
                self._same_creation(topic, wanted)
            except TopicRecreated:
                if not self.recreate:
                    raise
                return _Plan(topic, wanted, None, range(wanted.partitions), self._numbers(topic, 0, wanted), drop=True)
            known = sum(1 for key in self._partitions if key[0] == topic)
            if wanted.partitions <= known:
                return None
            config = self.target.read_config(topic)
            self._check_config(topic, wanted, config)
            return _Plan(topic, wanted, config, range(known, wanted.partitions), self._numbers(topic, known, wanted))
        try:
            config = self.target.read_config(topic)
        except (TopicNotFound, RootNotFound):
            return _Plan(topic, wanted, None, range(wanted.partitions), self._numbers(topic, 0, wanted))
        self._lock(topic)
        copied = self._copied_id(topic, config)
        fresh = _Plan(topic, wanted, None, range(wanted.partitions), {}, drop=True)
        if wanted.topic_id and copied and copied != wanted.topic_id:
            if self.recreate:
                fresh.numbers = self._numbers(topic, 0, wanted)
                return fresh
            raise self._recreated(topic, copied, wanted.topic_id)
        unproven = bool(wanted.topic_id) and not copied and config.topic_id != wanted.topic_id
        try:
            self._check_config(topic, wanted, config)
            numbers = self._numbers(topic, config.partitions, wanted)
            for partition in range(config.partitions):
                number = self._check_partition(topic, partition)
                if number is not None:
                    numbers[partition] = number
        except (Diverged, SourceGap) as e:
            if not unproven:
                raise
            if self.recreate:
                fresh.numbers = self._numbers(topic, 0, wanted)
                return fresh
            raise type(e)(
                f"{e} (the topic's id is {config.topic_id} in the target and {wanted.topic_id} in {self.source.name}:"
                " if it was deleted and created again there, delete it from the target or give --recreate)"
            ) from None
        record = bool(wanted.topic_id) and not copied
        return _Plan(topic, wanted, config, range(wanted.partitions), numbers, record=record)

    def _apply(self, plan: _Plan) -> None:
        """Make the target topic what ``plan`` says (created, grown, recorded) and copy its partitions."""
        topic, wanted = plan.topic, plan.wanted
        if plan.drop:
            self._forget(topic)
            self.target.delete_topic(topic)
            log.warning(
                "deleted topic %s from %s: it copied another creation of the topic than %s's (now %s)",
                topic,
                self.target.path,
                self.source.name,
                wanted.topic_id,
            )
        config = plan.config
        if config is None:
            config = self.target.create_topic(topic, wanted)
            log.info("created topic %s in %s", topic, self.target.path)
            plan.record = bool(wanted.topic_id)
        if topic not in self._held:
            self._lock(topic)
        if config.partitions < wanted.partitions:
            config = self.target.alter_topic(topic, partitions=wanted.partitions)
            log.info("topic %s of %s grown to %d partitions", topic, self.target.path, wanted.partitions)
        if wanted.holds_headers and not config.holds_headers:  # the source may hold magic 3: so may the copy
            config = self.target.alter_topic(topic, headers=True)
            log.info("topic %s of %s now holds headers, as in %s", topic, self.target.path, self.source.name)
        if plan.record:
            self._write_record(topic, config.topic_id, wanted.topic_id)
        self._ids[topic] = wanted.topic_id
        self._skipped.pop(topic, None)
        for partition, (offset, count) in plan.numbers.items():
            self._number(topic, partition, offset, count)
        fetch = max(1, min(self.fetch_bytes, config.segment_bytes))
        for partition in plan.partitions:
            target = self.target.log(topic, partition)
            end = target.log_end_offset
            copy = PartitionCopy(topic, partition, end, end)
            self._partitions[(topic, partition)] = _Partition(topic, partition, target, config.max_message_bytes, fetch, copy)

    def _check_config(self, topic: str, wanted: TopicConfig, config: TopicConfig) -> None:
        """Refuse a target topic that cannot become a copy of the source's settings: more
        partitions (never shrunk), another format, smaller messages.  Fewer partitions and
        no headers are what ``_apply`` changes."""
        if config.partitions > wanted.partitions:
            raise Diverged(
                f"topic {topic!r} has {wanted.partitions} partitions in {self.source.name}"
                f" but {config.partitions} in {self.target.path}"
            )
        if config.format != wanted.format:
            raise Diverged(
                f"topic {topic!r} is in {wanted.format} format in {self.source.name} but in {config.format} in the target"
            )
        if config.max_message_bytes < wanted.max_message_bytes:
            raise Diverged(
                f"topic {topic!r} takes messages of up to {wanted.max_message_bytes} bytes in {self.source.name}"
                f" but only {config.max_message_bytes} in the target"
            )

    def _numbers(self, topic: str, first: int, wanted: TopicConfig) -> dict[int, tuple[int, int]]:
        """Partitions ``first`` on, still to be made in the target -> the source's log start
        and its Kafka offset, where not both 0."""
        starts = {p: self._start(topic, p) for p in range(first, wanted.partitions)}
        return {p: start for p, start in starts.items() if start != (0, 0)}

    def _start(self, topic: str, partition: int) -> tuple[int, int]:
        """The source's log start and its Kafka offset (0 where the source cannot tell)."""
        for _ in range(3):
            start = self.source.offsets(topic, partition)[0]
            try:
                return start, self._source_count(topic, partition, start) or 0
            except OffsetOutOfRange:  # retention moved the start meanwhile: look again
                continue
        raise SourceGap(f"{topic}/{partition}: the source's log start keeps moving")

    def _source_count(self, topic: str, partition: int, offset: int) -> int | None:
        """The source's Kafka offset at ``offset``; None where it cannot tell, or cannot
        count its segments (damage, logged: the bytes are copied all the same, up to it)."""
        try:
            return self.source.kafka_offset(topic, partition, offset)
        except (CorruptMessage, CorruptState) as e:
            log.warning("%s/%d: the Kafka offsets of %s are not copied: %s", topic, partition, self.source.name, e)
            return None

    def _number(self, topic: str, partition: int, offset: int, count: int) -> None:
        """Make the target partition's message at ``offset`` (its end) have Kafka offset
        ``count``: an empty one starts there, one that holds messages is renumbered."""
        target = self.target.log(topic, partition)
        state = target.state()
        if state.log_start_offset == state.log_end_offset:
            target.start_at(offset, count)
            return
        shift = target.renumber(offset, count)
        if shift:
            log.warning(
                "%s/%d of %s: Kafka offsets renumbered by %+d to %s's (copied by a kl that did not copy them,"
                " or its state record was rebuilt)",
                topic,
                partition,
                self.target.path,
                shift,
                self.source.name,
            )

    def _check_partition(self, topic: str, partition: int) -> tuple[int, int] | None:
        """Check that the target partition is a prefix of the source's (see the module's
        docstring).  Returns where it must be numbered anew (see ``_Plan.numbers``): at
        the source's log start where an empty one starts there instead, at its end where
        its Kafka offset there is not the source's; else None."""
        where = f"{topic}/{partition}"
        target = self.target.log(topic, partition)
        state = target.state()
        start, end = state.log_start_offset, state.log_end_offset
        source_start, source_end = self.source.offsets(topic, partition)
        if end > source_end:
            raise Diverged(f"{where}: the target ends at offset {end}, beyond the source's end {source_end}")
        if start == end and end < source_start:
            return self._start(topic, partition)
        if end < source_start:
            raise SourceGap(
                f"{where}: the target ends at offset {end} but the source now starts at {source_start}"
                f" (offsets {end} to {source_start} are gone from the source); delete the target topic to copy it afresh"
            )
        self._compare_tail(where, topic, partition, target, max(start, source_start, end - TAIL_CHECK_BYTES), end)
        theirs = self._source_count(topic, partition, end)
        if theirs is not None and theirs != target.kafka_offset(end):
            return end, theirs
        return None

    def _compare_tail(self, where: str, topic: str, partition: int, target: Log, offset: int, end: int) -> None:
        while offset < end:
            mine = read_raw(target, offset, end - offset)
            theirs = self.source.read(topic, partition, offset, len(mine))
            n = min(len(mine), len(theirs))  # either may stop early, at the end of a segment file
            if not n or mine[:n] != theirs[:n]:
                at = offset + next((i for i in range(n) if mine[i] != theirs[i]), n)
                raise Diverged(f"{where}: the target differs from the source in the message at offset {_message_at(target, at)}")
            offset += n

    # -------------------------------------------------------------- which creation

    def _copied_id(self, topic: str, config: TopicConfig) -> str:
        """The source's topic id the target topic records it copies ("" when it records none:
        made by a kl mirror before the record, or by other means)."""
        path = os.path.join(self.target.topic_path(topic), MIRROR_RECORD)
        try:
            with open(path, "rb") as f:
                record = json.loads(f.read())
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except FileNotFoundError:
            return ""
        except OSError as e:
            raise storage_error(e, "read", path) from None
        except ValueError as e:
            raise InvalidConfig(f"mirror record {path} is unreadable ({e}): delete it, the next run checks the bytes") from None
        if record.get("topic_id") != config.topic_id:  # not of this creation of the target topic
            return ""
        return str(record.get("source_topic_id", ""))

    def _write_record(self, topic: str, topic_id: str, source_id: str) -> None:
        record = {"topic_id": topic_id, "source_topic_id": source_id, "source": self.source.name}
        write_atomic(os.path.join(self.target.topic_path(topic), MIRROR_RECORD), (json.dumps(record) + "\n").encode())

    def _same_creation(self, topic: str, wanted: TopicConfig | None = None) -> None:
        """Raise ``TopicRecreated`` unless the source's topic is still the creation copied
        (``TopicNotFound`` when it is gone); a source without topic ids passes."""
        try:
            now = (wanted or self.source.config(topic)).topic_id
        except TopicNotFound:
            raise TopicNotFound(f"topic {topic!r} was deleted from {self.source.name}") from None
        was = self._ids[topic]
        if was and now and now != was:
            raise self._recreated(topic, was, now)

    def _still_same(self, topic: str) -> None:
        """``_same_creation`` with what the source says now (a server is asked again)."""
        self.source.refresh()
        self._same_creation(topic)

    def _recreated(self, topic: str, was: str, now: str) -> TopicRecreated:
        return TopicRecreated(
            topic,
            was,
            now,
            f"copy in {self.target.path} was made from {self.source.name}",
            f"delete it from {self.target.path} (kl topics delete), or mirror with --recreate to copy the new one afresh",
        )

    def _skip(self, topic: str, error: KlError) -> None:
        """Stop copying ``topic`` (logged once per reason) and release its mirror lock."""
        self._forget(topic)
        self._unlock(topic)
        if self._skipped.get(topic) != str(error):
            log.warning("%s; not copied now, the other topics are", error)
        self._skipped[topic] = str(error)

    def _forget(self, topic: str) -> None:
        """Drop the topic's partitions from the copy, after flushing what was copied."""
        for key in sorted(k for k in self._partitions if k[0] == topic):
            p = self._partitions.pop(key)
            with contextlib.suppress(KlError):  # a target topic deleted meanwhile
                p.log.flush()
            self._dropped.append(p.copy)
        self._ids.pop(topic, None)

    def _lock(self, topic: str) -> None:
        """Take the target topic's mirror lock (held until ``close``)."""
        if topic in self._held:
            return
        if self._slots is None:
            self._slots = locks.slots_for(os.path.join(self.target.path, LOCKS_DIR, MIRROR_SLOTS))
        slot = int.from_bytes(hashlib.blake2b(topic.encode(), digest_size=7).digest(), "big")
        if not self._slots.try_lock(slot):
            raise MirrorBusy(f"another kl mirror is copying into topic {topic!r} of {self.target.path}")
        self._held[topic] = slot

    def _unlock(self, topic: str) -> None:
        slot = self._held.pop(topic, None)
        if slot is not None and self._slots is not None:
            self._slots.unlock(slot)

    def copy_round(self, stop: threading.Event | None = None) -> bool:
        """Copy up to ``ROUND_BYTES`` into each partition in turn; True if anything was copied
        (or a topic was found deleted or created again in the source)."""
        copied = False
        for key, p in list(self._partitions.items()):
            if stop is not None and stop.is_set():
                break
            if self._partitions.get(key) is not p:  # its topic was dropped or made afresh in this round
                continue
            try:
                copied = self._copy(p, ROUND_BYTES, stop) > 0 or copied
            except (TopicRecreated, TopicNotFound) as e:
                self._again(p.topic, e)
                copied = True
        return copied

    def _again(self, topic: str, error: TopicRecreated | TopicNotFound) -> None:
        """After ``error`` while copying ``topic``: with ``recreate`` copy a new creation
        afresh, else while following skip the topic, else raise ``error``."""
        try:
            if not (self.recreate and isinstance(error, TopicRecreated)):
                raise error
            plan = self._check(topic)
            if plan is not None:
                self._apply(plan)
        except (TopicRecreated, TopicNotFound) as e:
            if not self.follow:
                raise
            self._skip(topic, e)

    def _copy(self, p: _Partition, budget: int, stop: threading.Event | None) -> int:
        """Append the source's data from the target's end on, up to about ``budget`` bytes or
        until ``stop`` is set; returns the bytes copied."""
        where = f"{p.topic}/{p.partition}"
        done = 0
        size = p.fetch_bytes
        while done < budget and not (stop is not None and stop.is_set()):
            offset = p.copy.to_offset
            try:
                data = self.source.read(p.topic, p.partition, offset, size)
            except TopicNotFound as e:
                self._still_same(p.topic)
                raise TopicNotFound(f"topic {p.topic!r} was deleted from {self.source.name} ({e})") from None
            except OffsetOutOfRange as e:
                self._still_same(p.topic)  # a new creation's offsets mean nothing here
                source_start, source_end = self.source.offsets(p.topic, p.partition)
                if offset > source_end:
                    raise Diverged(f"{where}: the target ends at offset {offset}, beyond the source's end {source_end}") from None
                if offset < source_start:
                    raise SourceGap(
                        f"{where}: the target ends at offset {offset} but the source now starts at {source_start}"
                    ) from None
                raise e
            if not data:
                break
            self._same_creation(p.topic)  # after the read: what was read is of the creation copied
            length, count = walk(data, 0, len(data), p.max_message_bytes)
            if count == 0:
                entry = check(data, 0, len(data), p.max_message_bytes)
                whole = entry.size
                if entry.problem is not None and entry.problem.kind is INCOMPLETE and len(data) == size < whole:
                    size = whole  # one message larger than a fetch: ask for all of it
                    continue
                self._still_same(p.topic)
                raise Diverged(
                    f"{where}: the source holds no valid message at offset {offset}, where the target ends"
                    f" ({entry.problem}): they diverged, or the source is damaged there"
                )
            size = p.fetch_bytes
            data = data if length == len(data) else data[:length]
            batch = walked(data, p.max_message_bytes)  # a compressed batch counts its inner messages
            at = p.log.append(batch)
            if at != offset:
                raise Diverged(
                    f"{where}: the target's end moved from offset {offset} to {at} while copying"
                    " (did something else write to it?); it no longer mirrors the source"
                )
            p.copy.to_offset = offset + length
            p.copy.bytes += length
            p.copy.messages += batch.count
            done += length
            if self.on_progress is not None:
                self.on_progress(p.copy)
        return done


def mirror(
    source: Source,
    target: Root,
    topics: list[str] | None = None,
    *,
    follow: bool = False,
    stop: threading.Event | None = None,
    poll: float = POLL_SECONDS,
    recreate: bool = False,
) -> list[PartitionCopy]:
    """Copy ``topics`` (default: all) from ``source`` into ``target``; see ``Mirror.run``."""
    return Mirror(source, target, topics, recreate=recreate).run(follow=follow, stop=stop, poll=poll)
