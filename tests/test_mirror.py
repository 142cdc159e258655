"""kl mirror: copies with identical offsets and bytes, from a root or a server, resuming
from the target's end, refusing a target that is not a copy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import kl
from kl import mirror
from kl.log import offsetindex
from kl.log.log import Position
from kl.net.daemon import Daemon
from kl.net.server import ServeConfig
from kl_cli.main import cli

from conftest import flip_byte, read_all

KL = [sys.executable, "-m", "kl_cli"]
SMALL = kl.TopicConfig(partitions=2, segment_bytes=16 << 10, max_message_bytes=4 << 10, flush_ms=0)


def fill(root: kl.Root, topic: str, n: int, *, start: int = 0, partitions: int = 2) -> None:
    """``n`` messages of varied sizes, round-robin over the partitions, a few per append."""
    producer = kl.Producer(root)
    for i in range(start, start + n, 5):
        values = [b"m%d-" % j + b"x" * (j * 37 % 500) for j in range(i, min(i + 5, start + n))]
        producer.send_batch(topic, values, partition=i // 5 % partitions)


def raw(root: kl.Root, topic: str, partition: int) -> tuple[int, bytes]:
    """(log start, every byte from the log start to the log end) of a partition."""
    log = root.log(topic, partition)
    state = log.state()
    chunks, offset = [], state.log_start_offset
    while offset < state.log_end_offset:
        chunk = mirror.read_raw(log, offset, 1 << 20)
        chunks.append(chunk)
        offset += len(chunk)
    return state.log_start_offset, b"".join(chunks)


def assert_same(source: kl.Root, target: kl.Root, topic: str = "t") -> None:
    for p in range(source.config(topic).partitions):
        assert raw(target, topic, p) == raw(source, topic, p)


def retain_to(root: kl.Root, topic: str, partition: int, keep: int) -> int:
    """Delete all but the last ``keep`` segments (as retention does); returns the new log start."""
    log = root.log(topic, partition)
    segments = log.segments()
    assert len(segments) > keep
    with log.locked():
        log.delete_segments(segments[:-keep], segments[-keep].base_offset)
    return segments[-keep].base_offset


@pytest.fixture
def source(tmp_path: Path) -> Iterator[kl.Root]:
    root = kl.Root(tmp_path / "source", lock_timeout=30)
    root.create_topic("t", SMALL)
    fill(root, "t", 300)
    yield root
    root.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[kl.Root]:
    root = kl.Root(tmp_path / "target", lock_timeout=30)
    yield root
    root.close()


@pytest.fixture
def server(source: kl.Root) -> Iterator[str]:
    srv = Daemon(source, ServeConfig(port=0))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.port}"
    srv.stop()
    thread.join(10)


def run(source: kl.Root | str, target: kl.Root, topics: list[str] | None = None) -> list[mirror.PartitionCopy]:
    src = mirror.LocalSource(kl.Root(source.path)) if isinstance(source, kl.Root) else mirror.open_source(source)
    try:
        return mirror.mirror(src, target, topics)
    finally:
        src.close()


# ----------------------------------------------------------------- copying


def test_local_copy_has_identical_offsets_bytes_and_settings(source, target):
    copies = run(source, target)
    assert_same(source, target)
    assert target.config("t") == source.config("t")
    assert [(c.partition, c.from_offset, c.to_offset) for c in copies] == [
        (p, 0, source.log("t", p).log_end_offset) for p in (0, 1)
    ]
    assert sum(c.messages for c in copies) == 300
    assert len(list(Path(target.path, "t", "0").glob("*.kl"))) > 1  # segments rolled in the target too


def test_headers_and_null_values_are_copied_and_a_target_without_headers_gets_them(source, target):
    kl.Producer(source).send_batch("t", [b"v", None], headers=[[("h", b"1")], None], partition=0)
    target.create_topic("t", dataclasses.replace(source.config("t"), headers=False))
    run(source, target)
    assert_same(source, target)
    assert target.config("t").holds_headers
    assert [(msg.value, msg.headers) for msg in read_all(target, "t", 0)[-2:]] == [(b"v", (("h", b"1"),)), (None, ())]


def test_server_copy_has_identical_offsets_and_bytes(source, target, server):
    source.create_topic("other", kl.TopicConfig(max_message_bytes=8 << 10, segment_bytes=64 << 10))
    fill(source, "other", 40, partitions=1)
    run(server, target)
    assert_same(source, target)
    assert_same(source, target, "other")
    assert target.config("other") == source.config("other")


def test_message_larger_than_a_fetch_is_fetched_whole(source, target, server):
    kl.Producer(source).send("t", b"L" * 3000, partition=0)
    src = mirror.open_source(server)
    try:
        mirror.Mirror(src, target, ["t"], fetch_bytes=1000).run()
    finally:
        src.close()
    assert_same(source, target)


def test_resumes_from_the_target_end(source, target, server):
    run(source, target)
    ends = [target.log("t", p).log_end_offset for p in (0, 1)]
    fill(source, "t", 100, start=300)
    copies = run(server, target)
    assert [c.from_offset for c in copies] == ends
    assert sum(c.messages for c in copies) == 100
    assert_same(source, target)


def test_empty_target_starts_at_the_source_log_start(source, target, server):
    start = retain_to(source, "t", 0, keep=2)
    assert start > 0
    run(server, target)
    assert target.log("t", 0).log_start_offset == start
    assert_same(source, target)
    fill(source, "t", 20, start=300)
    run(source, target)
    assert_same(source, target)


def test_target_behind_the_source_start_is_refused(source, target):
    run(source, target)
    end = target.log("t", 0).log_end_offset
    fill(source, "t", 300, start=300)
    start = retain_to(source, "t", 0, keep=1)
    with pytest.raises(mirror.SourceGap, match=f"ends at offset {end} but the source now starts at {start}"):
        run(source, target)


def test_cli_summary_per_partition(source, target):
    result = CliRunner().invoke(cli, ["mirror", source.path, target.path, "t"])
    assert result.exit_code == 0, result.output
    ends = [source.log("t", p).log_end_offset for p in (0, 1)]
    assert result.stdout.splitlines() == [
        "topic  partition  from  to     bytes  messages",
        f"t      0          0     {ends[0]}  {ends[0]}  150",
        f"t      1          0     {ends[1]}  {ends[1]}  150",
    ]


def test_a_second_mirror_into_the_topic_is_refused(source, target):
    first = mirror.Mirror(mirror.LocalSource(source), target)
    first.discover()
    try:
        with pytest.raises(mirror.MirrorBusy, match="another kl mirror is copying into topic 't'"):
            run(source, target)
    finally:
        first.close()
    run(source, target)
    assert_same(source, target)


class Kafka07Broker:
    """A stand-in for a Kafka 0.7 broker in front of a kl serve: a connection whose first
    request is one of kl's (HELLO) is closed, as Kafka 0.7 closes one on an unknown type;
    any other is passed through as a plain (0.7) connection."""

    def __init__(self, upstream: str):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = conn.recv(6, socket.MSG_WAITALL)
            if len(head) < 6 or struct.unpack(">ih", head)[1] >= 100:
                return
            with socket.create_connection(self.upstream) as up:
                up.sendall(head)
                threading.Thread(target=self._pipe, args=(up, conn), daemon=True).start()
                self._pipe(conn, up)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def kafka07(source: kl.Root, server: str) -> Iterator[str]:
    source.create_topic("legacy", kl.TopicConfig(partitions=2, segment_bytes=16 << 10, max_message_bytes=4 << 10, format="0.7"))
    fill(source, "legacy", 200)
    broker = Kafka07Broker(server)
    yield broker.address
    broker.close()


def test_copy_from_a_kafka07_broker_needs_topics_and_partitions(source, target, kafka07):
    src = mirror.open_source(kafka07, partitions=2)
    try:
        assert isinstance(src, mirror.RemoteSource) and not src.kl
        mirror.mirror(src, target, ["legacy"])
        with pytest.raises(kl.InvalidConfig, match="cannot list its topics: name them"):
            mirror.mirror(src, target)
    finally:
        src.close()
    assert target.config("legacy").format == "0.7"
    assert_same(source, target, "legacy")
    done = subprocess.run([*KL, "mirror", kafka07, target.path, "legacy"], capture_output=True, timeout=60)
    assert (done.returncode, done.stderr.decode()) == (
        1,
        f"Error: {kafka07} is a Kafka 0.7 broker, which cannot say how many partitions 'legacy' has\n",
    )


# ----------------------------------------------------------------- refusing a target that is not a copy


def test_target_with_other_data_is_refused_at_the_offset(source, target):
    run(source, target)
    log = target.log("t", 1)
    damaged = log.log_end_offset - 50
    (holder,) = [m.offset for m in read_all(target, "t", 1) if m.offset <= damaged < m.next_offset]
    base = log.state().active_base_offset
    flip_byte(Path(log.directory) / f"{base:020d}.kl", damaged - base)
    with pytest.raises(mirror.Diverged, match=f"t/1: the target differs from the source in the message at offset {holder}$"):
        run(source, target)


def test_target_longer_than_the_source_is_refused(source, target):
    run(source, target)
    kl.Producer(target).send("t", b"extra", partition=0)
    end, longer = source.log("t", 0).log_end_offset, target.log("t", 0).log_end_offset
    with pytest.raises(mirror.Diverged, match=f"t/0: the target ends at offset {longer}, beyond the source's end {end}"):
        run(source, target)


def test_target_written_elsewhere_is_refused(source, target):
    target.create_topic("t", SMALL)
    kl.Producer(target).send("t", b"not from the source", partition=0)
    with pytest.raises(mirror.Diverged, match=r"t/0: the target differs from the source in the message at offset 0 \(the"):
        run(source, target)


def test_target_with_more_partitions_is_refused_not_shrunk(source, target):
    target.create_topic("t", kl.TopicConfig(partitions=3))
    with pytest.raises(mirror.Diverged, match="has 2 partitions in .* but 3 in"):
        run(source, target)
    assert target.config("t").partitions == 3


def test_messages_count_the_inner_messages_of_compressed_batches(tmp_path, target):
    src = kl.Root(tmp_path / "zstd")
    src.create_topic("z", kl.TopicConfig(partitions=1))
    producer = kl.Producer(src, compression="zstd")
    for i in range(5):
        producer.send_batch("z", [b"v%d-%d" % (i, j) for j in range(1000)], partition=0)
    copies = run(src, target)
    assert [(c.messages, c.to_offset) for c in copies] == [(5000, src.log("z", 0).log_end_offset)]
    result = CliRunner().invoke(cli, ["mirror", src.path, str(tmp_path / "cli"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["messages"] == 5000
    src.close()


def test_partitions_added_to_the_source_are_added_to_the_target(source, target):
    run(source, target)
    topic_id = target.topic_id("t")
    source.alter_topic("t", partitions=3)
    fill(source, "t", 30, start=300, partitions=3)
    copies = run(source, target)
    assert target.config("t") == source.config("t")
    assert target.topic_id("t") == topic_id
    assert [c.partition for c in copies] == [0, 1, 2]
    assert_same(source, target)


def fresh_ends(path: str, partitions: int) -> list[int]:
    """The ends of topic t's partitions, read by a new Root (one that caches no config); -1 where there is none yet."""
    with contextlib.closing(kl.Root(path)) as root:
        try:
            return [root.log("t", p).log_end_offset for p in range(partitions)]
        except kl.KlError:
            return [-1] * partitions


