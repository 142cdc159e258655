"""A short run of ``scripts/soak-integrity``: random config edits, topic re-creates,
out-of-order and extreme timestamps under ``kl retain``, group members killed -9 and
stopped, damaged offsets files, compressed and plain produces, `--from-time`, in real processes, checked
against its model (the rules are listed in the script).  The long run is the script's
default of 30 minutes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak-integrity"


def run_soak(*args: str) -> tuple[int, str, dict]:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    lines = [line for line in p.stdout.splitlines() if line.startswith("summary-json: ")]
    summary = json.loads(lines[-1].removeprefix("summary-json: ")) if lines else {}
    return p.returncode, p.stdout + p.stderr, summary


def test_short_soak_holds_every_rule(tmp_path):
    rc, out, summary = run_soak("--minutes", "0.2", "--seed", "7", "--no-spark", "--workdir", str(tmp_path))
    assert rc == 0, out
    actions, checked = summary["actions"], summary["checked"]
    assert summary["steps"] >= 16
    for action in ("produce zstd", "produce json", "produce extreme", "edit config", "touch config", "recreate topic",
                   "retain", "start member", "kill -9 member", "SIGSTOP member", "consume -c", "library member",
                   "damage offsets", "from-time"):
        assert actions.get(action, 0) >= 1, (action, summary)
    assert checked["delivered"] >= 100 and checked["duplicates"] >= 100, summary
    assert checked["clear-errors"] >= 16 and checked["damaged"] >= 1, summary


def test_the_soak_sees_a_lost_segment_and_an_undelivered_message(tmp_path):
    """The harness's own check: a segment removed behind kl's back, and the deliveries of
    a group forgotten, each break their rule."""
    slow = ("damage offsets", "kill -9 member", "SIGSTOP member", "checkpoint", "recreate topic")
    rc, out, summary = run_soak("--minutes", "0.1", "--seed", "3", "--no-spark", "--workdir", str(tmp_path),
                                "--inject", "lose-segment", "--inject", "forget-deliveries",
                                *(arg for action in slow for arg in ("--without", action)))
    assert rc == 1, out
    assert summary["violated"]["acked"] >= 1 and summary["violated"]["delivered"] >= 1, out
    assert "soak-integrity: VIOLATIONS" in out
