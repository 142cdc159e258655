"""Appends from many processes and threads, and readers racing writers (real processes)."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import random
import struct
import threading
import time
import traceback
import zlib

import pytest

import kl

from conftest import read_all
from faultlib import tail_facts

FORK = multiprocessing.get_context("fork")
SPAWN = multiprocessing.get_context("spawn")

RECORD = struct.Struct(">HIII")
"""writer, sequence number, batch number, CRC32 of the padding that follows."""


def record(writer: int, seq: int, batch: int) -> bytes:
    """A self-checking value: its header names who wrote it; its padding varies in length."""
    padding = bytes([(writer * 31 + seq) % 251]) * ((seq * 7 + writer) % 97)
    return RECORD.pack(writer, seq, batch, zlib.crc32(padding)) + padding


def parse(value: bytes) -> tuple[int, int, int]:
    writer, seq, batch, crc = RECORD.unpack_from(value)
    padding = value[RECORD.size :]
    assert zlib.crc32(padding) == crc, f"torn value from writer {writer} seq {seq}"
    assert value == record(writer, seq, batch), f"wrong bytes for writer {writer} seq {seq}"
    return writer, seq, batch


def run(processes, timeout: float) -> None:
    for p in processes:
        p.start()
    deadline = time.monotonic() + timeout
    for p in processes:
        p.join(max(deadline - time.monotonic(), 0.1))
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
        p.join()
    assert not alive, f"{len(alive)} processes still running after {timeout}s"
    assert [p.exitcode for p in processes] == [0] * len(processes)


def check_log(root: kl.Root, topic: str, writers: int, per_writer: int, partition: int = 0) -> None:
    """Every message exactly once, each writer's in order, each batch contiguous, offsets rising."""
    messages = read_all(root, topic, partition, max_bytes=1 << 20)
    assert len(messages) == writers * per_writer
    next_seq = [0] * writers
    previous = None
    finished_batches: set[tuple[int, int]] = set()
    for msg in messages:
        writer, seq, batch = parse(msg.value)
        assert seq == next_seq[writer], f"writer {writer}: expected seq {next_seq[writer]}, got {seq}"
        next_seq[writer] += 1
        if previous is not None:
            assert msg.offset == previous.next_offset
            assert msg.offset > previous.offset or msg.offset == previous.offset == previous.next_offset
            prev_writer, _, prev_batch = parse(previous.value)
            if (prev_writer, prev_batch) != (writer, batch):
                finished_batches.add((prev_writer, prev_batch))
        assert (writer, batch) not in finished_batches, f"batch {batch} of writer {writer} is interleaved"
        previous = msg
    assert next_seq == [per_writer] * writers
    log = root.log(topic, partition)
    assert previous.next_offset == log.log_end_offset
    total = sum(s.size_in_bytes for s in log.segments())
    assert total == log.log_end_offset - log.log_start_offset


# ----------------------------------------------------------------- writers


def produce(root: kl.Root | str, topic: str, writer: int, count: int, seed: int, compression: str | None = None,
            first_seq: int = 0) -> None:
    """Send records ``first_seq`` to ``count - 1``: mostly small batches, some single sends."""
    rng = random.Random(seed)
    producer = kl.Producer(root, compression=compression, batch_bytes=1 << 20)
    seq, batch = first_seq, first_seq
    while seq < count:
        if rng.random() < 0.3:
            producer.send(topic, record(writer, seq, batch), partition=0)
            seq += 1
        else:
            n = min(rng.randint(2, 40), count - seq)
            producer.send_batch(topic, [record(writer, seq + i, batch) for i in range(n)], partition=0)
            seq += n
        batch += 1


def producer_process(root, topic, writer, count, seed, compression=None, first_seq=0):
    try:
        produce(root, topic, writer, count, seed, compression, first_seq)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def test_8_producer_processes_into_one_partition(tmp_path):
    root = kl.Root(tmp_path, lock_timeout=60)
    root.create_topic("race", kl.TopicConfig(segment_bytes=4 << 20))
    kl.Producer(root).send("race", record(0, 0, 0))  # the parent holds writer handles when it forks
    writers, per_writer = 8, 20_000
    procs = [
        FORK.Process(target=producer_process, args=(root, "race", w, per_writer, w, None, 1 if w == 0 else 0))
        for w in range(writers)
    ]
    run(procs, timeout=120)
    check_log(kl.Root(tmp_path), "race", writers, per_writer)
    assert len(root.log("race", 0).segments()) > 1


