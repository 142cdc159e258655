"""``kl recover``, ``kl retain`` and ``kl dump`` on real files: exact lines, exit codes,
and the bytes on disk before and after.

Topics are written through the library with a fixed timestamp, so every size, offset
and line below is exact.  A message with a 1-byte value and no key is 23 bytes; with a
10-byte value, 32.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kl
from kl.log import locks, recovery
from kl.timespec import DURATION_FORMS
from kl_cli.main import cli

from conftest import grow_by, partition_locked_elsewhere
from faultlib import as_if_rebooted

TS = 1_700_000_000_000
DAY_MS = 86_400_000
KL = [sys.executable, "-m", "kl_cli"]
KAFKA07_SEGMENT = Path(__file__).resolve().parent / "data" / "kafka-0.7" / "MagicByte0-0" / "00000000000000000000.kafka"
SMALL_SEGMENTS = kl.TopicConfig(segment_bytes=1024, max_message_bytes=512)
"""32 messages of 32 bytes to a segment."""
GARBAGE = b"garbage!" * 40
SEGMENT0 = "00000000000000000000.kl"


# ----------------------------------------------------------------- helpers


@pytest.fixture
def kl_root(tmp_path: Path) -> str:
    (tmp_path / "root").mkdir()
    return str(tmp_path / "root")


def run(root: str, *args: str) -> Result:
    """``kl --root ROOT ARGS`` in-process, stdout and stderr kept apart."""
    return CliRunner().invoke(cli, ["--root", root, *args], env={"KL_ROOT": None}, catch_exceptions=False)


def out(root: str, *args: str, code: int = 0) -> list[str]:
    """Run kl, assert its exit status and an empty stderr; return its stdout lines."""
    result = run(root, *args)
    assert (result.exit_code, result.stderr) == (code, ""), result.output
    return result.stdout.splitlines()


def usage_error(root: str, *args: str) -> str:
    result = run(root, *args)
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    return result.stderr.splitlines()[-1]


def make(
    root: str,
    topic: str = "t",
    values=(b"1", b"2", b"3"),
    *,
    config: kl.TopicConfig | None = None,
    appends: int = 1,
    timestamp: int = TS,
    compression: str | None = None,
    flush: bool = True,
) -> Path:
    """Create ``topic`` and write ``values`` ``appends`` times (one append each); return
    partition 0's directory.  ``flush=False`` leaves the last append unflushed."""
    r = kl.Root(root)
    if topic not in r.topics():
        r.create_topic(topic, config or kl.TopicConfig(flush_ms=0))
    producer = kl.Producer(r, compression=compression)
    for i in range(appends):
        producer.send_batch(topic, list(values), partition=0, timestamp=timestamp)
        if flush or i < appends - 1:
            producer.flush()
    r.close()
    return Path(root) / topic / "0"


