"""``Root.alter_topic`` and ``kl topics alter``: settings changed in place, the topic id
kept, refusals that write nothing, and running producers, readers, followers and groups
taking the change up without a restart."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_group import wait_for
from test_serve import Daemon

import kl
from kl.log import retention
from kl.log.config import CONFIG_FILE
from kl.log.state import STATE_FILE, PartitionState
from kl_cli.main import cli

from conftest import partition_dir, read_all, segment_files, write, write_each

KL = [sys.executable, "-m", "kl_cli"]
MEMBER = str(Path(__file__).resolve().parent / "groupmember.py")


def config_bytes(root: kl.Root, topic: str) -> bytes:
    return (Path(root.path) / topic / CONFIG_FILE).read_bytes()


def tree(path: str) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> contents)."""
    found = {}
    for directory, _, files in os.walk(path):
        for name in files:
            full = os.path.join(directory, name)
            found[os.path.relpath(full, path)] = Path(full).read_bytes()
    return found


def kl_cli(root: kl.Root, *args: str):
    return CliRunner().invoke(cli, ["--root", root.path, *args], env={"KL_ROOT": None}, catch_exceptions=False)


# ----------------------------------------------------------------- the library


def test_alter_changes_the_settings_and_keeps_the_topic_id(root):
    created = root.create_topic("t", kl.TopicConfig(partitions=2))
    altered = root.alter_topic("t", retention_ms=60_000, retention_bytes=1 << 20, flush_messages=10, flush_ms=0,
                               segment_bytes=1 << 24, max_message_bytes=1 << 21)
    expected = dataclasses.replace(created, retention_ms=60_000, retention_bytes=1 << 20, flush_messages=10, flush_ms=0,
                                   segment_bytes=1 << 24, max_message_bytes=1 << 21)
    assert altered == expected
    assert kl.Root(root.path).config("t") == expected
    assert kl.Root(root.path).topic_id("t") == created.topic_id


def test_alter_adds_empty_partitions_and_leaves_the_existing_ones_alone(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    write(root, "t", [b"a", b"b"], partition=0)
    write(root, "t", [b"c"], partition=1)
    before = tree(os.path.join(root.path, "t"))
    assert root.alter_topic("t", partitions=4).partitions == 4
    after = tree(os.path.join(root.path, "t"))
    assert {k: v for k, v in after.items() if k.split(os.sep)[0] in ("0", "1")} == {
        k: v for k, v in before.items() if k != CONFIG_FILE
    }
    root.create_topic("fresh", kl.TopicConfig(partitions=1))
    for p in (2, 3):
        assert sorted(os.listdir(partition_dir(root, "t", p))) == sorted(os.listdir(partition_dir(root, "fresh", 0)))
        assert [f.stat().st_size for f in segment_files(root, "t", p)] == [0]
        state = PartitionState.decode((partition_dir(root, "t", p) / STATE_FILE).read_bytes(), "state")
        assert (state.log_start_offset, state.log_end_offset) == (0, 0)
    assert not [name for name in os.listdir(os.path.join(root.path, "t")) if name.startswith(".")]
    write(root, "t", [b"new"], partition=3)
    assert [m.value for m in read_all(root, "t", 3)] == [b"new"]


def test_alter_adds_partitions_of_a_kafka_07_topic_in_its_format(root):
    root.create_topic("old", kl.TopicConfig(format="0.7"))
    root.alter_topic("old", partitions=2)
    assert [f.name for f in segment_files(root, "old", 1)] == ["00000000000000000000.kafka"]
    write(root, "old", [b"0.7 message"], partition=1)
    assert [m.value for m in read_all(root, "old", 1)] == [b"0.7 message"]


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"partitions": 1}, kl.ConfigNotAlterable, "partitions can only grow: the topic has 2, not 1"),
        ({"max_message_bytes": 1000}, kl.ConfigNotAlterable, "max_message_bytes can only grow: the topic has 1048576, not 1000"),
        ({"format": "0.7"}, kl.ConfigNotAlterable, "format cannot change after a topic is created"),
        ({"topic_id": "A" * 22}, kl.ConfigNotAlterable, "topic_id cannot change after a topic is created"),
        ({"colour": 3}, kl.InvalidConfig, "unknown topic setting colour"),
        ({"retention_ms": -1}, kl.InvalidConfig, "retention_ms must be a whole number >= 0, not -1"),
        ({"partitions": 10_001}, kl.InvalidConfig, "partitions must be between 1 and 10000, not 10001"),
        ({"segment_bytes": 100}, kl.InvalidConfig, r"segment_bytes \(100\) must be at least max_message_bytes \(1048576\)"),
        ({"flush_ms": "soon"}, kl.InvalidConfig, "flush_ms must be a whole number >= 0, not 'soon'"),
        ({"partitions": 3, "format": "0.7"}, kl.ConfigNotAlterable, "format cannot change"),
    ],
)
def test_alter_refuses_what_cannot_change_and_writes_nothing(root, changes, error, message):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    before = tree(root.path)
    with pytest.raises(error, match=f"^{message}"):
        root.alter_topic("t", **changes)
    assert tree(root.path) == before


