"""Producers: partition, frame and append messages.

``send`` appends one message and returns once it is published (and, with
``fsync=True``, durable).  ``send_batch`` frames many messages in bulk and appends them
per partition in chunks of at most ``batch_bytes``; each chunk is one atomic append.

Async mode (Kafka's ``producer.type=async``): ``Producer(root, linger_ms=5)`` makes
``send`` only queue the message in memory and return at once.  A background thread, one
per producer, takes everything queued every ``linger_ms`` milliseconds, or as soon as
``batch_size`` messages are waiting, and appends it per topic and partition through the
same framing, compression and size checks as ``send_batch``.  Order holds per partition:
messages sent by one thread to one partition land in the order they were sent.  Messages
without a key or partition go to one partition per round of the thread, chosen by the
partitioner (keys go to their key's partition); messages without a timestamp are stamped
when the thread takes them.  ``send(..., on_delivery=fn)`` has ``fn(None, appended)`` or
``fn(error, None)`` called (confluent-kafka's order) on that thread once the message is
appended (``appended`` holds its own offsets, or those of the compressed batch holding
it) or has failed; the older ``callback=fn``, ``fn(appended, error)``, still works and
warns (``DeprecationWarning``, once per call site).  An error nobody was told of (no
callback) is raised by the next ``flush()`` or
``close()``.  The queue holds at most ``queue_size`` messages: ``send`` then waits for
room, up to ``queue_timeout`` seconds, and raises ``QueueFull``.  ``flush()`` waits for
everything queued before it to be appended, then fsyncs; ``close()`` also stops the
thread, after which ``send`` raises ``ProducerClosed``; a normal interpreter exit sends
what is still queued.  A killed process loses what it had queued and not yet appended,
never more, and never leaves a torn message.  After ``os.fork()`` the child starts with
an empty queue (the parent's queued messages are the parent's to send) and starts its
own thread on its first send.  ``send_batch`` stays synchronous: it appends at once,
ahead of what is queued.  The thread lives until ``close()``: close a producer you are
done with (or use ``with``).

The fast lane: a ``send`` costs one append to a list.  A message is queued as a tuple of
its fields; but the first thread to send (the owner) queues a plain message (no key,
timestamp or callback) going where its previous plain one went as its bare value, with no
tuple made: the thread sends it where the last plain message (a ``_Header``) before it
went.  Other threads always queue tuples and never headers, so nothing can come between a
header and its values.  This cuts what a send costs by about a fifth, and its garbage.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import operator
import os
import random
import threading
import time
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from kl.errors import (
    FormatMismatch,
    InvalidConfig,
    InvalidTimestamp,
    MessageTooLarge,
    ProducerClosed,
    QueueFull,
    TopicNotFound,
)
from kl.log import core, openfiles
from kl.log import message as m
from kl.log.config import TopicConfig
from kl.log.log import Log
from kl.log.messageset import frame, frame_v1, wrap, wrap_v1
from kl.log.pycore import chunks
from kl.log.validate import Checked
from kl.serde import Serializer, serialize
from kl.topic import Root

Partitioner = Callable[[bytes | None, int], int]
"""(key, number of partitions) -> partition."""

DEFAULT_BATCH_BYTES = 256 << 10
"""The largest append (keyless batches turn to the next partition after each)."""
DEFAULT_BATCH_SIZE = 1000
"""Async mode: queued messages that wake the background thread before ``linger_ms``."""
DEFAULT_QUEUE_SIZE = 100_000
"""Async mode: queued messages beyond which ``send`` waits for room."""

MAX_ATOMIC_PARTITIONS = 256
"""The most partitions one batch appends to at once (``atomic_partitions``)."""

log = logging.getLogger(__name__)


def atomic_partitions() -> int:
    """How many partitions a keyed ``send_batch`` may touch and still go in all at once
    (it holds their locks and files open together: a share of ``openfiles.budget``)."""
    return max(1, min(MAX_ATOMIC_PARTITIONS, openfiles.budget() // 8))


def hash_partitioner(key: bytes | None, partitions: int) -> int:
    """CRC32 of the key modulo the partition count (stable across processes, hosts and
    Python versions; librdkafka's default); a random partition when there is no key."""
    if key is None:
        return random.randrange(partitions)
    return zlib.crc32(key) % partitions


def murmur2_partitioner(key: bytes | None, partitions: int) -> int:
    """murmur2 of the key, its sign bit cleared, modulo the partition count: the Java
    client's default for keys (and kafka-python's); a random partition when there is no key."""
    if key is None:
        return random.randrange(partitions)
    return (core.murmur2(key) & 0x7FFFFFFF) % partitions


PARTITIONER_OF: dict[str, Partitioner] = {"crc32": hash_partitioner, "murmur2": murmur2_partitioner}
"""The partitioner of each value of a topic's ``partitioner`` setting."""


class Appended(NamedTuple):
    """Where one append landed: ``count`` messages from ``offset`` to ``next_offset``."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    count: int  # type: ignore[assignment]  # the messages appended; shadows tuple.count, as the seed named it


Callback = Callable[[Appended | None, BaseException | None], object]
"""Async mode: called with (where the message landed, None) or (None, the error)."""

OnDelivery = Callable[[BaseException | None, Appended | None], object]
"""Called with (None, where the message landed) or (the error, None), as confluent-kafka does."""

_Item = tuple[str, bytes | None, bytes | None, int | None, int | None, Callback | None, m.Headers]
"""A queued message: topic, value, key, partition, timestamp, callback, headers."""
_TOPIC, _VALUE, _KEY, _PARTITION, _TIMESTAMP, _CALLBACK, _HEADERS = (operator.itemgetter(i) for i in range(7))
_NONE = {None}
_Group = tuple[list[bytes | None], list[bytes | None], list[m.Headers] | None]
"""One partition's part of a keyed batch: values, keys, headers."""


class Producer:
    """Sends messages to topics under a root.  Safe to share between threads and processes.

    ``compression`` is ``"zstd"``, ``"gzip"`` or None; ``fsync`` makes every append durable
    before it is acknowledged; ``partitioner`` (default: each topic's ``partitioner``
    setting, :func:`hash_partitioner` or :func:`murmur2_partitioner`) gives keys partitions.

    ``linger_ms`` (None: synchronous) turns on async mode (see the module docstring):
    ``send`` queues and returns None, and a background thread appends the queue every
    ``linger_ms`` or once ``batch_size`` messages wait; ``send`` waits up to
    ``queue_timeout`` seconds (None: as long as it takes, 0: not at all) while
    ``queue_size`` messages are queued, then raises ``QueueFull``.  Callbacks run on that
    thread and must not wait for it: ``flush`` and ``close`` there raise RuntimeError, and
    a ``send`` there never waits for room.

    ``key_serializer`` and ``value_serializer`` (see :mod:`kl.serde`) turn what ``send``
    and ``send_batch`` are given into bytes; without one, a key or value must be bytes
    (``TypeError`` naming the fix, raised by ``send`` before anything is queued).  None is
    never serialized: it stays a null value.  Header values are not serialized (bytes or None).
    """

    def __init__(
        self,
        root: Root | str | os.PathLike[str],
        *,
        compression: str | None = None,
        fsync: bool = False,
        partitioner: Partitioner | None = None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        linger_ms: float | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        queue_timeout: float | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
    ):
        self.root = Root(root) if isinstance(root, (str, os.PathLike)) else root
        if compression not in (None, *m.CODECS):
            raise InvalidConfig(f"unknown compression {compression!r}: use zstd, gzip or none")
        if linger_ms is not None and not linger_ms >= 0:
            raise InvalidConfig(f"linger_ms must be 0 or more, not {linger_ms!r}")
        if not 1 <= batch_size <= queue_size:
            raise InvalidConfig(f"need 1 <= batch_size <= queue_size, not batch_size {batch_size} and queue_size {queue_size}")
        if queue_timeout is not None and not queue_timeout >= 0:
            raise InvalidConfig(f"queue_timeout must be 0 or more (or None), not {queue_timeout!r}")
        self.codec = m.CODECS[compression or "none"]
        self.fsync = fsync
        self.partitioner = partitioner
        self.batch_bytes = batch_bytes
        self.key_serializer = key_serializer
        self.value_serializer = value_serializer
        self._serializing = key_serializer is not None or value_serializer is not None
        self._written: set[Log] = set()
        """The logs appended to since the last flush (none with ``fsync``: nothing to flush)."""
        self._used: set[Log] = set()
        """The logs appended to since ``close``, whose files it closes."""
        self._guard = threading.Lock()
        self.linger_ms = linger_ms
        self.batch_size = batch_size
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self._rooms: dict[str, int] = {}
        """Async mode: topic -> the largest value without a key that needs no size check."""

        self._closed = False
        self._reset()
        if linger_ms is not None:
            _async_producers.add(self)

    def _reset(self) -> None:
        """Async mode's state, fresh (at start, and in a forked child)."""
        self._queue: list[_Item | bytes] = []
        """Appended to by send() without a lock; cut from the front by the thread under ``_cond``."""
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lane = core.Lane(self._queue, self._slow, Producer.send.__get__(self))
        """send() in async mode, with its state (kl.log.pycore.Lane): its ``owner`` is the
        thread that may queue bare values, the first one to send (fixed, so that no other
        thread's message can come between its header and its values); it is aimed at the
        topic and partition of the owner's last header, where its next plain sends go as
        bare values; it calls ``_slow`` once more than ``wake_at`` messages are queued: -1
        before the thread runs, 0 while it idles, ``batch_size - 1`` while it lingers,
        then ``queue_size`` until the thread takes the queue."""
        lane_fits = type(self).send is Producer.send and not self._serializing  # not over a subclass's send; bytes as given
        if self.linger_ms is not None and lane_fits:
            self.send = self._lane.send  # type: ignore[method-assign,assignment]  # the compiled core's: no Python frame
        self._woken = False
        self._closing = False
        self._rounds_started = self._rounds_done = 0
        self._error: BaseException | None = None
        self._header: _Item | None = None
        """The background thread's: the last header taken; bare values go where it went."""

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        callback: Callback | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
        on_delivery: OnDelivery | None = None,
    ) -> Appended | None:
        """Append one message; returns where it landed (None in async mode, which only
        queues it).  ``on_delivery``, if given, is called with (None, where it landed) or
        (the error, None) once it is appended or has failed; in sync mode before this
        returns (and the error is raised too).  ``callback`` is the deprecated form,
        called with (where it landed, None) or (None, the error); not both.
        ``key`` and ``value`` go through the producer's serializers (``TypeError`` at
        once for what is not bytes without one).

        ``headers`` are (key, value) pairs, keys ``str`` (stored as UTF-8) and values
        bytes or None; a ``value`` of None is a null value (a tombstone).  Either needs a
        topic with the ``headers`` setting (``FormatMismatch`` names the fix), and bad
        headers raise ``InvalidHeaders``.

        A topic deleted and created again while this producer lives is looked up afresh
        (its partitions and limits may have changed): the send goes to the new topic.
        Async mode raises at once ``MessageTooLarge`` (as the topic's limit was when
        first sent to), ``TopicNotFound`` for a topic not sent to before, ``QueueFull``
        and ``ProducerClosed``; other errors come later (see the module docstring).
        """
        if self._serializing or type(value) is not bytes or (key is not None and type(key) is not bytes):
            value, key = serialize(self.value_serializer, value, "value"), serialize(self.key_serializer, key, "key")
        if on_delivery is not None:
            if callback is not None:
                raise TypeError("send() takes on_delivery= or callback=, not both: pass on_delivery= alone")
            callback = _error_first(on_delivery)
        elif callback is not None:
            deprecated = "send(callback=fn) is deprecated: pass on_delivery=fn, called fn(error, appended)"
            warnings.warn(deprecated, DeprecationWarning, stacklevel=2)
        if timestamp is not None:
            _check_timestamp(timestamp)
        headers = _headers(headers) if headers else ()
        if self.linger_ms is None:
            return self._send_now(topic, value, key, partition, timestamp, callback, headers)
        # async mode, past the lane (the plain sends of its owner to where it is aimed)
        special = bool(headers) or value is None
        if special or len(value) > self._rooms.get(topic, -1) or key is not None or timestamp is not None:  # type: ignore[arg-type]
            self._admit(topic, m.framed_size(value, key, headers), key is not None, timestamp is not None, special)
        lane = self._lane
        me = threading.get_ident()
        plain = key is None and timestamp is None and callback is None and not special and lane.owner in (None, me)
        if plain and lane.owner is None:
            with self._cond:
                if lane.owner is None:
                    lane.owner = me
            plain = lane.owner == me
        item: _Item = (topic, value, key, partition, timestamp, callback, headers)
        if plain:
            item = _Header(item)
        queue = self._queue
        queue.append(item)
        if len(queue) > lane.wake_at:
            self._slow(item)
        if plain:
            lane.aim(topic, partition, self._rooms.get(topic, -1))
        return None

    def _send_now(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        timestamp: int | None,
        callback: Callback | None,
        headers: m.Headers,
    ) -> Appended:
        try:
            try:
                appended = self._send(topic, value, key, partition, timestamp, headers)
            except TopicNotFound:
                if not self._refreshed(topic):
                    raise
                appended = self._send(topic, value, key, partition, timestamp, headers)
        except Exception as e:
            if callback is not None:
                _call(callback, None, e)
            raise
        if callback is not None:
            _call(callback, appended, None)
        return appended

    def _send(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int | None, timestamp: int | None, headers: m.Headers
    ) -> Appended:
        if partition is None:
            partition = self._partition(topic, key)
        log = self.root.log(topic, partition)
        ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
        config = log.config
        if headers or value is None:
            self._check_headers(topic, config)
            data = m.encode(value, key, ts, m.CODEC_NONE, headers)
        elif config.legacy:
            _raise(self._mismatch(topic, config, key is not None, timestamp is not None))
            data = m.encode_v1(value)
        elif key is None and type(value) is bytes and len(value) <= config.max_message_bytes and core.NAME == "compiled":
            data = core.frame((value,), ts)  # m.encode's bytes in one C call (the pure core's frame is slower)
        else:
            data = m.encode(value, key, ts)
        size = len(data)
        if size > config.max_message_bytes:
            self._check_size(topic, size)
        if self.codec:
            offset, size, _ = self._put(log, data, 1, ts, config.max_message_bytes)
        else:  # _put without compression, one call less
            offset = log.append(tuple.__new__(Checked, (data, 1)), fsync=self.fsync)  # Checked.framed(data, 1), inline
            if log not in self._written:
                self._note(log)
        return tuple.__new__(Appended, (topic, partition, offset, offset + size, 1))  # Appended(...) without its frame

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
    ) -> list[Appended]:
        """Append many messages, in appends of up to ``batch_bytes``.

        With keys (and no ``partition``) each message goes to its key's partition.
        Without, the appends go to ``partition``, or else in turn to every partition,
        starting from the one the partitioner picks.  Every message is checked against
        the topic's size limit before any is written.  A topic of format 0.7 takes no
        keys, no timestamp and no zstd (``FormatMismatch``).  A timestamp outside the
        years 1 to 9999 raises ``InvalidTimestamp`` (see ``message.MIN_TIMESTAMP``).
        ``headers``, one entry per message as ``keys``, and null values (None) need a
        topic with the ``headers`` setting (see ``send``).  Keys and values go through
        the producer's serializers, all before any is appended.
        """
        if self._serializing:
            values = [serialize(self.value_serializer, value, "value") for value in values]
            keys = None if keys is None else [serialize(self.key_serializer, key, "key") for key in keys]
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(values)} values but {len(keys)} keys")
        if headers is not None and len(headers) != len(values):
            raise ValueError(f"{len(values)} values but {len(headers)} headers")
        if not values:
            return []
        if timestamp is not None:
            _check_timestamp(timestamp)
        hs = None if headers is None else [_headers(h) for h in headers]
        if hs is not None and not any(hs):
            hs = None
        ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
        config = self.root.config(topic)
        sizes, special = _measure(values, keys, hs)
        if special:  # headers, or a null value
            self._check_headers(topic, config)
            hs = hs or [()] * len(values)  # framed one by one (message.encode)
        if config.legacy:
            _raise(self._mismatch(topic, config, keys is not None and keys.count(None) != len(keys), timestamp is not None))
        if keys is not None and partition is None:
            groups = self._group(topic, values, keys, hs)
            for vals, ks, h in groups.values():
                self._check_batch(topic, vals, ks, h)
            if 1 < len(groups) <= atomic_partitions() and self._fits_one_append(topic, groups):
                return self._append_at_once(topic, groups, ts, values, keys, timestamp, hs)
            return [
                a for p, (vals, ks, h) in groups.items() for a in self._append(topic, itertools.repeat(p), vals, ks, ts, None, h)
            ]
        self._check_size(topic, max(sizes) + m.HEADER_SIZE)
        return self._append(topic, self._targets(topic, partition), values, keys, ts, partition, hs)

    def send_records(
        self,
        topic: str,
        data: bytes,
        delimiter: bytes = b"\n",
        *,
        keep_delimiter: bool = False,
        partition: int | None = None,
        first: int | None = None,
        max_records: int = 0,
    ) -> tuple[list[Appended], int]:
        """Append the records of ``data``, each ended by ``delimiter`` (kept at the end of
        its value with ``keep_delimiter``), as messages without a key, in appends of up to
        ``batch_bytes`` and ``max_records`` messages (0: any number): split and framed in
        one pass of the core, with no Python object per record.

        The appends go to ``partition``, or else in turn to every partition from ``first``
        (default: the one the partitioner picks).  Returns the appends and how many bytes
        of ``data`` they took: an unterminated rest is left, and so is a record too large
        for the topic and everything after it (``send_batch`` of that record alone raises
        ``MessageTooLarge``).  A topic of format 0.7 has its records framed as magic 1.
        The records are bytes as they are: the producer's serializers do not apply.
        """
        config = self.root.config(topic)
        keep = delimiter if keep_delimiter else b""
        ts = time.time_ns() // 1_000_000
        targets = self._targets(topic, partition, first)
        if config.legacy:  # magic 1: split here, and frame as send_batch does
            _raise(self._mismatch(topic, config, False, False))
            end = data.rfind(delimiter) + len(delimiter) if delimiter in data else 0
            values = [value + keep for value in data[:end].split(delimiter)[:-1]]
            limit = config.max_message_bytes - m.HEADER_SIZE  # as send_batch checks
            fits = next((i for i, value in enumerate(values) if len(value) > limit), len(values))
            if fits < len(values):
                end = sum(len(value) + len(delimiter) - len(keep) for value in values[:fits])
                values = values[:fits]
            return (self._append(topic, targets, values, None, ts, partition) if values else []), end
        pieces, stop, _ = core.frame_records(
            data, 0, delimiter, keep_delimiter, ts, config.max_message_bytes, self._chunk_limit(config), max_records
        )
        out: list[Appended] = []
        start = 0
        for framed, n, end in pieces:
            target = next(targets)
            try:
                offset, size, _ = self._put(self.root.log(topic, target), framed, n, ts, config.max_message_bytes)
            except TopicNotFound:
                if not self._refreshed(topic):
                    raise
                more, took = self.send_records(
                    topic,
                    data[start:],
                    delimiter,
                    keep_delimiter=keep_delimiter,
                    partition=partition,
                    first=target,
                    max_records=max_records,
                )
                return out + more, start + took
            out.append(Appended(topic, target, offset, offset + size, n))
            start = end
        return out, stop

    def _targets(self, topic: str, partition: int | None, first: int | None = None) -> Iterator[int]:
        """The partitions of the appends in turn: ``partition`` each time, or else every
        partition in turn from ``first`` (when it is one; else the partitioner's pick)."""
        if partition is not None:
            return itertools.repeat(partition)
        count = self.root.config(topic).partitions
        if first is None or not 0 <= first < count:
            first = self._partition(topic, None)
        return ((first + i) % count for i in itertools.count())

    def flush(self) -> None:
        """fsync every partition this producer wrote to since the last flush.  In async
        mode first wait until everything queued before this call is appended, and raise
        the first error since the last flush that no callback was told of."""
        if self.linger_ms is not None:
            self._wait_for_queue()
        with self._guard:
            written, self._written = self._written, set()
        for log in written:
            try:
                log.flush()
            except TopicNotFound:
                pass  # deleted meanwhile: nothing of it is left to flush
        self._raise_unreported()

    def close(self) -> None:
        """Flush what was written and close the files kept open for it (those no other
        thread is appending through).  A synchronous producer stays usable; an async one
        appends what is queued, stops its thread and refuses further sends."""
        if self.linger_ms is not None:
            self._stop()
        self.flush()
        with self._guard:
            used, self._used = self._used, set()
        for log in used:
            log.close_idle()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- async mode

    def _slow(self, item: _Item | bytes) -> None:
        """send()'s way out of the fast path: start the thread, wake it, or wait for room."""
        with self._cond:
            queue = self._queue
            if self._closed or self._closing:
                _discard(queue, item)
                raise ProducerClosed("send() after close(): this producer is closed")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kl-producer", daemon=True)
                self._thread.start()
            if len(queue) >= self.batch_size:
                self._woken = True
                self._lane.wake_at = self.queue_size
            elif self._lane.wake_at < self.batch_size - 1:
                self._lane.wake_at = self.batch_size - 1  # the first message after idling: linger from now
            self._cond.notify_all()
            if len(queue) <= self.queue_size or threading.current_thread() is self._thread:
                return
            timeout = self.queue_timeout
            if not self._cond.wait_for(lambda: len(self._queue) <= self.queue_size or self._closing, timeout):
                if _discard(self._queue, item):
                    raise QueueFull(f"the queue held {self.queue_size} messages for {timeout} s (queue_timeout)")

    def _admit(self, topic: str, size: int, keyed: bool = False, timed: bool = False, special: bool = False) -> None:
        """send()'s size and format checks, and ``TopicNotFound`` for a topic it has not
        seen; ``special``: the message has headers or a null value."""
        config = self.root.config(topic)
        limit = config.max_message_bytes
        if special:
            self._check_headers(topic, config)
        if config.legacy:
            _raise(self._mismatch(topic, config, keyed, timed))
        if size > limit:
            raise MessageTooLarge(f"a message of {size} bytes exceeds max_message_bytes {limit} of topic {topic!r}")
        self._rooms[topic] = limit - m.HEADER_SIZE

    def _run(self) -> None:
        """The background thread: take the queue round after round until closed."""
        cond, linger = self._cond, (self.linger_ms or 0) / 1000
        while True:
            with cond:
                if not self._queue and not self._woken and not self._closing:
                    self._lane.wake_at = 0  # idle: the next send wakes us (set before looking: see send)
                    if not self._queue:
                        cond.wait_for(lambda: self._woken or self._closing or self._lane.wake_at != 0)
                if not self._woken and not self._closing:
                    cond.wait_for(lambda: self._woken or self._closing, linger)
                self._woken = False
                if self._lane.wake_at > self.batch_size - 1:
                    self._lane.wake_at = self.batch_size - 1
                closing = self._closing
                self._rounds_started += 1
            try:
                self._drain()
            except Exception:  # the thread must go on: _drain reports what it can
                log.exception("kl producer thread: unexpected error")
            with cond:
                self._rounds_done += 1
                cond.notify_all()
                if closing and not self._queue:
                    return

    def _wait_for_queue(self) -> None:
        """Wait until the thread has appended everything queued before this call."""
        with self._cond:
            thread = self._thread
            if thread is None or not thread.is_alive():
                if self._queue:  # queued, but no thread (closed): append them here
                    self._drain()
                return
            self._not_from_a_callback()
            ticket = self._rounds_started + 1
            self._woken = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._rounds_done >= ticket or not thread.is_alive())

    def _not_from_a_callback(self) -> None:
        if threading.current_thread() is self._thread:
            raise RuntimeError("flush() or close() from a producer callback would wait for itself")

    def _stop(self) -> None:
        self._not_from_a_callback()
        with self._cond:
            self._closing = True
            self._lane.wake_at = -1
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._cond:
            self._closed = True
            self._thread = None
            if self._queue:  # a send() that raced close()
                self._drain()

    def _raise_unreported(self) -> None:
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def _drain(self) -> None:
        """Take everything queued and append it, per topic."""
        queue = self._queue
        with self._cond:  # not while _discard takes one out; sends append behind them meanwhile
            taken = queue[:]
            del queue[: len(taken)]
        if not taken:
            return
        now = time.time_ns() // 1_000_000
        items = self._whole(taken, now)
        if not items:
            return
        try:
            topics = set(map(_TOPIC, items))
        except Exception as e:  # an unhashable topic
            self._failed(items, e)
            return
        if len(topics) == 1:
            self._deliver(topics.pop(), items, now, retry=True)
            return
        for topic in dict.fromkeys(map(_TOPIC, items)):
            self._deliver(topic, [item for item in items if item[0] == topic], now, retry=True)

    def _whole(self, taken: list[_Item | bytes], now: int) -> list[_Item]:
        """The messages taken from the queue as items: each bare value goes where the plain
        message before it went.  A run of bare values at the front is appended here as far
        as it can be, without making items of them."""
        header = self._header
        if header is not None and taken and type(taken[0]) is bytes:
            taken = taken[self._write_plain(header[0], header[3], taken, now) :]  # type: ignore[arg-type]
        items: list[_Item] = []
        for thing in taken:
            kind = type(thing)
            if kind is bytes:
                assert header is not None
                items.append((header[0], thing, None, header[3], None, None, ()))  # type: ignore[arg-type]
            else:
                if kind is _Header:
                    header = thing  # type: ignore[assignment]
                items.append(thing)  # type: ignore[arg-type]
        self._header = header
        return items

    def _write_plain(self, topic: str, partition: int | None, values: list[bytes], now: int) -> int:
        """Append the run of bare values (no key, timestamp or callback) at the front of
        ``values`` to one place; how many were appended (or failed for good).  Whatever
        is unusual (a topic of format 0.7, a value too large) is left to the general path."""
        try:
            config = self.root.config(topic)
            if partition is None:
                partition = self._partition(topic, None)
            log = self.root.log(topic, partition)
        except Exception:
            return 0
        if config.legacy:
            return 0
        pieces, stop = core.frame_values(values, 0, now, config.max_message_bytes, self._chunk_limit(config))
        done = 0
        for framed, count in pieces:
            try:
                self._put(log, framed, count, now, config.max_message_bytes)
            except TopicNotFound:
                return done
            except Exception as e:
                self._failed([(topic, v, None, partition, None, None, ()) for v in values[done : done + count]], e)
            done += count
        return stop

    def _deliver(self, topic: str, items: list[_Item], now: int, retry: bool) -> None:
        """Append one topic's messages, per partition, in the order they were sent."""
        left: list[_Item] = []
        gone: TopicNotFound | None = None
        for partition, group in self._place(topic, items).items():
            if left:
                left += group
            else:
                left, gone = self._write(topic, partition, group, now)
        if not left:
            return
        assert gone is not None
        if retry and self._refreshed(topic):  # deleted and created again: the rest goes to the new topic
            order = {id(item): i for i, item in enumerate(items)}
            left.sort(key=lambda item: order[id(item)])
            self._deliver(topic, left, now, retry=False)
        else:
            self._failed(left, gone)

    def _place(self, topic: str, items: list[_Item]) -> dict[int, list[_Item]]:
        """Group messages by partition, in order: keys by the partitioner, keyless ones
        without a partition all to one the partitioner picks."""
        partitions = set(map(_PARTITION, items))
        if len(partitions) == 1 and set(map(_KEY, items)) == _NONE:
            (partition,) = partitions
            if partition is None:
                try:
                    partition = self._partition(topic, None)
                except Exception as e:
                    self._failed(items, e)
                    return {}
            return {partition: items}
        groups: dict[int, list[_Item]] = {}
        keyless: int | None = None
        for item in items:
            partition = item[3]
            try:
                if partition is None:
                    if item[2] is not None:
                        partition = self._partition(topic, item[2])
                    else:
                        if keyless is None:
                            keyless = self._partition(topic, None)
                        partition = keyless
            except Exception as e:
                self._failed([item], e)
                continue
            groups.setdefault(partition, []).append(item)
        return groups

    def _write(self, topic: str, partition: int, items: list[_Item], now: int) -> tuple[list[_Item], TopicNotFound | None]:
        """Append one partition's messages in chunks; returns those left unwritten
        because the topic (or the partition) is gone, and why (the caller looks again)."""
        try:
            config = self.root.config(topic)
            log = self.root.log(topic, partition)
        except TopicNotFound as e:
            return items, e
        values = list(map(_VALUE, items))
        keys: list[bytes | None] | None = list(map(_KEY, items))
        assert keys is not None
        limit = config.max_message_bytes
        if keys.count(None) == len(keys):
            keys = None
        given: list[m.Headers] = list(map(_HEADERS, items))
        sizes, magic_3 = _measure(values, keys, given if any(given) else None)
        headers = given if magic_3 else None
        mismatch = self._mismatch(topic, config, keys is not None) if config.legacy else None
        if headers is not None and not config.holds_headers:
            mismatch = self._no_headers(topic, config)
            if mismatch is not None:  # only the messages with headers or a null value fail
                special = [item for item in items if item[6] or item[1] is None]
                self._failed(special, mismatch)
                rest = [item for item in items if not (item[6] or item[1] is None)]
                return self._write(topic, partition, rest, now) if rest else ([], None)
        if mismatch is not None:
            self._failed(items, mismatch)
            return [], None
        if max(sizes) + m.HEADER_SIZE > limit:
            return self._write_fitting(topic, partition, items, now, limit)
        stamps: list[int | None] | None = list(map(_TIMESTAMP, items))
        assert stamps is not None
        if stamps.count(None) == len(stamps) or config.legacy:
            stamps = None
        callbacks = list(map(_CALLBACK, items))
        told = callbacks.count(None) != len(callbacks)
        for start, stop in chunks(sizes, self._chunk_limit(config)):
            ks = None if keys is None else keys[start:stop]
            hs = None if headers is None else headers[start:stop]
            if stamps is None:
                data, ts = _frame(config, values[start:stop], now, ks, hs), now
            else:
                ts_list = [now if t is None else t for t in stamps[start:stop]]
                count = stop - start
                codecs = [m.CODEC_NONE] * count
                data = b"".join(map(m.encode, values[start:stop], ks or [None] * count, ts_list, codecs, hs or [()] * count))
                ts = ts_list[0]
            try:
                offset, size, wrapped = self._put(log, data, stop - start, ts, limit)
            except TopicNotFound as e:
                return items[start:], e
            except Exception as e:
                self._failed(items[start:stop], e)
                continue
            if told:
                header = m.LEGACY_HEADER_SIZE if config.legacy else m.HEADER_SIZE
                self._tell(topic, partition, offset, size, items[start:stop], wrapped, header, sizes[start:stop])
        return [], None

    def _write_fitting(
        self, topic: str, partition: int, items: list[_Item], now: int, limit: int
    ) -> tuple[list[_Item], TopicNotFound | None]:
        """``_write`` for the messages that fit the topic's limit; the others fail."""
        fitting = []
        for item in items:
            size = m.framed_size(item[1], item[2], item[6])
            if size > limit:
                too_large = f"a message of {size} bytes exceeds max_message_bytes {limit} of topic {topic!r}"
                self._failed([item], MessageTooLarge(too_large))
            else:
                fitting.append(item)
        return self._write(topic, partition, fitting, now) if fitting else ([], None)

    def _tell(
        self, topic: str, partition: int, offset: int, size: int, items: list[_Item], wrapped: bool, header: int, sizes: list[int]
    ) -> None:
        """Call the callbacks of one append: each message's own offsets (``header`` plus
        ``sizes``: the bytes each has before its key and value, and the rest), or the
        compressed batch's that holds it."""
        if wrapped:
            appended = Appended(topic, partition, offset, offset + size, len(items))
            for item in items:
                if item[5] is not None:
                    _call(item[5], appended, None)
            return
        for item, rest in zip(items, sizes, strict=True):
            end = offset + header + rest
            if item[5] is not None:
                _call(item[5], Appended(topic, partition, offset, end, 1), None)
            offset = end

    def _failed(self, items: list[_Item], error: BaseException) -> None:
        """Tell the callbacks of messages that were not appended; keep the error for the
        next flush() when some had none."""
        unreported = False
        for item in items:
            if item[5] is None:
                unreported = True
            else:
                _call(item[5], None, error)
        if unreported:
            log.debug("kl producer: %d messages not appended: %s", len(items), error)
            with self._cond:
                if self._error is None:
                    self._error = error

    # ----------------------------------------------------------------- helpers

    def partition_of(self, topic: str, key: bytes) -> int:
        """The partition of ``topic`` that a message with ``key`` goes to."""
        return self._partition(topic, key)

    def _partition(self, topic: str, key: bytes | None) -> int:
        config = self.root.config(topic)
        partitions = config.partitions
        p = (self.partitioner or PARTITIONER_OF[config.partitioner])(key, partitions)
        if not isinstance(p, int) or not 0 <= p < partitions:
            raise InvalidConfig(f"partitioner returned {p!r} for a topic with {partitions} partitions")
        return p

    def _group(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None], headers: list[m.Headers] | None
    ) -> dict[int, _Group]:
        groups: dict[int, _Group] = {}
        for i, (value, key) in enumerate(zip(values, keys, strict=True)):
            vals, ks, hs = groups.setdefault(self._partition(topic, key), ([], [], None if headers is None else []))
            vals.append(value)
            ks.append(key)
            if hs is not None and headers is not None:
                hs.append(headers[i])
        return groups

    def check_format(self, topic: str, *, keyed: bool = False, timed: bool = False, headers: bool = False) -> None:
        """Raise ``FormatMismatch`` when ``topic`` cannot store what this producer would
        send it: keys (when ``keyed``), timestamps (when ``timed``) or zstd in a topic of
        format 0.7, headers or null values (when ``headers``) in a topic without them."""
        config = self.root.config(topic)
        if headers:
            self._check_headers(topic, config)
        _raise(self._mismatch(topic, config, keyed, timed))

    def _mismatch(self, topic: str, config: TopicConfig, keyed: bool, timed: bool = False) -> FormatMismatch | None:
        """What a topic of format 0.7 cannot store of these messages: a key, a timestamp, zstd."""
        if not config.legacy:
            return None
        if keyed:
            return FormatMismatch(f"topic {topic!r} stores Kafka 0.7 messages, which have no key")
        if timed:
            return FormatMismatch(f"topic {topic!r} stores Kafka 0.7 messages, which have no timestamp")
        if self.codec == m.CODEC_ZSTD:
            return FormatMismatch(f"topic {topic!r} stores Kafka 0.7 messages, which cannot be compressed with zstd (use gzip)")
        return None

    def _check_headers(self, topic: str, config: TopicConfig) -> None:
        """Raise ``FormatMismatch`` when ``topic`` cannot hold headers or null values (a
        config cached from before ``kl topics alter --headers`` is read again first)."""
        if not config.holds_headers and not config.legacy:
            config = self.root.refresh_config(topic)
        _raise(self._no_headers(topic, config))

    def _no_headers(self, topic: str, config: TopicConfig) -> FormatMismatch | None:
        if config.legacy:
            return FormatMismatch(f"topic {topic!r} stores Kafka 0.7 messages, which cannot hold headers or null values")
        if not config.holds_headers:
            return FormatMismatch(
                f"topic {topic!r} was created without headers and cannot hold headers or null values: "
                f"allow them with kl topics alter {topic} --headers (kl versions before headers then refuse the topic)"
            )
        return None

    def _check_size(self, topic: str, size: int) -> None:
        limit = self.root.config(topic).max_message_bytes
        if size > limit:  # raised by kl topics alter since the config was read?
            limit = self.root.refresh_config(topic).max_message_bytes
        if size > limit:
            raise MessageTooLarge(f"a message of {size} bytes exceeds max_message_bytes {limit} of topic {topic!r}")

    def _check_batch(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, headers: list[m.Headers] | None
    ) -> None:
        self._check_size(topic, max(message_sizes(values, keys, headers)) + m.HEADER_SIZE)

    def _refreshed(self, topic: str) -> bool:
        """Forget what is cached of ``topic``; True if it exists (again)."""
        self.root.forget(topic)
        try:
            self.root.config(topic)
        except TopicNotFound:
            return False
        return True

    def _append(
        self,
        topic: str,
        targets: Iterator[int],
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        ts: int,
        partition: int | None,
        headers: list[m.Headers] | None = None,
    ) -> list[Appended]:
        """Frame, compress and append ``values`` chunk by chunk, each to the next target;
        what is left when the topic turns out to have been created again goes to the new one."""
        config = self.root.config(topic)
        out: list[Appended] = []
        for start, stop in chunks(message_sizes(values, keys, headers), self._chunk_limit(config)):
            target = next(targets)
            log = self.root.log(topic, target)
            hs = None if headers is None else headers[start:stop]
            data = _frame(config, values[start:stop], ts, None if keys is None else keys[start:stop], hs)
            try:
                offset, size, _ = self._put(log, data, stop - start, ts, config.max_message_bytes)
            except TopicNotFound:
                if not self._refreshed(topic):
                    raise
                rest = None if keys is None else keys[start:]
                again = None if config.legacy else ts  # a 0.7 topic's messages have none to keep
                more = None if headers is None else headers[start:]
                return out + self.send_batch(topic, values[start:], rest, partition=partition, timestamp=again, headers=more)
            out.append(Appended(topic, target, offset, offset + size, stop - start))
        return out

    def _fits_one_append(self, topic: str, groups: dict[int, _Group]) -> bool:
        """Whether each partition's messages of ``groups`` take one append (one chunk of ``_append``'s)."""
        limit = self._chunk_limit(self.root.config(topic))
        return all(next(iter(chunks(message_sizes(vals, ks, h), limit)))[1] == len(vals) for vals, ks, h in groups.values())

    def _append_at_once(
        self,
        topic: str,
        groups: dict[int, _Group],
        ts: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None],
        timestamp: int | None,
        headers: list[m.Headers] | None,
    ) -> list[Appended]:
        """Append each partition's messages of ``groups`` in one append, all at once
        (``Root.append_all``); all of them again to the topic created anew, if it was."""
        config = self.root.config(topic)
        appends = []
        for p, (vals, ks, h) in groups.items():
            target = self.root.log(topic, p)
            packed = self._packed(target, _frame(config, vals, ts, ks, h), ts, config.max_message_bytes)[0]
            appends.append((target, Checked.framed(packed, len(vals))))
        try:
            offsets = self.root.append_all(appends, fsync=self.fsync)
        except TopicNotFound:
            if not self._refreshed(topic):
                raise
            again = None if config.legacy else ts
            return self.send_batch(topic, values, keys, timestamp=again, headers=headers)
        for target, _ in appends:
            if target not in self._written:
                self._note(target)
        return [
            Appended(topic, p, offset, offset + len(data), count)
            for p, (_, (data, count)), offset in zip(groups, appends, offsets, strict=True)
        ]

    def _chunk_limit(self, config: TopicConfig) -> int:
        """The most bytes of framed messages one append takes (a compressed one must fit
        ``max_message_bytes`` as one message)."""
        limit = min(self.batch_bytes, config.segment_bytes)
        return min(limit, config.max_message_bytes - m.HEADER_SIZE) if self.codec else limit

    def _put(self, log: Log, data: bytes, count: int, ts: int, limit: int) -> tuple[int, int, bool]:
        """Compress ``data`` (``count`` framed messages) as one message when a codec is set
        and it fits ``limit``, append it and note the log for ``flush``: (offset, bytes
        appended, whether compressed)."""
        data, wrapped = self._packed(log, data, ts, limit)
        offset = log.append(Checked.framed(data, count), fsync=self.fsync)
        if log not in self._written:
            self._note(log)
        return offset, len(data), wrapped

    def _packed(self, log: Log, data: bytes, ts: int, limit: int) -> tuple[bytes, bool]:
        """``data`` compressed as one message when a codec is set and it fits ``limit``;
        whether it was."""
        if self.codec:
            if log.config.legacy:  # the callers refused zstd (see _mismatch)
                packed = wrap_v1(data, self.codec)
            else:
                packed = wrap(data, self.codec, ts)
            if len(packed) <= limit:
                return packed, True
        return data, False

    def _note(self, log: Log) -> None:
        with self._guard:
            if not self.fsync:
                self._written.add(log)
            self._used.add(log)