def send_each(root: str, topic: str, count: int, timestamp: int, first: int = 0) -> None:
    """``count`` 32-byte messages, one append each."""
    r = kl.Root(root)
    producer = kl.Producer(r)
    for i in range(first, first + count):
        producer.send(topic, b"m%09d" % i, partition=0, timestamp=timestamp)
    producer.close()
    r.close()


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def flip_bit(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1
    path.write_bytes(bytes(data))


def consume(root: str, topic: str = "t") -> list[str]:
    return out(root, "consume", topic)


# ----------------------------------------------------------------- kl recover


def test_recover_a_clean_topic(kl_root):
    make(kl_root)
    assert out(kl_root, "recover") == ["t/0: ok (0 bytes checked)"]


def test_recover_cuts_a_garbage_tail_and_a_second_run_is_clean(kl_root):
    segment = make(kl_root) / SEGMENT0
    with open(segment, "ab") as f:
        f.write(GARBAGE)
    assert out(kl_root, "recover", "t") == [
        "t/0: fixed: offset 69: 320 bytes past the log end were never published [cut]; cut 320 bytes (1 message)"
    ]
    assert segment.stat().st_size == 69
    assert out(kl_root, "recover", "t") == ["t/0: ok (0 bytes checked)"]
    assert consume(kl_root) == ["1", "2", "3"]


def reboot(root: str, topic: str = "t") -> None:
    """Mark the partition's state as written before a reboot: its unflushed data may be torn."""
    as_if_rebooted(kl.Root(root).log(topic, 0))


def test_a_file_cut_in_the_boot_that_wrote_it_is_damage_not_a_torn_tail(kl_root):
    segment = make(kl_root, appends=2) / SEGMENT0
    os.truncate(segment, 69 + 23 + 5)
    assert out(kl_root, "recover", code=3) == [
        "t/0: damaged: offset 97: file ends at offset 97, before the committed end 138 [left as it is]"
    ]
    assert segment.stat().st_size == 97


def test_recover_keeps_the_complete_messages_of_a_file_ending_inside_one(kl_root):
    segment = make(kl_root, appends=2, flush=False) / SEGMENT0
    reboot(kl_root)
    os.truncate(segment, 69 + 23 + 5)  # the second append: one message whole, the next torn
    assert out(kl_root, "recover") == [
        "t/0: fixed: offset 92: file ends inside the message at offset 92 [cut]; cut 5 bytes (1 message)"
    ]
    assert consume(kl_root) == ["1", "2", "3", "1"]


def test_recover_drops_the_whole_last_append_when_a_message_in_it_is_bad(kl_root):
    segment = make(kl_root, appends=2, flush=False) / SEGMENT0
    reboot(kl_root)
    flip_bit(segment, 69 + 23 + 22)  # the value of the second message of the last append
    assert out(kl_root, "recover") == [
        (
            "t/0: fixed: offset 69: checksum mismatch at offset 92 (drops the last append, from 69) [cut]; "
            "cut 69 bytes (3 messages)"
        )
    ]
    assert consume(kl_root) == ["1", "2", "3"]


def test_dry_run_on_a_torn_tail_changes_nothing_and_exits_3(kl_root):
    directory = make(kl_root)
    with open(directory / SEGMENT0, "ab") as f:
        f.write(GARBAGE)
    before = snapshot(directory)
    assert out(kl_root, "recover", "--dry-run", code=3) == [
        ("t/0: found: offset 69: 320 bytes past the log end were never published [would cut]; would cut 320 bytes (1 message)")
    ]
    assert snapshot(directory) == before


def test_mid_log_damage_is_reported_with_its_offset_and_left_alone(kl_root):
    directory = make(kl_root, appends=2)
    flip_bit(directory / SEGMENT0, 23 + 22)  # the value of message 2, flushed and followed by an append
    before = snapshot(directory)
    assert out(kl_root, "recover", "--deep", code=3) == ["t/0: damaged: offset 23: checksum mismatch [left as it is]"]
    assert out(kl_root, "recover", "--deep", "--dry-run", code=3) == [
        "t/0: found: offset 23: checksum mismatch [nothing changed]"
    ]
    assert snapshot(directory) == before


def test_repair_pads_over_the_damage_after_copying_the_segment_aside(kl_root):
    directory = make(kl_root, values=[b"1", b"2", b"3", b"4"], appends=2)
    segment = directory / SEGMENT0
    flip_bit(segment, 23 + 22)
    damaged = segment.read_bytes()
    [line] = out(kl_root, "recover", "--deep", "--repair")
    assert re.fullmatch(
        rf"t/0: fixed: offset 23: checksum mismatch \[repaired: 23 bytes padded \(1 padding message\), original kept as "
        rf"{re.escape(str(segment))}\.damaged-\d{{8}}T\d{{6}}-[0-9a-f]{{6}}\]",
        line,
    ), line
    [aside] = [p for p in directory.iterdir() if ".damaged-" in p.name]
    assert aside.read_bytes() == damaged
    assert segment.stat().st_size == len(damaged)  # later offsets stay valid
    assert consume(kl_root) == ["1", "3", "4", "1", "2", "3", "4"]
    assert out(kl_root, "recover", "--deep") == ["t/0: ok (184 bytes checked)"]


def test_recover_json_is_one_object_per_partition(kl_root):
    with open(make(kl_root) / SEGMENT0, "ab") as f:
        f.write(GARBAGE)
    make(kl_root, "u")
    rows = [json.loads(line) for line in out(kl_root, "recover", "--json")]
    assert rows == [
        {
            "topic": "t",
            "partition": 0,
            "status": "fixed",
            "checked_bytes": 320,
            "cut_bytes": 320,
            "cut_messages": 1,
            "findings": [
                {
                    "offset": 69,
                    "path": str(Path(kl_root) / "t" / "0" / SEGMENT0),
                    "reason": "320 bytes past the log end were never published",
                    "action": "cut",
                    "kind": "INCOMPLETE",
                }
            ],
        },
        {"topic": "u", "partition": 0, "status": "ok", "checked_bytes": 0, "cut_bytes": 0, "cut_messages": 0, "findings": []},
    ]


def test_dry_run_and_repair_together_is_a_usage_error(kl_root):
    make(kl_root)
    assert usage_error(kl_root, "recover", "--dry-run", "--repair") == "Error: --dry-run, --repair cannot be used together"


def test_recover_without_topics_covers_every_partition_of_every_topic(kl_root):
    make(kl_root, "b")
    kl.Root(kl_root).create_topic("a", kl.TopicConfig(partitions=2))
    assert out(kl_root, "recover") == [
        "a/0: ok (0 bytes checked)",
        "a/1: ok (0 bytes checked)",
        "b/0: ok (0 bytes checked)",
    ]
    assert out(kl_root, "recover", "b") == ["b/0: ok (0 bytes checked)"]


def test_recover_an_unknown_topic_is_an_error_and_the_others_are_checked(kl_root):
    make(kl_root)
    result = run(kl_root, "recover", "nope", "t")
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        f"nope: error: topic 'nope' does not exist in {kl_root}\nt/0: ok (0 bytes checked)\n",
        "Error: not checked: nope (see the report)\n",
    )


def half_deleted(root: str, topic: str) -> None:
    """What a ``kl topics delete`` killed after marking the partitions deleted leaves."""
    from kl.topic import _mark_deleted

    for state in Path(root, topic).glob("*/state"):
        _mark_deleted(str(state))


def broken_root(kl_root: str) -> None:
    """Topic z (2 partitions, torn tail in 0) among a stray directory, a stray file, a
    topic whose config is damaged and a half-deleted topic."""
    with open(make(kl_root, "z", config=kl.TopicConfig(partitions=2)) / SEGMENT0, "ab") as f:
        f.write(GARBAGE)
    os.mkdir(Path(kl_root, "junk"))
    Path(kl_root, "notes.txt").write_text("hello")
    make(kl_root, "bad")
    Path(kl_root, "bad", "topic.json").write_text("{")
    make(kl_root, "gone")
    half_deleted(kl_root, "gone")


def test_recover_reports_strays_and_failed_topics_and_checks_every_other_topic(kl_root):
    make(kl_root)
    broken_root(kl_root)
    result = run(kl_root, "recover")
    assert result.stdout.splitlines() == [
        "junk: not a topic: no topic.json [left as it is]",
        "notes.txt: not a topic: not a directory [left as it is]",
        f"bad: error: topic config {kl_root}/bad/topic.json is unreadable: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"gone/0: error: partition {kl_root}/gone/0 was deleted",
        "t/0: ok (0 bytes checked)",
        "z/0: fixed: offset 69: 320 bytes past the log end were never published [cut]; cut 320 bytes (1 message)",
        "z/1: ok (0 bytes checked)",
    ]
    assert (result.exit_code, result.stderr) == (1, "Error: not checked: junk, notes.txt, bad, gone/0 (see the report)\n")
    assert consume(kl_root) == ["1", "2", "3"]


