"""Copying topics from a root or a server into another root, offset for offset (``kl mirror``).

Each partition's message sets are copied byte for byte: every offset in the target is
the source's.  The source is read as a Kafka 0.7 fetch reads (bytes up to a size or
the end of a segment file, perhaps ending inside a message); only the complete,
checksummed messages of a read are appended, through the target's normal append
protocol (lock, tail repair, publish).  Segment files roll at their own places in the
target; offsets do not depend on them.

The target's published log end is the only bookmark: a copy killed at any moment goes
on from there, with no duplicate and no gap.  A killed mirror loses nothing it
appended; after a power cut the target keeps what its flush policy made durable
(recovery cuts the rest) and the next run copies the rest again.  A mirror holds the
target topic's mirror lock (``ROOT/.locks/TOPIC/mirror.lock``) while it copies, so two
mirrors never write one topic; a local producer writing to a mirrored topic is caught
at its next append (the offset it got is not the source's) and reported.

What is checked before copying a partition (``Diverged`` names the offset):

* the source and the target topic have the same partition count (a target with fewer
  partitions is grown to the source's count, through ``Root.alter_topic``; one with more
  is refused) and format, and the target's messages may be as large as the source's;
* the target does not end beyond the source's end;
* the target's last ``TAIL_CHECK_BYTES`` (from where both hold data) equal the
  source's bytes at the same offsets;
* the source's next bytes, at the target's end, are whole valid messages.

A target that ends below the source's log start (retention deleted what it still
needs) is refused (``SourceGap``); an empty target starts at the source's log start.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kl.errors import InvalidConfig, KlError, LockTimeout, OffsetOutOfRange, RootNotFound, TopicNotFound
from kl.follow import Watch
from kl.log import locks
from kl.log.config import FORMAT_07, TopicConfig
from kl.log.log import EARLIEST, LATEST, Log
from kl.log.messageset import INCOMPLETE, check, count_messages, walk
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
MIRROR_LOCK = "mirror.lock"


class Diverged(KlError):
    """The target partition is not a copy of the source's (the message names the offset)."""