def test_alter_of_a_missing_topic_raises_topic_not_found(root):
    root.create_topic("t")
    with pytest.raises(kl.TopicNotFound, match="topic 'nope' does not exist"):
        root.alter_topic("nope", retention_ms=1)


def test_alter_finishes_what_an_interrupted_alter_left(root):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    topic = Path(root.path) / "t"
    os.mkdir(topic / ".adding-0123")  # killed while building partition 2
    root._create_partition(str(topic / "2"), ".kl")  # killed after renaming it in, before topic.json
    root.alter_topic("t", partitions=3)
    assert sorted(os.listdir(topic)) == ["0", "1", "2", CONFIG_FILE]
    write(root, "t", [b"x"], partition=2)
    assert [m.value for m in read_all(root, "t", 2)] == [b"x"]


def test_alter_refuses_to_remove_a_stray_partition_directory_holding_data(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    stray = Path(root.path) / "t" / "1"
    stray.mkdir()
    (stray / "00000000000000000000.kl").write_bytes(b"someone's data")
    before = tree(os.path.join(root.path, "t"))
    with pytest.raises(kl.StorageError, match="holds data: move it away"):
        root.alter_topic("t", partitions=2)
    assert tree(os.path.join(root.path, "t")) == before


# ----------------------------------------------------------------- handles opened before the alter


def test_a_smaller_segment_size_rolls_the_next_append_of_a_running_producer(root):
    root.create_topic("t", kl.TopicConfig(max_message_bytes=6000))
    producer = kl.Producer(root)
    producer.send("t", b"x" * 5000, partition=0)
    producer.send("t", b"x" * 5000, partition=0)
    assert len(segment_files(root, "t")) == 1
    kl.Root(root.path).alter_topic("t", segment_bytes=6000)  # through another handle
    producer.send("t", b"y" * 5000, partition=0)
    assert len(segment_files(root, "t")) == 2
    assert [len(m.value) for m in read_all(root, "t")] == [5000, 5000, 5000]


def test_a_larger_max_message_size_is_taken_up_by_running_producers_and_readers(root):
    root.create_topic("t", kl.TopicConfig(max_message_bytes=1000))
    write_each(root, "t", [b"small"])
    reader = kl.Consumer(kl.Root(root.path))
    assert [m.value for m in reader.fetch("t", 0, 0)] == [b"small"]  # its log holds the old maximum
    with pytest.raises(kl.MessageTooLarge):
        write_each(root, "t", [b"z" * 1500])
    kl.Root(root.path).alter_topic("t", max_message_bytes=2000)
    write_each(root, "t", [b"z" * 1500])  # this handle read the config under a second ago
    assert [m.value for m in reader.fetch("t", 0, 0)] == [b"small", b"z" * 1500]


def test_retention_of_a_running_process_uses_the_altered_settings(root):
    root.create_topic("t", kl.TopicConfig(segment_bytes=1000, max_message_bytes=1000))
    write_each(root, "t", [b"v" * 600] * 4)
    log = root.log("t", 0)
    assert retention.retain(log, delete_delay=0).deleted == []
    kl.Root(root.path).alter_topic("t", retention_bytes=1300)
    report = retention.retain(log, delete_delay=0)
    assert len(report.deleted) == 2
    assert log.log_start_offset > 0


def test_root_config_sees_added_partitions(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    assert root.config("t").partitions == 1
    kl.Root(root.path).alter_topic("t", partitions=3)
    write(root, "t", [b"to 2"], partition=2)  # a partition past the cached count is looked up afresh
    assert wait_for(lambda: root.config("t").partitions == 3, timeout=5, what="the config to be looked at again")


def test_an_altered_topic_is_not_taken_for_one_created_again(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    with kl.follow.Watch(0.01) as watch:
        watch.add(root.log("t", 0))
        kl.Root(root.path).alter_topic("t", partitions=2, retention_ms=5)
        watch.check()  # no TopicRecreated
        log = root.log("t", 0)
        assert not log._config_changed()
        write(root, "t", [b"a"])
        assert log.config.retention_ms == 5


# ----------------------------------------------------------------- processes at work across alters


def _appender(path: str, writer: str, stop: str) -> None:
    """Appends self-checking values to partition 0, one or a few at a time, until ``stop``
    exists; ``stop.WRITER`` says the first append is done."""
    producer = kl.Producer(path)
    seq = 0
    while not os.path.exists(stop):
        n = 1 + seq % 5
        producer.send_batch("t", [_value(int(writer), seq + i) for i in range(n)], partition=0)
        if not seq:
            Path(f"{stop}.{writer}").touch()
        seq += n


def _alterer(path: str, alters: str) -> None:
    """Alters topic t ``alters`` times: segment sizes of 1 MiB and of a few KiB in turn, a
    maximum message size one byte larger each time, a partition more every tenth time."""
    root = kl.Root(path)
    for i in range(int(alters)):
        root.alter_topic("t", segment_bytes=8192 * (1 + i % 3) if i % 2 else 1 << 20, max_message_bytes=4096 + i,
                         partitions=1 + i // 10)


def _value(writer: int, seq: int) -> bytes:
    padding = bytes([97 + seq % 26]) * (seq * 13 % 300)  # no newline: the follower prints one value a line
    return f"{writer} {seq} {zlib.crc32(padding)} ".encode() + padding


def _check(value: bytes) -> tuple[int, int]:
    writer, seq, crc, padding = value.split(b" ", 3)
    assert zlib.crc32(padding) == int(crc), f"torn value {value[:40]!r}"
    assert value == _value(int(writer), int(seq))
    return int(writer), int(seq)


def _python(root: kl.Root, call: str, *args: str) -> subprocess.Popen:
    """A process running ``call`` of this module on ``root`` and ``args``."""
    code = f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport test_topics_alter as t\n"
    code += f"t.{call}(*sys.argv[1:])\n"
    return subprocess.Popen([sys.executable, "-c", code, root.path, *args])


def test_producers_and_a_follower_keep_working_while_alter_runs_many_times(root, tmp_path):
    """Producer processes append while another process alters the segment size back and
    forth, raises the maximum message size and adds partitions: every value arrives once,
    whole, each writer's in order, and the small segment sizes made the log roll."""
    root.create_topic("t", kl.TopicConfig(partitions=1, segment_bytes=1 << 20, max_message_bytes=4096))
    stop = str(tmp_path / "stop")
    writers = [_python(root, "_appender", str(w), stop) for w in range(3)]
    follower = subprocess.Popen(KL + ["--root", root.path, "consume", "t", "--follow", "--partition", "0"],
                                stdout=subprocess.PIPE)
    try:
        wait_for(lambda: all(os.path.exists(f"{stop}.{w}") for w in range(3)), what="each writer's first append")
        alterer = _python(root, "_alterer", "60")
        assert alterer.wait(120) == 0
        Path(stop).touch()
        assert [p.wait(60) for p in writers] == [0, 0, 0]
        config = kl.Root(root.path).config("t")
        assert (config.max_message_bytes, config.partitions, config.segment_bytes) == (4096 + 59, 6, 8192 * 3)
        messages = read_all(root, "t", 0, max_bytes=1 << 20)
        seen = [_check(m.value) for m in messages]
        for w in range(3):
            mine = [s for x, s in seen if x == w]
            assert mine == list(range(len(mine))) and mine
        assert len(segment_files(root, "t")) > 1
        lines = []
        timer = threading.Timer(60, follower.kill)
        timer.start()
        while len(lines) < len(messages):
            lines.append(follower.stdout.readline().rstrip(b"\n"))
        timer.cancel()
        assert lines == [m.value for m in messages]
    finally:
        Path(stop).touch()
        for p in writers:
            if p.poll() is None:
                p.kill()
                p.wait()
        follower.send_signal(signal.SIGINT)
        follower.wait(10)


@contextlib.contextmanager
def following(*args: str) -> Iterator[subprocess.Popen]:
    """``kl ARGS`` (a ``consume --follow``) running, its stdout a pipe: killed if it is
    still there after 30 s, else interrupted at the end, which must end it by SIGINT."""
    follower = subprocess.Popen(KL + list(args), stdout=subprocess.PIPE)
    timer = threading.Timer(30, follower.kill)
    timer.start()
    try:
        yield follower
    finally:
        timer.cancel()
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == -signal.SIGINT


def alter(root: kl.Root, *args: str) -> None:
    assert subprocess.run(KL + ["--root", root.path, "topics", "alter", "t", *args]).returncode == 0


def test_a_follower_of_the_whole_topic_reads_partitions_added_while_it_runs(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    write(root, "t", [b"old"])
    with following("--root", root.path, "consume", "t", "--follow") as follower:
        assert follower.stdout.readline() == b"old\n"
        alter(root, "--partitions", "3")
        write(kl.Root(root.path), "t", [b"in 2"], partition=2)
        write(kl.Root(root.path), "t", [b"in 1"], partition=1)
        assert sorted([follower.stdout.readline(), follower.stdout.readline()]) == [b"in 1\n", b"in 2\n"]
        assert follower.poll() is None


def test_a_follower_of_several_topics_reads_the_partitions_added_to_one_of_them(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    root.create_topic("u", kl.TopicConfig(partitions=1))
    write(root, "u", [b"u0"])
    with following("--root", root.path, "consume", "t", "u", "--follow", "--format", "{topic}/{partition} {value}") as follower:
        assert follower.stdout.readline() == b"u/0 u0\n"
        alter(root, "--partitions", "2")
        write(kl.Root(root.path), "t", [b"t1"], partition=1)
        assert follower.stdout.readline() == b"t/1 t1\n"


def test_a_follower_through_a_daemon_reads_partitions_added_while_it_runs(root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    write(root, "t", [b"old"])
    daemon = Daemon(root, tmp_path / "serve.log")
    try:
        with following("consume", "--server", f"127.0.0.1:{daemon.address[1]}", "t", "--follow") as follower:
            assert follower.stdout.readline() == b"old\n"
            alter(root, "--partitions", "2")
            write(kl.Root(root.path), "t", [b"in 1"], partition=1)
            assert follower.stdout.readline() == b"in 1\n"
    finally:
        daemon.proc.terminate()
        daemon.proc.wait(30)


def test_a_delete_waits_for_an_alter_under_way(root):
    """An alter holds the config lock from its read to its write: a delete (and so a
    creation again) in between would get the old topic's id written into the new one."""
    root.create_topic("t")
    with kl.log.locks.locked(os.path.join(root.path, ".locks", "t", "config.lock"), 1):  # an alter, between read and write
        done = subprocess.run(KL + ["--root", root.path, "--lock-timeout", "0.3", "topics", "delete", "t"],
                              capture_output=True, text=True)
        assert done.returncode == 1 and "lock" in done.stderr, done.stderr
        assert root.topics() == ["t"]
    root.delete_topic("t")
    assert root.topics() == []


def test_a_group_takes_up_partitions_added_while_its_members_run(root, tmp_path):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    outs = [str(tmp_path / f"m{i}.out") for i in range(2)]
    members = [subprocess.Popen([sys.executable, MEMBER, root.path, "g", "t", out, "--poll", "0.05"]) for out in outs]

    def received() -> set[tuple[int, str]]:
        found = set()
        for out in outs:
            text = Path(out).read_text(encoding="utf-8") if os.path.exists(out) else ""
            for line in text[: text.rfind("\n") + 1].splitlines():
                if line.startswith("m "):
                    _, _, _, p, _, value = line.split(" ", 5)
                    found.add((int(p), value))
        return found

    try:
        producer = kl.Producer(kl.Root(root.path))
        for p in range(2):
            producer.send("t", f"before {p}".encode(), partition=p)
        wait_for(lambda: len(received()) == 2, what="the first messages")
        subprocess.run(KL + ["--root", root.path, "topics", "alter", "t", "--partitions", "4"], check=True)
        for p in range(4):
            producer.send("t", f"after {p}".encode(), partition=p)
        wanted = {(p, f"before {p}") for p in range(2)} | {(p, f"after {p}") for p in range(4)}
        wait_for(lambda: received() == wanted, what="the new partitions' messages")
    finally:
        for m in members:
            m.send_signal(signal.SIGTERM)
        assert [m.wait(30) for m in members] == [0, 0]


def test_a_group_starting_at_latest_reads_partitions_added_later_from_their_start(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    write(root, "t", [b"before the member"])
    with kl.GroupConsumer(kl.Root(root.path), "g", ["t"], start="latest", poll_interval=0.05, session_timeout=5) as member:
        wait_for(lambda: member.assignment() == {"t": [0]}, what="the member to own partition 0")
        subprocess.run(KL + ["--root", root.path, "topics", "alter", "t", "--partitions", "2"], check=True)
        write(kl.Root(root.path), "t", [b"in 1 at once"], partition=1)  # before the member saw the partition
        write(kl.Root(root.path), "t", [b"in 0"], partition=0)
        got = {(b.partition, m.value) for b in member.batches(follow=True, timeout=10, max_messages=2) for m in b.messages}
        assert got == {(1, b"in 1 at once"), (0, b"in 0")}
        assert member.assignment() == {"t": [0, 1]}


def test_a_load_plan_reads_partitions_added_to_a_loaded_topic_from_their_start_with_start_latest(root):
    from kl.spark import journal

    root.create_topic("ev", kl.TopicConfig(partitions=1))
    write(root, "ev", [b"before the first load"])
    first = journal.plan_run(root, ["ev"], {}, journal.Limits(start="latest"), journal.Settings())
    end = root.log("ev", 0).log_end_offset
    assert [tuple(r) for r in first.tasks] == [("ev", 0, end, end)]
    kl.Root(root.path).alter_topic("ev", partitions=3)
    write(root, "ev", [b"in 1"], partition=1)
    second = journal.plan_run(root, ["ev"], first.ends(), journal.Limits(start="latest"), journal.Settings(),
                              topic_ids=dict.fromkeys(first.ends(), root.topic_id("ev")))
    in_1 = root.log("ev", 1).log_end_offset
    assert [tuple(r) for r in second.tasks] == [("ev", 0, end, end), ("ev", 1, 0, in_1), ("ev", 2, 0, 0)]
    root.create_topic("new")
    write(root, "new", [b"old news"])
    third = journal.plan_run(root, ["new"], second.ends(), journal.Limits(start="latest"), journal.Settings())
    assert [(r.start, r.end) for r in third.tasks] == [(root.log("new", 0).log_end_offset,) * 2]  # a new topic: latest


def test_a_spark_stream_plans_partitions_added_in_its_next_micro_batch(root):
    pytest.importorskip("pyspark")
    from kl.spark import stream

    root.create_topic("t", kl.TopicConfig(partitions=1))
    write(root, "t", [b"first"])
    reader = stream.KlStreamReader(stream.stream_options({"root": root.path, "topics": "t"}))
    start = reader.initialOffset()
    kl.Root(root.path).alter_topic("t", partitions=2)
    write(kl.Root(root.path), "t", [b"in 1"], partition=1)
    end = reader.latestOffset(start, reader.getDefaultReadLimit()) if stream.ADMISSION_CONTROL else reader.latestOffset()
    assert end["t"]["id"] == start["t"]["id"]  # the same topic, not one created again
    planned = sorted((p.range.partition, p.range.start, p.range.end) for p in reader.partitions(start, end))
    assert planned == [(1, 0, root.log("t", 1).log_end_offset)]  # started at latest: partition 0 has nothing new


# ----------------------------------------------------------------- the command line


def test_cli_alter_changes_settings_quietly_when_piped(root):
    root.create_topic("t", kl.TopicConfig(partitions=1))
    result = kl_cli(root, "topics", "alter", "t", "--partitions", "2", "--retention-ms", "3600000",
                    "--segment-bytes", "2097152", "--max-message-bytes", "2000000", "--flush-messages", "5",
                    "--flush-ms", "0", "--retention-bytes", "99999999")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    config = kl.Root(root.path).config("t")
    assert (config.partitions, config.retention_ms, config.segment_bytes, config.max_message_bytes) == (2, 3600000, 2097152,
                                                                                                         2000000)
    assert (config.flush_messages, config.flush_ms, config.retention_bytes) == (5, 0, 99999999)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--partitions", "1"], "Error: partitions can only grow: the topic has 2, not 1"),
        (["--max-message-bytes", "64"], "Error: max_message_bytes can only grow: the topic has 1048576, not 64"),
        (["--segment-bytes", "0"], "Error: segment_bytes (0) must be at least max_message_bytes (1048576)"),
    ],
)
def test_cli_alter_refuses_with_one_line(root, args, error):
    root.create_topic("t", kl.TopicConfig(partitions=2))
    before = tree(root.path)
    result = kl_cli(root, "topics", "alter", "t", *args)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", error + "\n")
    assert tree(root.path) == before


def test_cli_alter_without_a_setting_is_a_usage_error(root):
    root.create_topic("t")
    result = kl_cli(root, "topics", "alter", "t")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: nothing to change: give at least one setting (see --help)"


def test_cli_alter_has_no_format_option(root):
    root.create_topic("t")
    result = kl_cli(root, "topics", "alter", "t", "--format", "0.7")
    assert result.exit_code == 2
    assert config_bytes(root, "t") == kl.Root(root.path).config("t").to_json()


def test_time_settings_take_durations_as_kl_retain_does(root):
    """--retention-ms and --flush-ms take 7d, 36h, 2s, PT1H30M or digits alone (ms), in
    create and alter alike; what is not a duration is refused naming the option."""
    result = kl_cli(root, "topics", "create", "t", "--retention-ms", "7d", "--flush-ms", "2s")
    assert result.exit_code == 0, result.output
    config = kl.Root(root.path).config("t")
    assert (config.retention_ms, config.flush_ms) == (7 * 86_400_000, 2000)
    for given, ms in (("36h", 36 * 3_600_000), ("PT1H30M", 5_400_000), ("86400000", 86_400_000)):
        assert kl_cli(root, "topics", "alter", "t", "--retention-ms", given).exit_code == 0
        assert kl.Root(root.path).config("t").retention_ms == ms
    refused = kl_cli(root, "topics", "alter", "t", "--retention-ms", "7x")
    assert refused.exit_code == 2
    assert "Invalid value for '--retention-ms': '7x' is not a duration" in refused.output
    assert kl.Root(root.path).config("t").retention_ms == 86_400_000


# ----------------------------------------------------------------- Kafka's names: --config, --if-not-exists


def test_create_and_alter_take_kafkas_config_names_with_durations_for_times(root):
    result = kl_cli(root, "topics", "create", "t", "--partitions", "2", "--config", "retention.ms=36h", "--config",
                    "flush.ms=500ms", "--config", "retention.bytes=-1", "--config", "flush.messages=9223372036854775807",
                    "--config", "max.message.bytes=2000000", "--config", "cleanup.policy=delete")  # fmt: skip
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    config = kl.Root(root.path).config("t")
    assert (config.partitions, config.retention_ms, config.flush_ms) == (2, 36 * 3_600_000, 500)
    assert (config.retention_bytes, config.flush_messages, config.max_message_bytes) == (0, 0, 2_000_000)
    result = kl_cli(root, "topics", "alter", "t", "--config", "retention.ms=-1", "--config", "segment.bytes=4000000",
                    "--flush-messages", "10")  # fmt: skip
    assert result.exit_code == 0, result.output
    config = kl.Root(root.path).config("t")
    assert (config.retention_ms, config.segment_bytes, config.flush_messages) == (0, 4_000_000, 10)


@pytest.mark.parametrize(
    ("args", "code", "error"),
    [
        (["--config", "cleanup.policy=compact"], 1,
         "Error: Invalid value compact for configuration cleanup.policy: kl does not compact; only delete is taken"),
        (["--config", "retention.ms=0"], 1,
         "Error: Invalid value 0 for configuration retention.ms: kl takes -1 (no limit) or more than 0"),
        (["--config", "min.insync.replicas=2"], 1,
         "Error: min.insync.replicas cannot be set: kl's topics always have min.insync.replicas=1"),
        (["--config", "segment.jitter.ms=5"], 1, "Error: Unknown topic config name: segment.jitter.ms (kl takes cleanup.policy, "
         "flush.messages, flush.ms, max.message.bytes, retention.bytes, retention.ms, segment.bytes)"),
        (["--config", "max.message.bytes=100"], 1, "Error: max_message_bytes can only grow: the topic has 1048576, not 100"),
        (["--config", "retention.ms=7x"], 2, "Error: Invalid value for '--config': '7x' is not a duration such as 2d, 12h, "
         "90m, 1h30m, 45s, 500ms or PT1H30M"),
        (["--config", "retention.ms"], 2, "Error: Invalid value for '--config': 'retention.ms' is not KEY=VALUE"),
        (["--config", "retention.ms=1", "--config", "retention.ms=2"], 2,
         "Error: Invalid value for '--config': retention.ms is given more than once"),
        (["--config", "retention.ms=1d", "--retention-ms", "2d"], 2,
         "Error: --retention-ms and --config retention.ms set the same setting: give one"),
    ],
)  # fmt: skip
def test_alter_refuses_a_kafka_config_kl_cannot_take_with_one_line(root, args, code, error):
    root.create_topic("t")
    before = tree(root.path)
    result = kl_cli(root, "topics", "alter", "t", *args)
    assert (result.exit_code, result.stdout, result.stderr.splitlines()[-1]) == (code, "", error)
    assert tree(root.path) == before


def test_create_if_not_exists_changes_nothing_of_a_topic_there(root):
    root.create_topic("t", kl.TopicConfig(partitions=3))
    before = tree(root.path)
    result = kl_cli(root, "topics", "create", "t", "--if-not-exists", "--partitions", "1", "--config", "retention.ms=1h")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    assert tree(root.path) == before
    again = kl_cli(root, "topics", "create", "t")
    assert (again.exit_code, again.stderr) == (1, f"Error: topic 't' already exists in {root.path}\n")
    made = kl_cli(root, "topics", "create", "u", "--if-not-exists", "--config", "retention.ms=1h")
    assert made.exit_code == 0 and kl.Root(root.path).config("u").retention_ms == 3_600_000
    refused = kl_cli(root, "topics", "create", "v", "--if-not-exists", "--config", "cleanup.policy=compact")
    assert refused.exit_code == 1 and "kl does not compact" in refused.stderr and "v" not in kl.Root(root.path).topics()


def test_alter_to_configs_kl_has_already_changes_nothing_and_succeeds(root):
    root.create_topic("t")
    before = config_bytes(root, "t")
    result = kl_cli(root, "topics", "alter", "t", "--config", "cleanup.policy=delete", "--config", "min.insync.replicas=1")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    assert config_bytes(root, "t") == before
    missing = kl_cli(root, "topics", "alter", "nope", "--config", "cleanup.policy=delete")
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