def test_recover_exits_3_for_a_stray_alone(kl_root):
    make(kl_root)
    os.mkdir(Path(kl_root, "junk"))
    assert out(kl_root, "recover", code=3) == ["junk: not a topic: no topic.json [left as it is]", "t/0: ok (0 bytes checked)"]
    assert out(kl_root, "recover", "t") == ["t/0: ok (0 bytes checked)"]
    rows = [json.loads(line) for line in out(kl_root, "recover", "--json", code=3)]
    assert rows[0] == {
        "topic": "junk",
        "partition": None,
        "status": "stray",
        "reason": "not a topic: no topic.json",
        "action": "left as it is",
    }


def test_retain_reports_strays_and_failed_topics_and_retains_every_other_topic(kl_root):
    directory = small_topic(kl_root)
    broken_root(kl_root)
    result = run(kl_root, "retain", "--max-bytes", "2000")
    assert result.stdout.splitlines() == [
        "junk: not a topic: no topic.json [left as it is]",
        "notes.txt: not a topic: not a directory [left as it is]",
        f"bad: error: topic config {kl_root}/bad/topic.json is unreadable: "
        "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"gone/0: error: partition {kl_root}/gone/0 was deleted",
        "t/0: deleted 00000000000000000000.kl (1024 bytes): partition holds 3200 bytes, over 2000",
        "t/0: deleted 00000000000000001024.kl (1024 bytes): partition holds 2176 bytes, over 2000",
        "t/0: deleted 2 segments (2048 bytes); log starts at 2048",
        "z/0: nothing to delete; log starts at 0",
        "z/1: nothing to delete; log starts at 0",
    ]
    assert (result.exit_code, result.stderr) == (1, "Error: not retained: junk, notes.txt, bad, gone/0 (see the report)\n")
    assert segments(directory)[2:] == ["00000000000000002048.kl", "00000000000000003072.kl"]


def test_recover_removes_old_leftovers_of_interrupted_creates_and_deletes(kl_root, monkeypatch):
    make(kl_root)
    for name in (".creating-0a1b", ".deleting-2c3d"):
        os.makedirs(Path(kl_root, name, "0"))
    Path(kl_root, ".now.1234.0a1b2c3d.tmp").write_bytes(b"")  # a clock reading killed (fsutil.file_time_ns)
    later = time.time_ns() + 3600 * 10**9  # the file system's clock, an hour on
    monkeypatch.setattr(kl.topic, "file_time_ns", lambda directory: later)
    assert out(kl_root, "recover", "--dry-run", code=3) == [
        ".creating-0a1b: left by an interrupted topic create [would remove]",
        ".deleting-2c3d: left by an interrupted topic delete [would remove]",
        ".now.1234.0a1b2c3d.tmp: temporary file left by an interrupted write [would remove]",
        "t/0: ok (0 bytes checked)",
    ]
    assert out(kl_root, "recover", "t") == ["t/0: ok (0 bytes checked)"]
    assert len(os.listdir(kl_root)) == 5
    assert out(kl_root, "recover") == [
        ".creating-0a1b: left by an interrupted topic create [removed]",
        ".deleting-2c3d: left by an interrupted topic delete [removed]",
        ".now.1234.0a1b2c3d.tmp: temporary file left by an interrupted write [removed]",
        "t/0: ok (0 bytes checked)",
    ]
    assert sorted(os.listdir(kl_root)) == [".locks", "t"]
    assert out(kl_root, "recover") == ["t/0: ok (0 bytes checked)"]


def test_fresh_leftovers_are_left_alone(kl_root):
    make(kl_root)
    os.makedirs(Path(kl_root, ".creating-0a1b"))
    assert out(kl_root, "recover") == ["t/0: ok (0 bytes checked)"]
    assert os.path.isdir(Path(kl_root, ".creating-0a1b"))


@pytest.mark.parametrize("command", ["recover", "retain"])
def test_a_missing_root_is_an_error(tmp_path, command):
    result = run(str(tmp_path / "gone"), command)
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        "",
        f"Error: root {tmp_path}/gone does not exist (is it mounted?)\n",
    )


def test_exit_status_3_reaches_the_shell(kl_root):
    """What cron sees: the real command's exit status."""
    with open(make(kl_root) / SEGMENT0, "ab") as f:
        f.write(GARBAGE)
    env = {**os.environ, "KL_ROOT": kl_root}
    done = subprocess.run(KL + ["recover", "--dry-run"], env=env, capture_output=True, timeout=30, check=False)
    assert (done.returncode, done.stderr) == (3, b"")
    done = subprocess.run(KL + ["recover"], env=env, capture_output=True, timeout=30, check=False)
    assert (done.returncode, done.stderr) == (0, b"")


# ----------------------------------------------------------------- kl retain


def small_topic(kl_root: str, count: int = 100, timestamp: int | None = None) -> Path:
    """``count`` 32-byte messages in 1 KiB segments: 0, 1024, 2048 full, 3072 active.
    They are young (now) unless ``timestamp`` says otherwise."""
    kl.Root(kl_root).create_topic("t", SMALL_SEGMENTS)
    send_each(kl_root, "t", count, int(time.time() * 1000) if timestamp is None else timestamp)
    return Path(kl_root) / "t" / "0"