class SourceGap(KlError):
    """The source no longer holds the offsets the target needs next (retention deleted them)."""


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
        """The topic's settings; raises ``TopicNotFound``."""
        ...

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, log end) of a partition."""
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

    def topics(self) -> list[str]:
        return self.root.topics()

    def config(self, topic: str) -> TopicConfig:
        return self.root.config(topic)

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        state = self.root.log(topic, partition).state()
        return state.log_start_offset, state.log_end_offset

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        return read_raw(self.root.log(topic, partition), offset, max_bytes)

    def wait(self, partitions: list[tuple[str, int]], timeout: float, stop: threading.Event) -> None:
        """Woken by inotify where it works (see ``kl.follow``); ``stop`` is seen within ``timeout``."""
        if self._watch is None:
            self._watch = Watch(poll_interval=timeout)
        for topic, partition in partitions:
            self._watch.add(self.root.log(topic, partition))
        if not stop.is_set():
            self._watch.wait(timeout)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self.root.close()


class RemoteSource:
    """A ``kl serve`` (kl's TOPICS gives the topics and their settings) or a Kafka 0.7
    broker (no such request: topics are named, and ``partitions`` says how many each has)."""

    def __init__(self, address: str, *, partitions: int | None = None, timeout: float = 30.0):
        self.name = address
        self.partitions = partitions
        try:
            self.conn = wire.Connection(address, timeout=timeout)
            self.kl = True
        except (wire.ProtocolError, wire.NetworkError):  # a Kafka 0.7 broker closes a connection on an unknown type
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
        self._configs = None
        return sorted(self._topic_configs())

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


def open_source(spec: str, *, partitions: int | None = None, timeout: float = 30.0) -> Source:
    """``HOST:PORT`` of a server (unless a directory has that name), else a root directory."""
    host, sep, port = spec.rpartition(":")
    if sep and host and port.isdigit() and not os.path.isdir(spec):
        return RemoteSource(spec, partitions=partitions, timeout=timeout)
    return LocalSource(Root(spec))


# ------------------------------------------------------------------ the mirror


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


class Mirror:
    """Copies ``topics`` (all of the source's when None) from ``source`` into ``target``.

    Not thread-safe; one ``Mirror`` per target topic at a time (others get ``MirrorBusy``).
    """

    def __init__(
        self,
        source: Source,
        target: Root,
        topics: list[str] | None = None,
        *,
        fetch_bytes: int = FETCH_BYTES,
        on_progress: Callable[[PartitionCopy], None] | None = None,
    ):
        self.source = source
        self.target = target
        self.named = [validate_name(t) for t in topics] if topics else None
        self.fetch_bytes = fetch_bytes
        self.on_progress = on_progress
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._held: list[locks.ProcessLock] = []

    @property
    def copies(self) -> list[PartitionCopy]:
        """What was copied so far, per partition, sorted."""
        return [p.copy for _, p in sorted(self._partitions.items())]

    def run(
        self, *, follow: bool = False, stop: threading.Event | None = None, poll: float = POLL_SECONDS
    ) -> list[PartitionCopy]:
        """Copy until every partition reaches the source's end (with ``follow``: until
        ``stop`` is set, seen within ``poll`` seconds, picking up new data, partitions
        added to the source and, when no topics were named, new topics).
        Returns what was copied per partition.  Raises ``Diverged``, ``SourceGap``,
        ``MirrorBusy`` and the usual ``KlError``s."""
        stop = stop or threading.Event()
        try:
            self.discover()
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
        for lock in self._held:
            lock.release()
        self._held.clear()

    def discover(self) -> None:
        """Check and prepare each topic not seen yet (created in the target if missing), and
        the partitions added to a topic's source since it was seen."""
        names = self.named if self.named is not None else self.source.topics()
        for topic in names:
            known = sum(1 for key in self._partitions if key[0] == topic)
            if known and self.source.config(topic).partitions <= known:
                continue
            config = self._target_config(topic, lock=not known)
            for partition in range(known, config.partitions):
                self._partitions[(topic, partition)] = self._prepare(topic, partition)

    def _target_config(self, topic: str, *, lock: bool) -> TopicConfig:
        """The target topic's config, after checking it against the source's: created when
        missing, its partitions grown to the source's count (never shrunk).  With ``lock``,
        takes the topic's mirror lock first (after creating the topic)."""
        wanted = self.source.config(topic)
        try:
            config = self.target.config(topic)
        except (TopicNotFound, RootNotFound):
            config = self.target.create_topic(topic, wanted)
            log.info("created topic %s in %s", topic, self.target.path)
        if lock:
            self._lock(topic)
        if config.partitions < wanted.partitions:
            config = self.target.alter_topic(topic, partitions=wanted.partitions)
            log.info("topic %s of %s grown to %d partitions", topic, self.target.path, wanted.partitions)
        if config.partitions != wanted.partitions:
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
        return config

    def _lock(self, topic: str) -> None:
        """Take the target topic's mirror lock (held until ``close``)."""
        lock = locks.lock_for(os.path.join(self.target.path, LOCKS_DIR, topic, MIRROR_LOCK))
        try:
            lock.acquire(0)
        except LockTimeout:
            raise MirrorBusy(f"another kl mirror is copying into topic {topic!r} of {self.target.path}") from None
        self._held.append(lock)

    def _prepare(self, topic: str, partition: int) -> _Partition:
        """Check that the target partition is a prefix of the source's (see the module's
        docstring) and start an empty one at the source's log start."""
        where = f"{topic}/{partition}"
        target = self.target.log(topic, partition)
        state = target.state()
        start, end = state.log_start_offset, state.log_end_offset
        source_start, source_end = self.source.offsets(topic, partition)
        if end > source_end:
            raise Diverged(f"{where}: the target ends at offset {end}, beyond the source's end {source_end}")
        if start == end and end < source_start:
            target.start_at(source_start)
            start = end = source_start
        elif end < source_start:
            raise SourceGap(
                f"{where}: the target ends at offset {end} but the source now starts at {source_start}"
                f" (offsets {end} to {source_start} are gone from the source); delete the target topic to copy it afresh"
            )
        self._compare_tail(where, topic, partition, target, max(start, source_start, end - TAIL_CHECK_BYTES), end)
        config = self.target.config(topic)
        fetch = max(1, min(self.fetch_bytes, config.segment_bytes))
        return _Partition(topic, partition, target, config.max_message_bytes, fetch, PartitionCopy(topic, partition, end, end))

    def _compare_tail(self, where: str, topic: str, partition: int, target: Log, offset: int, end: int) -> None:
        while offset < end:
            mine = read_raw(target, offset, end - offset)
            theirs = self.source.read(topic, partition, offset, len(mine))
            n = min(len(mine), len(theirs))  # either may stop early, at the end of a segment file
            if not n or mine[:n] != theirs[:n]:
                at = offset + next((i for i in range(n) if mine[i] != theirs[i]), n)
                raise Diverged(f"{where}: the target differs from the source in the message at offset {_message_at(target, at)}")
            offset += n

    def copy_round(self, stop: threading.Event | None = None) -> bool:
        """Copy up to ``ROUND_BYTES`` into each partition in turn; True if anything was copied."""
        copied = False
        for p in list(self._partitions.values()):
            if stop is not None and stop.is_set():
                break
            copied = self._copy(p, ROUND_BYTES, stop) > 0 or copied
        return copied

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
            except OffsetOutOfRange as e:
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
            length, count = walk(data, 0, len(data), p.max_message_bytes)
            if count == 0:
                entry = check(data, 0, len(data), p.max_message_bytes)
                whole = entry.size
                if entry.problem is not None and entry.problem.kind is INCOMPLETE and len(data) == size < whole:
                    size = whole  # one message larger than a fetch: ask for all of it
                    continue
                raise Diverged(
                    f"{where}: the source holds no valid message at offset {offset}, where the target ends"
                    f" ({entry.problem}): they diverged, or the source is damaged there"
                )
            size = p.fetch_bytes
            data = data if length == len(data) else data[:length]
            count = count_messages(data, p.max_message_bytes)  # a compressed batch counts its inner messages
            at = p.log.append(data, count)
            if at != offset:
                raise Diverged(
                    f"{where}: the target's end moved from offset {offset} to {at} while copying"
                    " (did something else write to it?); it no longer mirrors the source"
                )
            p.copy.to_offset = offset + length
            p.copy.bytes += length
            p.copy.messages += count
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
) -> list[PartitionCopy]:
    """Copy ``topics`` (default: all) from ``source`` into ``target``; see ``Mirror.run``."""
    return Mirror(source, target, topics).run(follow=follow, stop=stop, poll=poll)
