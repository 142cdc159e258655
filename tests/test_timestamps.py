"""Time is what the messages say, in any order (Kafka's rules): retention dates a segment
by its largest timestamp, kept in a time summary beside it that is never believed when
damaged or stale; ``offset_for_time`` finds the first message, in log order, stamped at
or after T; timestamps Spark and Parquet cannot hold are refused at produce."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kl
from kl.log import timeindex
from kl.log.message import MAX_TIMESTAMP, MIN_TIMESTAMP
from kl.log.recovery import recover
from kl.log.retention import retain
from kl.log.validate import Checked
from kl_cli.main import cli

from conftest import partition_locked_elsewhere, write_each

DAY_MS = 86_400_000
NOW = time.time_ns() // 1_000_000
THREE = kl.TopicConfig(segment_bytes=96, max_message_bytes=96)
"""Three 32-byte messages (10-byte values) to a segment."""


def run(root: kl.Root, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--root", root.path, *args], input=input, env={"KL_ROOT": None}, catch_exceptions=False)


def stamped(root: kl.Root, stamps: list[int], name: str = "ts", config: kl.TopicConfig = THREE) -> kl.Log:
    """One 32-byte message per stamp, one append each: three to a segment."""
    root.create_topic(name, config)
    write_each(root, name, [b"v%09d" % ts for ts in stamps[:1]], timestamp=stamps[0])
    for ts in stamps[1:]:
        write_each(root, name, [b"v%09d" % ts], timestamp=ts)
    return root.log(name, 0)


def summaries(log: kl.Log) -> list[str]:
    return sorted(p.name for p in Path(log.directory).iterdir() if p.name.endswith(timeindex.SUFFIX))


# ----------------------------------------------------------------- offset_for_time


def test_from_time_finds_a_message_out_of_order_in_an_earlier_segment(root):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500])
    assert [s.base_offset for s in log.segments()] == [0, 96]
    assert log.offset_for_time(5000) == 32  # the 9000 message, though 3000 comes after it
    result = run(root, "consume", "ts", "--from-time", "5000")
    assert result.exit_code == 0
    assert result.stdout.split() == ["v000009000", "v000002000", "v000003000", "v000004000", "v000004500"]


@pytest.mark.parametrize(
    "time_ms, offset",
    [(0, 0), (1000, 0), (1001, 32), (9000, 32), (9001, 320), (6100, 32)],
)
def test_offset_for_time_is_the_first_in_log_order_stamped_at_or_after(root, time_ms, offset):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500, 6000, 5000, 6000, 1500])
    assert log.offset_for_time(time_ms) == offset


def test_offset_for_time_skips_closed_segments_whose_largest_stamp_is_earlier(root):
    log = stamped(root, [1000, 2000, 3000, 4000, 9000, 5000, 6000])
    assert log.offset_for_time(8000) == 128
    assert log.offset_for_time(5500) == 128
    assert summaries(log) == ["00000000000000000000.kl.time", "00000000000000000096.kl.time"]


def test_a_lying_summary_of_another_size_is_not_believed(root):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500])
    first = log.segments()[0]
    stat = os.stat(first.path)
    timeindex.write(first.path, timeindex.TimeSummary(0, stat.st_size - 1, stat.st_mtime_ns, 1000, 0))
    assert log.offset_for_time(5000) == 32
    assert timeindex.read(first.path, 0, stat.st_size, stat.st_mtime_ns).max_timestamp == 9000  # rebuilt


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "stale mtime", "other base"])
def test_a_damaged_or_stale_summary_is_rebuilt(root, damage):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500])
    first = log.segments()[0]
    assert log.offset_for_time(5000) == 32
    path = Path(timeindex.summary_path(first.path))
    stat = os.stat(first.path)
    lie = timeindex.TimeSummary(0, stat.st_size, stat.st_mtime_ns, 1000, 0).encode()
    data = {
        "garbage": b"x" * timeindex.SIZE,
        "truncated": lie[:-1],
        "flipped": lie[:30] + bytes([lie[30] ^ 0xFF]) + lie[31:],
        "stale mtime": timeindex.TimeSummary(0, stat.st_size, stat.st_mtime_ns - 1, 1000, 0).encode(),
        "other base": timeindex.TimeSummary(96, stat.st_size, stat.st_mtime_ns, 1000, 0).encode(),
    }[damage]
    path.write_bytes(data)
    assert log.offset_for_time(5000) == 32
    assert timeindex.TimeSummary.decode(path.read_bytes()).max_timestamp == 9000


def test_a_reader_without_write_access_still_finds_the_time(root):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500])
    os.chmod(log.directory, 0o555)
    try:
        assert log.offset_for_time(5000) == 32
    finally:
        os.chmod(log.directory, 0o755)


def test_the_summary_record_round_trips_and_says_when_there_is_no_timestamp():
    summary = timeindex.TimeSummary(96, 1024, 17, timeindex.NO_TIMESTAMP, 3)
    assert len(summary.encode()) == timeindex.SIZE
    assert timeindex.TimeSummary.decode(summary.encode()) == summary
    assert summary.newest is None


def _churn(root_path: str, stop) -> None:
    """Append out-of-order stamps and retain after every append, until ``stop``."""
    root = kl.Root(root_path)
    producer = kl.Producer(root)
    i = 0
    while not stop.is_set():
        producer.send_batch("churn", [b"m%09d" % i], partition=0, timestamp=1000 + (i * 7919) % 100_000)
        retain(root.log("churn", 0), max_age_ms=0, max_bytes=300, delete_delay=0)
        i += 1
    producer.close()


def test_offset_for_time_racing_retain_in_other_processes_never_fails(root):
    import multiprocessing

    root.create_topic("churn", THREE)
    write_each(root, "churn", [b"m%09d" % i for i in range(9)], timestamp=1000)
    stop = multiprocessing.Event()
    workers = [multiprocessing.Process(target=_churn, args=(root.path, stop)) for _ in range(2)]
    for w in workers:
        w.start()
    log = root.log("churn", 0)
    try:
        deadline = time.monotonic() + 3
        lookups = 0
        while time.monotonic() < deadline:
            offset = log.offset_for_time(50_000)
            assert offset % 32 == 0
            lookups += 1
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert lookups > 100 and log.state().log_start_offset > 0


# ----------------------------------------------------------------- retention


def fresh_then_old(root: kl.Root) -> kl.Log:
    """Segment 0: fresh1, fresh2 (stamped now) then a message stamped 30 days ago;
    segment 96 (active): two more stamped 30 days ago."""
    old = NOW - 30 * DAY_MS
    root.create_topic("t", THREE)
    write_each(root, "t", [b"fresh1____", b"fresh2____"], timestamp=NOW)
    write_each(root, "t", [b"old_______"] * 3, timestamp=old)
    log = root.log("t", 0)
    assert [s.base_offset for s in log.segments()] == [0, 96]
    return log


def test_retain_keeps_a_segment_whose_newest_message_is_young(root):
    log = fresh_then_old(root)
    result = run(root, "retain", "--max-age", "7d", "--delete-delay", "0")
    assert (result.exit_code, result.stdout) == (0, "t/0: nothing to delete; log starts at 0\n")
    assert log.state().log_start_offset == 0


def test_retain_deletes_a_segment_once_its_newest_message_is_old(root):
    log = fresh_then_old(root)
    report = retain(log, max_age_ms=7 * DAY_MS, max_bytes=0, now_ms=NOW + 8 * DAY_MS, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0]
    assert report.reasons == [f"older than {7 * DAY_MS} ms (newest message {NOW})"]
    assert summaries(log) == []  # the deleted segment's summary went with it


def test_retain_does_not_believe_a_damaged_summary(root):
    log = fresh_then_old(root)
    first = log.segments()[0]
    stat = os.stat(first.path)
    lie = timeindex.TimeSummary(0, stat.st_size, stat.st_mtime_ns, NOW - 30 * DAY_MS, 0).encode()
    Path(timeindex.summary_path(first.path)).write_bytes(lie[:-4] + b"\0\0\0\0")
    assert retain(log, max_age_ms=7 * DAY_MS, max_bytes=0, delete_delay=0).deleted == []


def test_retain_dates_messages_without_timestamps_by_the_file_time(root):
    root.create_topic("old", kl.TopicConfig(segment_bytes=96, max_message_bytes=96, format="0.7"))
    write_each(root, "old", [b"a" * 22] * 4)  # 32-byte magic 1 messages
    log = root.log("old", 0)
    first = log.segments()[0]
    os.utime(first.path, ns=((NOW - 30 * DAY_MS) * 1_000_000,) * 2)
    report = retain(log, max_age_ms=7 * DAY_MS, max_bytes=0, delete_delay=0)
    assert [s.base_offset for s in report.deleted] == [0]


def test_retain_dry_run_counts_the_set_aside_files_the_real_run_unlinks(root):
    root.create_topic("t", THREE)
    write_each(root, "t", [b"m%09d" % i for i in range(12)], timestamp=NOW)  # segments 0, 96, 192, 288
    log = root.log("t", 0)
    first = retain(log, max_age_ms=0, max_bytes=300)  # sets segment 0 aside, unlinks it in 60 s
    assert [s.base_offset for s in first.deleted] == [0] and first.unlinked == 0
    dry = retain(log, max_age_ms=0, max_bytes=200, dry_run=True, delete_delay=0)
    real = retain(log, max_age_ms=0, max_bytes=200, delete_delay=0)
    assert [s.base_offset for s in dry.deleted] == [s.base_offset for s in real.deleted] == [96]
    assert (dry.unlinked, dry.unlinked_bytes) == (real.unlinked, real.unlinked_bytes) == (2, 192)


def test_retain_dry_run_line_says_what_would_be_unlinked(root):
    root.create_topic("t", THREE)
    write_each(root, "t", [b"m%09d" % i for i in range(12)], timestamp=NOW)
    retain(root.log("t", 0), max_age_ms=0, max_bytes=300)
    result = run(root, "retain", "--max-age", "0", "--max-bytes", "300", "--dry-run", "--delete-delay", "0")
    assert result.stdout == "t/0: nothing to delete; log starts at 96; would unlink 1 set-aside segment (96 bytes)\n"


# ----------------------------------------------------------------- recover


def test_recover_rebuilds_a_damaged_summary_and_removes_an_orphan(root):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500])
    log.offset_for_time(5000)
    first = log.segments()[0]
    path = Path(timeindex.summary_path(first.path))
    path.write_bytes(b"junk")
    orphan = Path(log.directory) / "00000000000000099999.kl.time"
    orphan.write_bytes(b"junk")
    report = recover(log)
    assert [(f.kind, f.action) for f in report.findings] == [("TIME_SUMMARY", "removed"), ("TIME_SUMMARY", "rebuilt")]
    assert timeindex.TimeSummary.decode(path.read_bytes()).max_timestamp == 9000
    assert not orphan.exists()
    assert recover(log).findings == []


# ----------------------------------------------------------------- the range of timestamps


@pytest.mark.parametrize("ts", [MIN_TIMESTAMP - 1, MAX_TIMESTAMP + 1, 9223372036854775807, -(1 << 63)])
def test_the_producer_refuses_a_timestamp_spark_cannot_hold(root, topic, ts):
    producer = kl.Producer(root)
    with pytest.raises(kl.InvalidTimestamp, match=f"timestamp {ts} is outside the range kl stores, "
                       f"{MIN_TIMESTAMP} to {MAX_TIMESTAMP} ms since the epoch"):
        producer.send(topic, b"x", timestamp=ts)
    with pytest.raises(kl.InvalidTimestamp):
        producer.send_batch(topic, [b"x"], timestamp=ts)
    producer.close()
    assert root.log(topic, 0).log_end_offset == 0


def test_the_async_producer_refuses_it_at_send(root, topic):
    producer = kl.Producer(root, linger_ms=5)
    with pytest.raises(kl.InvalidTimestamp):
        producer.send(topic, b"x", timestamp=MAX_TIMESTAMP + 1)
    producer.close()


@pytest.mark.parametrize("ts", [MIN_TIMESTAMP, 0, MAX_TIMESTAMP])
def test_the_ends_of_the_range_are_stored(root, topic, ts):
    kl.Producer(root).send(topic, b"x", timestamp=ts)
    assert next(iter(root.log(topic, 0).read(0, 100))).timestamp == ts


def test_produce_json_refuses_a_timestamp_out_of_range(root, topic):
    line = json.dumps({"value": "x", "timestamp": 253402300800000})
    result = run(root, "produce", topic, "--json", input=json.dumps({"value": "ok"}) + "\n" + line + "\n")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: line 2: 'timestamp': timestamp 253402300800000 is outside the range kl stores, "
        f"{MIN_TIMESTAMP} to {MAX_TIMESTAMP} ms since the epoch (years 1 to 9999, what Spark and Parquet can hold); "
        "1 line before it was committed\n"
    )


# ----------------------------------------------------------------- format 0.7


def test_a_0_7_topic_refuses_a_timestamp_as_it_refuses_a_key(root):
    root.create_topic("old", kl.TopicConfig(format="0.7"))
    producer = kl.Producer(root)
    with pytest.raises(kl.FormatMismatch, match="stores Kafka 0.7 messages, which have no timestamp"):
        producer.send("old", b"x", timestamp=NOW)
    with pytest.raises(kl.FormatMismatch, match="which have no timestamp"):
        producer.send_batch("old", [b"x"], timestamp=NOW)
    producer.send("old", b"y")
    producer.close()
    result = run(root, "produce", "old", "--json", input=json.dumps({"value": "x", "timestamp": NOW}) + "\n")
    assert result.exit_code == 1
    assert "topic 'old' stores Kafka 0.7 messages, which have no timestamp" in result.stderr
    assert [m.value for m in root.log("old", 0).read(0, 100)] == [b"y"]


def test_a_0_7_topic_takes_json_lines_whose_timestamp_is_null(root):
    root.create_topic("old", kl.TopicConfig(format="0.7"))
    result = run(root, "produce", "old", "--json", input=json.dumps({"value": "x", "timestamp": None}) + "\n")
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------- reading old data with such stamps (kl.spark.arrow)


def with_bad_stamps(root: kl.Root, topic: str, compressed: bool = False) -> None:
    """Messages stamped 1000, year 10000, int64's largest and 2000, appended as older kl
    versions (or other writers) could: past the producer's check."""
    from kl.log.messageset import frame, wrap

    stamps = [1000, 253402300800000, 9223372036854775807, 2000]
    data = b"".join(frame([b"m%d" % i], ts) for i, ts in enumerate(stamps))
    if compressed:
        data = wrap(data, kl.log.message.CODEC_GZIP, 2000)
    root.log(topic, 0).append(Checked.framed(data, len(stamps)))