def segments(directory: Path) -> list[str]:
    """The partition's files but its state and the segments' time summaries and offset indexes."""
    return sorted(p.name for p in directory.iterdir() if p.name != "state" and not p.name.endswith((".time", ".index")))


def test_retain_by_size_deletes_the_oldest_segments(kl_root):
    directory = small_topic(kl_root)
    assert out(kl_root, "retain", "--max-bytes", "2000") == [
        "t/0: deleted 00000000000000000000.kl (1024 bytes): partition holds 3200 bytes, over 2000",
        "t/0: deleted 00000000000000001024.kl (1024 bytes): partition holds 2176 bytes, over 2000",
        "t/0: deleted 2 segments (2048 bytes); log starts at 2048",
    ]
    assert segments(directory) == [
        "00000000000000000000.kl.deleted",
        "00000000000000001024.kl.deleted",
        "00000000000000002048.kl",
        "00000000000000003072.kl",
    ]
    assert consume(kl_root)[0] == "m000000064"
    assert out(kl_root, "retain", "--max-bytes", "2000") == ["t/0: nothing to delete; log starts at 2048"]


def test_retain_dry_run_lists_and_deletes_nothing(kl_root):
    directory = small_topic(kl_root)
    before = snapshot(directory)
    assert out(kl_root, "retain", "--max-bytes", "2500", "--dry-run") == [
        "t/0: would delete 00000000000000000000.kl (1024 bytes): partition holds 3200 bytes, over 2500",
        "t/0: would delete 1 segment (1024 bytes); log would start at 1024",
    ]
    assert snapshot(directory) == before


def test_retain_by_age_uses_message_timestamps_and_keeps_the_active_segment(kl_root):
    now = int(time.time() * 1000)
    directory = small_topic(kl_root, 100, timestamp=now - 30 * DAY_MS)
    send_each(kl_root, "t", 3, now, first=100)  # young messages, in the active segment
    [line0, _, line2, summary, *_] = out(kl_root, "retain", "--max-age", "20d", "--delete-delay", "0")
    assert line0.startswith("t/0: deleted 00000000000000000000.kl (1024 bytes): older than 1728000000 ms")
    assert line2.startswith("t/0: deleted 00000000000000002048.kl (1024 bytes): older than 1728000000 ms")
    assert summary == "t/0: deleted 3 segments (3072 bytes); log starts at 3072; unlinked 3 set-aside segments (3072 bytes)"
    assert segments(directory) == ["00000000000000003072.kl"]  # the active one, old messages and all
    assert (Path(kl_root) / ".locks" / "t" / "0.lock").exists()
    assert consume(kl_root) == [b"m%09d".decode() % i for i in range(96, 103)]


def test_retain_names_the_message_stamped_in_the_future_that_keeps_every_later_segment(kl_root):
    now = int(time.time() * 1000)
    kl.Root(kl_root).create_topic("t", SMALL_SEGMENTS)
    send_each(kl_root, "t", 40, now - 10 * DAY_MS)
    send_each(kl_root, "t", 1, now + 365 * DAY_MS, first=40)  # offset 1280, in the second segment
    send_each(kl_root, "t", 90, now - 10 * DAY_MS, first=41)  # segments 2048 and 3072 closed, old
    future = datetime.datetime.fromtimestamp((now + 365 * DAY_MS) / 1000, datetime.timezone.utc)
    held = (
        rf"t/0: stopped at 00000000000000001024\.kl: its newest message, at offset 1280, is stamped {now + 365 * DAY_MS} "
        rf"\({future:%Y-%m-%dT%H:%M:%S}Z\), \d+ ms \(36[45]\.\d days\) in the future: it keeps the 2 later segments "
        r"\(2048 bytes\) older than 86400000 ms"
    )
    [deleted, stop, summary] = out(kl_root, "retain", "--max-age", "1d", "--dry-run")
    assert deleted.startswith("t/0: would delete 00000000000000000000.kl (1024 bytes): older than 86400000 ms")
    assert re.fullmatch(held, stop), stop
    assert summary == "t/0: would delete 1 segment (1024 bytes); log would start at 1024"
    [row] = [json.loads(line) for line in out(kl_root, "retain", "--max-age", "1d", "--json")]
    assert re.fullmatch(held.removeprefix(r"t/0: stopped at 00000000000000001024\.kl: "), row["held"].pop("reason"))
    assert row["held"] == {
        "segment": "00000000000000001024.kl",
        "base_offset": 1024,
        "offset": 1280,
        "newest": now + 365 * DAY_MS,
        "later_segments": 2,
        "later_bytes": 2048,
    }
    assert row["log_start_offset"] == 1024
    assert re.fullmatch(held, out(kl_root, "retain", "--max-age", "1d")[0])  # and again on each run, while it lasts


def test_retain_by_age_keeps_young_segments(kl_root):
    small_topic(kl_root, 100, timestamp=int(time.time() * 1000) - DAY_MS)
    assert out(kl_root, "retain", "--max-age", "2d") == ["t/0: nothing to delete; log starts at 0"]


def test_retain_uses_the_topic_settings_by_default(kl_root):
    r = kl.Root(kl_root)
    r.create_topic("by-age", SMALL_SEGMENTS)
    r.create_topic("by-size", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, retention_bytes=2500))
    send_each(kl_root, "by-age", 100, TS)  # far older than the default retention_ms, 7 days
    send_each(kl_root, "by-size", 100, int(time.time() * 1000))
    assert [line for line in out(kl_root, "retain") if "log starts" in line] == [
        "by-age/0: deleted 3 segments (3072 bytes); log starts at 3072",
        "by-size/0: deleted 1 segment (1024 bytes); log starts at 1024",
    ]


