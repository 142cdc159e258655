"""Consumer groups (SPEC §9-§10): processes on any hosts share topics' partitions as one consumer.

Every member of a group runs a coordinator thread which, every ``poll_interval``:

1. moves its heartbeat on (when it was late, it first checks it still owns what it owned);
2. lists the live members (kl/registry.py) and the topics its subscription matches;
3. takes its share by SPEC §10's range assignment: releases what it no longer gets (after
   committing what was consumed of it), then claims what it gets; a claim of a partition
   another member still owns is retried every ``CLAIM_RETRY`` seconds until it let go;
4. auto-commits on its interval; between polls it wakes to commit too, once a stream
   marked messages consumed and the interval has passed since the last commit.

It never waits long behind another process: the group's locks (kl/registry.py) are
waited for ``LOCK_WAIT`` of the session timeout at most; a claim, release or commit that
finds its partition's lock held is tried again on the next poll.  A lock that stays held
(its holder stopped: SIGSTOP, a hung host) is gone on without while a member is expired
or once it was held for the session timeout, so such a holder delays the others by about
the session timeout, as any stopped member does.  A member whose root disappears fails
at its next poll (``RootNotFound`` from its streams).

Streams read their partitions in the caller's threads; the coordinator only hands
partitions to them and takes them back.

Bounds: a member that dies (its lock goes with the process) is replaced within about
``poll_interval`` to notice plus ``poll_interval`` for the others to release what moves,
plus ``CLAIM_RETRY``.  A member that stops beating (SIGSTOP, a hung host, a host cut off
from NFS) is expired by the others after ``session_timeout`` of their own clocks; its
own lease ends as long after its last beat, so from then on it hands out nothing, and
when it wakes up it drops what was taken from it: its commits of those partitions are
rejected (``NotOwner``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeVar, cast

from kl.consumer import DEFAULT_MAX_BYTES, Batch, ResetPolicy, skip_report
from kl.errors import (
    CorruptMessage,
    CorruptState,
    InvalidConfig,
    KlError,
    LockTimeout,
    OffsetOutOfRange,
    RootNotFound,
    StorageError,
    TopicNotFound,
)
from kl.follow import CaughtUp, Watch
from kl.log.config import same_creation
from kl.log.cursor import Cursor, advance
from kl.log.log import Log, Position
from kl.log.message import Headers, Message
from kl.log.messageset import MessageSet
from kl.log.state import PartitionState
from kl.registry import Commit, CorruptOffset, GroupTaken, Member, NotOwner, Registration, Registry, kafka_lease, subscribes
from kl.serde import Deserializer, deserialize
from kl.topic import Root, validate_name

log = logging.getLogger(__name__)

CLAIM_RETRY = 0.02
"""Seconds between attempts to claim a partition another member still owns."""
LOCK_WAIT = 0.05
"""Longest wait for a group lock, as a share of the session timeout."""
WAKE_EVERY = 0.1
"""Longest a waiting stream waits for data (inotify wakes it sooner) before it looks
for partitions handed to it again."""

T = TypeVar("T")

OnLost = Callable[[str, int, str], None]
"""Told (topic, partition, why) when a partition was taken from this member."""

TopicPartition = tuple[str, int]
Offsets = Mapping[TopicPartition, "Position | int"] | Iterable[tuple[TopicPartition, "Position | int"]]
"""What ``commit(offsets)`` stores: (topic, partition) -> position, as a mapping or pairs."""
OnRebalance = Callable[["GroupConsumer", list[TopicPartition]], None]
"""``on_assign``/``on_revoke``: told the member and the (topic, partition)s it got or gives up."""


class Record(NamedTuple):
    """A message as a group stream hands it out; ``key`` and ``value`` are what the
    member's deserializers made of them (bytes without one; None stays None)."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    timestamp: int | None
    key: Any
    value: Any
    headers: Headers = ()


@dataclass(eq=False)
class _Claim:
    """A partition this member owns, and how far it got."""

    topic: str
    partition: int
    generation: int
    topic_id: str
    """The id of the topic's creation this member reads (what its commits name)."""
    position: Position
    """Where the next fetch starts."""
    handed: Position
    """After the last message handed out (what ``commit()`` stores)."""
    consumed: Position
    """After the last message the caller came back from (what auto-commit stores)."""
    committed: Position | None
    end: int
    """The log end when this member first saw the partition: ``batches()`` stops there."""
    stream: MessageStream
    log: Log
    error: KlError | None = None
    blocked: bool = False
    """Its committed offset is unusable and ``reset`` is "fail": nothing is read or committed."""
    paused: bool = False
    """``pause()``d: its stream reads nothing of it."""
    assigning: bool = True
    """Claimed, ``on_assign`` not called yet: its stream reads nothing of it."""


