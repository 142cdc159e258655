"""The stateless consumer (the seed's low-level API): fetch by offset, find offsets, follow.

A consumer keeps no position of its own: every call names the offset to read from, and
the caller stores ``next_offset`` wherever suits it (with its output, for exactly-once).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, cast

from kl.errors import InvalidConfig
from kl.follow import CaughtUp, Watch
from kl.log.cursor import Cursor
from kl.log.log import EARLIEST, LATEST, Position
from kl.log.message import Message
from kl.log.messageset import MessageSet
from kl.serde import Deserializer, deserialize
from kl.topic import Root

DEFAULT_MAX_BYTES = 1 << 20
ResetPolicy = Literal["fail", "earliest", "latest"]
Start = Literal["earliest", "latest"] | int | Position | Mapping[int, int | Position] | Mapping[tuple[str, int], int | Position]
"""Where ``Consumer.consume`` starts: the log start or end, a byte offset or a ``Position``
(an offset and how many messages stored there to skip), or one of those per partition
(of several topics: per (topic, partition))."""
Until = int | Mapping[int, int] | Mapping[tuple[str, int], int]
"""Where ``Consumer.consume`` stops: before a byte offset (for one partition), or before
one per partition (of several topics: per (topic, partition); a partition not named has
no such bound)."""

log = logging.getLogger(__name__)

__all__ = ["Batch", "Consumer", "EARLIEST", "LATEST", "DEFAULT_MAX_BYTES", "Position", "Skipped", "Start", "Until"]


class Batch(NamedTuple):
    """The valid messages one fetch gave from one partition, in order."""

    topic: str
    partition: int
    offset: int
    """Where the fetch started."""
    next_offset: int
    """Where the partition's next fetch starts (inside a compressed batch: at the batch)."""
    messages: list[Message] | list[bytes | None]
    """``Message`` objects, or with ``values_only`` their values alone (deserialized, with
    the consumer's deserializers)."""