def test_retain_delete_delay_unlinks_what_earlier_runs_set_aside(kl_root):
    directory = small_topic(kl_root)
    out(kl_root, "retain", "--max-bytes", "2500")
    assert "00000000000000000000.kl.deleted" in segments(directory)
    assert out(kl_root, "retain", "--max-bytes", "2500", "--delete-delay", "0") == [
        "t/0: nothing to delete; log starts at 1024; unlinked 1 set-aside segment (1024 bytes)"
    ]
    assert segments(directory) == ["00000000000000001024.kl", "00000000000000002048.kl", "00000000000000003072.kl"]


def test_retain_json(kl_root):
    small_topic(kl_root)
    [row] = [json.loads(line) for line in out(kl_root, "retain", "--max-bytes", "2500", "--json")]
    assert row == {
        "topic": "t",
        "partition": 0,
        "dry_run": False,
        "deleted": [
            {
                "segment": "00000000000000000000.kl",
                "base_offset": 0,
                "size_in_bytes": 1024,
                "reason": "partition holds 3200 bytes, over 2500",
            }
        ],
        "deleted_bytes": 1024,
        "held": None,
        "log_start_offset": 1024,
        "unlinked": 0,
        "unlinked_bytes": 0,
    }


@pytest.mark.parametrize("value", ["7 days", "-1d", "1.5h", "d", ""])
def test_a_bad_max_age_is_a_usage_error(kl_root, value):
    make(kl_root)
    assert usage_error(kl_root, "retain", "--max-age", value) == (
        f"Error: Invalid value for '--max-age': {value!r} is not {DURATION_FORMS}"
    )


@pytest.mark.parametrize("value", ["1d12h", "36h", "P1DT12H", "2160m"])
def test_max_age_takes_the_duration_forms_of_every_command(kl_root, value):
    small_topic(kl_root, 100, timestamp=int(time.time() * 1000) - 2 * DAY_MS)
    assert out(kl_root, "retain", "--max-age", value, "--dry-run")[-1].endswith("log would start at 3072")


# ----------------------------------------------------------------- kl dump


def test_dump_a_topic(kl_root):
    path = make(kl_root, values=[b"1", b"22"]) / SEGMENT0
    assert out(kl_root, "dump", "t") == [
        f"Dumping {path}",
        f"offset: 0 position: 0 size: 23 magic: 2 codec: none timestamp: {TS} valid: yes key: -",
        f"offset: 23 position: 23 size: 24 magic: 2 codec: none timestamp: {TS} valid: yes key: -",
    ]


def test_dump_print_data_shows_keys_and_values_escaped(kl_root):
    r = kl.Root(kl_root)
    r.create_topic("t")
    kl.Producer(r).send_batch("t", [b"v", b"two\nlines\xff"], keys=[b"k", None], partition=0, timestamp=TS)
    assert out(kl_root, "dump", "t", "--print-data")[1:] == [
        f"offset: 0 position: 0 size: 24 magic: 2 codec: none timestamp: {TS} valid: yes key: k value: v",
        f"offset: 24 position: 24 size: 32 magic: 2 codec: none timestamp: {TS} valid: yes key: - value: two\\nlines\\xff",
    ]


def test_dump_a_segment_file_needs_no_root(kl_root, tmp_path):
    path = make(kl_root) / SEGMENT0
    result = CliRunner().invoke(cli, ["dump", str(path)], env={"KL_ROOT": None})
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [f"Dumping {path}"] + [
        f"offset: {o} position: {o} size: 23 magic: 2 codec: none timestamp: {TS} valid: yes key: -" for o in (0, 23, 46)
    ]


def test_dump_the_kafka_0_7_segment(kl_root):
    assert KAFKA07_SEGMENT.exists(), f"the Kafka 0.7 sample is missing: {KAFKA07_SEGMENT}"
    lines = out(kl_root, "dump", str(KAFKA07_SEGMENT), "--print-data")
    assert len(lines) == 1 + 100
    assert lines[1] == "offset: 0 position: 0 size: 109 magic: 0 codec: none timestamp: - valid: yes key: - value: " + "x" * 100
    assert lines[-1].startswith("offset: 10791 position: 10791 size: 109 magic: 0 codec: none timestamp: - valid: yes")


def test_dump_stops_at_damage_and_exits_3(kl_root):
    path = make(kl_root, appends=2) / SEGMENT0
    flip_bit(path, 23 + 22)
    assert out(kl_root, "dump", "t", code=3) == [
        f"Dumping {path}",
        f"offset: 0 position: 0 size: 23 magic: 2 codec: none timestamp: {TS} valid: yes key: -",
        "offset: 23 position: 23 size: 23 valid: no",
        "stopped at offset 23 (position 23): checksum mismatch",
    ]


def test_dump_a_truncated_file(kl_root, tmp_path):
    copy = tmp_path / SEGMENT0
    copy.write_bytes((make(kl_root) / SEGMENT0).read_bytes()[:60])
    assert out(kl_root, "dump", str(copy), code=3)[-2:] == [
        "offset: 46 position: 46 size: 23 valid: no",
        "stopped at offset 46 (position 46): file ends inside a message of 23 bytes",
    ]


def test_dump_marks_bytes_past_the_published_end_which_are_not_damage(kl_root):
    path = make(kl_root) / SEGMENT0
    with open(path, "ab") as f:
        f.write(GARBAGE)
    assert out(kl_root, "dump", "t")[-4:] == [
        f"offset: 46 position: 46 size: 23 magic: 2 codec: none timestamp: {TS} valid: yes key: -",
        "published end at offset 69; what follows was never published (kl recover cuts it)",
        "offset: 69 position: 69 size: 0 valid: no",
        "stopped at offset 69 (position 69): unknown magic 97",
    ]