def spawned_producer(path, topic, writer, count, seed):
    produce(str(path), topic, writer, count, seed)


def test_spawned_producer_processes_into_one_partition(tmp_path):
    kl.Root(tmp_path).create_topic("spawned")
    procs = [SPAWN.Process(target=spawned_producer, args=(str(tmp_path), "spawned", w, 2000, w)) for w in range(3)]
    run(procs, timeout=60)
    check_log(kl.Root(tmp_path), "spawned", 3, 2000)


def test_compressing_producer_processes_into_one_partition(tmp_path):
    root = kl.Root(tmp_path)
    root.create_topic("zipped", kl.TopicConfig(segment_bytes=256 << 10, max_message_bytes=64 << 10))
    procs = [
        FORK.Process(target=producer_process, args=(str(tmp_path), "zipped", w, 3000, w, ("zstd", "gzip", None)[w % 3]))
        for w in range(4)
    ]
    run(procs, timeout=60)
    check_log(kl.Root(tmp_path), "zipped", 4, 3000)


def test_producer_processes_spread_over_partitions(tmp_path):
    root = kl.Root(tmp_path)
    root.create_topic("spread", kl.TopicConfig(partitions=3))

    procs = [FORK.Process(target=_keyed_process, args=(str(tmp_path), w)) for w in range(4)]
    run(procs, timeout=60)
    counts = {}
    for p in range(3):
        for msg in read_all(root, "spread", p):
            assert kl.hash_partitioner(msg.key, 3) == p
            counts[msg.value] = counts.get(msg.value, 0) + 1
    assert len(counts) == 4 * 1000 and set(counts.values()) == {1}


def _keyed_process(path, writer):
    try:
        producer = kl.Producer(path)
        values = [b"%d-%d" % (writer, i) for i in range(1000)]
        keys = [b"key-%d" % (i % 13) for i in range(1000)]
        for i in range(0, 1000, 50):
            producer.send_batch("spread", values[i : i + 50], keys=keys[i : i + 50])
    except BaseException:
        traceback.print_exc()
        os._exit(1)


# ----------------------------------------------------------------- readers racing writers


def tail_reader(path: str, topic: str, writers: int, per_writer: int, seed: int, budget: float) -> None:
    """Follow the partition with fetches of random sizes, checking every message seen."""
    try:
        rng = random.Random(seed)
        consumer = kl.Consumer(path)
        offset, seen, next_seq = 0, 0, [0] * writers
        deadline = time.monotonic() + budget
        previous_next = 0
        while seen < writers * per_writer:
            if time.monotonic() > deadline:
                raise AssertionError(f"reader stuck at offset {offset} after {seen} messages")
            messages = consumer.fetch(topic, 0, offset, rng.choice([1, 4096, 5000, 8192, 30_000, 1 << 16]))
            got = False
            for msg in messages:
                assert msg.offset == previous_next, f"offset {msg.offset} does not follow {previous_next}"
                writer, seq, _ = parse(msg.value)
                assert seq == next_seq[writer], f"writer {writer}: expected {next_seq[writer]}, got {seq}"
                next_seq[writer] += 1
                previous_next = offset = msg.next_offset
                seen += 1
                got = True
            if not got:
                time.sleep(0.001)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def test_readers_racing_writers_never_see_a_torn_message(tmp_path):
    root = kl.Root(tmp_path)
    root.create_topic("tail", kl.TopicConfig(segment_bytes=64 << 10, max_message_bytes=16 << 10,
                                             flush_messages=500, flush_ms=50))
    writers, per_writer = 3, 6000
    readers = [FORK.Process(target=tail_reader, args=(str(tmp_path), "tail", writers, per_writer, r, 50))
               for r in range(3)]
    producers = [
        FORK.Process(target=producer_process, args=(str(tmp_path), "tail", w, per_writer, 100 + w,
                                                    "zstd" if w == 2 else None))
        for w in range(writers)
    ]
    run(readers + producers, timeout=60)
    check_log(root, "tail", writers, per_writer)
    assert len(root.log("tail", 0).segments()) > 3


