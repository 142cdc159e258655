"""Kafka offsets in the storage: one per message since the partition began (a compressed
batch's inner messages each their own), carried by the state record and each segment's
offset index, the same from every reader and after retention, recovery and upgrade."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import kl
from kl.errors import InvalidOffset, OffsetOutOfRange
from kl.log import message as m
from kl.log import offsetindex, retention
from kl.log.importer import import_topic
from kl.log.log import Position, SegmentInfo
from kl.log.messageset import wrap
from kl.log.recovery import recover
from kl.log.state import RECORD_V3, STATE_FILE, UNKNOWN, read_state
from kl.log.validate import Checked

from conftest import flip_byte, write

SMALL = kl.TopicConfig(segment_bytes=256, max_message_bytes=256)


def every_message(root: kl.Root, topic: str) -> list[tuple[Position, bytes]]:
    """Each message with its position (offset, and skip inside a compressed batch)."""
    log = root.log(topic, 0)
    out: list[tuple[Position, bytes]] = []
    last, skip = -1, 0
    for msg in log.messages(log.log_start_offset, log.log_end_offset):
        skip = skip + 1 if msg.offset == last else 0
        last = msg.offset
        out.append((Position(msg.offset, skip), msg.value))
    return out


def mixed(root: kl.Root, topic: str = "t", config: kl.TopicConfig = SMALL) -> list[tuple[Position, bytes]]:
    """Plain messages and compressed batches over several segments."""
    root.create_topic(topic, config)
    n = 0
    for round_ in range(12):
        values = [b"v%05d" % (n + i) for i in range(7)]
        n += len(values)
        write(root, topic, values, compression="zstd" if round_ % 3 else None)
    return every_message(root, topic)


def test_each_message_has_its_kafka_offset_and_back(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    assert len(log.segments()) > 2
    assert log.kafka_offsets() == (0, len(messages))
    for k, (position, _) in enumerate(messages):
        assert log.kafka_position(k) == position
        assert log.kafka_offset(position.offset, position.skip) == k
    assert log.kafka_position(len(messages)) == Position(log.log_end_offset)
    for wrong in (-1, len(messages) + 1):
        with pytest.raises(OffsetOutOfRange):
            log.kafka_position(wrong)


def test_a_fresh_reader_and_the_published_counts_agree(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    state = read_state(os.path.join(root.log("t", 0).directory, STATE_FILE))
    assert state.log_end_count == len(messages)
    fresh = kl.Root(tmp_path).log("t", 0)
    assert [fresh.kafka_position(k) for k in range(len(messages))] == [p for p, _ in messages]


def test_the_index_is_a_cache_rebuilt_when_damaged_or_missing(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    closed = log.segments()[:-1]
    log.kafka_position(0)  # counts every segment
    for info in closed:
        assert offsetindex.read(info.path, info.base_offset, *_size_mtime(info.path)) is not None
    os.unlink(offsetindex.index_path(closed[0].path))
    with open(offsetindex.index_path(closed[1].path), "r+b") as f:
        f.seek(30)
        f.write(b"\xff")
    fresh = kl.Root(tmp_path).log("t", 0)
    assert [fresh.kafka_position(k) for k in range(len(messages))] == [p for p, _ in messages]


def test_retention_moves_the_start_and_renumbers_nothing(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    first = log.segments()[0]
    kept = [(k, p) for k, (p, _) in enumerate(messages) if p.offset >= log.segments()[1].base_offset]
    with log.locked():
        log.delete_segments([first], log.segments()[1].base_offset)
    fresh = kl.Root(tmp_path).log("t", 0)
    assert fresh.kafka_offsets() == (kept[0][0], len(messages))
    assert all(fresh.kafka_position(k) == p for k, p in kept)
    with pytest.raises(OffsetOutOfRange):
        fresh.kafka_position(kept[0][0] - 1)


@pytest.mark.parametrize("renumbered", [False, True])
def test_recovery_of_a_lost_state_record_keeps_the_numbers_after_retention(tmp_path, renumbered) -> None:
    """Retention deleted every closed segment, then the state record was lost: the
    active segment's base count, kept beside it at its roll (and where a copy is
    renumbered), still numbers its messages as before."""
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    if renumbered:
        log.renumber(log.log_end_offset, len(messages) + 1000)
    shift = 1000 * renumbered
    active = log.segments()[-1]
    kept = [(k + shift, p) for k, (p, _) in enumerate(messages) if p.offset >= active.base_offset]
    assert retention.retain(log, max_bytes=1, delete_delay=0).log_start_offset == active.base_offset
    log.close()
    os.unlink(log.state_path)
    report = recover(kl.Root(tmp_path).log("t", 0))
    assert [f.kind for f in report.findings] == ["STATE"]
    fresh = kl.Root(tmp_path).log("t", 0)
    assert fresh.kafka_offsets() == (kept[0][0], len(messages) + shift)
    assert [fresh.kafka_position(k) for k, _ in kept] == [p for _, p in kept]
    assert not recover(kl.Root(tmp_path).log("t", 0)).findings


def test_a_partition_an_older_kl_wrote_gets_its_counts_on_first_open(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    for info in log.segments():
        offsetindex.remove(info.path)
    state = read_state(log.state_path)
    record = RECORD_V3.pack(b"klst", 3, *state[:9])  # as kl before counts wrote it
    with open(log.state_path, "r+b") as f:
        f.write(record + (__import__("zlib").crc32(record)).to_bytes(4, "big"))
    old = read_state(log.state_path)
    assert (old.active_base_count, old.log_end_count) == (UNKNOWN, UNKNOWN)
    reader = kl.Root(tmp_path).log("t", 0)
    assert reader.kafka_offsets() == (0, len(messages))  # a reader works them out
    write(kl.Root(tmp_path), "t", [b"after"])  # the next writer publishes them
    assert read_state(log.state_path).log_end_count == len(messages) + 1
    assert kl.Root(tmp_path).log("t", 0).kafka_position(len(messages)).offset == log.state().last_append_offset


def _size_mtime(path: str) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def test_offsets_for_times_inside_a_compressed_batch(tmp_path) -> None:
    root = kl.Root(tmp_path)
    root.create_topic("t")
    log = root.log("t", 0)
    log.append(Checked.framed(m.encode(b"before", None, 500), 1))
    inner = b"".join(m.encode(b"v%d" % i, None, 1000 * i) for i in range(1, 6))  # stamped 1000 to 5000
    at = log.append(Checked.framed(wrap(inner, m.CODEC_ZSTD, 1000), 5))
    for time_ms, kafka_offset in ((900, 1), (1000, 1), (2500, 3), (5000, 5)):
        position, msg = log.message_for_time(time_ms)
        assert (position, log.kafka_offset(*position)) == (Position(at, kafka_offset - 1), kafka_offset)
        assert msg.value == b"v%d" % kafka_offset
    assert log.message_for_time(5001) is None


def test_kl_consume_reads_from_a_kafka_offset_and_prints_them(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    cli = [sys.executable, "-m", "kl_cli", "--root", str(tmp_path), "consume", "t"]
    for start in (0, 9, len(messages) - 1):
        shown = (
            subprocess.run(
                [*cli, "-o", f"kafka:{start}", "--format", "{kafka_offset} {offset} {value}"], capture_output=True, check=True
            )
            .stdout.decode()
            .split("\n")[:-1]
        )
        assert shown == [f"{k} {p.offset} {v.decode()}" for k, (p, v) in enumerate(messages) if k >= start]
    out_of_range = subprocess.run([*cli, "-o", f"kafka:{len(messages) + 1}"], capture_output=True)
    assert out_of_range.returncode == 1 and out_of_range.stderr.count(b"\n") == 1
    assert b"Kafka offset" in out_of_range.stderr and b"out of range" in out_of_range.stderr
    remote = subprocess.run([*cli[:3], "consume", "t", "--server", "127.0.0.1:1", "-o", "kafka:1"], capture_output=True)
    assert remote.returncode == 2 and b"not with --server" in remote.stderr


def test_recover_reports_a_damaged_or_wrong_offset_index_and_one_of_no_segment(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    log.kafka_position(0)  # every closed segment counted and indexed
    first, second = log.segments()[:2]
    with open(offsetindex.index_path(first.path), "r+b") as f:
        f.seek(40)
        f.write(b"\x7f")  # damaged: its checksum fails
    kept = offsetindex.read(second.path, second.base_offset, *_size_mtime(second.path))
    offsetindex.write(second.path, kept._replace(messages=kept.messages + 1))  # a wrong count, checksummed
    orphan = offsetindex.index_path(os.path.join(log.directory, "00000000000099999999.kl"))
    with open(orphan, "wb") as f:
        f.write(b"x")
    report = recover(kl.Root(tmp_path).log("t", 0))
    found = sorted((f.kind, f.action, f.path) for f in report.findings)
    assert found == sorted(
        [
            ("OFFSET_INDEX", "rebuilt", offsetindex.index_path(first.path)),
            ("OFFSET_INDEX", "rebuilt", offsetindex.index_path(second.path)),
            ("OFFSET_INDEX", "removed", orphan),
        ]
    )
    assert not os.path.exists(orphan)
    fresh = kl.Root(tmp_path).log("t", 0)
    assert [fresh.kafka_position(k) for k in range(len(messages))] == [p for p, _ in messages]
    assert not recover(kl.Root(tmp_path).log("t", 0)).findings


def copied_partition(root: kl.Root, topic: str, to: str, keep: tuple[str, ...]) -> str:
    """A copy of partition 0's segment files and of those of its other files named in
    ``keep`` ("state", "indexes"), as ``cp`` without ``-p`` makes it (new modification times)."""
    source = root.log(topic, 0).directory
    os.makedirs(to)
    for name in os.listdir(source):
        wanted = (
            name.endswith(".kl")
            or (name == STATE_FILE and "state" in keep)
            or (name.endswith(offsetindex.SUFFIX) and "indexes" in keep)
        )
        if wanted:
            with open(os.path.join(source, name), "rb") as f, open(os.path.join(to, name), "wb") as out:
                out.write(f.read())
    return to


@pytest.mark.parametrize("keep", [("state",), ("indexes",), ("state", "indexes")])
@pytest.mark.parametrize("deleted", ["oldest", "closed"])
def test_kl_topics_import_keeps_the_kafka_offsets_a_directory_tells(tmp_path, keep, deleted) -> None:
    """With the oldest segment deleted, or every closed one (then only the active
    segment's index, from its roll, tells its numbers)."""
    root = kl.Root(tmp_path / "old")
    messages = mixed(root)
    log = root.log("t", 0)
    log.kafka_position(0)  # every closed segment indexed
    segments = log.segments()
    gone = segments[:1] if deleted == "oldest" else segments[:-1]
    start = segments[len(gone)].base_offset
    with log.locked():
        log.delete_segments(gone, start)
    for info in gone:
        offsetindex.remove(info.path)
    kept = [(k, p) for k, (p, _) in enumerate(messages) if p.offset >= start]
    directory = copied_partition(root, "t", str(tmp_path / "copy"), keep)
    done = subprocess.run(
        [sys.executable, "-m", "kl_cli", "--root", str(tmp_path / "new"), "topics", "import", "t", directory],
        capture_output=True,
        check=True,
    )
    assert done.stdout.decode().startswith(f"t/0: imported {directory}: ")
    imported = kl.Root(tmp_path / "new").log("t", 0)
    assert imported.kafka_offsets() == (kept[0][0], len(messages))
    assert [imported.kafka_position(k) for k, _ in kept] == [p for _, p in kept]
    assert [imported.kafka_offset(*p) for _, p in kept] == [k for k, _ in kept]


def test_kl_topics_import_counts_from_0_where_a_directory_tells_no_kafka_offsets(tmp_path) -> None:
    root = kl.Root(tmp_path / "old")
    messages = mixed(root)
    log = root.log("t", 0)
    second = log.segments()[1].base_offset
    with log.locked():
        log.delete_segments([log.segments()[0]], second)
    kept = [p for p, _ in messages if p.offset >= second]
    new = kl.Root(tmp_path / "new")
    (done,) = import_topic(new, "t", [copied_partition(root, "t", str(tmp_path / "copy"), ())])
    assert done.kafka_offsets == (0, len(kept))
    assert [new.log("t", 0).kafka_position(k) for k in range(len(kept))] == kept


def mixed_segment(path, where: str) -> tuple[list[tuple[Position, bytes]], SegmentInfo]:
    """``mixed`` in a root at ``path``, and its second segment (``where`` "closed") or its
    active one."""
    root = kl.Root(path)
    messages = mixed(root)
    segments = root.log("t", 0).segments()
    return messages, segments[1] if where == "closed" else segments[-1]


@pytest.mark.parametrize("where", ["closed", "active"])
def test_a_repair_keeps_the_kafka_offsets_after_the_damage_and_moves_those_before_it_up(tmp_path, where) -> None:
    messages, damaged = mixed_segment(tmp_path, where)
    early = kl.Root(tmp_path).log("t", 0)  # a long-running reader (kl serve's) that counted before the damage
    assert [early.kafka_position(k) for k in range(len(messages))] == [p for p, _ in messages]
    with open(damaged.path, "rb") as f:
        length = int.from_bytes(f.read(4), "big")
    flip_byte(damaged.path, 4 + length - 1)  # the last byte of the segment's first message set
    lost = [k for k, (p, _) in enumerate(messages) if p.offset == damaged.base_offset]
    kl_cli = [sys.executable, "-m", "kl_cli", "--root", str(tmp_path)]
    done = subprocess.run([*kl_cli, "recover", "--deep", "--repair"], capture_output=True)
    assert b"repaired" in done.stdout, done
    kept = [(k if k > lost[-1] else k + len(lost), p) for k, (p, _) in enumerate(messages) if k not in lost]
    fresh = kl.Root(tmp_path)
    assert [p for p, _ in every_message(fresh, "t")] == [p for _, p in kept]
    for log in (fresh.log("t", 0), early):
        assert log.kafka_offsets() == (len(lost), len(messages))  # the log end's is kept
        assert [log.kafka_offset(*p) for _, p in kept] == [k for k, _ in kept]
        assert [log.kafka_position(k) for k, _ in kept] == [p for _, p in kept]
    subprocess.run([*kl_cli, "produce", "t", "--partition", "0"], input=b"next\n", capture_output=True, check=True)
    appended = kl.Root(tmp_path).log("t", 0).state().last_append_offset
    write(kl.Root(tmp_path), "t", [b"x" * 100] * 6)  # rolls
    again = kl.Root(tmp_path).log("t", 0)
    assert again.kafka_offset(appended) == len(messages)
    assert [again.kafka_offset(*p) for _, p in kept] == [k for k, _ in kept]
    assert not recover(again, deep=True).findings


@pytest.mark.parametrize("where", ["closed", "active"])
def test_a_shallow_repair_of_a_segment_cut_short_pads_from_its_last_whole_message(tmp_path, where) -> None:
    messages, cut = mixed_segment(tmp_path, where)
    last = max(p.offset for p, _ in messages if p.offset < cut.base_offset + cut.size_in_bytes)
    os.truncate(cut.path, last - cut.base_offset + 10)  # inside its last message set, below the committed end
    done = subprocess.run([sys.executable, "-m", "kl_cli", "--root", str(tmp_path), "recover", "--repair"], capture_output=True)
    assert b"repaired" in done.stdout, done
    log = kl.Root(tmp_path).log("t", 0)
    assert not recover(log, deep=True).findings
    lost = [k for k, (p, _) in enumerate(messages) if p.offset == last]
    kept = [(k if k > lost[-1] else k + len(lost), p) for k, (p, _) in enumerate(messages) if k not in lost]
    assert [p for p, _ in every_message(kl.Root(tmp_path), "t")] == [p for _, p in kept]
    assert log.kafka_offsets() == (len(lost), len(messages))
    assert [log.kafka_position(k) for k, _ in kept] == [p for _, p in kept]


def test_kl_topics_alter_renumbers_nothing(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root, config=kl.TopicConfig(segment_bytes=256, max_message_bytes=256, headers=False))
    reader = kl.Root(tmp_path).log("t", 0)
    assert reader.kafka_offsets() == (0, len(messages))  # a reader that counted before the change
    kl_cli = [sys.executable, "-m", "kl_cli", "--root", str(tmp_path)]
    change = ["--partitions", "3", "--segment-bytes", "4096", "--max-message-bytes", "512", "--headers", "--retention-ms", "9000"]
    subprocess.run([*kl_cli, "topics", "alter", "t", *change], capture_output=True, check=True)
    subprocess.run([*kl_cli, "produce", "t", "--partition", "0"], input=b"after\n", capture_output=True, check=True)
    for log in (reader, kl.Root(tmp_path).log("t", 0)):
        assert log.kafka_offsets() == (0, len(messages) + 1)
        assert [log.kafka_position(k) for k in range(len(messages))] == [p for p, _ in messages]
        assert log.kafka_position(len(messages)).offset == log.state().last_append_offset
    assert [kl.Root(tmp_path).log("t", p).kafka_offsets() for p in (1, 2)] == [(0, 0), (0, 0)]


def test_renumber_shifts_every_kafka_offset_alike_and_start_at_takes_a_count(tmp_path) -> None:
    root = kl.Root(tmp_path)
    messages = mixed(root)
    log = root.log("t", 0)
    end = log.log_end_offset
    with pytest.raises(InvalidOffset, match="it ends at"):
        log.renumber(0, 5)  # not the log end
    with pytest.raises(InvalidOffset, match="starts at Kafka offset 0"):
        log.renumber(end, len(messages) - 1)  # the first message would be -1
    assert log.renumber(end, len(messages) + 100) == 100
    assert log.renumber(end, len(messages) + 100) == 0
    fresh = kl.Root(tmp_path).log("t", 0)
    assert fresh.kafka_offsets() == (100, len(messages) + 100)
    assert [fresh.kafka_position(k + 100) for k in range(len(messages))] == [p for p, _ in messages]
    root.create_topic("e")
    empty = root.log("e", 0)
    empty.start_at(1000, 77)
    (appended,) = write(root, "e", [b"first"])
    assert appended.offset == 1000
    assert kl.Root(tmp_path).log("e", 0).kafka_offsets() == (77, 78)