def test_dump_marks_late_bytes_past_a_closed_segments_end_which_are_not_damage(kl_root):
    directory = make(kl_root, values=[b"m%09d" % i for i in range(20)], config=SMALL_SEGMENTS, appends=2)
    with open(directory / SEGMENT0, "ab") as f:  # a writer that lost its lock wrote late (see kl-format(5))
        f.write(GARBAGE)
    lines = out(kl_root, "dump", "t")
    at = lines.index("published end at offset 640; what follows was never published (kl recover cuts it)")
    assert lines[at + 1 : at + 3] == [
        "offset: 640 position: 640 size: 0 valid: no",
        "stopped at offset 640 (position 640): unknown magic 97",
    ]
    assert lines[at + 3] == "Dumping " + str(directory / "00000000000000000640.kl")


def test_dump_deep_lists_the_messages_of_a_compressed_batch(kl_root):
    make(kl_root, values=[b"a", b"bb"], compression="zstd")
    lines = out(kl_root, "dump", "t", "--deep", "--print-data")
    assert re.fullmatch(
        rf"offset: 0 position: 0 size: \d+ magic: 2 codec: zstd timestamp: {TS} valid: yes key: - value: \(compressed\)", lines[1]
    )
    assert lines[2:] == [
        f"  inner: 0 timestamp: {TS} key: - value_size: 1 value: a",
        f"  inner: 1 timestamp: {TS} key: - value_size: 2 value: bb",
    ]
    assert len(out(kl_root, "dump", "t")) == 2  # without --deep, the batch is one line


def test_dump_json(kl_root):
    make(kl_root, values=[b"a", b"bb"], compression="zstd")
    [row] = [json.loads(line) for line in out(kl_root, "dump", "t", "--json", "--deep", "--print-data")]
    assert row == {
        "partition": 0,
        "offset": 0,
        "position": 0,
        "size": row["size"],
        "magic": 2,
        "codec": "zstd",
        "timestamp": TS,
        "valid": True,
        "problem": None,
        "key": None,
        "inner": [
            {"timestamp": TS, "key": None, "value_size": 1, "value": "a"},
            {"timestamp": TS, "key": None, "value_size": 2, "value": "bb"},
        ],
    }


def test_dump_one_partition(kl_root):
    kl.Root(kl_root).create_topic("t", kl.TopicConfig(partitions=2))
    make(kl_root)
    assert out(kl_root, "dump", "t", "-p", "1") == [f"Dumping {Path(kl_root) / 't' / '1' / SEGMENT0}"]
    assert len(out(kl_root, "dump", "t")) == 1 + 3 + 1


def test_dump_target_errors(kl_root):
    path = make(kl_root) / SEGMENT0
    assert usage_error(kl_root, "dump", str(path), "-p", "0") == "Error: -p/--partition applies to a topic, not to a segment file"
    for target, message in [
        (str(path.parent), f"Error: {path.parent} is a directory: give a segment file or a topic name"),
        ("nope.kl", "Error: no such segment file: nope.kl"),
        ("nope", f"Error: topic 'nope' does not exist in {kl_root}"),
    ]:
        result = run(kl_root, "dump", target)
        assert (result.exit_code, result.stderr) == (1, message + "\n")


def test_repair_in_a_closed_segment_and_dump_of_the_copy_it_kept(kl_root):
    directory = small_topic(kl_root)
    segment = directory / "00000000000000001024.kl"
    flip_bit(segment, 64 + 25)  # message m000000034, at offset 1088
    assert out(kl_root, "recover", code=0) == ["t/0: ok (0 bytes checked)"]  # sizes and the tail only: not seen
    assert out(kl_root, "recover", "--deep", code=3) == ["t/0: damaged: offset 1088: checksum mismatch [left as it is]"]
    [line] = out(kl_root, "recover", "--deep", "--repair")
    assert line.startswith(
        "t/0: fixed: offset 1088: checksum mismatch [repaired: 32 bytes padded (1 padding message), original kept as "
    )
    [aside] = [p for p in directory.iterdir() if ".damaged-" in p.name]
    assert out(kl_root, "dump", str(aside), code=3)[-2:] == [
        "offset: 1088 position: 64 size: 32 valid: no",
        "stopped at offset 1088 (position 64): checksum mismatch",
    ]
    assert out(kl_root, "dump", str(segment))[3] == (
        "offset: 1088 position: 64 size: 32 magic: 2 codec: padding timestamp: - valid: yes key: -"
    )
    values = consume(kl_root)
    assert len(values) == 99 and "m000000034" not in values
    assert out(kl_root, "recover", "--deep") == ["t/0: ok (3200 bytes checked)"]


@pytest.mark.parametrize("command", ["recover", "retain"])
def test_a_partition_whose_lock_is_held_is_reported_and_the_others_are_done(kl_root, monkeypatch, command):
    make(kl_root, "a", [b"x" * 10] * 40, config=SMALL_SEGMENTS, appends=2)  # retain has a segment to delete
    grow_by(Path(kl_root, "a", "0", "00000000000000001280.kl"), GARBAGE)  # and recover a tail to cut
    make(kl_root, "b")
    with partition_locked_elsewhere(kl_root, "a", 0):
        monkeypatch.setitem(kl.Root.__init__.__kwdefaults__, "lock_timeout", 0.2)
        result = run(kl_root, command, *(["--max-bytes", "1"] if command == "retain" else []))
    lines = result.stdout.splitlines()
    assert lines[0] == f"a/0: error: lock {kl_root}/.locks/a/0.lock is held by another process (waited 0.2s)"
    assert lines[1].startswith("b/0: ") and "error" not in lines[1]
    verb = "checked" if command == "recover" else "retained"
    assert (result.exit_code, result.stderr) == (1, f"Error: not {verb}: a/0 (see the report)\n")


