"""Producers: partition, frame and append messages.

``send`` appends one message and returns once it is published (and, with
``fsync=True``, durable).  ``send_batch`` frames many messages in bulk and appends them
per partition in chunks of at most ``batch_bytes``; each chunk is one atomic append.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from kl import message as m
from kl.errors import InvalidConfig, MessageTooLarge, TopicNotFound
from kl.log import Log
from kl.messageset import frame, wrap
from kl.topic import Root

Partitioner = Callable[[bytes | None, int], int]
"""(key, number of partitions) -> partition."""

DEFAULT_BATCH_BYTES = 256 << 10
"""The largest append (keyless batches turn to the next partition after each)."""


def hash_partitioner(key: bytes | None, partitions: int) -> int:
    """CRC32 of the key modulo the partition count (stable across processes, hosts and
    Python versions); a random partition when there is no key."""
    if key is None:
        return random.randrange(partitions)
    return zlib.crc32(key) % partitions


class Appended(NamedTuple):
    """Where one append landed: ``count`` messages from ``offset`` to ``next_offset``."""

    topic: str
    partition: int
    offset: int
    next_offset: int
    count: int  # type: ignore[assignment]  # the messages appended; shadows tuple.count, as the seed named it


class Producer:
    """Sends messages to topics under a root.  Safe to share between threads and processes.

    ``compression`` is ``"zstd"``, ``"gzip"`` or None; ``fsync`` makes every send durable
    before it returns; ``partitioner`` replaces :func:`hash_partitioner`.
    """

    def __init__(
        self,
        root: Root | str | os.PathLike[str],
        *,
        compression: str | None = None,
        fsync: bool = False,
        partitioner: Partitioner = hash_partitioner,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ):
        self.root = root if isinstance(root, Root) else Root(root)
        if compression not in (None, *m.CODECS):
            raise InvalidConfig(f"unknown compression {compression!r}: use zstd, gzip or none")
        self.codec = m.CODECS[compression or "none"]
        self.fsync = fsync
        self.partitioner = partitioner
        self.batch_bytes = batch_bytes
        self._written: set[Log] = set()
        self._guard = threading.Lock()

    def send(
        self, topic: str, value: bytes, key: bytes | None = None, partition: int | None = None, timestamp: int | None = None
    ) -> Appended:
        """Append one message; returns where it landed.

        A topic deleted and created again while this producer lives is looked up afresh
        (its partitions and limits may have changed): the send goes to the new topic.
        """
        try:
            return self._send(topic, value, key, partition, timestamp)
        except TopicNotFound:
            if not self._refreshed(topic):
                raise
            return self._send(topic, value, key, partition, timestamp)

    def _send(self, topic: str, value: bytes, key: bytes | None, partition: int | None, timestamp: int | None) -> Appended:
        if partition is None:
            partition = self._partition(topic, key)
        log = self.root.log(topic, partition)
        ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
        data = m.encode(value, key, ts)
        if len(data) > log.config.max_message_bytes:
            self._check_size(topic, len(data))
        if self.codec:
            wrapped = wrap(data, self.codec, ts)
            if len(wrapped) <= log.config.max_message_bytes:
                data = wrapped
        offset = log.append(data, 1, fsync=self.fsync)
        if log not in self._written:
            self._note(log)
        return Appended(topic, partition, offset, offset + len(data), 1)

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> list[Appended]:
        """Append many messages, in appends of up to ``batch_bytes``.

        With keys (and no ``partition``) each message goes to its key's partition.
        Without, the appends go to ``partition``, or else in turn to every partition,
        starting from the one the partitioner picks.  Every message is checked against
        the topic's size limit before any is written.
        """
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(values)} values but {len(keys)} keys")
        if not values:
            return []
        ts = time.time_ns() // 1_000_000 if timestamp is None else timestamp
        if keys is not None and partition is None:
            groups = self._group(topic, values, keys)
            for vals, ks in groups.values():
                self._check_batch(topic, vals, ks)
            return [a for p, (vals, ks) in groups.items() for a in self._append(topic, itertools.repeat(p), vals, ks, ts, None)]
        self._check_batch(topic, values, keys)
        if partition is None:
            first, count = self._partition(topic, None), self.root.config(topic).partitions
            targets: Iterator[int] = ((first + i) % count for i in itertools.count())
        else:
            targets = itertools.repeat(partition)
        return self._append(topic, targets, values, keys, ts, partition)

    def flush(self) -> None:
        """fsync every partition this producer wrote to since the last flush."""
        with self._guard:
            written, self._written = self._written, set()
        for log in written:
            try:
                log.flush()
            except TopicNotFound:
                pass  # deleted meanwhile: nothing of it is left to flush

    def close(self) -> None:
        """Flush what was written; the producer stays usable."""
        self.flush()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- helpers

    def _partition(self, topic: str, key: bytes | None) -> int:
        partitions = self.root.config(topic).partitions
        p = self.partitioner(key, partitions)
        if not isinstance(p, int) or not 0 <= p < partitions:
            raise InvalidConfig(f"partitioner returned {p!r} for a topic with {partitions} partitions")
        return p

    def _group(
        self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None]
    ) -> dict[int, tuple[list[bytes], list[bytes | None]]]:
        groups: dict[int, tuple[list[bytes], list[bytes | None]]] = {}
        for value, key in zip(values, keys, strict=True):
            vals, ks = groups.setdefault(self._partition(topic, key), ([], []))
            vals.append(value)
            ks.append(key)
        return groups

    def _check_size(self, topic: str, size: int) -> None:
        limit = self.root.config(topic).max_message_bytes
        if size > limit:
            raise MessageTooLarge(f"a message of {size} bytes exceeds topic {topic!r}'s max_message_bytes {limit}")

    def _check_batch(self, topic: str, values: Sequence[bytes], keys: Sequence[bytes | None] | None) -> None:
        if keys is None:
            largest = max(map(len, values))
        else:
            largest = max(len(v) + len(k or b"") for v, k in zip(values, keys, strict=True))
        self._check_size(topic, largest + m.HEADER_SIZE)

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
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None,
        ts: int,
        partition: int | None,
    ) -> list[Appended]:
        """Frame, compress and append ``values`` chunk by chunk, each to the next target;
        what is left when the topic turns out to have been created again goes to the new one."""
        config = self.root.config(topic)
        limit = min(self.batch_bytes, config.segment_bytes)
        if self.codec:
            limit = min(limit, config.max_message_bytes - m.HEADER_SIZE)
        out: list[Appended] = []
        for start, stop in _chunks(values, keys, limit):
            target = next(targets)
            log = self.root.log(topic, target)
            data = frame(values[start:stop], ts, None if keys is None else keys[start:stop])
            if self.codec:
                wrapped = wrap(data, self.codec, ts)
                if len(wrapped) <= config.max_message_bytes:
                    data = wrapped
            try:
                offset = log.append(data, stop - start, fsync=self.fsync)
            except TopicNotFound:
                if not self._refreshed(topic):
                    raise
                rest = None if keys is None else keys[start:]
                return out + self.send_batch(topic, values[start:], rest, partition=partition, timestamp=ts)
            out.append(Appended(topic, target, offset, offset + len(data), stop - start))
            if log not in self._written:
                self._note(log)
        return out

    def _note(self, log: Log) -> None:
        if not self.fsync and log not in self._written:
            with self._guard:
                self._written.add(log)


def _chunks(values: Sequence[bytes], keys: Sequence[bytes | None] | None, limit: int) -> Iterable[tuple[int, int]]:
    """(start, stop) index ranges whose framed size stays within ``limit`` (a lone
    message larger than it is a chunk of its own)."""
    sizes = map(len, values) if keys is None else (len(v) + len(k or b"") for v, k in zip(values, keys, strict=True))
    ends = list(itertools.accumulate(map(operator.add, sizes, itertools.repeat(m.HEADER_SIZE))))
    start, consumed = 0, 0
    while start < len(ends):
        stop = max(bisect.bisect_right(ends, consumed + limit, lo=start), start + 1)
        yield start, stop
        consumed, start = ends[stop - 1], stop