def test_follow_picks_up_partitions_added_to_the_source(source, target):
    src = mirror.LocalSource(kl.Root(source.path))
    stop = threading.Event()
    copies: list[list[mirror.PartitionCopy]] = []
    thread = threading.Thread(target=lambda: copies.append(mirror.mirror(src, target, ["t"], follow=True, stop=stop, poll=0.05)))
    thread.start()
    try:
        wait_until(lambda: ends(target) == ends(source))
        source.alter_topic("t", partitions=3)
        kl.Producer(source).send("t", b"new", partition=2)
        wait_until(lambda: fresh_ends(target.path, 3) == [source.log("t", p).log_end_offset for p in range(3)])
    finally:
        stop.set()
        thread.join(20)
        src.close()
    assert [c.partition for c in copies[0]] == [0, 1, 2]
    assert_same(source, target)


def test_cli_error_is_one_line(source, target):
    target.create_topic("t", kl.TopicConfig(partitions=3))
    done = subprocess.run([*KL, "mirror", source.path, target.path], capture_output=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.decode().count("\n") == 1 and done.stderr.startswith(b"Error: topic 't' has 2 partitions")


# ----------------------------------------------------------------- following, stopping, crashing


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def wait_until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def ends(root: kl.Root) -> list[int]:
    try:
        return [root.log("t", p).log_end_offset for p in (0, 1)]
    except (kl.TopicNotFound, kl.RootNotFound, kl.CorruptState):
        return [-1, -1]


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, -signal.SIGINT)])
def test_follow_copies_new_data_until_stopped(source, target, processes, sig, status):
    proc = subprocess.Popen(
        [*KL, "mirror", source.path, target.path, "--follow", "--poll", "0.05", "--json"], stdout=subprocess.PIPE
    )
    processes.append(proc)
    wait_until(lambda: ends(target) == ends(source))
    fill(source, "t", 50, start=300)
    wait_until(lambda: ends(target) == ends(source))
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == status
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["partition"], r["from_offset"], r["to_offset"], r["messages"]) for r in rows] == [
        (p, 0, end, 175) for p, end in enumerate(ends(source))
    ]
    assert_same(source, target)