def arrow_stamps(root: kl.Root, topic: str, policy: str) -> list:
    arrow = pytest.importorskip("kl.spark.arrow")
    from kl.spark.ranges import Range

    r = Range(topic, 0, 0, root.log(topic, 0).log_end_offset)
    batches = list(arrow.read_range(root, r, bad_timestamps=policy))
    return [ts.value // 1000 if ts.is_valid else None for b in batches for ts in b.column("timestamp")]


@pytest.mark.parametrize("compressed", [False, True])
def test_a_read_fails_naming_the_message_with_a_stamp_out_of_range(root, topic, compressed):
    with_bad_stamps(root, topic, compressed)
    offset = 0 if compressed else 24
    with pytest.raises(kl.InvalidTimestamp) as e:
        arrow_stamps(root, topic, "fail")
    assert str(e.value) == (
        f"topic {topic!r} partition 0 offset {offset}: timestamp 253402300800000 is outside the range kl stores, "
        f"{MIN_TIMESTAMP} to {MAX_TIMESTAMP} ms since the epoch (years 1 to 9999, what Spark and Parquet can hold); "
        "read it with kl load --bad-timestamps clamp or null (the kl source's option badTimestamps)"
    )


@pytest.mark.parametrize("compressed", [False, True])
def test_a_read_clamps_or_nulls_a_stamp_out_of_range_never_wraps_it(root, topic, compressed):
    with_bad_stamps(root, topic, compressed)
    assert arrow_stamps(root, topic, "clamp") == [1000, MAX_TIMESTAMP, MAX_TIMESTAMP, 2000]
    assert arrow_stamps(root, topic, "null") == [1000, None, None, 2000]


def test_retain_dates_segments_before_it_takes_the_partition_lock(root):
    log = stamped(root, [1000, 9000, 2000, 3000, 4000, 4500, 6000])
    log.lock_timeout = 0.2
    with partition_locked_elsewhere(root.path, "ts", 0), pytest.raises(kl.LockTimeout):
        retain(log, max_age_ms=DAY_MS, max_bytes=0)
    assert summaries(log) == ["00000000000000000000.kl.time", "00000000000000000096.kl.time"]
