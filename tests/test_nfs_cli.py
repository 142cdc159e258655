"""The issue's own NFS reproduction through the command line: two ``kl produce`` per host
on two hosts, 10,000 lines each, into one partition; every line comes back once."""

from __future__ import annotations

import sys
from collections import Counter

import nfslab
import pytest

pytestmark = pytest.mark.skipif(nfslab.unavailable() is not None, reason=str(nfslab.unavailable()))

ROOT = f"{nfslab.MOUNT}/cli"
LINES = 10_000


def kl(*args: str) -> str:
    return " ".join([sys.executable, "-m", "kl_cli", "--root", ROOT, *args])


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_two_kl_produce_on_each_of_two_hosts_lose_no_line(lab):
    assert lab.run("a", ["sh", "-c", kl("topics", "create", "lines")]).returncode == 0
    producers = [
        lab.spawn(host, ["sh", "-c", f"seq -f '{host}{n}-%06g' 1 {LINES} | {kl('produce', 'lines')}"])
        for host in "ab"
        for n in "01"
    ]
    for producer in producers:
        result = producer.wait(timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
    for host in "ab":
        consumed = lab.run(host, ["sh", "-c", kl("consume", "lines")], timeout=300)
        assert consumed.returncode == 0, consumed.stderr[-2000:]
        lines = consumed.stdout.splitlines()
        assert len(lines) == 4 * LINES and Counter(lines).most_common(1)[0][1] == 1, f"host {host}: {len(lines)} lines"
        assert {line.split("-")[0] for line in lines} == {"a0", "a1", "b0", "b1"}
        checked = lab.run(host, ["sh", "-c", kl("recover", "--deep", "--dry-run")])
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_keyed_kl_produce_on_two_hosts_into_four_partitions_keeps_every_key_in_order(lab):
    """Each round of a keyed produce takes all four partitions' locks at once
    (``append_all``), on both hosts at the same time: no line lost or doubled, no wait
    for each other past the locks, and each key's lines in the order sent."""
    assert lab.run("a", ["sh", "-c", kl("topics", "create", "keyed", "--partitions", "4")]).returncode == 0
    produce = kl("produce", "keyed", "-K", "' '")
    producers = [
        lab.spawn(host, ["sh", "-c", f"seq 1 {LINES} | awk '{{print $1 % 13 \" {host}-\" $1}}' | {produce}"]) for host in "ab"
    ]
    for producer in producers:
        result = producer.wait(timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
    consumed = lab.run("b", ["sh", "-c", kl("consume", "keyed", "--format", "'{key} {value}'")], timeout=300)
    assert consumed.returncode == 0, consumed.stderr[-2000:]
    lines = consumed.stdout.splitlines()
    assert len(lines) == 2 * LINES and len(set(lines)) == len(lines)
    for host in "ab":
        for key in range(13):
            mine = [int(line.split("-")[1]) for line in lines if line.startswith(f"{key} {host}-")]
            assert mine == sorted(mine) and len(mine) == len(range(key or 13, LINES + 1, 13)), (host, key)
    checked = lab.run("a", ["sh", "-c", kl("recover", "--deep", "--dry-run")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