def test_killed_at_random_moments_and_resumed(source, target, server, processes):
    stop = threading.Event()

    def produce() -> None:
        n = 300
        while not stop.is_set():
            fill(source, "t", 10, start=n)
            n += 10
            time.sleep(0.002)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    rng = random.Random(os.getpid())
    try:
        for spec in [source.path, server] * 3:
            before = ends(target)
            proc = subprocess.Popen([*KL, "mirror", spec, target.path, "--follow", "--poll", "0.01"])
            processes.append(proc)
            wait_until(lambda before=before: ends(target) != before)  # it is copying
            time.sleep(rng.uniform(0, 0.2))
            proc.kill()
            proc.wait(10)
    finally:
        stop.set()
        producer.join(10)
    copied = ends(target)  # a partition whose turn no killed mirror reached is still at 0
    copies = run(source, target)
    assert [c.from_offset for c in copies] == copied and max(copied) > 0  # resumed where the target ends
    assert_same(source, target)


# ----------------------------------------------------------------- Kafka offsets


def numbered(root: kl.Root, topic: str, partition: int) -> list[tuple[Position, int]]:
    """Each message's position (offset, and skip inside a compressed batch) and Kafka offset, by a fresh reader."""
    with contextlib.closing(kl.Root(root.path)) as fresh:
        log = fresh.log(topic, partition)
        out, last, skip = [], -1, 0
        for msg in log.messages(log.log_start_offset, log.log_end_offset):
            skip = skip + 1 if msg.offset == last else 0
            last = msg.offset
            out.append((Position(msg.offset, skip), log.kafka_offset(msg.offset, skip)))
        return out


