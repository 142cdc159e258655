"""Consumer group administration (``kl.groups``, ``kl groups``): describe with lag, reset,
delete, export and import; members as real processes holding their locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import kl
from kl import groups
from kl.groups import AtTime, OffsetChange, ShiftBy, Status
from kl.log import message as m
from kl.log.log import Position
from kl.log.retention import retain
from kl.log.validate import Checked
from kl.registry import Registry
from kl.timespec import format_iso
from kl_cli.main import cli

from conftest import write, write_each

HOUR = 3_600_000
MEMBER = """
import sys, time
from kl.registry import Registry
registry = Registry(sys.argv[1], sys.argv[2])
me = registry.register({"topics": sys.argv[3].split(",")})
for topic_partition in sys.argv[4:]:
    topic, partition = topic_partition.split("/")
    registry.claim(topic, int(partition), me.member.id, {})
print(me.member.id, flush=True)
time.sleep(600)
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def commit(root: kl.Root, group: str, topic: str, partition: int, offset: int) -> None:
    Registry(root.path, group).write_offset(topic, partition, offset, "test")


def committed(root: kl.Root, group: str, topic: str, partition: int) -> int | None:
    found = Registry(root.path, group).committed(topic, partition)
    return None if found is None else found.offset


def change(topic: str, partition: int, old: int | None, new: int) -> OffsetChange:
    """A change between offsets outside compressed batches."""
    return OffsetChange(topic, partition, None if old is None else Position(old), Position(new))


def run(root: kl.Root, *args: str, input: str | None = None):
    return CliRunner().invoke(cli, ["--root", root.path, "groups", *args], input=input)


def row(info: groups.GroupInfo, topic: str, partition: int) -> groups.PartitionLag:
    (found,) = [p for p in info.partitions if (p.topic, p.partition) == (topic, partition)]
    return found