def test_retain_with_nothing_to_delete_takes_no_lock(kl_root, monkeypatch):
    make(kl_root, "a", [b"x" * 10] * 40, config=SMALL_SEGMENTS, appends=2)
    with partition_locked_elsewhere(kl_root, "a", 0):
        monkeypatch.setitem(kl.Root.__init__.__kwdefaults__, "lock_timeout", 0.2)
        assert out(kl_root, "retain", "--max-age", "0", "--max-bytes", "0") == ["a/0: nothing to delete; log starts at 0"]


# ----------------------------------------------------------------- kl topics import


def test_topics_import_brings_a_kafka_07_partition_in_and_refuses_it_twice(kl_root):
    source = str(KAFKA07_SEGMENT.parent)
    assert out(kl_root, "topics", "import", "k", source) == [f"k/0: imported {source}: 1 segment, offsets 0 to 10900"]
    assert len(consume(kl_root, "k")) == 100
    result = run(kl_root, "topics", "import", "k", source)
    assert (result.exit_code, result.stderr) == (1, "Error: partition 0 of topic 'k' is not empty (it ends at 10900)\n")
    assert out(kl_root, "recover", "--deep") == ["k/0: ok (10900 bytes checked)"]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_dump_lists_runs_from_the_core_exactly_as_message_by_message(kl_root, monkeypatch, each_core, as_json):
    """Runs of plain messages are listed by the core (``kl.log.dump.dump_lines``): the same
    text (or JSON) as a listing built record by record, around keyed, compressed and
    damaged messages and across the published end, of a topic and of a segment file."""
    r = kl.Root(kl_root)
    r.create_topic("t")
    # closed (flushed) before the unpublished bytes go in: a background flush still due
    # would take the lock and cut them, as a writer cuts a torn tail
    with kl.Producer(r) as producer, kl.Producer(r, compression="zstd") as zstd:
        for n in range(3):
            producer.send_batch("t", [b"v%d-%d" % (n, i) for i in range(3000)], partition=0, timestamp=TS + n)
            producer.send_batch("t", [b"kv", b"kv2"], keys=[b"k\n", b"\xff"], partition=0, timestamp=-1)
        zstd.send_batch("t", [b"a", b"bb"], partition=0)
        producer.send_batch("t", [b"tail%d" % i for i in range(5)], partition=0, timestamp=253402300799999)
    with open(Path(kl_root) / "t" / "0" / SEGMENT0, "ab") as f:  # never published, then damage
        f.write(b"".join(kl.log.message.encode(b"late%d" % i) for i in range(4)) + GARBAGE)
    import kl_cli.maintenance
    from kl.log.dump import Lines, dump_file, dump_lines

    runs: list[Lines] = []

    def counted(*args, **options):
        for item in dump_lines(*args, **options):
            if isinstance(item, Lines):
                runs.append(item)
            yield item

    options = ["--json"] if as_json else []
    segment = str(Path(kl_root) / "t" / "0" / SEGMENT0)
    monkeypatch.setattr(kl_cli.maintenance, "dump_lines", counted)
    fast = out(kl_root, "dump", "t", *options)  # the damage is past the published end: not damage
    fast_file = run(kl_root, "dump", segment, *options).stdout
    monkeypatch.setattr(
        kl_cli.maintenance, "dump_lines", lambda path, published=None, templates=None, **options: dump_file(path, **options)
    )
    assert fast == out(kl_root, "dump", "t", *options)
    assert fast_file == run(kl_root, "dump", segment, *options).stdout
    assert len(runs) >= 9 and sum(run.text.count(b"\n") for run in runs) >= 18000
    if as_json:
        rows = [json.loads(line) for line in fast]
        assert {row["partition"] for row in rows} == {0} and rows[-1]["past_log_end"] and not rows[0].get("past_log_end")
        return
    late = fast.index(next(line for line in fast if line.startswith("published end at offset")))
    assert [line.split(" valid: ")[1] for line in fast[late - 1 : late + 6 : 6]] == ["yes key: -", "no"]
    assert fast[late + 1].endswith("valid: yes key: -") and "timestamp: 253402300799999" in fast[late - 1]


# ----------------------------------------------------------------- what a kill -9 leaves


def killed(root: str, patch: str, *args: str) -> None:
    """``kl --root ROOT ARGS`` in a process of its own that ``patch`` (Python run first,
    with ``kill()`` at hand) kills with SIGKILL at the chosen step; it must die so."""
    code = (
        "import os, signal, sys\n"
        "def kill():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"{patch}\n"
        f"sys.argv = ['kl', '--root', {root!r}, *{list(args)!r}]\n"
        "from kl_cli import main\nmain()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert result.returncode == -9, result.stderr.decode()


def kl_cli(root: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KL, "--root", root, *args], capture_output=True, text=True, timeout=120)


def later(monkeypatch, module, seconds: float = 3600) -> None:
    """Move the file system's clock, as ``module`` reads it, ``seconds`` on."""
    then = time.time_ns() + round(seconds * 1e9)
    monkeypatch.setattr(module, "file_time_ns", lambda directory: then)