def assert_same_kafka_offsets(source: kl.Root, target: kl.Root, topic: str = "t") -> None:
    """Every message of the target has the source's Kafka offset, each way of asking."""
    for p in range(source.config(topic).partitions):
        theirs = numbered(source, topic, p)
        assert numbered(target, topic, p) == theirs
        with contextlib.closing(kl.Root(source.path)) as src, contextlib.closing(kl.Root(target.path)) as copy:
            assert copy.log(topic, p).kafka_offsets() == src.log(topic, p).kafka_offsets()
            assert [copy.log(topic, p).kafka_position(k) for _, k in theirs] == [position for position, _ in theirs]


def compressed(root: kl.Root, rounds: int, *, partitions: int = 2) -> None:
    """``rounds`` zstd batches of 40 messages, round-robin over the partitions."""
    producer = kl.Producer(root, compression="zstd")
    for i in range(rounds):
        producer.send_batch("t", [b"z%d-%d" % (i, j) for j in range(40)], partition=i % partitions)


@pytest.mark.parametrize("via", ["root", "server"])
def test_kafka_offsets_are_the_sources_from_a_start_retention_moved(source, target, server, via):
    compressed(source, 6)
    fill(source, "t", 200, start=300)
    compressed(source, 4)
    starts = [retain_to(source, "t", p, keep=2) for p in (0, 1)]
    assert all(kl.Root(source.path).log("t", p).kafka_offsets()[0] > 0 for p in (0, 1))
    run(source if via == "root" else server, target)
    assert [target.log("t", p).log_start_offset for p in (0, 1)] == starts
    assert any(position.skip for position, _ in numbered(target, "t", 0))  # compressed batches were copied
    assert_same_kafka_offsets(source, target)
    compressed(source, 3)
    fill(source, "t", 50, start=500)
    run(source if via == "root" else server, target)  # resumed
    assert_same_kafka_offsets(source, target)


