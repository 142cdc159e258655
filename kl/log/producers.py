"""Idempotent producers' state, kept by the partition: the producer journal.

A Kafka producer with idempotence numbers its batches per partition (producer id, epoch,
sequence); the partition appends each once, in order, and answers a retry with the
offset it was appended at, as Kafka's producer state does.  The partition's journal,
``producers`` beside its segments, holds one fixed-size record per idempotent append:
a serial, the producer's id, epoch and the batch's first and last sequence, where it was
appended (offset and Kafka offset) and when.  It is read and written under the
partition lock with the append itself, so every writer on every host checks a retry
against the same state, and it survives the daemon.

A record is written before its append is published, and the published state record
carries the serial of the last one (``PartitionState.producer_serial``): a record past
that serial belongs to an append that was never published (the writer died between
the two) and is cut off by the next writer.  When the journal outgrows what it holds
(the last ``BATCHES`` batches of each producer seen within ``EXPIRY_MS``) it is
rewritten with only that.  See ``man/kl-format.5``.
"""

from __future__ import annotations

import collections
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from typing import NamedTuple

from kl.errors import InvalidProducerEpoch, OutOfOrderSequence
from kl.log.fsutil import open_file, storage_error, write_all, write_atomic

log = logging.getLogger(__name__)

FILE = "producers"
TAG = b"klpj"
RECORD = struct.Struct(">4sQqhiiqqq")
CRC = struct.Struct(">I")
SIZE = RECORD.size + CRC.size
BATCHES = 5
"""Batches remembered per producer: as many as a Kafka producer keeps in flight."""
EXPIRY_MS = 24 * 3600 * 1000
"""A producer not heard from for this long is forgotten (Kafka's ``producer.id.expiration.ms``)."""
MAX_PRODUCERS = 10_000
"""Producers remembered per partition: beyond, the least recently heard are forgotten
when the journal is rewritten."""
COMPACT_RECORDS = 4096
"""The journal is rewritten once it has this many records more than it needs."""
MAX_SEQUENCE = 0x7FFFFFFF


class Batch(NamedTuple):
    """What an idempotent producer's batch claims."""

    producer_id: int
    epoch: int
    first_sequence: int
    last_sequence: int


class Entry(NamedTuple):
    """One journal record: an idempotent append."""

    serial: int
    producer_id: int
    epoch: int
    first_sequence: int
    last_sequence: int
    offset: int
    kafka_offset: int
    time_ms: int

    def encode(self) -> bytes:
        record = RECORD.pack(TAG, *self)
        return record + CRC.pack(zlib.crc32(record))


class Producer:
    """A producer's epoch and last batches, as the journal holds them."""

    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int):
        self.epoch = epoch
        self.batches: collections.deque[Entry] = collections.deque(maxlen=BATCHES)


def decode(data: bytes) -> Entry | None:
    """A record, or None where it is torn or damaged."""
    if len(data) < SIZE or CRC.unpack_from(data, RECORD.size)[0] != zlib.crc32(data[: RECORD.size]):
        return None
    tag, *fields = RECORD.unpack_from(data)
    return Entry(*fields) if tag == TAG else None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def follows(sequence: int, last: int) -> bool:
    """``sequence`` is the one after ``last`` (wrapping at 2**31 - 1, as Kafka's does)."""
    return sequence == last + 1 or (sequence == 0 and last == MAX_SEQUENCE)