class MessageStream:
    """A blocking iterator over the messages of the partitions this stream is given.

    Iterating waits for new messages; it ends when the consumer is closed or stopped, or
    after ``timeout`` seconds without a message (never, if None).  A message counts as
    consumed (for auto-commit) once the caller asks for the next one.  Use a stream from
    one thread at a time; different streams may be used by different threads.
    """

    def __init__(self, consumer: GroupConsumer, timeout: float | None):
        self._consumer = consumer
        self.timeout = timeout
        self._lock = threading.Lock()
        """Held while the stream reads or changes its state (not while it waits for data)."""
        self._claims: list[_Claim] = []
        self._turn = 0
        self._pending: Iterator[Message] = iter(())
        self._pending_claim: _Claim | None = None
        self._pending_at = Position(0)
        """After the last message of ``_pending`` handed out (at first: where its fetch started)."""
        self._last: tuple[_Claim, Position] | None = None
        self._pieces: list[tuple[_Claim, Batch, Position]] = []
        """The rest of the last fetch for ``batches()``: each piece and where it ends."""
        self._watch = Watch(consumer.poll_interval, detect_recreation=False)  # the coordinator starts it afresh
        self._watched: set[Log] = set()
        self._waiting = False

    def __iter__(self) -> MessageStream:
        return self

    def __next__(self) -> Record:
        record = self.poll(self.timeout)
        if record is None:
            raise StopIteration
        return record

    def poll(self, timeout: float | None = None) -> Record | None:
        """The next message, or None after ``timeout`` seconds or once the consumer stops."""
        consumer = self._consumer
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._mark_consumed()
            while not consumer._stopped.is_set():
                if time.monotonic() < consumer._lease_until:
                    claim = self._pending_claim
                    if claim is None:
                        got = self._fetch(True, False, None, None)
                        if got is not None:
                            claim, [(batch, _)], self._pending_at = got
                            self._pending, self._pending_claim = iter(batch.messages), claim  # type: ignore[arg-type]
                    if claim is not None:
                        message = next(self._pending, None)
                        if isinstance(message, Message):
                            claim.handed = self._pending_at = advance(self._pending_at, message)
                            self._last = (claim, claim.handed)
                            if consumer.key_deserializer is None and consumer.value_deserializer is None:
                                return Record(claim.topic, claim.partition, *message)
                            key = deserialize(consumer.key_deserializer, message.key)
                            value = deserialize(consumer.value_deserializer, message.value)
                            return Record(claim.topic, claim.partition, *message._replace(key=key, value=value))
                        self._pending_claim = None
                        continue
                if not self._wait(deadline):
                    return None
            return None

    def poll_nowait(self) -> Record | CaughtUp | None:
        """``poll(0)``, but where it would give None while the consumer runs, a
        ``kl.follow.CaughtUp`` for a caller that waits itself (``kl.aio``, on its event
        loop's reader): wait on its watch, then call again.  None once the consumer stops.
        The watch stays the stream's: close the consumer only after the wait ended."""
        record = self.poll(0)
        if record is not None or self._consumer._stopped.is_set():
            return record
        with self._lock:
            return CaughtUp(self._watching(), WAKE_EVERY)

    # ----------------------------------------------------------------- for GroupConsumer

    def _batch(self, timeout: float | None, follow: bool, values_only: bool, limit: int | None) -> Batch | None:
        with self._lock:
            self._mark_consumed()
            if not self._pieces:
                got = self._next_batch(timeout, follow, values_only, limit)
                if got is None:
                    return None
                claim, pieces, _ = got
                self._pieces = [(claim, batch, end) for batch, end in pieces]
            claim, batch, end = self._pieces.pop(0)
            claim.handed = end
            self._last = (claim, end)
            return batch

    def _mark_consumed(self) -> None:
        """What was handed out last is consumed: the coordinator commits it on the interval."""
        if self._last is not None:
            claim, offset = self._last
            claim.consumed, self._last = offset, None
            consumer = self._consumer
            if consumer.auto_commit and not consumer._to_commit:
                consumer._to_commit = True
                consumer._wake.set()

    def _next_batch(
        self, timeout: float | None, follow: bool, values_only: bool, limit: int | None
    ) -> tuple[_Claim, list[tuple[Batch, Position]], Position] | None:
        consumer = self._consumer
        deadline = None if timeout is None else time.monotonic() + timeout
        while not consumer._stopped.is_set():
            if time.monotonic() < consumer._lease_until:
                got = self._fetch(follow, values_only, limit, consumer.max_bytes)
                if got is not None:
                    return got
                if not follow and consumer._settled and all(c.position.offset >= c.end for c in self._claims):
                    return None
            if not self._wait(deadline):
                return None
        return None

    def _wait(self, deadline: float | None) -> bool:
        """Wait for new data (``kl.follow.Watch``) or partitions; False once ``deadline``
        passed.  Raises what keeps the coordinator from renewing the lease, once it ran out."""
        consumer = self._consumer
        error = consumer._error
        if error is not None and time.monotonic() >= consumer._lease_until:
            raise error
        wait = WAKE_EVERY if deadline is None else min(WAKE_EVERY, deadline - time.monotonic())
        if wait <= 0:
            return False
        watch = self._watching()
        self._waiting = True
        self._lock.release()  # the coordinator may hand partitions over meanwhile
        try:
            watch.wait(wait)
        finally:
            self._lock.acquire()
            self._waiting = False
            if consumer._stopped.is_set():
                self._watch.close()
        return True

    def _watching(self) -> Watch:
        """The watch, over the partitions claimed now (called with the lock held)."""
        logs = {c.log for c in self._claims if c.error is None}
        for gone in self._watched - logs:
            self._watch.remove(gone)
        for new in logs - self._watched:
            self._watch.add(new)
        self._watched = logs
        return self._watch

    def _fetch(
        self, follow: bool, values_only: bool, limit: int | None, piece_bytes: int | None
    ) -> tuple[_Claim, list[tuple[Batch, Position]], Position] | None:
        """One fetch from the next partition in turn that has messages: its claim, its
        messages as batches of about ``piece_bytes`` each (one batch if None) with where
        each ends, and where the fetch started (the claim's position is now after it)."""
        consumer, claims = self._consumer, self._claims
        for k in range(len(claims)):
            claim = claims[(self._turn + k) % len(claims)]
            if claim.paused or claim.assigning:
                continue
            if claim.error is not None:
                raise claim.error
            start = claim.position
            if not follow and start.offset >= claim.end:
                continue
            max_bytes = consumer.max_bytes if follow else max(1, min(consumer.max_bytes, claim.end - start.offset))
            try:
                cursor = consumer._cursor(claim)
                pieces, damage = read_from(cursor, max_bytes, values_only, limit, piece_bytes)
            except OffsetOutOfRange as e:  # under reset "fail", or of a topic created again
                if not consumer._recreated(claim.topic):
                    consumer._reset_position(claim, e)
                continue
            except TopicNotFound:
                continue  # deleted: the coordinator lets it go
            if damage is not None and consumer._recreated(claim.topic):
                continue  # what looks damaged is another topic of the same name: the coordinator starts it afresh
            claim.position = cursor.position
            if damage is not None:
                consumer._damaged(claim, cursor, damage)
            if pieces:
                self._turn = (self._turn + k + 1) % len(claims)
                batches, at = [], start.offset
                for got, end in pieces:
                    batches.append((Batch(claim.topic, claim.partition, at, end.offset, got), end))
                    at = end.offset
                return claim, batches, start
        return None

    def _add(self, claim: _Claim) -> None:
        with self._lock:
            self._claims.append(claim)

    def _remove(self, claim: _Claim) -> None:
        """Stop reading ``claim``'s partition and forget what was fetched of it and not handed out."""
        with self._lock:
            self._claims.remove(claim)
            self._forget_fetched(claim)
            if self._last is not None and self._last[0] is claim:
                self._last = None

    def _rewind(self, claim: _Claim, to: Position, *, unblock: bool = False) -> None:
        """Read ``claim``'s partition from ``to`` next, forgetting what was fetched of it and
        not handed out (and, with ``unblock``, the error its reads raise)."""
        with self._lock:
            self._forget_fetched(claim)
            claim.position = claim.handed = to
            if unblock:  # and commit where the caller chose, not before it
                claim.error, claim.blocked, claim.consumed = None, False, to

    def _forget_fetched(self, claim: _Claim) -> None:
        if self._pending_claim is claim:
            self._pending, self._pending_claim = iter(()), None
        self._pieces = [piece for piece in self._pieces if piece[0] is not claim]

    def _close(self) -> None:
        """Free the watch's descriptor (a stream waiting on it frees it as it wakes up)."""
        with self._lock:
            if not self._waiting:
                self._watch.close()