def test_recover_reports_and_removes_what_a_killed_topics_alter_left(kl_root):
    make(kl_root)
    # killed once the fourth new partition is built, before its rename: three renamed in, topic.json not written
    patch = (
        "import kl.topic\nmade = []\nreal = kl.topic.Root._create_partition\n"
        "def create(directory, suffix):\n    real(directory, suffix)\n    made.append(directory)\n"
        "    len(made) == 4 and kill()\n"
        "kl.topic.Root._create_partition = staticmethod(create)\n"
    )
    killed(kl_root, patch, "topics", "alter", "t", "--partitions", "300")
    topic = Path(kl_root, "t")
    adding = [name for name in os.listdir(topic) if name.startswith(".adding-")]
    assert sorted(set(os.listdir(topic)) - set(adding)) == ["0", "1", "2", "3", "topic.json"] and len(adding) == 1
    dry = kl_cli(kl_root, "recover", "--dry-run")
    assert (dry.returncode, dry.stderr) == (3, "")
    assert dry.stdout.splitlines() == [
        f"t/{adding[0]}: a partition an interrupted kl topics alter was building [would remove]",
        *(f"t/{p}: partition {p} of an interrupted kl topics alter (topic.json names 1) [would remove]" for p in (1, 2, 3)),
        "t/0: ok (0 bytes checked)",
    ]
    assert len(os.listdir(topic)) == 6  # a dry run changes nothing
    done = kl_cli(kl_root, "recover")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == f"t/{adding[0]}: a partition an interrupted kl topics alter was building [removed]"
    assert sorted(os.listdir(topic)) == ["0", "topic.json"]
    assert kl_cli(kl_root, "recover", "--dry-run").stdout == "t/0: ok (0 bytes checked)\n"
    assert kl_cli(kl_root, "topics", "alter", "t", "--partitions", "3").returncode == 0


def test_recover_leaves_alone_what_an_alter_under_way_builds(kl_root):
    make(kl_root)
    os.mkdir(Path(kl_root, "t", ".adding-0123"))
    with locks.locked(str(Path(kl_root, ".locks", "t", "config.lock")), 1):  # the alter holds it
        assert out(kl_root, "recover") == ["t/0: ok (0 bytes checked)"]
    assert os.path.isdir(Path(kl_root, "t", ".adding-0123"))


def test_a_directory_past_the_partitions_holding_data_is_reported_not_removed(kl_root):
    make(kl_root)
    stray = Path(kl_root, "t", "1")
    stray.mkdir()
    (stray / SEGMENT0).write_bytes(b"someone's data")
    reason = "not a partition of the topic (1 partitions) and holds data: move it away [left as it is]"
    assert out(kl_root, "recover", code=3) == [f"t/1: {reason}", "t/0: ok (0 bytes checked)"]
    assert (stray / SEGMENT0).read_bytes() == b"someone's data"


def test_a_killed_repair_leaves_no_partial_copy_the_next_run_keeps(kl_root):
    segment = make(kl_root, "t", [b"x" * 10] * 100) / SEGMENT0
    flip_bit(segment, 32 * 50 + 30)  # the value of message 50
    patch = (
        "import kl.log.recovery as r\n"
        "def copy(source, target):\n"
        "    with open(source, 'rb') as f, open(target, 'wb') as g:\n        g.write(f.read(1000))\n    kill()\n"
        "r.shutil.copy2 = copy\n"
    )
    killed(kl_root, patch, "recover", "--deep", "--repair")
    [partial] = [name for name in os.listdir(segment.parent) if ".damaged-" in name]
    assert partial.startswith(f".{SEGMENT0}.damaged-") and partial.endswith(".tmp")  # never under a copy's name
    dry = kl_cli(kl_root, "recover", "--deep", "--dry-run")
    assert dry.returncode == 3
    assert dry.stdout.splitlines() == [
        "t/0: found: offset 0: partial copy of a segment left by an interrupted kl recover --repair [would remove]",
        "t/0: found: offset 1600: checksum mismatch [nothing changed]",
    ]
    done = kl_cli(kl_root, "recover", "--deep", "--repair")
    assert done.returncode == 0, done.stdout
    [copy] = [name for name in os.listdir(segment.parent) if ".damaged-" in name]
    assert copy.startswith(f"{SEGMENT0}.damaged-") and os.path.getsize(segment.parent / copy) == 3200


def test_recover_removes_the_temporary_files_a_killed_retain_left_once_old(kl_root, monkeypatch):
    small_topic(kl_root, timestamp=TS)
    directory = Path(kl_root, "t", "0")
    patch = (
        "import kl.log.fsutil as t\nreal = t.write_atomic\n"
        "t.write_atomic = lambda path, data, **kw: real(\n"
        "    path, data, before_rename=kill if path.endswith('.time') else None, **kw)\n"
    )
    killed(kl_root, patch, "retain", "--max-age", "1d")  # killed dating its first segment
    [tmp] = [name for name in os.listdir(directory) if name.endswith(".tmp")]
    assert tmp.startswith(f".{SEGMENT0}.time.")
    assert kl_cli(kl_root, "recover", "--dry-run").stdout == "t/0: ok (0 bytes checked)\n"  # it might be a write under way
    later(monkeypatch, recovery)
    finding = "offset 0: temporary file left by an interrupted write [%s]"
    assert out(kl_root, "recover", "--dry-run", code=3) == ["t/0: found: " + finding % "would remove"]
    assert out(kl_root, "recover") == ["t/0: fixed: " + finding % "removed"]
    assert not [name for name in os.listdir(directory) if name.endswith(".tmp")]
    assert out(kl_root, "recover") == ["t/0: ok (0 bytes checked)"]
    assert out(kl_root, "retain", "--max-age", "1d")[-1] == "t/0: deleted 3 segments (3072 bytes); log starts at 3072"


def test_recover_lists_many_findings_one_per_line(kl_root, monkeypatch):
    small_topic(kl_root, timestamp=TS)
    directory = Path(kl_root, "t", "0")
    for n in range(50):
        (directory / f".{SEGMENT0}.time.{n}.0123abcd.tmp").write_bytes(b"")
    later(monkeypatch, recovery)
    lines = out(kl_root, "recover", "--deep", "--dry-run", code=3)
    assert len(lines) == 50 and all(line.startswith("t/0: found: offset 0: temporary file") for line in lines)