def _frame(
    config: TopicConfig,
    values: Sequence[bytes | None],
    ts: int,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[m.Headers] | None = None,
) -> bytes:
    """Messages framed as the topic stores them: magic 2 (3 with headers or a null value),
    or magic 1 (no key, no timestamp) in a topic of format 0.7."""
    if config.legacy:
        return frame_v1(values)  # type: ignore[arg-type]  # the callers refused None (_no_headers)
    return frame(values, ts, keys, headers)


_headers = m.as_headers


def _check_timestamp(timestamp: int) -> None:
    problem = m.timestamp_problem(timestamp)
    if problem is not None:
        raise InvalidTimestamp(problem)


def _raise(error: Exception | None) -> None:
    if error is not None:
        raise error


def _error_first(on_delivery: OnDelivery) -> Callback:
    """An ``on_delivery`` function called as a ``Callback``."""
    return lambda appended, error: on_delivery(error, appended)


def _call(callback: Callback, appended: Appended | None, error: BaseException | None) -> None:
    try:
        callback(appended, error)
    except Exception:
        log.exception("kl producer: a send() callback raised")


class _Header(tuple):
    """A queued plain message of the owner thread: the bare values queued after it go where it goes."""

    __slots__ = ()


def _discard(queue: list[_Item | bytes], item: _Item | bytes) -> bool:
    """Take ``item`` (the object itself: the last one queued) back out of the queue (the
    caller holds the lock the thread cuts under); False when the thread took it already."""
    for i in range(len(queue) - 1, -1, -1):
        if queue[i] is item:
            del queue[i]
            return True
    return False