class Journal:
    """A partition's producer journal, as one writer sees it; used under the partition lock."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, FILE)
        self.producers: dict[int, Producer] = {}
        self._serial = -1
        """The serial of the last record read or written (-1: nothing read yet)."""
        self._size = 0
        """How far the file was read (whole records)."""
        self._inode = -1
        self._records = 0

    def check(self, batch: Batch, serial: int, log_end_count: int) -> Entry | None:
        """Where ``batch`` was appended before (a retry), or None where it is new and
        follows what the producer appended.  ``serial`` and ``log_end_count`` are the
        published state's.  Raises ``InvalidProducerEpoch`` and ``OutOfOrderSequence``."""
        self._load(serial, log_end_count)
        known = self.producers.get(batch.producer_id)
        if known is None:
            return None  # a producer the partition has no state of: any sequence starts it (as in Kafka)
        if batch.epoch < known.epoch:
            raise InvalidProducerEpoch(
                f"producer {batch.producer_id} sent epoch {batch.epoch}, older than its epoch {known.epoch} here"
            )
        if batch.epoch > known.epoch:
            if batch.first_sequence != 0:
                raise OutOfOrderSequence(
                    f"producer {batch.producer_id} began epoch {batch.epoch} at sequence {batch.first_sequence}, not 0"
                )
            return None
        for entry in known.batches:
            if (entry.first_sequence, entry.last_sequence) == (batch.first_sequence, batch.last_sequence):
                return entry
        last = known.batches[-1].last_sequence
        if not follows(batch.first_sequence, last):
            raise OutOfOrderSequence(
                f"producer {batch.producer_id} sent sequence {batch.first_sequence}, expected {(last + 1) & MAX_SEQUENCE}"
            )
        return None

    def write(self, batch: Batch, serial: int, offset: int, kafka_offset: int, *, durable: bool) -> None:
        """Record ``batch``, appended at ``offset`` (``kafka_offset``), before its append is
        published with ``serial`` (the published one plus one); the file is rewritten
        first where it outgrew what it holds.  Raises ``StorageError``."""
        entry = Entry(serial, *batch, offset, kafka_offset, now_ms())
        if self._records >= COMPACT_RECORDS + BATCHES * min(len(self.producers), MAX_PRODUCERS):
            self._compact(entry.time_ms)
        try:
            fd = open_file(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                stat = os.fstat(fd)
                if (stat.st_ino, stat.st_size) != (self._inode, self._size):  # a torn record, or another writer's
                    self._sync(fd, entry.serial - 1, entry.kafka_offset)
                write_all(fd, entry.encode())  # (appended: a writer paused past its NFS lease overwrites nothing)
                if durable:
                    os.fsync(fd)
                self._size = os.fstat(fd).st_size
            finally:
                os.close(fd)
        except OSError as e:
            self.forget()
            raise storage_error(e, "write", self.path) from None
        self._add(entry)

    def forget(self) -> None:
        """Drop what was read: the next check reads the file again (after a write that
        was not published)."""
        self.producers.clear()
        self._serial, self._size, self._inode, self._records = -1, 0, -1, 0

    def _load(self, serial: int, log_end_count: int) -> None:
        """Bring the view up to the published ``serial``."""
        if serial == self._serial:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if serial:
                log.warning("%s is missing: retries of its producers' batches may be appended twice", self.path)
            self.forget()
            self._serial = serial
            return
        except OSError as e:
            raise storage_error(e, "open", self.path) from None
        try:
            self._sync(fd, serial, log_end_count)
        except OSError as e:
            self.forget()
            raise storage_error(e, "read", self.path) from None
        finally:
            os.close(fd)

    def _sync(self, fd: int, serial: int, log_end_count: int) -> None:
        """Read what other writers appended to the open journal (all of it where it was
        replaced), up to the published ``serial``, and cut off the records of appends
        never published: past it, torn, or (out of order) a writer's that lost its lock."""
        stat = os.fstat(fd)
        if stat.st_ino != self._inode or stat.st_size < self._size or serial < self._serial:
            self.forget()
            self._serial, self._inode = 0, stat.st_ino  # (serials begin at 1)
        data = _read_all(fd, self._size)
        kept = self._size
        for end, entry in _entries(data, self.path):
            if entry.serial > serial:
                break  # (and what follows)
            if entry.serial <= self._serial:
                continue
            if entry.kafka_offset < log_end_count:  # (recovery may have cut the log back)
                self._add(entry)
            self._serial, kept = entry.serial, self._size + end
        if kept < self._size + len(data):
            os.ftruncate(fd, kept)
        self._size = kept
        if self._serial != serial:
            log.warning(
                "%s ends at serial %d, its partition's state at %d: retries of some producers' batches may be appended twice",
                self.path,
                self._serial,
                serial,
            )
            self._serial = serial

    def _add(self, entry: Entry) -> None:
        known = self.producers.get(entry.producer_id)
        if known is None or entry.epoch != known.epoch:
            known = self.producers[entry.producer_id] = Producer(entry.epoch)
        known.batches.append(entry)
        self._serial = entry.serial
        self._records += 1

    def _compact(self, now_ms: int) -> None:
        """Rewrite the file with only what it holds: the last batches of each producer
        heard from within ``EXPIRY_MS``, of the ``MAX_PRODUCERS`` heard from last."""
        live = [known for known in self.producers.values() if now_ms - known.batches[-1].time_ms < EXPIRY_MS]
        live = sorted(live, key=lambda known: known.batches[-1].serial)[-MAX_PRODUCERS:]
        kept = sorted((e for known in live for e in known.batches), key=lambda e: e.serial)
        write_atomic(self.path, b"".join(e.encode() for e in kept))
        serial = self._serial
        self.forget()
        for entry in kept:
            self._add(entry)
        self._serial, self._size = serial, len(kept) * SIZE
        try:
            self._inode = os.stat(self.path).st_ino
        except OSError as e:
            raise storage_error(e, "stat", self.path) from None


def last_serial(directory: str) -> int:
    """The serial of the last whole record of the partition's journal (0: none), for a
    state record rebuilt from the segments (by ``kl recover``), which publishes them all."""
    serial = 0
    for entry in _records(directory):
        serial = max(serial, entry.serial)
    return serial


def _read_all(fd: int, position: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.pread(fd, 1 << 20, position)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        position += len(chunk)


def _entries(data: bytes, path: str) -> Iterator[tuple[int, Entry]]:
    """The records of ``data``, each with where it ends: a damaged one in the middle is
    skipped (and logged), a torn or damaged last one ends them."""
    whole = len(data) - len(data) % SIZE
    for position in range(0, whole, SIZE):
        entry = decode(data[position : position + SIZE])
        if entry is None:
            if position + SIZE >= len(data):
                return
            log.warning("%s: damaged record at byte %d skipped (run 'kl recover')", path, position)
            continue
        yield position + SIZE, entry


def last_batches(directory: str, serial: int, log_end_count: int) -> dict[int, Entry]:
    """Each producer's last batch (by producer id) as the journal holds it, read without
    the lock: of the appends published (``serial`` and ``log_end_count`` the published
    state's), from producers heard from within ``EXPIRY_MS``."""
    found: dict[int, Entry] = {}
    for entry in _records(directory):
        if entry.serial <= serial and entry.kafka_offset < log_end_count:
            known = found.get(entry.producer_id)
            if known is None or entry.serial > known.serial:
                found[entry.producer_id] = entry
    now = now_ms()
    return {pid: entry for pid, entry in found.items() if now - entry.time_ms < EXPIRY_MS}


def _records(directory: str) -> list[Entry]:
    """The whole records of the partition's journal (none where there is none)."""
    path = os.path.join(directory, FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise storage_error(e, "read", path) from None
    return [entry for _, entry in _entries(data, path)]