class GroupConsumer:
    """A member of consumer group ``group`` under ``root``, sharing its topics' partitions
    with the other members; every group gets every message.

    Given ``topics`` (a list of names) or ``pattern`` (a regular expression the whole name
    must match, minus those matching ``exclude``; topics created later are picked up), it
    joins at once and is read by iterating over it or with ``batches()``.  Given neither,
    it joins when ``create_message_streams`` or ``create_message_streams_by_filter`` is called.

    A partition without a committed offset, or with one of an earlier creation of its
    topic (another topic id: logged), starts at ``start`` ("earliest" or "latest"); one
    added to its topic (``Root.alter_topic``) after this member first looked at the
    topic starts at its log start (it holds only newer messages).  The members see
    added partitions within a second or so and share them out again.  A committed
    offset that cannot be used goes by ``reset``: out of the log (retention deleted it)
    or in a damaged offset file of an older kl (set aside as ``P.damaged`` first; a
    damaged line of a commits file is skipped, see kl/registry.py), "earliest" and
    "latest" go on from the log start or end with a warning; "fail" blocks the partition:
    every poll of its stream raises ``OffsetOutOfRange`` or ``CorruptOffset``, and nothing
    is committed over it, until ``seek()`` says where to go on.  With ``auto_commit`` the
    consumed messages' offsets are committed every ``auto_commit_interval`` seconds
    (shorter than ``poll_interval`` too),
    when a partition moves to another member, and by ``close()``; inside a compressed
    batch a commit is of the position after the last message (``kl.Position``).

    ``on_assign(consumer, partitions)`` and ``on_revoke(consumer, partitions)`` (sorted lists
    of (topic, partition): only those that move, as in Kafka's cooperative rebalancing, not
    the whole assignment as in its eager one) are called around every rebalance:
    ``on_revoke`` after the final auto-commit of the partitions given up and before they
    are (it may ``commit(offsets)`` them), then ``on_assign`` after the new ones are
    claimed and before any of their messages is handed out (it may ``seek()`` or
    ``pause()`` them); ``close()`` calls ``on_revoke`` with what is still owned.  A topic
    deleted and created again is revoked (without a final auto-commit: its offsets are of
    the old topic), then the new one's partitions are assigned.  Partitions taken away
    without a clean revoke (this member expired, its commit rejected) go to ``on_lost``
    instead.  They run in the coordinator's thread (the first rebalance in the
    constructor's, ``close()``'s in its caller's) and hold up the
    heartbeat while they run; an exception they raise is logged (``logging``) and the
    member goes on.  ``key_deserializer``/``value_deserializer`` (kl.serde) turn the keys
    and values that iteration and streams hand out (``Record``) into objects (what one
    raises comes out of the iteration, its message counted as handed out); the raw bytes
    are not kept (leave them out to get bytes); ``batches()`` hands out bytes.

    Every method but iteration and ``batches()`` is safe from any thread.
    """

    def __init__(
        self,
        root: Root | str | os.PathLike[str],
        group: str,
        topics: list[str] | None = None,
        *,
        pattern: str | None = None,
        exclude: str | None = None,
        start: str = "earliest",
        reset: str = "earliest",
        auto_commit: bool = True,
        auto_commit_interval: float = 5.0,
        poll_interval: float = 0.5,
        session_timeout: float = 10.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        skip_corrupt: bool = False,
        on_lost: OnLost | None = None,
        on_assign: OnRebalance | None = None,
        on_revoke: OnRebalance | None = None,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ):
        if not group:
            raise InvalidConfig("a group id cannot be empty (Kafka's rule for a group's members)")
        if start not in ("earliest", "latest"):
            raise InvalidConfig(f"start must be earliest or latest, not {start!r}")
        if reset not in ("earliest", "latest", "fail"):
            raise InvalidConfig(f"reset must be earliest, latest or fail, not {reset!r}")
        if not 0 < poll_interval < session_timeout:
            raise InvalidConfig(f"poll_interval ({poll_interval}) must be above 0 and below session_timeout ({session_timeout})")
        self.root = root if isinstance(root, Root) else Root(root)
        self.registry = Registry(self.root.path, group, lock_timeout=session_timeout * LOCK_WAIT)
        self.group = group
        self.start, self.reset, self.skip_corrupt = start, reset, skip_corrupt
        self.auto_commit, self.auto_commit_interval = auto_commit, auto_commit_interval
        self.poll_interval, self.session_timeout = poll_interval, session_timeout
        self.max_bytes = max_bytes
        self.on_lost, self.on_assign, self.on_revoke = on_lost, on_assign, on_revoke
        self.key_deserializer, self.value_deserializer = key_deserializer, value_deserializer
        self._subscription: dict[str, object] | None = None
        self._streams: list[MessageStream] = []
        self._route: Callable[[str, int], MessageStream] = lambda topic, partition: self._streams[0]
        self._registration: Registration | None = None
        self._owned: dict[tuple[str, int], _Claim] = {}
        self._releasing: dict[tuple[str, int], tuple[_Claim, bool, str]] = {}
        """Partitions given up whose release (claim, whether to commit, member id) found its lock held."""
        self._busy: dict[tuple[str, int], float] = {}
        """Partition -> when its lock was first found held by another process (while it stays so)."""
        self._expired_now: dict[str, int] = {}
        self._gone = False
        self._ends: dict[tuple[str, int], int] = {}
        """Partition -> its log end when this member first looked (where a run without
        ``follow`` ends)."""
        self._first_looks: dict[tuple[str, int], PartitionState] = {}
        """The states read for ``_ends`` in this poll, for its claims (which then read them
        no second time)."""
        self._first_counts: dict[str, int] = {}
        """Topic -> its number of partitions when this member first looked: those added
        since (``Root.alter_topic``) hold only messages newer than the member, read from
        their start whatever ``start`` says."""
        self._seen: dict[str, tuple[int, float]] = {}
        self._topic_ids: dict[str, str] = {}
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease_until = 0.0
        self._error: Exception | None = None
        self._settled = False
        self._committed_at = time.monotonic()
        self._to_commit = False
        """Some stream marked messages consumed since the last commit began."""
        self._wake = threading.Event()
        """Set to wake the coordinator before its next poll: something to commit, or ``close()``."""
        self._closed = False
        self._default: MessageStream | None = None
        if topics is not None or pattern is not None:
            self._default = MessageStream(self, None)
            self._join(_subscription(topics, pattern, exclude), [self._default])
            self._start()

    @property
    def member_id(self) -> str | None:
        """``HOST:UUID`` once joined."""
        return None if self._registration is None else self._registration.member.id

    # ----------------------------------------------------------------- streams

    def create_message_streams(
        self, counts: Mapping[str, int], *, timeout: float | None = None
    ) -> dict[str, list[MessageStream]]:
        """``counts[topic]`` streams for each topic (subscribing to those topics); each
        partition feeds exactly one of its topic's streams.  Joins the group."""
        for topic, n in counts.items():
            validate_name(topic)
            if not isinstance(n, int) or n < 1:
                raise InvalidConfig(f"topic {topic!r} needs at least 1 stream, not {n!r}")
        streams = {topic: [MessageStream(self, timeout) for _ in range(n)] for topic, n in counts.items()}
        self._join(_subscription(list(counts), None, None), [s for group in streams.values() for s in group])
        self._route = lambda topic, partition: streams[topic][partition % len(streams[topic])]
        self._start()
        return streams

    def create_message_streams_by_filter(
        self, whitelist: str | None = None, blacklist: str | None = None, n: int = 1, *, timeout: float | None = None
    ) -> list[MessageStream]:
        """``n`` streams over every topic whose name matches ``whitelist`` (all if None)
        and not ``blacklist``, topics created later included.  Joins the group."""
        if n < 1:
            raise InvalidConfig(f"at least 1 stream, not {n}")
        streams = [MessageStream(self, timeout) for _ in range(n)]
        self._join(_subscription(None, whitelist or ".*", blacklist), streams)
        self._route = lambda topic, partition: streams[(zlib.crc32(topic.encode()) + partition) % n]
        self._start()
        return streams

    def __iter__(self) -> Iterator[Record]:
        """Every message of this member's share, from one stream (the constructor's topics)."""
        return self._single()

    def _single(self) -> MessageStream:
        if self._default is None:
            raise InvalidConfig("this consumer was given no topics or pattern: iterate over its message streams")
        return self._default

    def batches(
        self,
        *,
        follow: bool = False,
        timeout: float | None = None,
        values_only: bool = False,
        max_messages: int | None = None,
    ) -> Iterator[Batch]:
        """This member's share as ``Batch``es (as ``Consumer.consume`` gives them).

        Without ``follow`` it ends once the assignment settled and every partition it owns
        reached the end it had when this member first saw it; with it, it waits for more,
        until ``timeout`` seconds pass without a message (never, if None).  Ends too after
        ``max_messages`` messages, or once ``stop()`` or ``close()`` is called.  A batch holds
        about ``max_bytes`` of values and keys at most (a larger message alone; a compressed
        batch is cut inside), so what the caller has moved past can be committed closely:
        a batch counts as consumed once the next one is asked for; ``commit()`` stores all
        handed out.
        """
        stream = self._single()
        remaining = max_messages
        while remaining != 0:
            batch = stream._batch(timeout, follow, values_only, remaining)
            if batch is None:
                return
            if remaining is not None:
                remaining -= len(batch.messages)
            yield batch

    # ----------------------------------------------------------------- offsets, membership

    def assignment(self) -> dict[str, list[int]]:
        """The partitions this member owns now, by topic."""
        with self._lock:
            out: dict[str, list[int]] = {}
            for topic, partition in sorted(self._owned):
                out.setdefault(topic, []).append(partition)
            return out

    def commit(self, offsets: Offsets | None = None) -> None:
        """Commit the offsets after every message handed out so far, or, given ``offsets``
        ((topic, partition) -> position, or a list of such pairs), exactly those (the
        position of the next message to read, as Kafka's ``commit(offsets)``: a record's
        ``next_offset``; before the last message of a compressed batch that is the batch's
        start, where ``position()`` right after the record is exact).  ``offsets`` naming
        a partition this member does not own raises ``NotOwner`` naming them and commits
        nothing.  Raises ``NotOwner`` (after committing the rest) for partitions taken
        from this member meanwhile; it stops reading them.
        Where another process holds a partition's lock it tries again every poll interval
        (without holding up the heartbeat) for up to the session timeout, then raises
        ``LockTimeout``."""
        if offsets is None:
            self._commit_all("handed", raise_lost=True)
            return
        pairs = offsets.items() if isinstance(offsets, Mapping) else offsets
        wanted = {(topic, partition): _position(at) for (topic, partition), at in pairs}
        with self._lock:
            claims = self._claims(list(wanted), "commit")
            due = {key: (claims[key], at) for key, at in wanted.items()}
        self._commit_all("handed", raise_lost=True, offsets=due)

    def seek(self, topic: str, partition: int, position: Position | int | Literal["earliest", "latest"]) -> None:
        """Hand out ``topic``/``partition``'s messages from ``position`` next: a byte offset
        (``kl.Position`` inside a compressed batch), "earliest" or "latest" (the log's start
        or end now).  Only of a partition this member owns (``NotOwner`` else); what was
        fetched of it and not handed out is dropped.  Kafka's ``seek`` (with
        ``seek_to_beginning``/``seek_to_end``); nothing is committed by it.  As in Kafka,
        it is the way on for a partition whose polls raise (under ``reset="fail"``, or at a
        damaged message): reading goes on from ``position``, and commits of it are stored
        again (a damaged offset file of an older kl is first set aside, as ``reset`` does)."""
        with self._lock:
            claim = self._claims([(topic, partition)], "seek")[topic, partition]
            if position in ("earliest", "latest"):
                state = claim.log.state()
                to = Position(state.log_start_offset if position == "earliest" else state.log_end_offset)
            else:
                to = _position(position)
            if claim.blocked and isinstance(claim.error, CorruptOffset):
                kept = self.registry.set_aside(topic, partition)
                log.warning("group %s: %s set aside as %s; going on from %s", self.group, claim.error.path, kept, to)
            claim.stream._rewind(claim, to, unblock=True)

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Hand out nothing more of ``partitions`` (owned ones: ``NotOwner`` else) until
        ``resume()``; they stay this member's (it heartbeats on: no rebalance).  What was
        fetched of them and not handed out comes after ``resume()`` (``batches()`` without
        ``follow`` waits for that).  As in Kafka, a partition that moves to another member
        and back is no longer paused."""
        with self._lock:
            for claim in self._claims(partitions, "pause").values():
                claim.stream._rewind(claim, claim.handed)
                claim.paused = True

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Hand out ``partitions`` again (owned ones: ``NotOwner`` else) after ``pause()``."""
        with self._lock:
            for claim in self._claims(partitions, "resume").values():
                claim.paused = False

    def paused(self) -> list[TopicPartition]:
        """The partitions owned and paused, sorted."""
        with self._lock:
            return sorted(key for key, claim in self._owned.items() if claim.paused)

    def position(self, topic: str, partition: int) -> Position:
        """Where the next message handed out of an owned partition starts (``NotOwner`` else)."""
        with self._lock:
            return self._claims([(topic, partition)], "position")[topic, partition].handed

    def committed(self, topic: str, partition: int) -> Position | None:
        """The group's committed position of ``topic``/``partition`` as the registry's files
        hold it now (owned or not), or None: never committed, or of an earlier creation of
        the topic.  Raises ``CorruptOffset`` for a damaged offset file of an older kl."""
        found = self.registry.committed(topic, partition)
        if found is None or not same_creation(found.topic_id, self._topic_id(topic) or ""):
            return None
        return found.position

    def _claims(self, partitions: list[TopicPartition], what: str) -> dict[TopicPartition, _Claim]:
        """The claims of ``partitions``; ``NotOwner`` naming those this member does not own."""
        missing = [f"{t}/{p}" for t, p in partitions if (t, p) not in self._owned]
        if missing:
            raise NotOwner(f"cannot {what} {', '.join(missing)}: not owned by this member (see assignment())")
        return {(t, p): self._owned[t, p] for t, p in partitions}

    def stop(self) -> None:
        """Make every stream and ``batches()`` end soon (safe from a signal handler); then ``close()``."""
        self._stopped.set()

    def close(self) -> None:
        """Leave the group at once, so the others take over without waiting for a timeout:
        with ``auto_commit``, commit what was consumed (call ``commit()`` first to include
        the messages handed out last), then delete the registration, which gives up every
        partition at once (an owner record naming a member that is gone is free to claim)."""
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        self._wake.set()
        for stream in self._streams:
            stream._close()
        if self._thread is not None:
            self._thread.join()
        if self._gone:  # nothing to leave: writing would create the root's directories again
            if self._registration is not None:
                self._registration.close()
            return
        try:
            if self.auto_commit and self._registration is not None:
                self._commit_all("consumed", raise_lost=False)
            with self._lock:
                self._call(self.on_revoke, [c for c in self._owned.values() if not c.assigning])
        finally:
            with self._lock:
                for claim in list(self._owned.values()):
                    self._drop(claim)
                if self._registration is not None:
                    self._registration.close()

    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- coordination

    def _join(self, subscription: dict[str, object], streams: list[MessageStream]) -> None:
        if self._registration is not None:
            raise InvalidConfig(f"this consumer already joined group {self.group!r}: create its streams once")
        if self._closed:
            raise InvalidConfig("this consumer is closed")
        self._subscription = subscription
        self._streams = streams
        self._registration = registration = self.registry.register(subscription)
        try:
            self._refuse_kafka()
        except BaseException:
            self._registration = None
            registration.close()
            raise

    def _refuse_kafka(self) -> None:
        """Raise ``GroupTaken`` while Kafka clients are (or may still be) members of the group:
        called once registered, so a Kafka coordinator registering meanwhile sees this member."""
        marks = [str(m.subscription["kafka"]) for m in self.registry.members() if "kafka" in m.subscription]
        lease = kafka_lease(self.root.path, self.group)
        if marks or (lease is not None and lease[1] is None):
            address = marks[0] if marks else lease[0] if lease is not None else "?"
            raise GroupTaken(
                f"group {self.group!r} has Kafka clients as members (coordinated by kl serve at {address}):"
                " a kl member cannot join it while they are in it"
            )
        if lease is not None:
            raise GroupTaken(
                f"group {self.group!r} had Kafka clients as members until their coordinator (kl serve at {lease[0]})"
                f" stopped: they may read their partitions for {lease[1]:.0f} s more; a kl member can join it then"
            )

    def _start(self) -> None:
        """The first rebalance, here (so a member owns its share once this returns), then the thread."""
        try:
            self._poll()
        except BaseException:
            self.close()  # leave again: nothing of it may linger in the group
            raise
        self._thread = threading.Thread(target=self._run, name=f"kl-group-{self.group}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Poll every poll interval; between polls, commit what was consumed once the
        commit interval has passed since the last commit."""
        polled = time.monotonic()
        while True:
            poll_at = polled + (self.poll_interval if self._settled else CLAIM_RETRY)
            commit_at = self._committed_at + self.auto_commit_interval if self._to_commit else poll_at
            self._wake.wait(max(0.0, min(poll_at, commit_at) - time.monotonic()))
            self._wake.clear()
            if self._stopped.is_set():
                return
            now = time.monotonic()
            try:
                if now >= poll_at:
                    polled = now
                    self._poll()
                    self._error = None
                elif self._to_commit and now >= self._committed_at + self.auto_commit_interval:
                    self._auto_commit()
            except RootNotFound as e:  # for good: the streams raise it at once
                self._error, self._lease_until, self._gone = e, 0.0, True
                return
            except Exception as e:  # noqa: BLE001 - tried again next poll; streams raise it once the lease ran out
                if str(e) != str(self._error):
                    log.warning("group %s: %s", self.group, e)
                self._error = e

    def _poll(self) -> None:
        assert self._registration is not None
        with self._lock:
            topics = self.root.topics()  # RootNotFound before anything is written under a root that is gone
            now = time.monotonic()
            try:
                self._registration.beat()  # first, so that from here on nobody takes more
            except StorageError as e:
                self._rejoin(f"its heartbeat failed ({e})")
            if now >= self._lease_until:
                self._validate()
            self._lease_until = now + self.session_timeout
            members = self.registry.members()
            if self._registration.member.id not in {m.id for m in members}:
                self._rejoin("its registration is gone: its lock was lost (an NFS lease that ran out?)")
                members = self.registry.members()
            expired = self._expired_now = self._expired(members, now)
            for claim, commit, member in list(self._releasing.values()):
                self._finish_release(claim, commit, member)
            wanted = self._assignment(topics, [m for m in members if m.id not in expired])
            for claim in self._revoke([claim for key, claim in self._owned.items() if key not in wanted]):
                self._release(claim, commit=self.auto_commit)
            to_claim: dict[str, list[int]] = {}
            for topic, partition in sorted(wanted - self._owned.keys() - self._releasing.keys()):
                to_claim.setdefault(topic, []).append(partition)
            try:
                for topic, partitions in to_claim.items():
                    self._claim(topic, partitions, expired)
            finally:  # those taken before a failure are read from now on too
                self._assigned()
            self._settled = wanted == self._owned.keys()
            if self.auto_commit and now - self._committed_at >= self.auto_commit_interval:
                self._auto_commit()

    def _assigned(self) -> None:
        """``on_assign`` of the partitions claimed since the last call; then their streams read them."""
        assigned = [claim for claim in self._owned.values() if claim.assigning]
        self._call(self.on_assign, assigned)
        for claim in assigned:
            claim.assigning = False

    def _revoke(self, claims: list[_Claim]) -> list[_Claim]:
        """Before ``claims`` are given up: with ``on_revoke``, their final auto-commit (else
        their release commits), then ``on_revoke``; returns those still owned after."""
        told = [c for c in claims if not c.assigning]  # (on_assign is always called first)
        if self.on_revoke is None or not told:
            return claims
        due = {}
        for c in told if self.auto_commit else []:
            with c.stream._lock:
                if not c.blocked and c.consumed != c.committed:
                    due[c.topic, c.partition] = (c, c.consumed)
        try:
            if due:
                self._commit("consumed", raise_lost=False, offsets=due)  # what found its lock held: the release commits it
        except KlError as e:
            log.warning("group %s: not committed before the revoke: %s", self.group, e)
        self._call(self.on_revoke, [c for c in told if self._owned.get((c.topic, c.partition)) is c])
        return [c for c in claims if self._owned.get((c.topic, c.partition)) is c]

    def _call(self, callback: OnRebalance | None, claims: list[_Claim]) -> None:
        """``callback(self, partitions)`` of ``claims``, if any; what it raises is logged."""
        if callback is None or not claims:
            return
        try:
            callback(self, sorted((c.topic, c.partition) for c in claims))
        except Exception:
            log.exception("group %s: %s raised (the member goes on)", self.group, getattr(callback, "__name__", callback))

    def _claim(self, topic: str, partitions: list[int], expired: dict[str, int]) -> None:
        """Claim the partitions of ``topic`` (``_unless_busy`` each, all in one go) and take
        those it got; those whose lock was held are tried again next poll."""
        assert self._registration is not None
        me = self._registration.member.id
        forced = functools.partial(self._forced, topic)
        outcomes = list(zip(partitions, self.registry.claim_many(topic, partitions, me, expired, force=forced), strict=True))
        for i, (partition, outcome) in enumerate(outcomes):
            if isinstance(outcome, LockTimeout):
                self._note_busy(topic, partition, outcome)
                continue
            self._busy.pop((topic, partition), None)
            if outcome is not None:
                try:
                    self._take(topic, partition, outcome)
                except BaseException:
                    for p, generation in outcomes[i:]:  # claimed, not taken: let them go again
                        if isinstance(generation, int):
                            with contextlib.suppress(KlError):  # else they lapse with this member
                                self.registry.release(topic, p, me, generation)
                    raise

    def _auto_commit(self) -> None:
        if self._commit("consumed", raise_lost=False):
            self._committed_at = 0.0  # a lock was held: tried again next poll

    def _expired(self, members: list[Member], now: float) -> dict[str, int]:
        """Members whose heartbeat has not moved for ``session_timeout``: id -> that heartbeat.

        ``now`` was taken before ``members`` was read; a heartbeat seen moved counts from
        after the read.  (Counted from ``now``, a member stopped between the two, SIGSTOP or
        a hung host, would count the time it stood still against the others: on waking, its
        next poll, at once, would expire every member that had not beaten again since the
        read, and take their partitions.)"""
        seen = {}
        read = time.monotonic()
        for m in members:
            last = self._seen.get(m.id)
            seen[m.id] = last if last is not None and last[0] == m.beat else (m.beat, read)
        self._seen = seen
        me = self.member_id
        return {mid: beat for mid, (beat, since) in seen.items() if mid != me and now - since > self.session_timeout}

    def _unless_busy(self, topic: str, partition: int, action: Callable[..., T]) -> T:
        """``action(force=...)`` on the partition: raises ``LockTimeout`` (logged once)
        while another process holds its lock, unless that holder is taken for a stopped
        one: while a member is expired, or once the lock was held for the session timeout."""
        try:
            result = action(force=self._forced(topic, partition))
        except LockTimeout as e:
            self._note_busy(topic, partition, e)
            raise
        self._busy.pop((topic, partition), None)
        return result

    def _forced(self, topic: str, partition: int) -> bool:
        """Whether an action on the partition goes on without its lock (see ``_unless_busy``)."""
        since = self._busy.get((topic, partition))
        return bool(self._expired_now) or (since is not None and time.monotonic() - since > self.session_timeout)

    def _note_busy(self, topic: str, partition: int, error: LockTimeout) -> None:
        """The partition's lock was found held: from when (logged the first time)."""
        if (topic, partition) not in self._busy:
            self._busy[topic, partition] = time.monotonic()
            log.warning("group %s: %s; trying again", self.group, error)

    def _assignment(self, topics: list[str], live: list[Member]) -> set[tuple[str, int]]:
        """SPEC §10's range assignment of every subscribed topic among ``live``."""
        assert self._registration is not None and self._subscription is not None
        me = self._registration.member.id
        wanted: set[tuple[str, int]] = set()
        self._first_looks.clear()
        for topic in topics:
            if not subscribes(self._subscription, topic) or self._created_again(topic):
                continue
            try:
                count = self.root.config(topic).partitions
                self._first_counts.setdefault(topic, count)
                for p in range(count):
                    if (topic, p) not in self._ends:
                        state = self._first_looks[topic, p] = self.root.log(topic, p).state()
                        self._ends[topic, p] = state.log_end_offset
            except (TopicNotFound, CorruptState):
                continue
            ids = sorted({m.id for m in live if m.subscribes(topic)} | {me})
            per, extra = divmod(count, len(ids))
            i = ids.index(me)
            first = i * per + min(i, extra)
            wanted.update((topic, p) for p in range(first, first + per + (i < extra)))
        return wanted

    def _take(self, topic: str, partition: int, generation: int) -> None:
        log_ = self.root.log(topic, partition)
        state = self._first_looks.pop((topic, partition), None) or log_.state()
        end = self._ends[topic, partition]
        topic_id = self._topic_ids.get(topic) or self._topic_id(topic) or ""
        added = partition >= self._first_counts.get(topic, partition + 1)
        at = Position(state.log_start_offset if self.start == "earliest" or added else state.log_end_offset)
        claim = _Claim(topic, partition, generation, topic_id, at, at, at, None, end, self._route(topic, partition), log_)
        where = f"group {self.group}: the committed offset of {topic}/{partition}"
        try:
            committed = self.registry.committed(topic, partition)
        except CorruptOffset as e:
            committed = None
            if self.reset == "fail":
                claim.error, claim.blocked = e, True
            else:
                kept = self.registry.set_aside(topic, partition)
                at = Position(state.log_start_offset if self.reset == "earliest" else state.log_end_offset)
                log.warning(
                    "%s: %s is damaged (%s), kept as %s; going on from the %s offset %d",
                    where,
                    e.path,
                    e.reason,
                    kept,
                    self.reset,
                    at.offset,
                )
        if committed is not None and not same_creation(committed.topic_id, topic_id):
            log.warning(
                "%s is of a topic %s deleted and created again since (id %s, now %s): it counts as never committed;"
                " starting at the %s offset %d",
                where,
                topic,
                committed.topic_id,
                topic_id,
                self.start,
                at.offset,
            )
        elif committed is not None:
            claim.committed = at = committed.position
            if not state.log_start_offset <= at.offset <= state.log_end_offset:
                error = OffsetOutOfRange(
                    f"{where} ({at}) is outside the log ({state.log_start_offset} to {state.log_end_offset})",
                    offset=at.offset,
                    log_start_offset=state.log_start_offset,
                    log_end_offset=state.log_end_offset,
                )
                at = Position(self._reset_position(claim, error, blocks=True))
        claim.position = claim.handed = claim.consumed = at
        self._owned[topic, partition] = claim
        claim.stream._add(claim)

    def _reset_position(self, claim: _Claim, error: OffsetOutOfRange, *, blocks: bool = False) -> int:
        """Where ``reset`` goes on after ``error``; with "fail" the claim raises it from now
        on (and, with ``blocks``, as its committed offset is unusable, commits nothing)."""
        if self.reset == "fail":
            claim.error, claim.blocked = error, blocks
            return claim.position.offset
        to = error.log_start_offset if self.reset == "earliest" else error.log_end_offset
        log.warning("%s; going on from the %s offset %d", error, self.reset, to)
        return to

    def _cursor(self, claim: _Claim) -> Cursor:
        """A cursor at ``claim``'s position, with this member's ``reset`` and ``skip_corrupt``."""
        return Cursor(
            self.root.log(claim.topic, claim.partition),
            claim.position,
            reset=cast(ResetPolicy, self.reset),  # checked by __init__
            skip_corrupt=self.skip_corrupt,
            on_skip=skip_report(claim.topic, claim.partition),
            on_loss=lambda error, to: self._going_on(claim.topic, error, to),
        )

    def _going_on(self, topic: str, error: OffsetOutOfRange, to: int) -> None:
        """A cursor's ``on_loss``: log that it goes on at ``to``; raise ``error`` where the
        topic is another one now (the coordinator starts it afresh)."""
        if self._recreated(topic):
            raise error
        log.warning("%s; going on from the %s offset %d", error, self.reset, to)

    def _damaged(self, claim: _Claim, cursor: Cursor, damage: CorruptMessage) -> None:
        try:
            cursor.damaged(damage)
        except CorruptMessage as e:
            claim.error = e
        claim.position = cursor.position

    def _drop(self, claim: _Claim, lost: str | None = None) -> None:
        """Stop reading ``claim``'s partition and forget it, reporting it ``lost`` if given why."""
        claim.stream._remove(claim)
        del self._owned[claim.topic, claim.partition]
        if lost is not None:
            self._lost(claim, lost)

    def _release(self, claim: _Claim, *, commit: bool) -> None:
        """Stop reading ``claim``'s partition and give it up (finished by a later poll
        when its lock is held)."""
        self._drop(claim)
        assert self._registration is not None
        me = self._registration.member.id
        self._releasing[claim.topic, claim.partition] = (claim, commit, me)
        self._finish_release(claim, commit, me)

    def _finish_release(self, claim: _Claim, commit: bool, me: str) -> None:
        topic, partition = claim.topic, claim.partition
        try:
            if commit and not claim.blocked and claim.consumed != claim.committed:
                store = functools.partial(
                    self.registry.commit, topic, partition, claim.consumed, me, claim.generation, claim.topic_id
                )
                self._unless_busy(topic, partition, store)
                claim.committed = claim.consumed
            release = functools.partial(self.registry.release, topic, partition, me, claim.generation)
            self._unless_busy(topic, partition, release)
        except LockTimeout:
            return  # tried again next poll
        except NotOwner as e:
            self._lost(claim, str(e))
        del self._releasing[topic, partition]

    def _topic_id(self, topic: str) -> str | None:
        """What tells this creation of ``topic`` from another: its topic id (read now)."""
        try:
            return self.root.topic_id(topic)
        except KlError:
            return None

    def _recreated(self, topic: str) -> bool:
        """For a stream: ``topic`` is gone or another one since the coordinator last looked."""
        known = self._topic_ids.get(topic)
        return known is not None and self._topic_id(topic) != known

    def _created_again(self, topic: str) -> bool:
        """Whether ``topic`` was deleted and created again since the last look (its topic
        id changed); if so, forget it, ``on_revoke`` the partitions this member owned, drop
        their committed offsets and let them go, so the next rebalance claims the new ones
        afresh (and calls ``on_assign`` of them).
        (Messages read of the new topic before this was seen come again.)"""
        ident = self._topic_id(topic)
        if ident is None or self._topic_ids.setdefault(topic, ident) == ident:
            return False
        self._topic_ids[topic] = ident
        assert self._registration is not None
        owned = [c for c in self._owned.values() if c.topic == topic]
        self._call(self.on_revoke, [c for c in owned if not c.assigning])  # their partitions are gone
        for claim in owned:
            try:  # its offsets are the old topic's: the new one starts at ``start``
                self.registry.delete_offset(topic, claim.partition, self._registration.member.id, claim.generation)
            except NotOwner as e:
                self._drop(claim, str(e))
                continue
            except LockTimeout:
                pass  # left: an offset naming the old topic id counts as never committed anyway
            self._release(claim, commit=False)
        self.root.forget(topic)
        self._first_counts.pop(topic, None)
        for key in [key for key in self._ends if key[0] == topic]:
            del self._ends[key]
        return True

    def _rejoin(self, why: str) -> None:
        """Give every partition up (committing what was consumed where this member still
        owns it) and join again as a new member."""
        assert self._registration is not None and self._subscription is not None
        log.warning("group %s: member %s joins again: %s", self.group, self._registration.member.id, why)
        for claim in self._revoke(list(self._owned.values())):
            try:
                self._release(claim, commit=self.auto_commit)
            except KlError as e:
                self._lost(claim, f"{why}; {e}")
        with contextlib.suppress(OSError):
            self._registration.close()
        self._registration = self.registry.register(self._subscription)

    def _validate(self) -> None:
        """After a late heartbeat: drop what other members took meanwhile."""
        assert self._registration is not None
        me = self._registration.member.id
        for claim in list(self._owned.values()):
            try:
                owns = self.registry.owns(claim.topic, claim.partition, me, claim.generation)
            except LockTimeout as e:  # claimed again (from the committed offset) if it is still this member's
                self._drop(claim, f"after {self.session_timeout:g}s without a heartbeat its ownership cannot be checked: {e}")
                continue
            if not owns:
                self._drop(claim, f"taken over while this member was expired ({self.session_timeout:g}s without a heartbeat)")

    def _commit_all(
        self,
        which: Literal["handed", "consumed"],
        *,
        raise_lost: bool,
        offsets: dict[TopicPartition, tuple[_Claim, Position]] | None = None,
    ) -> None:
        """``_commit``, again every poll interval while locks are held (not holding up the
        coordinator meanwhile), for up to the session timeout; then ``LockTimeout``."""
        deadline = time.monotonic() + self.session_timeout
        while True:
            busy = self._commit(which, raise_lost=raise_lost, offsets=offsets)
            if not busy:
                return
            if time.monotonic() >= deadline:
                error = LockTimeout("; ".join(map(str, busy)))
                if raise_lost:
                    raise error
                log.warning("group %s: not committed: %s", self.group, error)
                return
            time.sleep(self.poll_interval)

    def _commit(
        self,
        which: Literal["handed", "consumed"],
        *,
        raise_lost: bool,
        offsets: dict[TopicPartition, tuple[_Claim, Position]] | None = None,
    ) -> list[LockTimeout]:
        """Commit every partition's offset, or those of ``offsets`` (each stored one is
        taken out of it); what found its lock held is returned (tried again by the caller)."""
        assert self._registration is not None
        me = self._registration.member.id
        rejected = []
        busy = []
        with self._lock:
            due: list[tuple[_Claim, Position]] = []
            if offsets is not None:
                for claim, offset in offsets.values():
                    if self._owned.get((claim.topic, claim.partition)) is not claim:
                        rejected.append(NotOwner(f"{claim.topic}/{claim.partition} was taken from this member meanwhile"))
                    else:
                        due.append((claim, offset))
                offsets.clear()
            else:
                self._committed_at, self._to_commit = time.monotonic(), False
            for claim in list(self._owned.values()) if offsets is None else []:
                with claim.stream._lock:
                    if which == "handed":  # all handed out is processed: auto-commit must not go back before it
                        claim.consumed = claim.handed
                    offset = claim.consumed
                if not claim.blocked and offset != claim.committed:
                    due.append((claim, offset))
            commits = [
                Commit(c.topic, c.partition, at, me, c.generation, c.topic_id, self._forced(c.topic, c.partition))
                for c, at in due
            ]
            for (claim, offset), outcome in zip(due, self.registry.commit_many(commits), strict=True):  # durable together
                if outcome is None:
                    self._busy.pop((claim.topic, claim.partition), None)
                    claim.committed = offset
                    if offsets is not None:  # what the caller stored stands: a release commits nothing over it
                        with claim.stream._lock:
                            claim.consumed = offset
                elif isinstance(outcome, LockTimeout):
                    self._note_busy(claim.topic, claim.partition, outcome)
                    busy.append(outcome)
                    if offsets is not None:
                        offsets[claim.topic, claim.partition] = (claim, offset)
                else:
                    self._drop(claim, str(outcome))
                    rejected.append(outcome)
        if rejected and raise_lost:
            raise NotOwner("; ".join(map(str, rejected)))
        return busy

    def _lost(self, claim: _Claim, why: str) -> None:
        log.warning("group %s lost %s/%d: %s", self.group, claim.topic, claim.partition, why)
        if self.on_lost is not None:
            self.on_lost(claim.topic, claim.partition, why)


Piece = tuple["list[Message] | list[bytes | None]", Position]
"""Some messages (or values) of one fetch, and where to resume after them."""


def read_from(
    cursor: Cursor, max_bytes: int, values_only: bool, limit: int | None, piece_bytes: int | None = None
) -> tuple[list[Piece], CorruptMessage | None]:
    """``Cursor.read``: the messages of one fetch (at most ``limit``) in pieces that hold
    about ``piece_bytes`` of values and keys each (a compressed batch is cut inside; one
    piece if None), each with where to resume after it, and the damage that ended them early."""
    start = cursor.position
    if values_only and limit is None and not start.skip:  # whole batches: the fast path
        runs, damage = cursor.read_with(max_bytes, lambda found: (_value_pieces(found, piece_bytes), found.next_offset))
        return runs or [], damage
    got, damage = cursor.read(max_bytes, limit=limit)
    messages = cast("list[Message]", got)
    pieces: list[Piece] = []
    position, piece, size = start, cast("list[Message]", []), 0
    for i, message in enumerate(messages):
        position = advance(position, message)
        piece.append(message)
        if piece_bytes is not None:
            size += len(message.value or b"") + len(message.key or b"")
            if size >= piece_bytes and i + 1 < len(messages):
                pieces.append((piece, position))
                piece, size = [], 0
    if piece:
        pieces.append((piece, cursor.position))
    if values_only:
        return [([msg.value for msg in cast("list[Message]", part)], end) for part, end in pieces], damage
    return pieces, damage


def _value_pieces(found: MessageSet, piece_bytes: int | None) -> list[Piece]:
    """The values of a fetch in pieces of about ``piece_bytes`` of values each (a
    compressed batch is cut inside; one piece if None), each with where it ends."""
    pieces: list[Piece] = []
    out: list[bytes | None] = []
    size = 0
    for values, at, end, stored in found.runs():
        if piece_bytes is None:
            out += values
            continue
        weight = sum(map(len, filter(None, values))) if stored else end - at  # a plain run's bytes: no less
        if stored and len(values) > 1 and size + weight >= piece_bytes:
            first = 0  # a compressed batch that ends the piece: cut inside, its values all at its offset
            for i in range(len(values) - 1):
                size += len(values[i] or b"")
                if size >= piece_bytes:
                    pieces.append(([*out, *values[first : i + 1]], Position(found.offset + at, i + 1)))
                    out, size, first = [], 0, i + 1
            out += values[first:]
            size += len(values[-1] or b"")
        else:
            out += values
            size += weight
        if size >= piece_bytes and out:
            pieces.append((out, Position(found.offset + end)))
            out, size = [], 0
    if out:
        pieces.append((out, Position(found.next_offset)))
    elif pieces:  # past padding after the last message too
        pieces[-1] = (pieces[-1][0], Position(found.next_offset))
    return pieces


def _position(at: object) -> Position:
    """A caller's position: a ``Position`` or a byte offset."""
    if isinstance(at, Position):
        return at
    if isinstance(at, int) and not isinstance(at, bool) and at >= 0:
        return Position(at)
    raise InvalidConfig(f"a position must be a byte offset (an int >= 0) or a kl.Position, not {at!r}")


def _subscription(topics: list[str] | None, pattern: str | None, exclude: str | None) -> dict[str, object]:
    if (topics is None) == (pattern is None):
        raise InvalidConfig("subscribe with topics or with a pattern (one of the two)")
    if topics is not None:
        if not topics:
            raise InvalidConfig("no topics to subscribe to")
        return {"topics": [validate_name(t) for t in topics]}
    for regex in (pattern, exclude):
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as e:
                raise InvalidConfig(f"bad topic pattern {regex!r}: {e}") from None
    return {"pattern": pattern, "exclude": exclude}