@pytest.fixture
def events(root: kl.Root) -> list[int]:
    """Topic t, 2 partitions: partition 0 has 10 messages stamped an hour ago (their offsets
    returned, then the log end), partition 1 is empty.  Group g committed 4 messages in."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    offsets = write_each(root, "t", [b"message %d" % i for i in range(10)], timestamp=now_ms() - HOUR)
    offsets.append(root.log("t", 0).log_end_offset)
    commit(root, "g", "t", 0, offsets[4])
    return offsets


@pytest.fixture
def member(root: kl.Root) -> Iterator[Callable[..., Member]]:
    started: list[Member] = []

    def start(group: str, topics: str, *owned: str) -> Member:
        process = subprocess.Popen(
            [sys.executable, "-c", MEMBER, root.path, group, topics, *owned], stdout=subprocess.PIPE, text=True
        )
        started.append(Member(process, process.stdout.readline().strip()))
        return started[-1]

    yield start
    for one in started:
        one.process.kill()
        one.process.wait()


class Member:
    """A group member in a child process: registered, holding its lock, owning what it claimed."""

    def __init__(self, process: subprocess.Popen, id: str):
        self.process, self.id = process, id

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


# ----------------------------------------------------------------- list, describe


def test_list_groups(root):
    root.create_topic("t")
    assert groups.list_groups(root) == []
    commit(root, "b", "t", 0, 0)
    commit(root, "a", "t", 0, 0)
    assert groups.list_groups(root) == ["a", "b"]
    assert groups.list_groups(root.path) == ["a", "b"]
    with pytest.raises(kl.RootNotFound):
        groups.list_groups(os.path.join(root.path, "missing"))


def test_describe_an_unknown_group(root):
    root.create_topic("t")
    with pytest.raises(kl.GroupNotFound, match="no group 'nope'"):
        groups.describe(root, "nope")
    with pytest.raises(kl.GroupNotFound, match=r"no group '\.\./x'"):
        groups.describe(root, "../x")  # any id is a group's (tests/test_group_ids.py)


def test_describe_gives_lag_in_messages_bytes_and_time(root, events):
    info = groups.describe(root, "g")
    assert info.group == "g" and info.members == []
    p0, p1 = info.partitions
    assert (p0.topic, p0.partition, p0.owner, p0.committed, p0.status) == ("t", 0, None, events[4], Status.OK)
    assert (p0.log_start_offset, p0.log_end_offset) == (0, events[10])
    assert (p0.lag_messages, p0.lag_bytes) == (6, events[10] - events[4])
    assert HOUR <= p0.lag_ms < 2 * HOUR
    assert (p0.committed_kafka_offset, p0.log_end_kafka_offset) == (4, 10)
    assert p1 == groups.PartitionLag(
        "t", 1, None, 0, None, None, 0, 0, None, None, None, Status.NOT_COMMITTED, log_end_kafka_offset=0
    )


def test_describe_when_caught_up(root, events):
    commit(root, "g", "t", 0, events[10])
    p0 = row(groups.describe(root, "g"), "t", 0)
    assert (p0.lag_messages, p0.lag_bytes, p0.lag_ms, p0.status) == (0, 0, None, Status.OK)


def test_lag_counts_the_messages_inside_compressed_batches_and_no_padding(root):
    root.create_topic("t")
    write(root, "t", [b"a", b"b"])
    start = root.log("t", 0).log_end_offset
    root.log("t", 0).append(Checked.framed(m.encode(bytes(40), None, 0, m.ATTR_PADDING), 0))  # (padding counts no message)
    stamp = now_ms() - 5 * HOUR
    write(root, "t", [b"z%d" % i for i in range(500)], compression="zstd", timestamp=stamp)
    write(root, "t", [b"c"])
    commit(root, "g", "t", 0, start)
    p0 = row(groups.describe(root, "g"), "t", 0)
    assert p0.lag_messages == 501
    assert p0.lag_bytes == root.log("t", 0).log_end_offset - start
    assert 5 * HOUR <= p0.lag_ms < 6 * HOUR  # the oldest is the batch's first message, not the padding


def test_positions_inside_a_compressed_batch_in_describe_reset_export_and_import(root):
    """Issue 16, point 4: OFFSET+SKIP is understood wherever a committed offset is."""
    root.create_topic("t")
    write(root, "t", [b"a"])
    batch = root.log("t", 0).log_end_offset
    write(root, "t", [b"z%d" % i for i in range(50)], compression="zstd")
    after = root.log("t", 0).log_end_offset
    commit(root, "g", "t", 0, 0)
    assert groups.reset(root, "g", Position(batch, 20), topic="t", partition=0) == [
        OffsetChange("t", 0, Position(0), Position(batch, 20))
    ]
    p0 = row(groups.describe(root, "g"), "t", 0)
    assert (p0.committed, p0.skip, p0.position, p0.lag_messages) == (batch, 20, Position(batch, 20), 30)
    assert f"t      0          -      {batch}+20" in run(root, "describe", "g").stdout
    assert groups.export(root, "g") == f"t 0 {batch}+20\n"
    result = run(root, "reset", "g", "--to", f"{batch}+49", "--topic", "t", "-p", "0")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {batch}+20 -> {batch}+49\n")
    for bad, held in ((f"{batch}+50", "50 messages"), ("0+1", "1 message,")):
        result = run(root, "reset", "g", "--to", bad, "--topic", "t", "-p", "0")
        assert result.exit_code == 1 and f"Error: position {bad} of t/0: offset" in result.stderr and held in result.stderr
        result = run(root, "import", "h", input=f"t 0 {bad}\n")
        assert result.exit_code == 1 and result.stderr.startswith(f"Error: line 1: position {bad} of t/0")
    assert groups.import_offsets(root, "h", f"t 0 {batch}+7\n") == [OffsetChange("t", 0, None, Position(batch, 7))]
    with kl.GroupConsumer(root, "h", ["t"]) as consumer:
        assert [v for b in consumer.batches(values_only=True) for v in b.messages] == [b"z%d" % i for i in range(7, 50)]
        consumer.commit()
    assert groups.export(root, "h") == f"t 0 {after}\n"


def test_lag_of_an_offset_retention_deleted(root):
    root.create_topic("t", kl.TopicConfig(segment_bytes=200, max_message_bytes=100))
    offsets = write_each(root, "t", [b"x" * 50 for _ in range(12)])
    commit(root, "g", "t", 0, offsets[0])
    retain(root.log("t", 0), max_bytes=300, delete_delay=0)
    start = root.log("t", 0).log_start_offset
    assert start > offsets[0]
    p0 = row(groups.describe(root, "g"), "t", 0)
    assert (p0.status, p0.committed, p0.log_start_offset) == (Status.BEFORE_START, offsets[0], start)
    assert p0.lag_messages == sum(1 for o in offsets if o >= start)
    assert p0.lag_bytes == root.log("t", 0).log_end_offset - start


def test_an_offset_past_the_log_end(root, events):
    commit(root, "g", "t", 1, 1000)
    p1 = row(groups.describe(root, "g"), "t", 1)
    assert (p1.status, p1.committed, p1.lag_messages, p1.lag_bytes) == (Status.PAST_END, 1000, None, None)


def test_a_deleted_topic_is_flagged_skipped_by_reset_and_commented_out_by_export(root, events):
    root.create_topic("u")
    write(root, "u", [b"u"])
    commit(root, "g", "u", 0, 0)
    root.delete_topic("t")
    assert [(p.topic, p.partition) for p in groups.describe(root, "g").partitions] == [("u", 0)]  # its offsets went with it
    commit(root, "g", "t", 0, events[4])  # as a member that committed while it was deleted would
    info = groups.describe(root, "g")
    assert [(p.topic, p.partition, p.status) for p in info.partitions] == [("t", 0, Status.GONE), ("u", 0, Status.OK)]
    assert row(info, "t", 0).committed == events[4] and row(info, "t", 0).log_end_offset is None
    assert groups.reset(root, "g", "latest") == [change("u", 0, 0, root.log("u", 0).log_end_offset)]
    assert groups.export(root, "g") == f"# t 0 {events[4]} (no such partition now)\nu 0 {root.log('u', 0).log_end_offset}\n"
    with pytest.raises(kl.TopicNotFound):
        groups.reset(root, "g", "earliest", topic="t")
    result = run(root, "describe", "g")
    assert result.exit_code == 0 and f"t      0          -      {events[4]}" in result.stdout and "topic deleted" in result.stdout


def test_a_damaged_offset_file_is_a_row_of_its_own_and_reset_overwrites_it(root, events):
    """Issue 16 (6a): describe lists every partition, the damaged one marked, and exits 1."""
    Path(root.path, ".groups", "g", "commits", "t").unlink()  # the group's offsets as an older kl kept them:
    path = Path(root.path, ".groups", "g", "offsets", "t", "0")
    path.parent.mkdir(parents=True)
    body = b"offset 9\nmember test\ntime 2023-11-14T22:13:20.000Z\n"
    path.write_bytes(body + b"crc32 %08x\n" % (zlib.crc32(body) ^ 1))
    commit(root, "g", "t", 1, 0)
    info = groups.describe(root, "g")
    assert [(p.partition, p.status, p.damage) for p in info.partitions] == [
        (0, Status.DAMAGED, "its checksum does not match"),
        (1, Status.OK, None),
    ]
    assert row(info, "t", 0).log_end_offset == events[10] and row(info, "t", 0).committed is None
    result = run(root, "describe", "g")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert "damaged: its checksum does not match" in result.stdout and "t      1          -      0" in result.stdout
    assert result.stderr == "Error: group g: damaged committed offset file of t/0: reset it with 'kl groups reset'\n"
    as_json = run(root, "describe", "g", "--json")
    assert as_json.exit_code == 1 and '"damage": "its checksum does not match"' in as_json.stdout
    export = run(root, "export", "g")
    assert export.exit_code == 1 and export.stderr.startswith(f"Error: damaged committed offset file {path} (its checksum")
    assert groups.reset(root, "g", "earliest") == [change("t", 0, None, 0), change("t", 1, 0, 0)]
    assert committed(root, "g", "t", 0) == 0


# ----------------------------------------------------------------- live members


def test_a_heartbeat_age_is_by_the_clock_of_the_files_not_the_clock_of_the_host_that_asks(root, member, monkeypatch):
    member("g", "t")
    ahead = time.time_ns() + 3600 * 10**9  # this host's clock an hour ahead of the file system's
    monkeypatch.setattr(time, "time_ns", lambda: ahead)
    (seen,) = groups.describe(root, "g").members
    assert 0 <= seen.beat_age_ms < 600_000


def test_a_live_member_is_described_blocks_changes_until_forced_and_goes_when_killed(root, events, member):
    one = member("g", "t", "t/1")
    info = groups.describe(root, "g")
    (seen,) = info.members
    assert (seen.id, seen.pid, seen.subscription) == (one.id, one.process.pid, {"topics": ["t"]})
    assert seen.host == one.id.split(":")[0] and seen.since_ms <= now_ms() and seen.beat_age_ms >= 0
    assert [(p.partition, p.owner, p.generation) for p in info.partitions] == [(0, None, 0), (1, one.id, 1)]
    for attempt in (
        lambda **kw: groups.reset(root, "g", "latest", **kw),
        lambda **kw: groups.reset(root, "g", "latest", dry_run=True, **kw),
        lambda **kw: groups.delete(root, "g", **kw),
        lambda **kw: groups.import_offsets(root, "g", "t 0 0\n", **kw),
    ):
        with pytest.raises(kl.GroupActive, match=rf"group 'g' has 1 live member \(.* pid {one.process.pid}\): stop it first"):
            attempt()
    assert committed(root, "g", "t", 0) == events[4]
    result = run(root, "reset", "g", "--to", "latest")
    assert (result.exit_code, result.stderr.count("\n")) == (1, 1) and "live member" in result.stderr

    assert groups.reset(root, "g", "latest", force=True)[0] == change("t", 0, events[4], events[10])
    assert committed(root, "g", "t", 0) == events[10]

    registration = Path(root.path, ".groups", "g", "ids", one.id)
    assert registration.exists()
    one.kill()
    info = groups.describe(root, "g")
    assert info.members == [] and row(info, "t", 1).owner is None and row(info, "t", 1).generation == 1
    assert not registration.exists()
    groups.delete(root, "g")
    assert groups.list_groups(root) == []


def test_partitions_of_topics_live_members_subscribe_to_are_described(root, member):
    root.create_topic("a", kl.TopicConfig(partitions=2))
    root.create_topic("b")
    member("fresh", "a")
    info = groups.describe(root, "fresh")
    assert [(p.topic, p.partition, p.status) for p in info.partitions] == [
        ("a", 0, Status.NOT_COMMITTED),
        ("a", 1, Status.NOT_COMMITTED),
    ]


def test_delete_with_force_while_a_member_lives(root, events, member):
    member("g", "t")
    with pytest.raises(kl.GroupActive):
        groups.delete(root, "g")
    groups.delete(root, "g", force=True)
    assert groups.list_groups(root) == []
    with pytest.raises(kl.GroupNotFound):
        groups.delete(root, "g")


# ----------------------------------------------------------------- reset


def test_reset_to_earliest_latest_and_a_time(root, events):
    commit(root, "g", "t", 1, 0)
    assert groups.reset(root, "g", "earliest") == [change("t", 0, events[4], 0), change("t", 1, 0, 0)]
    assert groups.reset(root, "g", "latest", topic="t", partition=0) == [change("t", 0, 0, events[10])]
    later = write_each(root, "t", [b"new"], timestamp=now_ms())[0]
    assert groups.reset(root, "g", AtTime(now_ms() - HOUR // 2), topic="t") == [
        change("t", 0, events[10], later),
        change("t", 1, 0, 0),
    ]
    assert groups.reset(root, "g", AtTime(0), topic="t", partition=0) == [change("t", 0, later, 0)]
    assert committed(root, "g", "t", 0) == 0
    assert Registry(root.path, "g").committed("t", 0).member.startswith("reset@")


def test_reset_to_a_byte_offset(root, events):
    assert groups.reset(root, "g", events[7], topic="t", partition=0) == [change("t", 0, events[4], events[7])]
    with pytest.raises(kl.InvalidOffset, match=f"offset {events[7] + 1} is not the start of a message"):
        groups.reset(root, "g", events[7] + 1, topic="t", partition=0)
    with pytest.raises(kl.OffsetOutOfRange):
        groups.reset(root, "g", events[10] + 100, topic="t", partition=0)
    with pytest.raises(kl.InvalidConfig, match=r"a byte offset \(0\) is for one partition, and topic 't' has 2"):
        groups.reset(root, "g", 0, topic="t")
    with pytest.raises(kl.InvalidConfig, match="a byte offset"):
        groups.reset(root, "g", 0)
    assert committed(root, "g", "t", 0) == events[7]


def test_reset_shift_by_messages_within_the_log(root, events):
    def shift(by: int) -> list[OffsetChange]:
        return groups.reset(root, "g", ShiftBy(by), topic="t", partition=0)

    assert shift(3) == [change("t", 0, events[4], events[7])]
    assert shift(-2) == [change("t", 0, events[7], events[5])]
    assert shift(0) == [change("t", 0, events[5], events[5])]
    assert shift(-100) == [change("t", 0, events[5], 0)]
    assert shift(100) == [change("t", 0, 0, events[10])]
    assert shift(1) == [change("t", 0, events[10], events[10])]
    assert committed(root, "g", "t", 0) == events[10]


def test_reset_shift_by_counts_the_messages_of_a_compressed_batch(root):
    root.create_topic("z")
    [batch] = write(root, "z", [b"a", b"b", b"c", b"d", b"e"], compression="zstd")
    f, g = write_each(root, "z", [b"f", b"g"])
    Registry(root.path, "g").write_offset("z", 0, Position(batch.offset, 2), "test")

    def shift(by: int) -> Position:
        [moved] = groups.reset(root, "g", ShiftBy(by), topic="z", partition=0, dry_run=True)
        return moved.new

    assert [shift(n) for n in (-3, -2, -1, 1, 2, 3, 4, 5)] == [
        Position(0),
        Position(0),
        Position(0, 1),
        Position(0, 3),
        Position(0, 4),
        Position(f),
        Position(g),
        Position(root.log("z", 0).log_end_offset),
    ]
    Registry(root.path, "g").write_offset("z", 0, Position(g), "test")
    assert [shift(n) for n in (-1, -2, -6)] == [Position(f), Position(0, 4), Position(0, 0)]


def test_reset_shift_by_a_partition_without_a_committed_offset_is_refused(root, events):
    with pytest.raises(kl.InvalidConfig) as refused:
        groups.reset(root, "g", ShiftBy(1))
    assert str(refused.value) == "group 'g' has no committed offset to shift for t/1: reset it to a place first"
    assert committed(root, "g", "t", 0) == events[4]


def test_reset_shift_by_from_below_the_log_start_counts_from_it(root):
    root.create_topic("small", kl.TopicConfig(segment_bytes=512, max_message_bytes=512))
    offsets = write_each(root, "small", [b"%02d" % i + b"." * 100 for i in range(24)])
    commit(root, "g", "small", 0, offsets[1])
    retain(root.log("small", 0), max_bytes=1200, max_age_ms=0, delete_delay=0)
    start = root.log("small", 0).log_start_offset
    assert start > offsets[1]
    later = offsets[offsets.index(start) + 2]
    assert groups.reset(root, "g", ShiftBy(2), topic="small") == [change("small", 0, offsets[1], later)]


def test_reset_checks_its_arguments_before_writing(root, events):
    with pytest.raises(kl.InvalidConfig, match=r"a partition \(1\) needs its topic"):
        groups.reset(root, "g", "earliest", partition=1)
    with pytest.raises(kl.TopicNotFound, match="has partitions 0 to 1, not 5"):
        groups.reset(root, "g", "earliest", topic="t", partition=5)
    with pytest.raises(kl.TopicNotFound):
        groups.reset(root, "g", "earliest", topic="nope")
    with pytest.raises(kl.GroupNotFound):
        groups.reset(root, "other", "earliest", topic="t")
    with pytest.raises(kl.InvalidConfig, match="not 'first'"):
        groups.reset(root, "g", "first")  # type: ignore[arg-type]
    assert groups.reset(root, "g", "earliest", dry_run=True) == [
        change("t", 0, events[4], 0),
        change("t", 1, None, 0),
    ]
    assert committed(root, "g", "t", 0) == events[4] and committed(root, "g", "t", 1) is None


# ----------------------------------------------------------------- export, import


def test_export_and_import_round_trip(root, events):
    commit(root, "g", "t", 1, 0)
    text = groups.export(root, "g")
    assert text == f"t 0 {events[4]}\nt 1 0\n"
    changes = groups.import_offsets(root, "copy", "# saved\n\n" + text + "   \n")
    assert changes == [change("t", 0, None, events[4]), change("t", 1, None, 0)]
    assert groups.export(root, "copy") == text
    assert groups.list_groups(root) == ["copy", "g"]
    assert Registry(root.path, "copy").committed("t", 0).member.startswith("import@")


def test_import_into_an_existing_group_changes_the_lines_given(root, events):
    assert groups.import_offsets(root, "g", f"t 1 0\nt 0 {events[9]}\n") == [
        change("t", 1, None, 0),
        change("t", 0, events[4], events[9]),
    ]
    assert groups.import_offsets(root, "empty", "# nothing\n") == []
    assert groups.list_groups(root) == ["empty", "g"]


@pytest.mark.parametrize(
    "line, error",
    [
        ("t 0", "expected 'TOPIC PARTITION OFFSET' or"),
        ("t 0 x", "expected 'TOPIC PARTITION OFFSET'"),
        ("t -1 0", "expected 'TOPIC PARTITION OFFSET'"),
        ("nope 0 0", "topic 'nope' does not exist"),
        ("../x 0 0", "invalid topic name"),
        ("t 2 0", "topic 't' has partitions 0 to 1, not 2"),
        ("t 0 5", "offset 5 is not the start of a message"),
        ("t 0 999999", "offset 999999 is out of range"),
        ("t 1 0", "t/1 is given twice"),
    ],
)
def test_a_bad_import_line_is_named_and_nothing_is_written(root, events, line, error):
    text = f"# offsets\nt 1 0\n\n{line}\n"
    with pytest.raises(kl.InvalidImport, match=f"^line 4: {error}"):
        groups.import_offsets(root, "g", text)
    assert committed(root, "g", "t", 1) is None
    with pytest.raises(kl.InvalidImport, match="^line 4"):
        groups.import_offsets(root, "new", text)
    assert groups.list_groups(root) == ["g"]
    result = run(root, "import", "g", input=text)
    assert result.exit_code == 1 and result.stderr.startswith("Error: line 4: ") and error in result.stderr
    assert result.stderr.count("\n") == 1


# ----------------------------------------------------------------- the command line


def test_cli_list_and_describe(root, events):
    assert (run(root, "list").exit_code, run(root, "list").stdout) == (0, "g\n")
    result = run(root, "describe", "g")
    assert result.exit_code == 0, result.stdout
    lines = result.stdout.splitlines()
    assert lines[:3] == ["group  g", "", "no live members"]
    assert lines[4].split() == [
        "topic",
        "partition",
        "owner",
        "committed",
        "log_end",
        "lag",
        "lag_bytes",
        "lag_time",
        "status",
    ]
    assert lines[5].split()[:7] == ["t", "0", "-", str(events[4]), str(events[10]), "6", str(events[10] - events[4])]
    assert lines[5].split()[7:] in (["1h", "00m", "ok"], ["1h", "01m", "ok"])
    assert lines[6].split() == ["t", "1", "-", "-", "0", "-", "-", "-", "not", "committed"]


def test_cli_describe_json(root, events):
    import json

    result = run(root, "describe", "g", "--json")
    obj = json.loads(result.stdout)
    assert obj["group"] == "g" and obj["members"] == []
    assert obj["partitions"][0] | {"committed_ms": 0, "lag_ms": 0} == {
        "topic": "t",
        "partition": 0,
        "owner": None,
        "generation": 0,
        "committed": events[4],
        "committed_ms": 0,
        "log_start_offset": 0,
        "log_end_offset": events[10],
        "lag_messages": 6,
        "lag_bytes": events[10] - events[4],
        "lag_ms": 0,
        "status": "ok",
        "skip": 0,
        "damage": None,
        "committed_kafka_offset": 4,
        "log_end_kafka_offset": 10,
    }
    assert obj["partitions"][1]["status"] == "not committed"


def test_cli_describe_with_a_member_in_a_real_process(root, events, member):
    one = member("g", "t", "t/0", "t/1")
    result = subprocess.run(
        [sys.executable, "-m", "kl_cli", "--root", root.path, "groups", "describe", "g"], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[2].split() == ["member", "host", "pid", "since", "last_beat"]
    assert lines[3].split()[:3] == [one.id, one.id.split(":")[0], str(one.process.pid)]
    assert [line.split()[2] for line in lines[6:8]] == [one.id, one.id]


def test_cli_reset(root, events):
    result = run(root, "reset", "g", "--to", "earliest", "--dry-run")
    assert (result.exit_code, result.stdout) == (
        0,
        f"t/0: {events[4]} -> 0 (dry run: not written)\nt/1: - -> 0 (dry run: not written)\n",
    )
    assert committed(root, "g", "t", 0) == events[4]
    result = run(root, "reset", "g", "--to", str(events[2]), "--topic", "t", "-p", "0")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[4]} -> {events[2]}\n")
    result = run(root, "reset", "g", "--to", "2000-01-01T00:00:00Z", "--topic", "t")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[2]} -> 0\nt/1: - -> 0\n")
    result = run(root, "reset", "g", "--to", "latest")
    assert (result.exit_code, result.stdout) == (0, f"t/0: 0 -> {events[10]}\nt/1: 0 -> 0\n")


def test_cli_reset_to_datetime_by_duration_and_shift_by(root, events):
    result = run(root, "reset", "g", "--to-datetime", "-2h", "--topic", "t", "--dry-run")
    assert (result.exit_code, result.stdout) == (
        0,
        f"t/0: {events[4]} -> 0 (dry run: not written)\nt/1: - -> 0 (dry run: not written)\n",
    )
    result = run(root, "reset", "g", "--by-duration", "30m")  # stamped an hour ago: after them all
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[4]} -> {events[10]}\nt/1: - -> 0\n")
    result = run(root, "reset", "g", "--by-duration", "PT2H", "--topic", "t", "-p", "0")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[10]} -> 0\n")
    result = run(root, "reset", "g", "--shift-by", "3")
    assert (result.exit_code, result.stdout) == (0, f"t/0: 0 -> {events[3]}\nt/1: 0 -> 0\n")
    result = run(root, "reset", "g", "--shift-by", "-1", "--topic", "t", "-p", "0")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[3]} -> {events[2]}\n")
    stamp = kl.Consumer(root).fetch("t", 0, events[2]).__iter__().__next__().timestamp
    result = run(root, "reset", "g", "--to-datetime", format_iso(stamp + 1), "--topic", "t", "-p", "0")
    assert (result.exit_code, result.stdout) == (0, f"t/0: {events[2]} -> {events[10]}\n")  # all stamped alike


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("--to", "soon"), 2, "'soon' is not earliest, latest, a byte offset (OFFSET or OFFSET+SKIP) or a time: milliseconds"),
        (("--to", "earliest", "-p", "0"), 2, "--partition needs --topic"),
        ((), 2, "give one of --to, --to-datetime, --by-duration or --shift-by"),
        (("--to", "earliest", "--shift-by", "0"), 2, "--to, --shift-by cannot be used together"),
        (("--to-datetime", "0", "--by-duration", "1h"), 2, "--to-datetime, --by-duration cannot be used together"),
        (("--to-datetime", "soon"), 2, "Invalid value for '--to-datetime': 'soon' is not a time: give milliseconds"),
        (("--by-duration", "-1h"), 2, "Invalid value for '--by-duration': '-1h' is not a duration such as 2d"),
        (("--shift-by", "1"), 1, "Error: group 'g' has no committed offset to shift for t/1: reset it to a place first\n"),
        (("--to", "0"), 1, "Error: a byte offset (0) is for one partition, and group 'g' has 2: give the partition\n"),
        (("--to", "7", "--topic", "t", "-p", "0"), 1, "Error: offset 7 is not the start of a message"),
        (("--to", "earliest", "--topic", "nope"), 1, "Error: topic 'nope' does not exist"),
    ],
)
def test_cli_reset_errors(root, events, args, code, message):
    result = run(root, "reset", "g", *args)
    assert result.exit_code == code and message in result.stderr, result.stderr
    if code == 1:
        assert result.stderr.count("\n") == 1
    assert committed(root, "g", "t", 0) == events[4]


def test_cli_export_import_and_delete(root, events):
    exported = run(root, "export", "g")
    assert (exported.exit_code, exported.stdout) == (0, f"t 0 {events[4]}\n")
    assert run(root, "import", "h", input=exported.stdout).exit_code == 0
    assert run(root, "export", "h").stdout == exported.stdout
    assert run(root, "import", "h", input="t 0 \xff\n").stderr.startswith("Error: line 1: expected")
    assert run(root, "delete", "h").exit_code == 0
    result = run(root, "delete", "h")
    assert (result.exit_code, result.stderr) == (1, f"Error: no group 'h' in {root.path}\n")
    assert run(root, "list").stdout == "g\n"


def test_cli_without_a_root(tmp_path):
    result = CliRunner().invoke(cli, ["--root", str(tmp_path / "none"), "groups", "list"])
    assert (result.exit_code, result.stderr) == (1, f"Error: root {tmp_path / 'none'} does not exist (is it mounted?)\n")