def test_a_copy_recovery_renumbered_takes_the_source_s_kafka_offsets_again(source, target):
    compressed(source, 4)
    retain_to(source, "t", 0, keep=2)
    run(source, target)
    log = target.log("t", 0)
    for info in log.segments():
        offsetindex.remove(info.path)
    os.unlink(log.state_path)
    recovered = subprocess.run([*KL, "--root", target.path, "recover"], capture_output=True, timeout=60)
    assert b"state record is missing" in recovered.stdout + recovered.stderr, recovered
    with contextlib.closing(kl.Root(target.path)) as fresh:
        assert fresh.log("t", 0).kafka_offsets()[0] == 0  # counted from the oldest segment: not the source's
    fill(source, "t", 20, start=300)
    done = subprocess.run([*KL, "mirror", source.path, target.path], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    start = kl.Root(source.path).log("t", 0).kafka_offsets()[0]
    assert f"t/0 of {target.path}: Kafka offsets renumbered by +{start} to {source.path}'s" in done.stderr.decode()
    assert_same(source, target)
    assert_same_kafka_offsets(source, target)


def test_a_server_that_cannot_tell_kafka_offsets_gives_a_copy_numbered_from_where_it_starts(source, target, server):
    start = retain_to(source, "t", 0, keep=2)
    src = mirror.open_source(server)
    assert isinstance(src, mirror.RemoteSource)
    src.conn.version = 2  # as a kl serve before KAFKA_OFFSET answers HELLO
    try:
        mirror.mirror(src, target)
    finally:
        src.close()
    assert_same(source, target)
    copy = numbered(target, "t", 0)
    assert copy[0] == (Position(start), 0)
    assert [k for _, k in copy] == list(range(len(copy)))


def test_a_source_damaged_at_its_start_is_still_numbered_and_copied_up_to_its_damage(source, target, server, caplog):
    """Its first message damaged: the count its segment's roll kept still numbers the
    log, so the copy would keep its Kafka offsets; nothing valid is there to copy."""
    log = source.log("t", 0)
    first = log.segments()[0]
    (damaged,) = [m for m in read_all(source, "t", 0) if m.offset == 0]
    flip_byte(first.path, damaged.next_offset - 1)
    with pytest.raises(mirror.Diverged, match="t/0: the source holds no valid message at offset 0, where the target ends"):
        run(server, target)
    assert "are not copied" not in caplog.text


# ----------------------------------------------------------------- creations of a topic


def recreate(root: kl.Root, topic: str = "t", *, partitions: int = 2, n: int = 300) -> str:
    """Delete ``topic`` and create it again with the same messages (the same bytes, a new id); returns the new id."""
    root.delete_topic(topic)
    config = root.create_topic(topic, dataclasses.replace(SMALL, partitions=partitions))
    fill(root, topic, n, partitions=partitions)
    return config.topic_id


def snapshot(path: str) -> dict[str, bytes]:
    """Every file under ``path`` but the lock files, with its bytes."""
    files = {}
    for directory, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".locks"]
        for name in names:
            files[os.path.relpath(os.path.join(directory, name), path)] = Path(directory, name).read_bytes()
    return files


def test_the_target_records_the_source_creation(source, target):
    run(source, target)
    record = json.loads(Path(target.path, "t", mirror.MIRROR_RECORD).read_bytes())
    assert record == {"topic_id": source.topic_id("t"), "source_topic_id": source.topic_id("t"), "source": source.path}
    assert target.topic_id("t") == source.topic_id("t")