def test_a_reader_of_a_growing_active_segment_sees_only_published_messages(tmp_path):
    root = kl.Root(tmp_path)
    root.create_topic("grow")
    stop = FORK.Event()
    writer = FORK.Process(target=_endless_writer, args=(str(tmp_path), stop))
    writer.start()
    try:
        consumer = kl.Consumer(root)
        offset, seen = 0, 0
        while seen < 5000:
            assert writer.is_alive(), "the writer died"
            end_before = consumer.latest_offset("grow", 0)
            for msg in consumer.fetch("grow", 0, offset, 1 << 16):
                assert msg.next_offset <= max(end_before, consumer.latest_offset("grow", 0))
                assert parse(msg.value)[1] == seen
                seen += 1
                offset = msg.next_offset
    finally:
        stop.set()
        writer.join(10)
    assert writer.exitcode == 0


def _endless_writer(path, stop):
    try:
        producer = kl.Producer(path)
        seq = 0
        while not stop.is_set():
            producer.send_batch("grow", [record(0, seq + i, seq) for i in range(10)])
            seq += 10
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def _batches_forever(path, writer):
    producer = kl.Producer(path)
    seq = 0
    while True:
        producer.send_batch("killed", [record(writer, seq + i, seq) + bytes(400) for i in range(200)])
        seq += 200


def test_writers_killed_mid_append_never_leave_a_torn_message(tmp_path):
    """Writers are killed at random moments until three kills have landed mid-append
    (bytes past the published end, or a segment a roll never published)."""
    root = kl.Root(tmp_path)
    root.create_topic("killed", kl.TopicConfig(segment_bytes=1 << 20, flush_messages=0, flush_ms=0))
    directory = root.log("killed", 0).directory
    rng = random.Random(7)
    kills = mid_append = 0
    last = 0xFFFF  # the writer number of the clean append after the kills
    while mid_append < 3:
        assert kills < 300, f"only {mid_append} of {kills} kills landed mid-append"
        p = FORK.Process(target=_batches_forever, args=(str(tmp_path), kills))
        p.start()
        time.sleep(rng.uniform(0.02, 0.1))
        p.kill()
        p.join()
        kills += 1
        mid_append += any(tail_facts(directory))  # the next writer repairs it
    kl.Producer(kl.Root(tmp_path)).send("killed", record(last, 0, 0) + bytes(400))
    seqs: dict[int, list[int]] = {}
    for msg in read_all(kl.Root(tmp_path), "killed"):
        writer, seq, _ = RECORD.unpack_from(msg.value)[:3]
        assert msg.value == record(writer, seq, seq - seq % 200 if writer != last else 0) + bytes(400)
        seqs.setdefault(writer, []).append(seq)
    assert seqs.pop(last) == [0]
    for writer, seen in seqs.items():
        assert seen == list(range(len(seen))), f"writer {writer}"
        assert len(seen) % 200 == 0, f"writer {writer}: a batch was cut ({len(seen)} messages)"


# ----------------------------------------------------------------- threads of one process


def _threads(target, count: int) -> None:
    errors = []

    def guarded(i):
        try:
            target(i)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_threads_sharing_one_producer_exclude_each_other(tmp_path):
    root = kl.Root(tmp_path)
    root.create_topic("threads", kl.TopicConfig(segment_bytes=128 << 10, max_message_bytes=64 << 10))
    producer = kl.Producer(root)

    def work(w):
        rng = random.Random(w)
        seq = batch = 0
        while seq < 2000:
            n = min(rng.randint(1, 20), 2000 - seq)
            if n == 1:
                producer.send("threads", record(w, seq, batch))
            else:
                producer.send_batch("threads", [record(w, seq + i, batch) for i in range(n)])
            seq, batch = seq + n, batch + 1

    _threads(work, 6)
    check_log(root, "threads", 6, 2000)


def test_several_producer_objects_in_one_process_exclude_each_other(tmp_path):
    kl.Root(tmp_path).create_topic("objects", kl.TopicConfig(segment_bytes=128 << 10, max_message_bytes=64 << 10))
    _threads(lambda w: produce(kl.Root(tmp_path), "objects", w, 2000, w), 6)
    check_log(kl.Root(tmp_path), "objects", 6, 2000)


def test_root_handles_by_different_paths_in_one_process_exclude_each_other(tmp_path):
    real = tmp_path / "real"
    kl.Root(real).create_topic("paths", kl.TopicConfig(segment_bytes=128 << 10, max_message_bytes=64 << 10))
    os.symlink(real, tmp_path / "link")
    spellings = [str(real), str(tmp_path / "link"), str(tmp_path / "link") + "/", str(real / ".." / "real")]
    _threads(lambda w: produce(kl.Root(spellings[w % 4]), "paths", w, 2000, w), 4)
    check_log(kl.Root(real), "paths", 4, 2000)