class Skipped(NamedTuple):
    """Damaged data ``Consumer.consume`` stepped over: the bytes from ``offset`` to ``next_offset``."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    reason: str


class Consumer:
    """Reads topics under a root without taking any lock.  Safe to share between threads.

    ``key_deserializer`` and ``value_deserializer`` (see :mod:`kl.serde`) turn the keys and
    values of the messages ``consume`` and ``stream`` hand out back from bytes (None stays
    None); ``fetch`` and ``multifetch`` stay raw ``MessageSet``s, bytes as stored.
    Header values are never deserialized.
    """

    def __init__(
        self,
        root: Root | str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ):
        self.root = Root(root) if isinstance(root, (str, os.PathLike)) else root
        self.max_bytes = max_bytes
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int | None = None) -> MessageSet:
        """The complete messages from ``offset`` within ``max_bytes`` (at least one whole
        message if any is there).  Raises ``OffsetOutOfRange`` and ``InvalidOffset``."""
        return self.root.log(topic, partition).read(offset, max_bytes or self.max_bytes)

    def multifetch(self, requests: Iterable[tuple[str, int, int, int | None]]) -> list[MessageSet]:
        """``fetch`` for each (topic, partition, offset, max_bytes), in order."""
        return [self.fetch(*request) for request in requests]

    def check_offset(self, topic: str, partition: int, offset: int) -> None:
        """Raise ``InvalidOffset`` unless a message starts at ``offset`` (a full check by
        scanning its segment; use it for offsets that come from a person)."""
        self.root.log(topic, partition).check_offset(offset)

    def earliest_offset(self, topic: str, partition: int) -> int:
        """The partition's log start: the byte offset of its first message kept."""
        return self.root.log(topic, partition).log_start_offset

    def latest_offset(self, topic: str, partition: int) -> int:
        """The partition's log end: the byte offset the next message published gets."""
        return self.root.log(topic, partition).log_end_offset

    def offsets_before(self, topic: str, partition: int, time_ms: int, max_offsets: int) -> list[int]:
        """Segment start offsets at or before ``time_ms``, newest first (the seed's
        ``getOffsetsBefore``); ``LATEST`` and ``EARLIEST`` give the log end and start."""
        return self.root.log(topic, partition).offsets_before(time_ms, max_offsets)

    def offset_for_time(self, topic: str, partition: int, time_ms: int) -> int:
        """The offset of the first message stamped at or after ``time_ms``."""
        return self.root.log(topic, partition).offset_for_time(time_ms)

    def offset_back(self, topic: str, partition: int, count: int) -> int:
        """The offset from which the last ``count`` messages can be read (a compressed
        batch whole: ``position_back`` for exactly ``count``)."""
        return self.root.log(topic, partition).offset_back(count)

    def position_back(self, topic: str, partition: int, count: int) -> Position:
        """Where exactly the last ``count`` messages start: a ``start`` for ``consume``."""
        return self.root.log(topic, partition).position_back(count)

    def kafka_position(self, topic: str, partition: int, kafka_offset: int) -> Position:
        """Where the message of Kafka offset ``kafka_offset`` is (a ``start`` for
        ``consume``): what Kafka clients of ``kl serve --kafka`` number it.  Raises
        ``OffsetOutOfRange``."""
        return self.root.log(topic, partition).kafka_position(kafka_offset)

    def kafka_offset(self, topic: str, partition: int, offset: int, skip: int = 0) -> int:
        """The Kafka offset of the message at ``offset`` (after ``skip`` messages of the
        compressed batch there).  Raises ``OffsetOutOfRange``."""
        return self.root.log(topic, partition).kafka_offset(offset, skip)

    def consume(
        self,
        topic: str | Sequence[str],
        partitions: Iterable[int] | Iterable[tuple[str, int]] | None = None,
        *,
        start: Start = "earliest",
        until: Until | None = None,
        until_time: int | None = None,
        follow: bool = False,
        max_messages: int | None = None,
        values_only: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[Skipped], None] | None = None,
        reset: ResetPolicy = "fail",
        max_bytes: int | None = None,
        idle_timeout: float | None = None,
        poll_interval: float = 0.1,
        caught_up: Literal["wait", "yield"] = "wait",
    ) -> Iterator[Batch]:
        """Read ``partitions`` of ``topic`` (all by default) round-robin, one fetch of each in turn.

        ``topic`` may be a list of topics, read together: their partitions in turn, so
        the topics interleave as their messages come, each partition in order; then
        ``partitions`` (all of each topic by default) are (topic, partition) pairs.
        ``start`` is "earliest", "latest", a byte offset or a ``Position`` (for one
        partition), or a mapping of partition (of several topics: of (topic, partition))
        to either.  Without ``follow`` each partition is read up to
        the end it had when this started, so a topic that keeps growing still ends;
        with it, new messages are waited for (``kl.follow.Watch``: on local disks woken by
        inotify, on NFS by polling every ``poll_interval`` seconds, which is also the
        backstop) until ``idle_timeout`` seconds pass without one (never, if None); reading
        all partitions, it also reads those added meanwhile (``Root.alter_topic``) from
        their start.  Stops after ``max_messages`` messages.  (``caught_up`` is for
        ``follow_steps``.)

        Two bounds end a partition early, with or without ``follow`` (which ends when
        every partition read has reached its bound): ``until``, a byte offset (one
        partition) or a mapping of partition (as for ``start``) to offset, stops a partition before its
        first message at or past that offset; ``until_time`` (milliseconds since the
        epoch) stops each partition before its first message, from where it starts,
        stamped at or after that time: the offset ``offset_for_time`` gives for it
        (Kafka's offsetsForTimes, kcat's ``-o e@TIME``), so a read from
        ``offset_for_time(a)`` until ``b`` (``a <= b``) gets exactly the messages
        between the two points.  Messages after that point stamped earlier (producers stamp
        their own clocks) are not read; messages without a timestamp never stop it.  While
        following, a partition that has no message stamped at or after ``until_time``
        also ends once it is caught up and this host's clock has passed that time.

        Each fetch that gives messages yields a ``Batch`` of them, all valid: with
        ``values_only`` just their values, the fast path.  At a damaged message the valid
        ones before it are yielded first; then ``CorruptMessage`` is raised, or, with
        ``skip_corrupt``, the damage is stepped over and reported to ``on_skip`` (by
        default logged as a warning).  A position that falls out of the log (retention
        deleted it) raises ``OffsetOutOfRange``, or with ``reset`` goes on from the log
        start ("earliest") or end ("latest").  Also raises ``TopicNotFound``,
        ``InvalidOffset`` and ``InvalidConfig`` (a bad ``start`` or ``reset``).
        """
        if reset not in ("fail", "earliest", "latest"):
            raise InvalidConfig(f"reset must be fail, earliest or latest, not {reset!r}")
        whole = partitions is None
        keys = self._keys(topic, partitions)
        one_topic = isinstance(topic, str)
        ends = {key: self.latest_offset(*key) for key in keys}
        starts = {key: self._start_position(key, start, ends, len(keys), one_topic) for key in keys}
        cursors = {key: self._cursor(key, starts[key], reset, skip_corrupt, on_skip) for key in keys}
        stops = _stops(until, keys, one_topic, None if follow else ends)  # None: nowhere (following)
        max_bytes = max_bytes or self.max_bytes
        remaining = max_messages
        # a start past the log end stays, for its read to raise OffsetOutOfRange
        active = [key for key in keys if (stop := stops[key]) is None or not stop <= starts[key].offset <= ends[key]]
        with Watch(poll_interval) as watch:
            if follow:
                for key in keys:  # before the first reads, so nothing published after them is missed
                    self._watch(watch, *key)
            idle_since = time.monotonic()
            while active and remaining != 0:
                progressed = False
                for key in list(active):
                    (t, p), cursor, stop = key, cursors[key], stops[key]
                    offset = cursor.position.offset
                    size = max_bytes if stop is None else max(1, min(max_bytes, stop - offset))
                    try:  # with a time bound, the messages (their timestamps) even for values only
                        got, damage = cursor.read(size, values_only=values_only and until_time is None, limit=remaining)
                    finally:
                        if follow:  # what was read (or failed) is of the topic followed, not of one created again
                            watch.check()
                    if until_time is not None:
                        got, at = _before(cast("list[Message]", got), until_time, values_only)
                        if at is not None:  # the time bound: this partition ends here, before any damage after it
                            cursor.position, stops[key] = Position(at), at
                            damage = None
                    if got:
                        if remaining is not None:
                            remaining -= len(got)
                        yield Batch(t, p, offset, cursor.position.offset, self._deserialized(got, values_only))
                        if remaining == 0:
                            return
                    if damage is not None:
                        cursor.damaged(damage)
                    moved = cursor.position.offset != offset
                    progressed = progressed or moved
                    stop = stops[key]
                    if (stop is not None and cursor.position.offset >= stop) or (
                        not moved and not follow
                    ):  # at its bound, or caught up
                        active.remove(key)
                    elif not moved and until_time is not None and time.time() * 1000 >= until_time:  # caught up past the time
                        active.remove(key)
                if follow and whole:
                    for key in self._added(keys):  # by kl topics alter
                        self._watch(watch, *key)
                        keys.append(key)
                        start_at = Position(self.earliest_offset(*key))  # all of it is newer than this follow
                        cursors[key] = self._cursor(key, start_at, reset, skip_corrupt, on_skip)
                        stops[key] = _stops(until if isinstance(until, Mapping) else None, [key], one_topic, None)[key]
                        active.append(key)
                if follow and progressed:
                    idle_since = time.monotonic()
                elif follow and active:
                    idle = time.monotonic() - idle_since
                    if idle_timeout is not None and idle >= idle_timeout:
                        return
                    waits = [] if idle_timeout is None else [idle_timeout - idle]
                    if until_time is not None:  # wake when the clock passes the time bound
                        waits.append(max(0.0, until_time / 1000 - time.time()))
                    if caught_up == "wait":
                        watch.wait(min(waits, default=None))
                    else:
                        yield CaughtUp(watch, min(waits, default=None))  # type: ignore[misc]  # follow_steps' type says

    def follow_steps(
        self, topic: str | Sequence[str], partitions: Iterable[int] | Iterable[tuple[str, int]] | None = None, **options: Any
    ) -> Iterator[Batch | CaughtUp]:
        """``consume(topic, partitions, follow=True, **options)`` for a caller that does the
        waiting itself (``kl.aio``, on its event loop's reader): where ``consume`` would
        wait for new messages, this yields a ``kl.follow.CaughtUp``; the caller waits on its
        watch (``Watch.steps``, never reading the log), then asks for the next item."""
        return self.consume(topic, partitions, follow=True, caught_up="yield", **options)

    def _deserialized(self, got: list[Message] | list[bytes | None], values_only: bool) -> list[Message] | list[Any]:
        """``got`` through the deserializers (as it is without any)."""
        keys, values = self.key_deserializer, self.value_deserializer
        if keys is None and values is None:
            return got
        if values_only:
            return [deserialize(values, value) for value in cast("list[bytes | None]", got)]
        messages = cast("list[Message]", got)
        return [msg._replace(key=deserialize(keys, msg.key), value=deserialize(values, msg.value)) for msg in messages]

    def _keys(
        self, topic: str | Sequence[str], partitions: Iterable[int] | Iterable[tuple[str, int]] | None
    ) -> list[tuple[str, int]]:
        """The (topic, partition) pairs ``consume`` reads, in turn: a topic's partitions
        together, in the order given."""
        if isinstance(topic, str):
            if partitions is None:
                return [(topic, p) for p in range(self.root.config(topic).partitions)]
            return [(topic, cast(int, p)) for p in dict.fromkeys(partitions)]
        topics = list(dict.fromkeys(topic))
        if partitions is None:
            return [(t, p) for t in topics for p in range(self.root.config(t).partitions)]
        keys = list(dict.fromkeys(cast("Iterable[tuple[str, int]]", partitions)))
        for key in keys:
            if not (isinstance(key, tuple) and len(key) == 2 and key[0] in topics):
                raise InvalidConfig(f"with several topics a partition is a (topic, partition) pair of them, not {key!r}")
            self.root.config(key[0])
        return keys

    def _added(self, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The partitions of the topics in ``keys`` that their configs now have and ``keys`` has not."""
        known: dict[str, int] = {}
        for t, p in keys:
            known[t] = max(known.get(t, 0), p + 1)
        return [(t, p) for t, count in known.items() for p in range(count, self.root.config(t).partitions)]

    def _cursor(
        self,
        key: tuple[str, int],
        position: Position,
        reset: ResetPolicy,
        skip_corrupt: bool,
        on_skip: Callable[[Skipped], None] | None,
    ) -> Cursor:
        """A cursor over the partition ``key`` at ``position``, with ``consume``'s policy."""
        report = skip_report(*key, on_skip)
        return Cursor(self.root.log(*key), position, reset=reset, skip_corrupt=skip_corrupt, on_skip=report)

    def _watch(self, watch: Watch, topic: str, partition: int) -> None:
        """Have ``watch`` wake ``consume`` when the partition grows (a remote consumer adds
        nothing: an empty watch sleeps the poll interval)."""
        watch.add(self.root.log(topic, partition))

    def _start_position(
        self, key: tuple[str, int], start: Start, ends: dict[tuple[str, int], int], count: int, one_topic: bool
    ) -> Position:
        topic, partition = key
        if start == "earliest":
            return Position(self.earliest_offset(topic, partition))
        if start == "latest":
            return Position(ends[key])
        if isinstance(start, (int, Position)):
            if count != 1:
                raise InvalidConfig(f"a start offset ({start}) is for one partition, not {count}")
            return start if isinstance(start, Position) else Position(start)
        if isinstance(start, Mapping):
            wanted = partition if one_topic else key
            if wanted not in start:
                raise InvalidConfig(f"start gives no offset for partition {wanted}")
            value = start[wanted]  # type: ignore[index]
            return value if isinstance(value, Position) else Position(value)
        raise InvalidConfig(f"start must be earliest, latest, an offset or a mapping of offsets, not {start!r}")

    def stream(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        idle_timeout: float | None = None,
        poll_interval: float = 0.1,
        reset: ResetPolicy = "fail",
        max_bytes: int | None = None,
        skip_corrupt: bool = False,
    ) -> Iterator[Message]:
        """Follow one partition from ``offset``, message by message: ``consume`` with
        ``follow=True`` (see there for ``idle_timeout``, ``reset`` and ``skip_corrupt``,
        which logs what it skips)."""
        for batch in self.consume(
            topic,
            [partition],
            start=offset,
            follow=True,
            skip_corrupt=skip_corrupt,
            reset=reset,
            max_bytes=max_bytes,
            idle_timeout=idle_timeout,
            poll_interval=poll_interval,
        ):
            yield from cast("list[Message]", batch.messages)


def _stops(
    until: Until | None, keys: list[tuple[str, int]], one_topic: bool, ends: dict[tuple[str, int], int] | None
) -> dict[tuple[str, int], int | None]:
    """Each partition's end: its ``until`` bound, and without following (``ends`` given)
    no further than its end at the start.  Raises ``InvalidConfig`` for a bad ``until``."""
    if until is None:
        bounds: Mapping[Any, int] = {}
    elif isinstance(until, Mapping):
        bounds = until
    elif isinstance(until, int) and not isinstance(until, bool):
        if len(keys) != 1:
            raise InvalidConfig(f"an end offset ({until}) is for one partition, not {len(keys)}")
        bounds = {keys[0]: until}
        one_topic = False
    else:
        raise InvalidConfig(f"until must be an offset or a mapping of offsets, not {until!r}")
    stops: dict[tuple[str, int], int | None] = {}
    for key in keys:
        bound = bounds.get(key[1] if one_topic else key)
        if ends is not None:
            bound = ends[key] if bound is None else min(bound, ends[key])
        stops[key] = bound
    return stops


def _before(messages: list[Message], time_ms: int, values_only: bool) -> tuple[list[Message] | list[bytes | None], int | None]:
    """The messages before the first stamped at or after ``time_ms`` (their values, with
    ``values_only``), and that message's offset (None when there is none)."""
    at = None
    for i, msg in enumerate(messages):
        if msg.timestamp is not None and msg.timestamp >= time_ms:
            messages, at = messages[:i], msg.offset
            break
    return ([msg.value for msg in messages] if values_only else messages), at


def skip_report(topic: str, partition: int, on_skip: Callable[[Skipped], None] | None = None) -> Callable[[int, int, str], None]:
    """A cursor's ``on_skip`` for the partition: a ``Skipped`` to ``on_skip``, by default
    logged as a warning."""

    def report(offset: int, next_offset: int, reason: str) -> None:
        skipped = Skipped(topic, partition, offset, next_offset, reason)
        if on_skip is None:
            log.warning("skipped damaged data of %s/%d from offset %d to %d: %s", *skipped)
        else:
            on_skip(skipped)

    return report
