"""The stateless consumer (the seed's low-level API): fetch by offset, find offsets, follow.

A consumer keeps no position of its own: every call names the offset to read from, and
the caller stores ``next_offset`` wherever suits it (with its output, for exactly-once).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, NamedTuple, cast

from kl.errors import CorruptMessage, InvalidConfig, OffsetOutOfRange
from kl.follow import Watch
from kl.log import EARLIEST, LATEST, Position
from kl.message import Message
from kl.messageset import MessageSet
from kl.topic import Root

DEFAULT_MAX_BYTES = 1 << 20
ResetPolicy = Literal["fail", "earliest", "latest"]
Start = Literal["earliest", "latest"] | int | Position | Mapping[int, int | Position]
"""Where ``Consumer.consume`` starts: the log start or end, a byte offset or a ``Position``
(an offset and how many messages stored there to skip), or one of those per partition."""

log = logging.getLogger(__name__)

__all__ = ["Batch", "Consumer", "EARLIEST", "LATEST", "DEFAULT_MAX_BYTES", "Position", "Skipped", "Start"]


class Batch(NamedTuple):
    """The valid messages one fetch gave from one partition, in order."""

    topic: str
    partition: int
    offset: int
    """Where the fetch started."""
    next_offset: int
    """Where the partition's next fetch starts (inside a compressed batch: at the batch)."""
    messages: list[Message] | list[bytes]
    """``Message`` objects, or with ``values_only`` their values alone."""


