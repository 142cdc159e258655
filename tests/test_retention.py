"""``kl.log.retention.retain``: whole segments by age (from message timestamps) and by size,
oldest first, never the active segment or a lock file; safe beside live readers and
producers (processes), which finish a deleted segment or get ``OffsetOutOfRange``."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

import kl
from kl.log.retention import DELETED_SUFFIX, retain
from kl.log.segment import list_segments
from kl.net.daemon import Daemon
from kl.net.server import ServeConfig

from faultlib import OrderChecker, fresh_log, payload, read_log, snapshot

ROLLING = kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, flush_messages=0, flush_ms=0)
PER_SEGMENT = 32
"""32-byte messages (10-byte values): one 32-message batch fills one segment exactly."""
HOUR = 3600 * 1000


def fill(root: kl.Root, timestamps: list[int], name: str = "t") -> kl.Log:
    """One full segment per timestamp, then an active segment with 3 messages stamped
    one hour after the last."""
    root.create_topic(name, ROLLING)
    producer = kl.Producer(root)
    for k, ts in enumerate(timestamps):
        producer.send_batch(name, [b"s%02dm%06d" % (k, i) for i in range(PER_SEGMENT)], partition=0, timestamp=ts)
    producer.send_batch(name, [b"active%04d" % i for i in range(3)], partition=0, timestamp=timestamps[-1] + HOUR)
    producer.close()
    log = root.log(name, 0)
    assert len(log.segments()) == len(timestamps) + 1
    return log


def bases(log: kl.Log) -> list[int]:
    return [s.base_offset for s in log.segments()]


def set_aside(log: kl.Log) -> list[str]:
    return sorted(p.name for p in Path(log.directory).iterdir() if p.name.endswith(DELETED_SUFFIX))


NOW = 1_700_000_000_000


@pytest.fixture
def aged(root) -> kl.Log:
    """Segments stamped 10, 8, 6 and 4 hours before NOW; the active one 3 hours before."""
    return fill(root, [NOW - h * HOUR for h in (10, 8, 6, 4)])


# ----------------------------------------------------------------- by age


def test_age_comes_from_the_timestamps_of_the_data(aged):
    # Each segment's newest message: 10, 8, 6 and 4 hours old.
    report = retain(aged, max_age_ms=5 * HOUR, max_bytes=0, now_ms=NOW, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0, 1024, 2048]
    assert bases(aged) == [3072, 4096]
    assert aged.state().log_start_offset == report.log_start_offset == 3072
    assert [msg.value for msg in read_log(aged)][0] == b"s03m000000"


def test_nothing_is_old_enough_at_an_earlier_now(aged):
    report = retain(aged, max_age_ms=5 * HOUR, max_bytes=0, now_ms=NOW - 6 * HOUR, delete_delay=0)
    assert report.deleted == []
    assert bases(aged) == [0, 1024, 2048, 3072, 4096]


def test_the_active_segment_is_never_deleted_by_age(aged):
    report = retain(aged, max_age_ms=1, max_bytes=0, now_ms=NOW + 100 * HOUR, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0, 1024, 2048, 3072]
    assert bases(aged) == [4096]
    assert [msg.value for msg in read_log(aged)] == [b"active%04d" % i for i in range(3)]
    assert retain(aged, max_age_ms=1, max_bytes=0, now_ms=NOW + 100 * HOUR).deleted == []


def test_a_host_whose_clock_is_ahead_neither_deletes_young_data_nor_unlinks_early(root, monkeypatch):
    """'Now' is the clock that stamps the files' times (on NFS the server's), not this host's:
    hosts minutes apart delete the same segments, and the delete delay holds for readers."""
    now = time.time_ns() // 1_000_000
    log = fill(root, [now - 2 * HOUR, now, now])
    ahead = time.time() + 3600  # this host's clock an hour ahead of the file system's
    monkeypatch.setattr(time, "time", lambda: ahead)
    monkeypatch.setattr(time, "time_ns", lambda: int(ahead * 1e9))
    report = retain(log, max_age_ms=HOUR // 2, max_bytes=0)
    assert [s.base_offset for s in report.deleted] == [0]
    assert report.unlinked == 0 and len(set_aside(log)) == 1
    assert retain(log, max_age_ms=HOUR // 2, max_bytes=0, delete_delay=0).unlinked == 1
    assert [name for name in os.listdir(log.directory) if name.startswith(".")] == []


def test_copying_a_topic_with_new_mtimes_does_not_change_what_age_deletes(root, tmp_path):
    now = time.time_ns() // 1_000_000
    log = fill(root, [now - h * HOUR for h in (50, 40, 30, 2)])
    copy = tmp_path / "copy"
    shutil.copytree(root.path, copy, copy_function=shutil.copy)  # every file gets a new mtime
    copied = kl.Root(copy).log("t", 0)
    for segment in copied.segments():
        assert os.stat(segment.path).st_mtime > time.time() - 60
    expected = [s.base_offset for s in retain(log, max_age_ms=24 * HOUR, max_bytes=0, dry_run=True).deleted]
    assert expected == [0, 1024, 2048]
    assert [s.base_offset for s in retain(copied, max_age_ms=24 * HOUR, max_bytes=0, delete_delay=0).deleted] == expected


def test_old_file_times_do_not_expire_young_data(root):
    now = time.time_ns() // 1_000_000
    log = fill(root, [now - 3 * 60_000, now - 2 * 60_000, now - 60_000])
    for segment in log.segments():
        os.utime(segment.path, (0, 0))  # 1970
    assert retain(log, max_age_ms=HOUR, max_bytes=0, delete_delay=0).deleted == []
    assert len(log.segments()) == 4


def test_the_topic_config_supplies_the_defaults(root):
    config = kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, retention_ms=5 * HOUR, retention_bytes=0)
    root.create_topic("c", config)
    producer = kl.Producer(root)
    for h in (10, 8, 6, 4):
        producer.send_batch("c", [b"x" * 10] * PER_SEGMENT, partition=0, timestamp=NOW - h * HOUR)
    producer.send("c", b"active", partition=0, timestamp=NOW)
    report = retain(root.log("c", 0), now_ms=NOW, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0, 1024, 2048]


# ----------------------------------------------------------------- by size


def test_size_retention_deletes_the_oldest_first(aged):
    total = aged.size_in_bytes()
    report = retain(aged, max_age_ms=0, max_bytes=total - 1500, now_ms=NOW, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0, 1024]
    assert report.deleted_bytes == 2048
    assert aged.size_in_bytes() <= total - 1500
    assert bases(aged) == [2048, 3072, 4096]


def test_size_retention_never_deletes_the_active_segment_or_lock_files(root, aged):
    lock = Path(root.path) / ".locks" / "t" / "0.lock"
    assert lock.exists()
    report = retain(aged, max_age_ms=0, max_bytes=1, now_ms=NOW, delete_delay=0)
    assert len(report.deleted) == 4
    assert bases(aged) == [4096]
    assert lock.exists()
    assert (Path(root.path) / ".locks").is_dir()
    kl.Producer(root).send("t", b"still writable", partition=0)
    assert [msg.value for msg in read_log(aged)][-1] == b"still writable"


def test_dry_run_lists_without_deleting(aged):
    before = snapshot(aged.directory)
    state = aged.state()
    report = retain(aged, max_age_ms=0, max_bytes=1, now_ms=NOW, dry_run=True, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0, 1024, 2048, 3072]
    assert report.reasons and all("bytes" in r for r in report.reasons)
    assert snapshot(aged.directory) == before
    assert aged.state() == state


def test_deleted_segments_are_set_aside_then_unlinked_after_the_delay(aged):
    report = retain(aged, max_age_ms=0, max_bytes=3000, now_ms=NOW)  # default delay: 60 s
    assert len(report.deleted) == 2 and report.unlinked == 0
    assert set_aside(aged) == [Path(s.path).name + DELETED_SUFFIX for s in report.deleted]
    assert bases(aged) == [2048, 3072, 4096]  # set-aside files are not segments
    assert [b for b, _ in list_segments(aged.directory)] == [2048, 3072, 4096]
    again = retain(aged, max_age_ms=0, max_bytes=3000, now_ms=NOW, delete_delay=0)
    assert again.deleted == [] and again.unlinked == 2
    assert set_aside(aged) == []


def test_delete_delay_zero_unlinks_at_once(aged):
    report = retain(aged, max_age_ms=0, max_bytes=1, now_ms=NOW, delete_delay=0)
    assert report.unlinked == 4
    assert set_aside(aged) == []


# ----------------------------------------------------------------- readers of deleted data


def test_a_reader_of_a_deleted_offset_gets_offset_out_of_range(root, aged):
    reader = fresh_log(aged)
    assert len(list(reader.read(0, 100))) == 3  # a reader part-way through segment 0
    retain(aged, max_age_ms=0, max_bytes=3000, now_ms=NOW, delete_delay=0)
    with pytest.raises(kl.OffsetOutOfRange) as e:
        reader.read(96, 100)
    assert e.value.log_start_offset == 2048
    with pytest.raises(kl.OffsetOutOfRange):
        list(kl.Consumer(kl.Root(root.path)).stream("t", 0, 96, idle_timeout=0))


@pytest.mark.parametrize("reset, first", [("earliest", b"s02m000000"), ("latest", None)])
def test_stream_restarts_per_its_reset_policy(root, aged, reset, first):
    retain(aged, max_age_ms=0, max_bytes=3000, now_ms=NOW, delete_delay=0)
    got = [msg.value for msg in kl.Consumer(kl.Root(root.path)).stream("t", 0, 0, idle_timeout=0, reset=reset)]
    assert (got[0] if got else None) == first


def test_a_reader_holding_a_deleted_segment_open_finishes_it(root, aged):
    """Once a read has opened a segment, deleting it does not disturb that read."""
    path = aged.segments()[0].path
    fd = os.open(path, os.O_RDONLY)
    try:
        retain(aged, max_age_ms=0, max_bytes=1, now_ms=NOW, delete_delay=0)
        assert not os.path.exists(path)
        data = os.pread(fd, 1024, 0)
    finally:
        os.close(fd)
    messages = kl.MessageSet(data, 0, max_message_bytes=512, stable_offset=1024, ends_at_eof=True)
    assert [msg.value for msg in messages] == [b"s00m%06d" % i for i in range(PER_SEGMENT)]


def test_a_reader_that_read_the_state_before_retention_moved_the_start_gets_the_new_start(root, aged, monkeypatch):
    """A read, and a Kafka offset's lookup, that found the state before retention
    published a new log start and set the segment aside: ``OffsetOutOfRange`` naming
    the new start (a reader resets there), neither a start that no longer holds nor
    a missing file."""
    stale = aged.state()
    retain(aged, max_age_ms=0, max_bytes=3000, now_ms=NOW, delete_delay=0)
    start = aged.state().log_start_offset
    assert start == 2 * 1024
    reader = kl.Root(root.path).log("t", 0)
    states = iter([stale])
    fresh = reader.state
    monkeypatch.setattr(reader, "state", lambda: next(states, None) or fresh())
    with pytest.raises(kl.OffsetOutOfRange) as e:
        reader.read(1024, 512)
    assert (e.value.offset, e.value.log_start_offset) == (1024, start)
    counted = kl.Root(root.path).log("t", 0)
    with pytest.raises(kl.OffsetOutOfRange) as e:
        counted.kafka_position(PER_SEGMENT, state=stale)
    assert (e.value.offset, e.value.log_start_offset) == (PER_SEGMENT, 2 * PER_SEGMENT)
    assert counted.kafka_offset(start, state=stale) == 2 * PER_SEGMENT
    assert counted.kafka_offsets(stale) == (2 * PER_SEGMENT, 4 * PER_SEGMENT + 3)


# ----------------------------------------------------------------- racing live processes

RACE_CONFIG = kl.TopicConfig(segment_bytes=16 << 10, max_message_bytes=4096, flush_messages=0, flush_ms=0)
RACE_SECONDS = 3.0


def _race_producer(root_path: str, stop, conn) -> None:
    sent = 0
    try:
        producer = kl.Producer(kl.Root(root_path))
        batch = 0
        while not stop.is_set():
            count = 1 + batch % 7
            producer.send_batch("race", [payload((1, 0, batch, i), count, 50 + batch % 200) for i in range(count)], partition=0)
            sent += count
            batch += 1
        producer.send_batch("race", [payload((2, 0, 0, i), 2) for i in range(2)], partition=0)  # the end marker
        conn.send((sent, None))
    except BaseException:
        conn.send((sent, traceback.format_exc()))


def _race_reader(root_path: str, mode: str, conn) -> None:
    checker = OrderChecker()
    resets = 0
    try:
        root = kl.Root(root_path)
        if mode == "stream":
            for msg in kl.Consumer(root).stream("race", 0, 0, reset="earliest", max_bytes=2048, poll_interval=0.001,
                                                idle_timeout=30):
                ident, _ = checker.check(msg) or ((0, 0, 0, 0), 0)
                time.sleep(0.0002)
                if ident[0] == 2 and ident[3] == 1:
                    break
        else:
            log = root.log("race", 0)
            offset, done = 0, False
            while not done:
                try:
                    messages = log.read(offset, 512)
                except kl.OffsetOutOfRange as e:
                    if e.offset >= e.log_start_offset:
                        checker.problem(f"OffsetOutOfRange for {e.offset} inside the log ({e})")
                        break
                    offset, resets = e.log_start_offset, resets + 1
                    continue
                for msg in messages:
                    ident, _ = checker.check(msg) or ((0, 0, 0, 0), 0)
                    if ident[0] == 2 and ident[3] == 1:
                        done = True
                offset = max(offset, messages.next_offset)
                time.sleep(0.002)
    except BaseException:
        checker.problem(f"{mode} reader raised: {traceback.format_exc()}")
    conn.send((checker.count, resets, checker.problems))


def test_retention_racing_live_readers_and_producers(root):
    root.create_topic("race", RACE_CONFIG)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    pipes, procs = [], []
    for target, args in [(_race_producer, (stop,)), (_race_reader, ("stream",)), (_race_reader, ("read",)),
                         (_race_reader, ("read",))]:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=target, args=(root.path, *args, child))
        p.start()
        child.close()
        pipes.append(parent)
        procs.append(p)
    log = root.log("race", 0)
    deleted = runs = 0
    deadline = time.monotonic() + RACE_SECONDS
    try:
        while time.monotonic() < deadline:
            report = retain(log, max_age_ms=0, max_bytes=40 << 10, delete_delay=0)
            deleted += len(report.deleted)
            runs += 1
            time.sleep(0.01)
        stop.set()
        results = [pipe.recv() if pipe.poll(60) else None for pipe in pipes]
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    print(f"\nretention race: {runs} retain runs deleted {deleted} segments; producer {results[0]}; "
          f"readers (messages, resets, problems) {results[1:]}")
    assert all(r is not None for r in results), results
    sent, error = results[0]
    assert error is None, error
    assert deleted > 0 and sent > 0
    for count, _resets, problems in results[1:]:
        assert problems == [], problems
        assert count > 0
    assert sum(r[1] for r in results[2:]) > 0, "the readers were never overtaken by retention"
    # What is left is whole and in order; retention ran to the end without leaving files behind.
    checker = OrderChecker()
    for msg in read_log(fresh_log(log)):
        checker.check(msg)
    assert checker.problems == []
    assert (Path(root.path) / ".locks" / "race" / "0.lock").exists()
    assert retain(log, max_age_ms=0, max_bytes=0, delete_delay=0).deleted == []
    assert not [n for n in os.listdir(log.directory) if n.endswith(DELETED_SUFFIX)]


def test_readers_racing_a_kl_retain_loop_retry_or_get_offset_out_of_range(root):
    """``-o -N`` (``position_back`` scans back to the oldest segment), reads from there,
    the same through ``kl serve``, and Kafka offsets looked up from the log start, while
    a loop of real ``kl retain`` processes deletes segments under them: messages or
    ``OffsetOutOfRange``, never a bare ``FileNotFoundError``."""
    root.create_topic("race", ROLLING)
    producer = kl.Producer(root)
    for k in range(40):
        producer.send_batch("race", [b"s%02dm%06d" % (k, i) for i in range(PER_SEGMENT)], partition=0)
    stop = threading.Event()
    server = Daemon(root, ServeConfig(port=0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    retain_loop = subprocess.Popen(
        ["bash", "-c", 'for i in $(seq 8); do "$@" retain race --max-bytes 8192 --delete-delay 0 >/dev/null || exit 1; done',
         "loop", sys.executable, "-m", "kl_cli"],
        env={**os.environ, "KL_ROOT": root.path},
    )
    outcomes: list[str] = []

    def produce() -> None:
        k = 40
        while not stop.is_set():
            producer.send_batch("race", [b"s%02dm%06d" % (k % 100, i) for i in range(PER_SEGMENT)], partition=0)
            k += 1
            time.sleep(0.005)

    def read_back(consumer: kl.Consumer) -> None:
        start = consumer.position_back("race", 0, 10**9)
        for _ in consumer.consume("race", start=start, values_only=True):
            pass

    def read_kafka(log: kl.Log) -> None:  # what a Kafka client's fetches look up, from the log start
        start, end = log.kafka_offsets()
        for k in range(start, end, PER_SEGMENT // 2):
            log.kafka_position(k)

    def read(how, reader) -> None:
        while not stop.is_set():
            try:
                how(reader)
                outcomes.append("read")
            except kl.OffsetOutOfRange:
                outcomes.append("out of range")
            except Exception as e:
                outcomes.append(f"{type(e).__name__}: {e}")

    remote = kl.RemoteConsumer(f"127.0.0.1:{server.port}")
    readers = [(read_back, kl.Consumer(root)), (read_back, remote), (read_kafka, kl.Root(root.path).log("race", 0))]
    threads = [threading.Thread(target=produce)] + [threading.Thread(target=read, args=reader) for reader in readers]
    for t in threads:
        t.start()
    try:
        assert retain_loop.wait(120) == 0
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        remote.close()
        server.stop()
        retain_loop.kill()
    assert root.log("race", 0).log_start_offset > 0
    assert outcomes.count("read") > 0
    assert [o for o in outcomes if o not in ("read", "out of range")] == []


def test_a_young_segment_before_old_ones_is_named_with_what_it_holds(root):
    log = fill(root, [NOW - 10 * HOUR, NOW + 24 * HOUR, NOW - 8 * HOUR, NOW - 6 * HOUR])
    report = retain(log, max_age_ms=2 * HOUR, now_ms=NOW)
    assert bases(log) == [1024, 2048, 3072, 4096]
    held = report.held
    assert held is not None and (held.segment.base_offset, held.offset, held.newest) == (1024, 1024, NOW + 24 * HOUR)
    assert (held.later, held.later_bytes) == (2, 2048)
    assert "86400000 ms (1.0 days) in the future: it keeps the 2 later segments (2048 bytes)" in held.reason
    assert retain(log, max_age_ms=0, max_bytes=0, now_ms=NOW).held is None  # no age rule: nothing held by it
    assert retain(log, max_age_ms=30 * HOUR, now_ms=NOW).held is None  # nothing after it is old enough either