def test_threads_and_processes_together(tmp_path):
    kl.Root(tmp_path).create_topic("mixed")

    procs = [FORK.Process(target=_threaded_process, args=(str(tmp_path), w)) for w in range(0, 6, 2)]
    run(procs, timeout=60)
    check_log(kl.Root(tmp_path), "mixed", 6, 1000)


def _threaded_process(path, first_writer):
    try:
        _threads(lambda i: produce(kl.Root(path), "mixed", first_writer + i, 1000, first_writer + i), 2)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


# ----------------------------------------------------------------- lock timeouts


def _hold_lock(path: str, held, release) -> None:
    from kl.log import locks

    root = kl.Root(path)
    with locks.locked(root._lock_path("locked", 0), 5):
        held.set()
        release.wait(30)


class RefusedLocks:
    """Counts this process's lock attempts refused because another process holds the lock
    (fcntl.lockf and fcntl.flock raising EAGAIN or EACCES); calls ``on_refused(count)``."""

    def __init__(self, monkeypatch, on_refused=lambda count: None):
        self.count = 0
        for name in ("lockf", "flock"):
            monkeypatch.setattr(fcntl, name, self._counting(getattr(fcntl, name), on_refused))

    def _counting(self, real, on_refused):
        def call(fd, operation, *args):
            try:
                return real(fd, operation, *args)
            except (BlockingIOError, PermissionError):
                self.count += 1
                on_refused(self.count)
                raise

        return call


def start_holder(path) -> tuple:
    """A process holding partition 0 of topic "locked" until ``release`` is set."""
    kl.Root(path).create_topic("locked")
    held, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(str(path), held, release))
    holder.start()
    assert held.wait(10)
    return holder, release


def test_a_lock_held_by_another_process_times_out_with_lock_timeout(tmp_path, monkeypatch):
    holder, release = start_holder(tmp_path)
    try:
        refused = RefusedLocks(monkeypatch)
        root = kl.Root(tmp_path, lock_timeout=0.3)
        with pytest.raises(kl.LockTimeout, match="another process"):
            kl.Producer(root).send("locked", b"x")
        assert refused.count == 1  # one attempt, then a wait in the kernel until the timeout
        assert list(kl.Consumer(root).fetch("locked", 0, 0)) == []  # readers take no lock
        monkeypatch.undo()
    finally:
        release.set()
        holder.join(10)
    kl.Producer(kl.Root(tmp_path, lock_timeout=5)).send("locked", b"after")
    assert [m.value for m in read_all(kl.Root(tmp_path), "locked")] == [b"after"]


def test_a_lock_waiter_gets_the_lock_when_its_holder_lets_go(tmp_path, monkeypatch):
    holder, release = start_holder(tmp_path)
    try:
        refused = RefusedLocks(monkeypatch, on_refused=lambda count: release.set())
        kl.Producer(kl.Root(tmp_path, lock_timeout=60)).send("locked", b"waited")
        assert refused.count == 1  # refused while the holder held it, then granted by the kernel
        monkeypatch.undo()
    finally:
        release.set()
        holder.join(10)
    assert holder.exitcode == 0
    assert [m.value for m in read_all(kl.Root(tmp_path), "locked")] == [b"waited"]


def test_a_lock_held_by_another_thread_times_out_with_lock_timeout(tmp_path):
    from kl.log import locks

    root = kl.Root(tmp_path, lock_timeout=0.2)
    root.create_topic("locked")
    held, release = threading.Event(), threading.Event()

    def hold():
        with locks.locked(root._lock_path("locked", 0), 5):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(5)
        with pytest.raises(kl.LockTimeout, match="another thread"):
            kl.Producer(root).send("locked", b"x")
    finally:
        release.set()
        thread.join()
    kl.Producer(root).send("locked", b"after")


def _die_holding_lock(path: str) -> None:
    from kl.log import locks

    root = kl.Root(path)
    locks.locked(root._lock_path("dead", 0), 5).__enter__()
    os._exit(0)


def test_a_lock_is_released_when_its_holder_dies(tmp_path):
    kl.Root(tmp_path).create_topic("dead")
    p = FORK.Process(target=_die_holding_lock, args=(str(tmp_path),))
    p.start()
    p.join(10)
    kl.Producer(kl.Root(tmp_path, lock_timeout=2)).send("dead", b"x")
