"""The installed ``kl`` on real file descriptors: stdout closed, full, read-only or a closed
pipe, and stderr a terminal (``kl dump``'s progress bar) or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import kl

from conftest import run_on_a_terminal

KL = str(Path(sys.executable).parent / "kl")
"""The ``kl`` command installed beside this Python, as a user runs it."""


@pytest.fixture
def kl_root(tmp_path: Path) -> str:
    """A root whose topic ``t`` holds 100,000 short lines in one partition."""
    assert os.access(KL, os.X_OK), f"kl is not installed beside {sys.executable}"
    path = str(tmp_path / "root")
    root = kl.Root(path)
    root.create_topic("t")
    with kl.Producer(root) as producer:
        producer.send_batch("t", [b"line %d" % i for i in range(100_000)], partition=0)
    return path


def shell(root: str, command: str) -> subprocess.CompletedProcess:
    """``command`` run by bash, where ``$KL`` is the installed kl."""
    env = {**os.environ, "KL_ROOT": root, "KL": KL}
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=60)


@pytest.mark.parametrize("command", ["consume t", "dump t"])
def test_stdout_closed_is_named(kl_root, command):
    done = shell(kl_root, f"$KL {command} >&-")
    assert (done.returncode, done.stderr, done.stdout) == (1, b"Error: stdout is closed\n", b"")


@pytest.mark.parametrize("command", ["consume t", "dump t"])
def test_a_full_disk_is_named_as_stdout_being_full(kl_root, command):
    done = shell(kl_root, f"$KL {command} > /dev/full")
    assert (done.returncode, done.stderr) == (1, b"Error: cannot write to stdout: no space left on device\n")


@pytest.mark.parametrize("command", ["consume t", "dump t"])
def test_a_read_only_stdout_is_named(kl_root, command):
    done = shell(kl_root, f"$KL {command} 1< /dev/null")
    assert (done.returncode, done.stderr) == (1, b"Error: cannot write to stdout: bad file descriptor\n")


@pytest.mark.parametrize("command, first", [("consume t", b"line 0"), ("dump t", b"Dumping ")])
def test_a_closed_pipe_ends_the_command_quietly_by_sigpipe(kl_root, command, first):
    done = shell(kl_root, f"$KL {command} | head -n 1; echo ${{PIPESTATUS[0]}} >&2")
    assert done.stdout.startswith(first) and done.stdout.count(b"\n") == 1
    assert done.stderr == b"%d\n" % (128 + signal.SIGPIPE)


def test_consume_writes_everything_to_a_file(kl_root, tmp_path):
    done = shell(kl_root, f"$KL consume t -c 3 > {tmp_path / 'out'}")
    assert (done.returncode, done.stderr) == (0, b"")
    assert (tmp_path / "out").read_bytes() == b"line 0\nline 1\nline 2\n"


def on_a_terminal(root: str, *args: str) -> tuple[int, bytes]:
    """Run ``kl ARGS`` with stderr on a pseudo-terminal and stdout to /dev/null; its exit
    status and what the terminal got."""
    return run_on_a_terminal([KL, *args], {**os.environ, "KL_ROOT": root, "TERM": "xterm", "COLUMNS": "100"}, "stderr")


def test_dump_shows_a_progress_bar_when_stderr_is_a_terminal(kl_root):
    total = os.path.getsize(kl.Root(kl_root).log("t", 0).segments()[0].path)
    code, seen = on_a_terminal(kl_root, "dump", "t")
    assert code == 0
    assert b"dumping" in seen and "━".encode() in seen
    assert f"{total / 1e6:.1f}/{total / 1e6:.1f} MB".encode() in seen  # the last refresh: every byte done
    assert b"offset:" not in seen  # the listing itself went to stdout


def test_dump_prints_nothing_on_stderr_and_imports_no_rich_when_piped(kl_root):
    program = """
import sys
from kl_cli.main import main
sys.argv = ["kl", "dump", "t"]
try:
    main()
except SystemExit as e:
    assert "rich" not in sys.modules, "rich imported"
    sys.exit(e.code)
"""
    done = subprocess.run([sys.executable, "-c", program], env={**os.environ, "KL_ROOT": kl_root}, capture_output=True)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.count(b"\n") == 1 + 100_000
