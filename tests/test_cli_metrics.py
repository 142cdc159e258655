"""``kl metrics``: rates and lag over time from the files, while a real producer writes;
plain lines and JSON lines when piped, a live table on a terminal, filters, and how it
ends (--count, SIGTERM, Ctrl-C, a missing root)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

import kl
from kl.registry import Registry

from conftest import run_on_a_terminal, write_each

KL = [sys.executable, "-m", "kl_cli"]
CONSUMED = 3


@pytest.fixture
def shop(root: kl.Root) -> kl.Root:
    """Topic t (2 partitions, 4 records in each); group g consumed and committed ``CONSUMED``
    of them (its member closed); topic quiet, untouched by anyone."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    root.create_topic("quiet")
    for p in range(2):
        write_each(root, "t", [b"r%d" % i for i in range(4)], partition=p)
    with kl.GroupConsumer(root, "g", ["t"], auto_commit=False, poll_interval=0.1) as member:
        taken = sum(len(b.messages) for b in member.batches(max_messages=CONSUMED))
        member.commit()
    assert taken == CONSUMED
    return root


@pytest.fixture
def producing(shop: kl.Root) -> Iterator[list[int]]:
    """A producer appending one record to t every few milliseconds until the test ends;
    the count appended so far."""
    done, sent = threading.Event(), [0]

    def run() -> None:
        producer = kl.Producer(shop)
        while not done.wait(0.005):
            producer.send("t", b"more")
            sent[0] += 1
        producer.close()

    thread = threading.Thread(target=run)
    thread.start()
    yield sent
    done.set()
    thread.join()


def metrics(root: kl.Root, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KL, "--root", root.path, "metrics", *args], capture_output=True, text=True, timeout=60)


def fields(line: str) -> dict[str, str]:
    return dict(field.split("=", 1) for field in line.split()[3:] if "=" in field)


def test_piped_it_prints_the_records_appended_between_two_snapshots_and_the_lag(shop, producing):
    result = metrics(shop, "--count", "2", "--interval", "0.2")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert [line.split()[1:3] for line in lines] == [["topic", "quiet"], ["topic", "t"], ["group", "g"]] * 2
    first, second = fields(lines[1]), fields(lines[4])
    assert (first["records"], first["records/s"], first["bytes"], first["bytes/s"]) == ("-", "-", "-", "-")
    appended = int(second["end"]) - int(first["end"])
    assert appended > 0 and second["records"] == f"+{appended}"
    seconds = (when(lines[4]) - when(lines[1])).total_seconds()
    assert float(second["records/s"]) == pytest.approx(appended / seconds, rel=0.02, abs=0.1)
    assert int(second["bytes"]) > 0 and int(second["size"]) == int(first["size"]) + int(second["bytes"])
    assert fields(lines[3])["bytes/s"] == "0.0" and fields(lines[3])["end"] == "0"
    for line, topic_line in ((lines[2], lines[1]), (lines[5], lines[4])):
        assert line.split()[3] == "t"
        group = fields(line)
        assert int(group["lag"]) == int(fields(topic_line)["end"]) - CONSUMED and group["members"] == "0"
    assert fields(lines[5])["change"] == f"+{appended}" and float(fields(lines[5])["lag/s"]) > 0
    assert fields(lines[2])["change"] == "-" and fields(lines[5])["lag_time"].endswith("s")


def when(line: str) -> datetime.datetime:
    return datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")


def test_json_lines_carry_the_same_figures(shop, producing):
    result = metrics(shop, "--count", "2", "--interval", "0.2", "--json", "--topic", "t")
    assert result.returncode == 0
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["kind"], r.get("topic")) for r in rows] == [("topic", "t"), ("group", "t")] * 2
    before, after = rows[0], rows[2]
    assert before["records_in"] is None and before["records_per_second"] is None
    assert after["records_in"] == after["records"] - before["records"] > 0
    assert after["seconds"] == (after["time_ms"] - before["time_ms"]) / 1000
    assert after["records_per_second"] == after["records_in"] / after["seconds"]
    assert after["bytes_in"] == after["log_end_offset"] - before["log_end_offset"]
    lag = rows[3]
    assert (lag["group"], lag["lag"], lag["lag_change"]) == ("g", after["records"] - CONSUMED, after["records_in"])
    assert lag["lag_bytes"] > 0 and lag["lag_ms"] >= 0


def test_the_filters_choose_the_topics_and_groups(shop):
    write_each(shop, "quiet", [b"q", b"q"])
    Registry(shop.path, "h").write_offset("quiet", 0, 0, "test", shop.topic_id("quiet"))
    everything = metrics(shop, "--count", "1").stdout.splitlines()
    assert [line.split()[1:4] for line in everything] == [
        ["topic", "quiet", "end=2"],
        ["topic", "t", "end=8"],
        ["group", "g", "t"],
        ["group", "h", "quiet"],
    ]
    chosen = metrics(shop, "--count", "1", "--topic", "quiet", "--group", "g", "--group", "h").stdout.splitlines()
    assert [line.split()[1:4] for line in chosen] == [["topic", "quiet", "end=2"], ["group", "h", "quiet"]]
    assert fields(chosen[1])["lag"] == "2"


def test_on_a_terminal_it_draws_a_table(shop):
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    code, seen = run_on_a_terminal([*KL, "--root", shop.path, "metrics", "--count", "2", "--interval", "0.1"], env)
    text = seen.decode()
    assert code == 0
    for word in ("records/s", "bytes/s", "lag trend", "lag time", "quiet"):
        assert word in text
    assert "= 0.0/s" in text  # the lag's trend once there is a snapshot before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_it_after_the_snapshot_at_hand(shop, sig):
    process = subprocess.Popen(
        [*KL, "--root", shop.path, "metrics", "--interval", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    first = [process.stdout.readline() for _ in range(3)]  # the first snapshot: 2 topics and a group
    assert [line.split()[1] for line in first] == ["topic", "topic", "group"]
    process.send_signal(sig)
    assert process.wait(30) == (0 if sig == signal.SIGTERM else -signal.SIGINT)
    assert (process.stdout.read(), process.stderr.read()) == ("", "")  # nothing after, no traceback


def test_bad_input(root, tmp_path):
    missing = metrics(kl.Root(tmp_path / "nowhere"), "--count", "1")
    assert (missing.returncode, missing.stderr) == (1, f"Error: root {tmp_path / 'nowhere'} does not exist (is it mounted?)\n")
    assert metrics(root, "--interval", "0").returncode == 2
    assert metrics(root, "--count", "0").returncode == 2
    bad = metrics(root, "--count", "1", "--topic", "../x")
    assert (bad.returncode, bad.stdout) == (1, "") and bad.stderr.startswith("Error: invalid topic name '../x'")