class Skipped(NamedTuple):
    """Damaged data ``Consumer.consume`` stepped over: the bytes from ``offset`` to ``next_offset``."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    reason: str


class Consumer:
    """Reads topics under a root without taking any lock.  Safe to share between threads."""

    def __init__(self, root: Root | str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Root(root) if isinstance(root, (str, os.PathLike)) else root
        self.max_bytes = max_bytes

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
        return self.root.log(topic, partition).log_start_offset

    def latest_offset(self, topic: str, partition: int) -> int:
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

    def consume(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        start: Start = "earliest",
        follow: bool = False,
        max_messages: int | None = None,
        values_only: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[Skipped], None] | None = None,
        reset: ResetPolicy = "fail",
        max_bytes: int | None = None,
        idle_timeout: float | None = None,
        poll_interval: float = 0.1,
    ) -> Iterator[Batch]:
        """Read ``partitions`` of ``topic`` (all by default) round-robin, one fetch of each in turn.

        ``start`` is "earliest", "latest", a byte offset or a ``Position`` (for one
        partition), or a mapping of partition to either.  Without ``follow`` each partition is read up to
        the end it had when this started, so a topic that keeps growing still ends;
        with it, new messages are waited for (``kl.follow.Watch``: on local disks woken by
        inotify, on NFS by polling every ``poll_interval`` seconds, which is also the
        backstop) until ``idle_timeout`` seconds pass without one (never, if None); reading
        all partitions, it also reads those added meanwhile (``Root.alter_topic``) from
        their start.  Stops after ``max_messages`` messages.

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
        partitions = list(range(self.root.config(topic).partitions) if partitions is None else dict.fromkeys(partitions))
        ends = {p: self.latest_offset(topic, p) for p in partitions}
        starts = {p: self._start_position(topic, p, start, ends, len(partitions)) for p in partitions}
        offsets = {p: position.offset for p, position in starts.items()}
        skips = {p: position.skip for p, position in starts.items() if position.skip}
        max_bytes = max_bytes or self.max_bytes
        remaining = max_messages
        active = [p for p in partitions if follow or offsets[p] != ends[p]]
        with Watch(poll_interval) as watch:
            if follow:
                for p in partitions:  # before the first reads, so nothing published after them is missed
                    self._watch(watch, topic, p)
            idle_since = time.monotonic()
            while active and remaining != 0:
                progressed = False
                for p in list(active):
                    offset = offsets[p]
                    size = max_bytes if follow else max(1, min(max_bytes, ends[p] - offset))
                    try:
                        got, offsets[p], damage = self._read(
                            topic, p, offset, size, values_only, remaining, skips.pop(p, 0)  # a skip: at the start only
                        )
                    except OffsetOutOfRange as e:
                        if reset == "fail":
                            raise
                        got, offsets[p], damage = [], e.log_start_offset if reset == "earliest" else e.log_end_offset, None
                    finally:
                        if follow:  # what was read (or failed) is of the topic followed, not of one created again
                            watch.check()
                    if got:
                        if remaining is not None:
                            remaining -= len(got)
                        yield Batch(topic, p, offset, offsets[p], got)
                        if remaining == 0:
                            return
                    if damage is not None:
                        if not skip_corrupt:
                            raise damage
                        offsets[p] = self.skip(topic, p, offsets[p], damage, on_skip)  # from where the damage starts
                    moved = offsets[p] != offset
                    progressed = progressed or moved
                    if not follow and (not moved or offsets[p] >= ends[p]):  # caught up, or a read gave nothing
                        active.remove(p)
                if follow and whole:
                    for p in range(len(partitions), self.root.config(topic).partitions):  # added by kl topics alter
                        self._watch(watch, topic, p)
                        partitions.append(p)
                        offsets[p] = self.earliest_offset(topic, p)  # all of it is newer than this follow
                        active.append(p)
                if follow and progressed:
                    idle_since = time.monotonic()
                elif follow:
                    idle = time.monotonic() - idle_since
                    if idle_timeout is not None and idle >= idle_timeout:
                        return
                    watch.wait(None if idle_timeout is None else idle_timeout - idle)

    def skip(
        self, topic: str, partition: int, offset: int, damage: CorruptMessage, on_skip: Callable[[Skipped], None] | None = None
    ) -> int:
        """Step over the ``damage`` found at ``offset``: where the next valid message starts.
        What was stepped over goes to ``on_skip`` (by default logged as a warning)."""
        skipped = Skipped(topic, partition, offset, self.root.log(topic, partition).skip_corrupt(offset), damage.reason)
        if on_skip is None:
            log.warning("skipped damaged data of %s/%d from offset %d to %d: %s", *skipped)
        else:
            on_skip(skipped)
        return skipped.next_offset

    def _watch(self, watch: Watch, topic: str, partition: int) -> None:
        """Have ``watch`` wake ``consume`` when the partition grows (a remote consumer adds
        nothing: an empty watch sleeps the poll interval)."""
        watch.add(self.root.log(topic, partition))

    def _start_position(self, topic: str, partition: int, start: Start, ends: dict[int, int], count: int) -> Position:
        if start == "earliest":
            return Position(self.earliest_offset(topic, partition))
        if start == "latest":
            return Position(ends[partition])
        if isinstance(start, (int, Position)):
            if count != 1:
                raise InvalidConfig(f"a start offset ({start}) is for one partition, not {count}")
            return start if isinstance(start, Position) else Position(start)
        if isinstance(start, Mapping):
            if partition not in start:
                raise InvalidConfig(f"start gives no offset for partition {partition}")
            value = start[partition]
            return value if isinstance(value, Position) else Position(value)
        raise InvalidConfig(f"start must be earliest, latest, an offset or a mapping of offsets, not {start!r}")

    def _read(
        self, topic: str, partition: int, offset: int, max_bytes: int, values_only: bool, limit: int | None, skip: int = 0
    ) -> tuple[list[Message] | list[bytes], int, CorruptMessage | None]:
        """The valid messages (at most ``limit``) of one fetch, where to read next, and
        the damage that ended them early (its offset is where to read next then).
        ``skip`` leaves out the first messages read: a ``Position``'s inside a compressed
        batch (a batch is read whole, so they are all in this fetch)."""
        if skip:
            got, next_offset, damage = self._read(
                topic, partition, offset, max_bytes, values_only, None if limit is None else limit + skip
            )
            del got[:skip]
            return got, next_offset, damage
        try:
            return *_take(self.fetch(topic, partition, offset, max_bytes), values_only, limit), None
        except CorruptMessage as e:
            if e.offset is None or e.offset < offset:
                raise
            damage, at = e, e.offset
        if at == offset:
            return [], offset, damage
        got, _ = _take(self.fetch(topic, partition, offset, at - offset), values_only, limit)
        return got, at, damage

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


def _take(messages: MessageSet, values_only: bool, limit: int | None) -> tuple[list[Message] | list[bytes], int]:
    """Up to ``limit`` messages (or values) of a set, and the offset after the last one."""
    if values_only:
        values, next_offset = messages.values()
        if limit is None or len(values) <= limit:
            return values, next_offset
    if limit is None:
        got = list(messages)
        return got, messages.next_offset
    got = list(itertools.islice(messages, limit))
    next_offset = got[-1].next_offset if len(got) == limit else messages.next_offset
    return [msg.value for msg in got] if values_only else got, next_offset
