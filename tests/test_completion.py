"""Shell completion of values (``cli/complete.py``), asked as bash asks: ``kl`` run with
``_KL_COMPLETE=bash_complete`` and the words in ``COMP_WORDS``/``COMP_CWORD``, and once
through bash itself with the script ``_KL_COMPLETE=bash_source kl`` prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_serve import Running

import kl
from kl import groups

KL = [sys.executable, "-m", "kl_cli"]


def complete(line: str, *, root: str | None = None) -> list[str]:
    """What bash is offered for the last word of ``line`` (a trailing space: a new word)."""
    words = line.split()
    if line.endswith(" "):
        words.append("")
    env = {k: v for k, v in os.environ.items() if k != "KL_ROOT"}
    env.update(COMP_WORDS=" ".join(words), COMP_CWORD=str(len(words) - 1), _KL_COMPLETE="bash_complete")
    if root is not None:
        env["KL_ROOT"] = root
    result = subprocess.run(KL, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    found = [line.split(",", 1) for line in result.stdout.splitlines() if line]  # nothing: one empty line
    assert all(kind == "plain" for kind, _ in found)
    return [value for _, value in found]


@pytest.fixture
def filled(root: kl.Root) -> kl.Root:
    """Topics ``events`` (3 partitions) and ``errors`` (1), groups ``loader`` and ``audit``."""
    root.create_topic("events", kl.TopicConfig(partitions=3))
    root.create_topic("errors")
    groups.import_offsets(root, "loader", "events 0 0\n")
    groups.import_offsets(root, "audit", "errors 0 0\n")
    return root


def test_topic_names_from_kl_root(filled):
    assert complete("kl consume ", root=filled.path) == ["errors", "events"]
    assert complete("kl consume ev", root=filled.path) == ["events"]
    assert complete("kl consume events e", root=filled.path) == ["errors", "events"]
    assert complete("kl produce er", root=filled.path) == ["errors"]
    assert complete("kl topics describe ", root=filled.path) == ["errors", "events"]


def test_topic_names_from_the_root_on_the_command_line(filled, tmp_path):
    assert complete(f"kl --root {filled.path} topics delete ") == ["errors", "events"]
    assert complete(f"kl --root {filled.path} topics delete ", root=str(tmp_path / "other")) == ["errors", "events"]
    assert complete(f"kl topics describe --root {filled.path} ") == ["errors", "events"]  # after the command too
    assert complete(f"kl consume --root {filled.path} events -p ") == ["0", "1", "2"]


def test_group_names(filled):
    assert complete("kl groups describe ", root=filled.path) == ["audit", "loader"]
    assert complete("kl groups reset l", root=filled.path) == ["loader"]
    assert complete("kl consume events --group ", root=filled.path) == ["audit", "loader"]


def test_partitions_of_the_named_topic(filled):
    assert complete("kl consume events -p ", root=filled.path) == ["0", "1", "2"]
    assert complete("kl consume events --partition 0 -p ", root=filled.path) == ["0", "1", "2"]
    assert complete("kl consume errors -p ", root=filled.path) == ["0"]
    assert complete("kl produce events -p 2", root=filled.path) == ["2"]
    assert complete("kl groups reset loader --topic events -p ", root=filled.path) == ["0", "1", "2"]


def test_no_partitions_without_one_known_topic(filled):
    assert complete("kl consume events errors -p ", root=filled.path) == []
    assert complete("kl consume nope -p ", root=filled.path) == []
    assert complete("kl groups reset loader -p ", root=filled.path) == []


def test_topics_and_partitions_of_the_server_named(filled, tmp_path):
    """With --server, what that kl serve serves: its --topics only, whatever the root."""
    running = Running(filled, topics=re.compile("ev.*"))
    server = f"127.0.0.1:{running.address[1]}"
    try:
        assert complete(f"kl consume --server {server} ", root=str(tmp_path / "missing")) == ["events"]
        assert complete(f"kl consume --server {server} events -p ") == ["0", "1", "2"]
        assert complete(f"kl topics describe --server {server} ") == ["events"]
    finally:
        running.stop()
    assert complete(f"kl consume --server {server} ", root=filled.path) == []  # gone: nothing, at once


def test_offset_keywords(filled):
    assert complete("kl consume events -o ", root=filled.path) == ["earliest", "latest", "beginning", "end"]
    assert complete("kl consume events --from-offset l", root=filled.path) == ["latest"]
    assert complete("kl groups reset loader --to ", root=filled.path) == ["earliest", "latest"]


def test_nothing_and_no_error_without_a_root(tmp_path):
    assert complete("kl consume ") == []
    assert complete("kl groups describe ", root=str(tmp_path / "missing")) == []
    assert complete("kl consume events -p ", root=str(tmp_path / "missing")) == []


def test_bash_completes_through_the_sourced_script(filled, tmp_path):
    """bash's own ``complete -F``: the function the script defines fills COMPREPLY."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kl"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m kl_cli "$@"\n')
    wrapper.chmod(0o755)
    script = """
        eval "$(_KL_COMPLETE=bash_source kl)"
        COMP_WORDS=(kl consume events -p ''); COMP_CWORD=4
        COMPREPLY=(); _kl_completion kl
        echo "${COMPREPLY[*]}"
        COMP_WORDS=(kl --root "$ROOT" consume e); COMP_CWORD=4
        COMPREPLY=(); _kl_completion kl
        echo "${COMPREPLY[*]}"
    """
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KL_ROOT": filled.path, "ROOT": filled.path}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "0 1 2\nerrors events\n")


def test_the_scripts_for_zsh_and_fish_are_printed():
    for shell, marker in [("zsh", "compdef _kl_completion kl"), ("fish", "complete --no-files --command kl")]:
        env = {**os.environ, "_KL_COMPLETE": f"{shell}_source"}
        result = subprocess.run(KL, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and marker in result.stdout, result.stdout
