"""Listings as JSON (``topics list|describe``, ``groups list|describe`` with ``--json``:
JSON lines, one object per topic or group), and ``kl topics list|describe --server``
through a real ``kl serve`` on 127.0.0.1 (kcat -L), which shows only what it serves."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_serve import KL, Daemon, Running, _no_daemon_outlives_its_test  # noqa: F401 - a fixture

import kl
from kl.net import kafka07, wire
from kl.net.remote import RemoteRoot
from kl_cli.main import cli

from conftest import write


def run(root: kl.Root, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--root", root.path, *args], env={"KL_ROOT": None}, catch_exceptions=False)


def lines(result: Result) -> list[dict]:
    """The JSON lines of a successful run's stdout."""
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    assert result.stdout == "" or result.stdout.endswith("\n")
    return [json.loads(line) for line in result.stdout.splitlines()]


def kl_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KL, *args], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def two(root: kl.Root) -> kl.Root:
    """Topic ``a`` (two partitions, three messages in 0) and ``b`` (one, empty)."""
    root.create_topic("a", kl.TopicConfig(partitions=2))
    root.create_topic("b")
    write(root, "a", [b"x", b"yy", b"zzz"])
    return root


# ----------------------------------------------------------------- --json


def test_topics_list_json_is_one_describe_object_per_line(two):
    listed = lines(run(two, "topics", "list", "--json"))
    assert [obj["topic"] for obj in listed] == ["a", "b"]
    assert listed == [lines(run(two, "topics", "describe", name, "--json"))[0] for name in ("a", "b")]
    a = listed[0]
    assert a["config"]["partitions"] == 2 and [p["partition"] for p in a["partitions"]] == [0, 1]
    assert a["partitions"][0]["log_end_offset"] == a["partitions"][0]["size_in_bytes"] > 0


def test_topics_describe_json_is_one_line(two):
    result = run(two, "topics", "describe", "a", "--json")
    assert result.stdout.count("\n") == 1 and json.loads(result.stdout)["topic"] == "a"


def test_topics_list_json_of_no_topics_prints_nothing(root):
    os.makedirs(root.path)
    assert lines(run(root, "topics", "list", "--json")) == []


def test_topics_list_json_names_a_topic_it_cannot_describe(two):
    Path(two.topic_path("b"), "topic.json").write_text("{not json")
    two.forget("b")
    listed = lines(run(two, "topics", "list", "--json"))
    assert listed[0]["topic"] == "a" and listed[1]["topic"] == "b" and "topic.json" in listed[1]["error"]


def test_topics_list_json_leaves_out_a_topic_deleted_while_listed(two, monkeypatch):
    topics = two.topics()
    monkeypatch.setattr(kl.Root, "topics", lambda self: topics)
    two.delete_topic("b")
    assert [obj["topic"] for obj in lines(run(two, "topics", "list", "--json"))] == ["a"]


def test_groups_list_json_is_one_describe_object_per_line(two):
    kl.groups.import_offsets(two, "g1", "a 0 0\n")
    kl.groups.import_offsets(two, "g2", "b 0 0\n")
    listed = lines(run(two, "groups", "list", "--json"))
    assert [obj["group"] for obj in listed] == ["g1", "g2"]
    described = run(two, "groups", "describe", "g1", "--json")
    assert described.stdout.count("\n") == 1 and json.loads(described.stdout).keys() == listed[0].keys()
    assert [(p["topic"], p["partition"], p["committed"]) for p in listed[0]["partitions"]] == [("a", 0, 0), ("a", 1, None)]


def test_errors_stay_one_line_on_stderr(root):
    os.makedirs(root.path)
    result = run(root, "topics", "describe", "nope", "--json")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == f"Error: topic 'nope' does not exist in {root.path}\n"


# ----------------------------------------------------------------- --server


@pytest.fixture
def daemon(two, tmp_path) -> str:
    """A ``kl serve`` of ``two``'s topic ``a`` only (``--topics 'a'``): its HOST:PORT."""
    started = Daemon(two, tmp_path / "log", "--topics", "a")
    return f"127.0.0.1:{started.address[1]}"


def test_topics_list_and_describe_through_a_daemon_show_only_what_it_serves(two, daemon):
    listed = kl_subprocess("topics", "list", "--server", daemon)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "a\n", "")
    as_json = kl_subprocess("topics", "list", "--server", daemon, "--json")
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == lines(run(two, "topics", "describe", "a", "--json"))
    described = kl_subprocess("topics", "describe", "--server", daemon, "a")
    assert described.stdout == run(two, "topics", "describe", "a").stdout
    hidden = kl_subprocess("topics", "describe", "--server", daemon, "b")
    assert (hidden.returncode, hidden.stdout) == (1, "")
    assert hidden.stderr == "Error: topic b is not served here (kl serve --topics)\n"


def test_a_listing_through_a_daemon_sees_new_messages(two, daemon):
    write(two, "a", [b"more"], partition=1)
    [obj] = [json.loads(line) for line in kl_subprocess("topics", "list", "--server", daemon, "--json").stdout.splitlines()]
    assert obj["partitions"][1]["log_end_offset"] == obj["partitions"][1]["size_in_bytes"] > 0


def test_a_listing_through_no_daemon_is_one_error_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    result = kl_subprocess("topics", "list", "--server", f"127.0.0.1:{port}")
    assert result.returncode == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    assert result.stderr.startswith("Error: ")


def test_remote_root_describes_as_root_does(two, daemon):
    remote = RemoteRoot(daemon)
    try:
        assert remote.describe("a") == two.describe("a")
        with pytest.raises(kl.KlError, match="not served here"):
            remote.describe("b")
    finally:
        remote.close()


def test_a_daemon_of_an_earlier_kl_is_named_as_the_likely_cause(two, monkeypatch):
    """A server without DESCRIBE closes the connection on it."""
    monkeypatch.delitem(kafka07.HANDLERS, wire.DESCRIBE)
    running = Running(two)
    remote = RemoteRoot(f"127.0.0.1:{running.address[1]}")
    try:
        assert remote.topics() == ["a", "b"]
        with pytest.raises(wire.ProtocolError, match=r"closed the connection \(a kl serve of an earlier kl does so on DESCRIBE"):
            remote.describe("a")
    finally:
        remote.close()
        running.stop()