def test_a_source_created_again_is_refused_in_one_line_and_nothing_changes(source, target):
    run(source, target)
    old = source.topic_id("t")
    new = recreate(source, partitions=3, n=330)  # the same bytes in partitions 0 and 1, and one more partition
    before = snapshot(target.path)
    done = subprocess.run([*KL, "mirror", source.path, target.path], capture_output=True, timeout=60)
    assert (done.returncode, done.stderr.decode()) == (
        1,
        f"Error: topic t was deleted and created again since this copy in {target.path} was made from {source.path}"
        f" (its topic id was {old}, it is {new} now): delete it from {target.path} (kl topics delete),"
        " or mirror with --recreate to copy the new one afresh\n",
    )
    assert snapshot(target.path) == before  # not grown to 3 partitions, nothing appended


def test_recreate_copies_the_new_creation_afresh(source, target):
    run(source, target)
    kl.Producer(source).send("t", b"old only", partition=0)
    run(source, target)
    new = recreate(source, n=20)
    done = subprocess.run([*KL, "mirror", source.path, target.path, "--recreate", "--json"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"deleted topic t from" in done.stderr
    assert target.topic_id("t") == new
    assert_same(source, target)
    assert [json.loads(line)["from_offset"] for line in done.stdout.splitlines()] == [0, 0]
    done = subprocess.run([*KL, "mirror", source.path, target.path, "--recreate"], capture_output=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, b"")  # the same creation now: nothing deleted


def test_a_source_created_again_while_copying_is_caught_before_its_bytes_are_appended(source, target):
    copier = mirror.Mirror(mirror.LocalSource(kl.Root(source.path)), target)
    copier.discover(first=True)
    new = recreate(source, n=600)
    try:
        with pytest.raises(kl.TopicRecreated, match=f"it is {new} now"):
            copier.copy_round()
    finally:
        copier.close()
        copier.source.close()
    assert ends(target) == [0, 0]


def test_a_source_created_again_behind_a_server_is_refused(source, target, server):
    run(server, target)
    before = snapshot(target.path)
    new = recreate(source)
    with pytest.raises(kl.TopicRecreated, match=f"it is {new} now"):
        run(server, target)
    assert snapshot(target.path) == before


def test_a_target_without_a_record_is_checked_by_its_bytes_then_recorded(source, target):
    """A target made before the record (by a kl mirror before topic ids, or by kl topics
    create), whose id is not the source's: adopted when its bytes are a copy."""
    target.create_topic("t", SMALL)
    run(source, target)
    Path(target.path, "t", mirror.MIRROR_RECORD).unlink()
    fill(source, "t", 10, start=300)
    run(source, target)
    assert_same(source, target)
    record = json.loads(Path(target.path, "t", mirror.MIRROR_RECORD).read_bytes())
    assert (record["topic_id"], record["source_topic_id"]) == (target.topic_id("t"), source.topic_id("t"))
    assert target.topic_id("t") != source.topic_id("t")  # its own id stays: the target's groups keep their offsets
    old = source.topic_id("t")
    recreate(source)
    with pytest.raises(kl.TopicRecreated, match=f"its topic id was {old}"):
        run(source, target)


def test_a_target_without_a_record_whose_bytes_differ_names_recreation(source, target):
    target.create_topic("t", SMALL)
    run(source, target)
    Path(target.path, "t", mirror.MIRROR_RECORD).unlink()
    new = recreate(source, n=40)
    kl.Producer(source).send_batch("t", [b"other bytes"] * 400, partition=0)
    pattern = rf"the topic's id is {target.topic_id('t')} in the target and {new} in .*: if it was deleted and created again"
    with pytest.raises(mirror.Diverged, match=pattern):
        run(source, target)
    run_recreating = mirror.Mirror(mirror.LocalSource(kl.Root(source.path)), target, recreate=True)
    try:
        run_recreating.run()
    finally:
        run_recreating.source.close()
    assert target.topic_id("t") == new
    assert_same(source, target)


@pytest.mark.parametrize("recreating", [False, True])
def test_follow_of_a_root_survives_topics_deleted_and_created_again(source, target, processes, recreating):
    source.create_topic("u", SMALL)
    fill(source, "u", 50)
    proc = subprocess.Popen(
        [*KL, "mirror", source.path, target.path, "--follow", "--poll", "0.05", *(["--recreate"] if recreating else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    processes.append(proc)
    with contextlib.closing(kl.Root(target.path)) as seen:
        wait_until(lambda: ends(seen) == ends(source) and fresh_ends_of(target.path, "u") == ends_of(source, "u"))
    source.delete_topic("u")
    fill(source, "t", 50, start=300)
    wait_until(lambda: fresh_ends_of(target.path, "t") == ends(source))
    new = source.create_topic("u", SMALL).topic_id
    fill(source, "u", 20)
    fill(source, "t", 50, start=350)
    wait_until(lambda: fresh_ends_of(target.path, "t") == ends(source))
    if recreating:
        wait_until(lambda: fresh_ends_of(target.path, "u") == ends_of(source, "u"))
        assert_same(source, target, "u")
    else:
        time.sleep(0.5)  # several polls: u is not copied
        assert fresh_ends_of(target.path, "u") != ends_of(source, "u")
    assert proc.poll() is None
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0
    lines = err.decode().splitlines()
    assert lines[0].startswith(f"Warning: topic 'u' was deleted from {source.path}")
    assert lines[0].endswith("; not copied now, the other topics are")
    if recreating:
        assert lines[1].startswith("Warning: deleted topic u from") and len(lines) == 2
    else:
        assert lines[1:] == [
            f"Warning: topic u was deleted and created again since this copy in {target.path} was made"
            f" from {source.path} (its topic id was {target.topic_id('u')}, it is {new} now):"
            f" delete it from {target.path} (kl topics delete), or mirror with --recreate to copy"
            " the new one afresh; not copied now, the other topics are"
        ]
    assert_same(source, target)


def ends_of(root: kl.Root, topic: str) -> list[int]:
    return [root.log(topic, p).log_end_offset for p in range(root.config(topic).partitions)]


def fresh_ends_of(path: str, topic: str) -> list[int]:
    """The ends of ``topic``'s partitions read by a new Root; [] where there is none."""
    with contextlib.closing(kl.Root(path)) as root:
        try:
            return ends_of(root, topic)
        except kl.KlError:
            return []


def test_recreate_killed_at_random_moments_and_run_again(source, target, processes):
    run(source, target)
    new = recreate(source, n=3000)
    rng = random.Random(os.getpid())
    for _ in range(4):
        proc = subprocess.Popen([*KL, "mirror", source.path, target.path, "--recreate"], stderr=subprocess.DEVNULL)
        processes.append(proc)
        time.sleep(rng.uniform(0.2, 0.8))
        proc.kill()
        proc.wait(10)
    done = subprocess.run([*KL, "mirror", source.path, target.path, "--recreate"], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert target.topic_id("t") == new
    assert_same(source, target)


def test_recreate_copies_a_source_created_again_while_copying_afresh(source, target):
    run(source, target)
    fill(source, "t", 50, start=300)
    copier = mirror.Mirror(mirror.LocalSource(kl.Root(source.path)), target, recreate=True)
    copier.discover(first=True)
    new = recreate(source, n=600)
    try:
        while copier.copy_round():
            pass
    finally:
        copier.close()
        copier.source.close()
    assert target.topic_id("t") == new
    assert_same(source, target)


def test_a_root_onto_itself_is_refused_and_left_as_it_was(source, tmp_path):
    before = read_all(source, "t", 0)
    with pytest.raises(mirror.SameRoot, match="cannot be mirrored onto itself"):
        run(source, kl.Root(source.path + "/."))
    link = tmp_path / "link"
    link.symlink_to(source.path)
    done = subprocess.run([*KL, "mirror", source.path, str(link), "t"], capture_output=True, timeout=60)
    assert done.returncode == 1 and done.stderr.decode().count("\n") == 1 and b"Traceback" not in done.stderr
    assert b"are the same root" in done.stderr and not done.stdout
    assert read_all(source, "t", 0) == before