_async_producers: weakref.WeakSet[Producer] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: every async producer starts afresh, with an empty queue."""
    for producer in list(_async_producers):
        producer._reset()


def _send_queued() -> None:
    """At interpreter exit: append what async producers still hold queued."""
    for producer in list(_async_producers):
        try:
            producer._wait_for_queue()
        except Exception:
            log.exception("kl producer: sending the queue at exit failed")


os.register_at_fork(after_in_child=_forked)
atexit.register(_send_queued)


def message_sizes(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, headers: Sequence[m.Headers] | None = None
) -> list[int]:
    """Each message's framed size less the magic 2 header (value and key bytes, and a
    magic 3 message's headers and lengths)."""
    return _measure(values, keys, headers)[0]


def _measure(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, headers: Sequence[m.Headers] | None
) -> tuple[list[int], bool]:
    """``_sizes``, and whether a message is magic 3 (it has headers or a null value):
    no look at each value beyond its ``len`` unless one is None."""
    if headers is None:
        try:
            if keys is None:
                return list(map(len, values)), False  # type: ignore[arg-type]
            return [len(v) + len(k or b"") for v, k in zip(values, keys, strict=True)], False  # type: ignore[arg-type]
        except TypeError:  # len(None): a null value
            pass
    hs = headers or [()] * len(values)
    ks = keys or [None] * len(values)
    return [m.framed_size(v, k, h) - m.HEADER_SIZE for v, k, h in zip(values, ks, hs, strict=True)], True
