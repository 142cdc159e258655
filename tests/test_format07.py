"""Topics of format 0.7: Kafka 0.7's messages in ``.kafka`` segments, for Kafka 0.7 clients.

Bytes on disk are decoded by hand here (``kafka_messages``), as a Kafka 0.7 client
would: length, magic 1, attrs, the CRC32 of the payload, the payload.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import struct
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kl
from kl.log.importer import ImportRefused, import_topic
from kl.log.log import EARLIEST, LATEST
from kl.log.messageset import frame, wrap, wrap_v1
from kl.log.recovery import recover
from kl.log.retention import retain
from kl.log.validate import Checked, validate, walked
from kl_cli.main import cli

from conftest import KAFKA07_SEGMENT, partition_dir, read_all, segment_files, v0, v1
from faultlib import flip_bit, fresh_log

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores

V07 = kl.TopicConfig(format="0.7", flush_ms=0)
SMALL = kl.TopicConfig(format="0.7", flush_ms=0, segment_bytes=100, max_message_bytes=64)


def kafka_messages(data: bytes) -> list[tuple[int, bytes]]:
    """(attrs, payload) of each message of a Kafka 0.7 message set, checking magic and crc."""
    out, pos = [], 0
    while pos < len(data):
        length, magic, attrs, crc = struct.unpack_from(">iBBI", data, pos)
        payload = data[pos + 10 : pos + 4 + length]
        assert (magic, zlib.crc32(payload)) == (1, crc), f"not a magic 1 message at {pos}"
        out.append((attrs, payload))
        pos += 4 + length
    assert pos == len(data)
    return out


def on_disk(root: kl.Root, topic: str) -> bytes:
    return b"".join(path.read_bytes() for path in segment_files(root, topic))


def run(root: kl.Root, *args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--root", root.path, *args], input=input, env={"KL_ROOT": None}, catch_exceptions=False)


@pytest.fixture
def old(root: kl.Root) -> str:
    """A one-partition topic of format 0.7."""
    root.create_topic("old", V07)
    return "old"


def three_segments(root: kl.Root) -> tuple[kl.Log, list[int], int]:
    """Topic "s" of format 0.7 with two closed segments and a non-empty active one, three
    20-byte messages each, their files last modified at 1000, 2000 and 3000 s:
    (log, base offsets, log end)."""
    root.create_topic("s", SMALL)
    producer = kl.Producer(root)
    for i in range(0, 9, 3):
        producer.send_batch("s", [b"%010d" % n for n in range(i, i + 3)], partition=0)  # one append, 60 bytes
    log = root.log("s", 0)
    bases = [s.base_offset for s in log.segments()]
    assert len(bases) == 3
    for i, path in enumerate(segment_files(root, "s")):
        os.utime(path, (1000 * (i + 1), 1000 * (i + 1)))
    return log, bases, log.log_end_offset


# ----------------------------------------------------------------- the topic and its files


def test_a_07_topic_is_created_with_a_kafka_segment(root, old):
    assert [p.name for p in segment_files(root, old)] == ["00000000000000000000.kafka"]
    assert json.loads((Path(root.path) / old / "topic.json").read_bytes())["format"] == "0.7"
    assert kl.Root(root.path).config(old).format == "0.7"


def test_an_unknown_format_is_refused():
    with pytest.raises(kl.InvalidConfig, match="format must be kl or 0.7, not '0.8'"):
        kl.TopicConfig(format="0.8")


def test_a_topic_json_without_format_reads_as_kl(root):
    root.create_topic("t")
    path = Path(root.path) / "t" / "topic.json"
    settings = json.loads(path.read_bytes())
    del settings["format"]
    path.write_text(json.dumps(settings))
    fresh = kl.Root(root.path)
    assert fresh.config("t").format == "kl"
    kl.Producer(fresh).send("t", b"v", key=b"k")
    assert [p.suffix for p in segment_files(fresh, "t")] == [".kl"]
    assert [(m.key, m.value) for m in read_all(fresh, "t")] == [(b"k", b"v")]


def test_describe_shows_the_format(root, old):
    assert re.search(r"^format +0\.7$", run(root, "topics", "describe", old).stdout, re.M)
    assert json.loads(run(root, "topics", "describe", old, "--json").stdout)["config"]["format"] == "0.7"


# ----------------------------------------------------------------- producing


def test_plain_messages_on_disk_are_kafka_07_messages(root, old):
    producer = kl.Producer(root)
    first = producer.send(old, b"one")
    assert (first.offset, first.next_offset) == (0, 13)
    producer.send_batch(old, [b"two", b"three"])
    assert kafka_messages(on_disk(root, old)) == [(0, b"one"), (0, b"two"), (0, b"three")]
    assert [(m.key, m.timestamp, m.value) for m in read_all(root, old)] == [
        (None, None, b"one"),
        (None, None, b"two"),
        (None, None, b"three"),
    ]


def test_a_gzip_batch_is_one_wrapper_of_kafka_07_messages(root, old):
    kl.Producer(root, compression="gzip").send_batch(old, [b"a", b"bb"])
    ((attrs, payload),) = kafka_messages(on_disk(root, old))
    assert attrs == 1
    assert kafka_messages(gzip.decompress(payload)) == [(0, b"a"), (0, b"bb")]
    assert [m.value for m in read_all(root, old)] == [b"a", b"bb"]


def test_the_async_producer_frames_kafka_07_messages_and_reports_their_offsets(root, old):
    landed = []
    with kl.Producer(root, linger_ms=1) as producer:
        producer.send(old, b"x", on_delivery=lambda e, a: landed.append((a.offset, a.next_offset)))
        producer.send(old, b"yy", on_delivery=lambda e, a: landed.append((a.offset, a.next_offset)))
        producer.send(old, b"zzz")
    assert kafka_messages(on_disk(root, old)) == [(0, b"x"), (0, b"yy"), (0, b"zzz")]
    assert landed == [(0, 11), (11, 23)]


def test_kl_produce_writes_kafka_07_messages(root, old):
    assert run(root, "produce", old, "--compression", "gzip", input=b"a\nb\n").exit_code == 0
    assert run(root, "produce", old, input=b"c\n").exit_code == 0
    (attrs, payload), plain = kafka_messages(on_disk(root, old))
    assert attrs == 1 and kafka_messages(gzip.decompress(payload)) == [(0, b"a"), (0, b"b")]
    assert plain == (0, b"c")


def test_a_roll_starts_another_kafka_segment(root):
    log, bases, end = three_segments(root)
    assert [p.name for p in segment_files(root, "s")] == [f"{b:020d}.kafka" for b in bases]
    assert kafka_messages(on_disk(root, "s")) == [(0, b"%010d" % i) for i in range(9)]
    assert (bases, end) == ([0, 60, 120], 180)


def test_keys_and_zstd_are_refused_and_nothing_is_written(root, old):
    no_key = "topic 'old' stores Kafka 0.7 messages, which have no key"
    with pytest.raises(kl.FormatMismatch, match=no_key):
        kl.Producer(root).send(old, b"v", key=b"k")
    with pytest.raises(kl.FormatMismatch, match=no_key):
        kl.Producer(root).send_batch(old, [b"v", b"w"], keys=[None, b"k"])
    with pytest.raises(kl.FormatMismatch, match=no_key), kl.Producer(root, linger_ms=1) as producer:
        producer.send(old, b"v", key=b"k")
    for linger_ms in (None, 1):
        with (
            pytest.raises(kl.FormatMismatch, match="cannot be compressed with zstd"),
            kl.Producer(root, compression="zstd", linger_ms=linger_ms) as producer,
        ):
            producer.send(old, b"v")
    result = run(root, "produce", old, "--key-delimiter", ":", input=b"k:v\n")
    assert (result.exit_code, result.stderr) == (1, f"Error: {no_key}\n")
    assert root.log(old, 0).log_end_offset == 0


# ----------------------------------------------------------------- importing Kafka 0.7 data


def test_an_imported_kafka_segment_is_appended_to(root, tmp_path):
    source = KAFKA07_SEGMENT.parent
    original = KAFKA07_SEGMENT.read_bytes()
    result = run(root, "topics", "import", "k", str(source), "--format", "0.7")
    assert result.exit_code == 0, result.output
    kl.Producer(root).send("k", b"hello")
    assert [p.name for p in segment_files(root, "k")] == [KAFKA07_SEGMENT.name]
    data = on_disk(root, "k")
    assert data.startswith(original)
    assert kafka_messages(data[len(original) :]) == [(0, b"hello")]
    values = [m.value for m in read_all(root, "k")]
    assert len(values) == 101 and values[-1] == b"hello"
    assert KAFKA07_SEGMENT.read_bytes() == original


def test_importing_kl_data_as_07_is_refused(root, tmp_path):
    root.create_topic("t")
    kl.Producer(root).send("t", b"v")
    kl_dir, disguised = tmp_path / "kl", tmp_path / "disguised"
    kl_dir.mkdir()
    disguised.mkdir()
    shutil.copy(partition_dir(root, "t") / "00000000000000000000.kl", kl_dir)
    shutil.copy(partition_dir(root, "t") / "00000000000000000000.kl", disguised / "00000000000000000000.kafka")
    with pytest.raises(
        ImportRefused, match=r"stores Kafka 0.7 messages \(format 0.7\): .*00000000000000000000.kl is a kl segment"
    ):
        import_topic(root, "k", [str(kl_dir)], V07)
    result = run(root, "topics", "import", "k", str(disguised), "--format", "0.7")
    assert result.exit_code == 1
    assert "00000000000000000000.kafka holds magic 2 messages (kl's), at offset 0" in result.stderr
    assert "k" not in root.topics()


# ----------------------------------------------------------------- checking a received set


def test_validate_counts_kafka_07_messages():
    data = v1(b"a") + v0(b"b") + wrap_v1(v1(b"c") + v1(b"d"), 1)
    assert validate(data, "0.7", 1024) == Checked(data, 4)


def test_validate_counts_kl_messages():
    data = frame([b"a", b"b"], 1) + wrap(frame([b"c"], 1), 4, 1)
    assert validate(data, "kl", 1024) == Checked(data, 3)


def test_validate_gives_bytes_for_a_received_buffer():
    data = frame([b"a"], 1)
    assert validate(memoryview(data), "kl", 1024) == Checked(data, 1)
    assert type(validate(bytearray(data), "kl", 1024).data) is bytes


def test_walked_counts_a_compressed_batchs_inner_messages():
    data = frame([b"a"], 1) + wrap(frame([b"b", b"c"], 1), 4, 1)
    assert walked(data, 1024) == Checked(data, 3)


@pytest.mark.parametrize(
    "data, fmt, problem",
    [
        (b"", "0.7", r"empty message set \(at position 0\)"),
        (v1(b"a") + v1(b"bb")[:-1], "0.7", r"partial message at the end \(11 of 12 bytes\) \(at position 11\)"),
        (v1(b"a")[:-1] + b"b", "0.7", r"checksum mismatch \(at position 0\)"),
        (v1(b"a") + frame([b"b"], 1), "0.7", r"magic 2 in a topic of format 0.7 \(at position 11\)"),
        (v1(b"a"), "kl", r"magic 1 in a topic of format kl \(at position 0\)"),
        (v1(b"x" * 100), "0.7", r"message of 110 bytes exceeds max_message_bytes 64 \(at position 0\)"),
        (wrap(frame([b"b"], 1), 4, 1), "0.7", "magic 2 in a topic of format 0.7"),
        (v1(b"\x28\xb5\x2f\xfd", 4), "0.7", r"attributes 0x04 \(codec zstd\) in a topic of format 0.7"),
        (v1(b"a", 0x08), "0.7", r"attributes 0x08 \(codec none\)"),
        (wrap_v1(frame([b"c"], 1), 1), "0.7", "inner message's magic is not for format 0.7"),
        (v1(b"not gzip", 1), "0.7", "compressed batch: gzip"),
    ],
)
def test_validate_refuses(data, fmt, problem):
    with pytest.raises(kl.InvalidMessageSet, match=problem):
        validate(data, fmt, 64)


# ----------------------------------------------------------------- time by file mtime


def test_offsets_before_follows_kafka_07_by_segment_mtimes(root):
    log, (b0, b1, b2), end = three_segments(root)
    now = time.time_ns() // 1_000_000
    assert log.offsets_before(LATEST, 10) == [end, b2, b1, b0]
    assert log.offsets_before(LATEST, 1) == [end]
    assert log.offsets_before(EARLIEST, 10) == [b0]
    assert log.offsets_before(2_500_000, 10) == [b1, b0]
    assert log.offsets_before(2_000_000, 1) == [b1]
    assert log.offsets_before(999_999, 10) == []
    assert log.offsets_before(now + 60_000, 10) == [end, b2, b1, b0]


def test_an_empty_active_segment_adds_no_log_end(root, old):
    log = root.log(old, 0)
    os.utime(segment_files(root, old)[0], (1000, 1000))
    assert log.offsets_before(LATEST, 10) == [0]
    assert log.offsets_before(2_000_000, 10) == [0]


def test_offset_for_time_is_the_first_segment_modified_since(root):
    log, (b0, b1, b2), end = three_segments(root)
    assert log.offset_for_time(0) == b0
    assert log.offset_for_time(1_000_000) == b0
    assert log.offset_for_time(1_000_001) == b1
    assert log.offset_for_time(2_500_000) == b2
    assert log.offset_for_time(3_000_001) == end


def test_retention_by_age_goes_by_segment_mtimes(root):
    log, (b0, b1, b2), end = three_segments(root)
    report = retain(log, max_age_ms=1_500_000, now_ms=3_000_000, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [b0]
    assert log.log_start_offset == b1
    report = retain(log, max_age_ms=1, now_ms=10_000_000, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [b1]  # never the active segment
    assert [m.value for m in read_all(root, "s")] == [b"%010d" % i for i in range(6, 9)]


# ----------------------------------------------------------------- recovery


def test_recover_repairs_a_07_topic_with_kafka_07_padding(root, old):
    kl.Producer(root, fsync=True).send_batch(old, [b"first", b"second", b"third"])
    log = root.log(old, 0)
    path = segment_files(root, old)[0]
    flip_bit(path, (15 + 12) * 8)  # inside "second"'s payload
    report = recover(fresh_log(log), deep=True, repair=True)
    assert [f.action.split(":")[0] for f in report.findings] == ["repaired"]
    assert [p.suffix for p in segment_files(root, old)] == [".kafka"]
    assert kafka_messages(path.read_bytes()) == [(0, b"first"), (0x08, bytes(6)), (0, b"third")]
    assert [m.value for m in read_all(root, old)] == [b"first", b"third"]
    assert not recover(fresh_log(log), deep=True).findings


def test_recover_cuts_unpublished_bytes_of_a_07_topic(root, old):
    kl.Producer(root).send(old, b"kept")
    path = segment_files(root, old)[0]
    with open(path, "ab") as f:
        f.write(v1(b"never published"))
    report = recover(fresh_log(root.log(old, 0)))
    assert [f.action for f in report.findings] == ["cut"]
    assert kafka_messages(path.read_bytes()) == [(0, b"kept")]
    kl.Producer(root).send(old, b"next")
    assert [m.value for m in read_all(kl.Root(root.path), old)] == [b"kept", b"next"]
