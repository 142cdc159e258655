"""The modes of what kl creates (kl(1), FILES): what the user's umask allows in a plain
root; in a shared root (the setgid bit on its directory) the group's read and write as
well, whatever the umask, with the other bits as the umask left them.  Every command
runs in a process of its own with the umask set; the two-user cases run kl as other
users (as root only)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

KL = [sys.executable, "-m", "kl_cli"]

TEAM, ALICE, BOB, OUTSIDER = 61000, 61001, 61002, 61003
GROUPS = {ALICE: [TEAM], BOB: [TEAM], OUTSIDER: [OUTSIDER]}
"""A group and three users that need no entry in /etc/passwd: Alice and Bob are in the team."""

AS_USER = """
import importlib, os, pkgutil, sys
import difflib, kl, kl_cli
from kl_cli import main
for package in (kl, kl_cli):  # while the interpreter's files are still readable
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.startswith("kl.spark") and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([gid])
os.setresgid(gid, gid, gid)
os.setresuid(uid, uid, uid)
sys.argv = ["kl", *sys.argv[3:]]
main()
"""
"""Run kl as another user: as root, the interpreter may sit where that user cannot read
(under /root), so kl is imported first and the user taken on after."""


def kl(
    root: Path, *args: str, umask: int, user: int | None = None, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``kl ARGS`` on ``root`` under ``umask``, as ``user`` if given."""
    argv = KL if user is None else [sys.executable, "-c", AS_USER, str(user), str(GROUPS[user][0])]
    env = {**os.environ, "KL_ROOT": str(root), "HOME": str(root.parent)}
    return subprocess.run([*argv, *args], env=env, umask=umask, input=input, capture_output=True, timeout=120, check=False)


def ok(root: Path, *args: str, umask: int, user: int | None = None, input: bytes | None = None) -> bytes:
    result = kl(root, *args, umask=umask, user=user, input=input)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def lines(n: int, start: int = 0) -> bytes:
    return b"".join(b"line %d\n" % i for i in range(start, start + n))


def every_kind(root: Path, umask: int) -> None:
    """Make each kind of file kl makes: topic, partitions (at creation and added later),
    segments rolled, their time summaries, imported copies, state, locks, a group's
    members and offsets."""
    ok(root, "topics", "create", "t", "--partitions", "2", "--segment-bytes", "2000", "--max-message-bytes", "1000", umask=umask)
    ok(root, "produce", "t", umask=umask, input=lines(300))
    ok(root, "topics", "alter", "t", "--partitions", "3", umask=umask)
    ok(root, "produce", "t", "-k", "x", umask=umask, input=lines(100))
    ok(root, "topics", "import", "copy", str(root / "t" / "1"), umask=umask)
    assert ok(root, "consume", "t", "--group", "g", umask=umask).count(b"\n") == 400
    ok(root, "recover", "--deep", umask=umask)
    ok(root, "retain", "--max-bytes", "4000", umask=umask)


def modes(root: Path) -> dict[str, set[str]]:
    """{"file 0600": {paths...}, "dir 0700": {...}} of what is under ``root``."""
    found: dict[str, set[str]] = {}
    for directory, dirs, files in os.walk(root):
        for name, kind in [*((d, "dir") for d in dirs), *((f, "file") for f in files)]:
            path = os.path.join(directory, name)
            found.setdefault(f"{kind} {stat.S_IMODE(os.lstat(path).st_mode):04o}", set()).add(os.path.relpath(path, root))
    return found


@pytest.mark.parametrize(
    ("umask", "file", "directory"), [("077", "0600", "0700"), ("022", "0644", "0755"), ("002", "0664", "0775")]
)
def test_a_plain_root_gets_what_the_umask_allows(tmp_path, umask, file, directory):
    root, umask = tmp_path / "root", int(umask, 8)
    every_kind(root, umask)  # kl makes the root too
    assert f"{stat.S_IMODE(root.stat().st_mode):04o}" == directory
    found = modes(root)
    assert set(found) == {f"file {file}", f"dir {directory}"}, found
    names = found[f"file {file}"]
    assert any(p.startswith("copy/0/0") for p in names), names
    assert {"t/topic.json", "t/2/state", ".locks/t/0.lock", ".groups/g/commits/t", ".groups/g/claims/t"} <= names
    assert {".kl", ".kl.time", ".kl.deleted"} <= {p[p.index(".kl") :] for p in names if ".kl" in p}, names


@pytest.mark.parametrize(
    ("umask", "file", "directory"), [("077", "0660", "2770"), ("022", "0664", "2775"), ("002", "0664", "2775")]
)
def test_a_shared_root_keeps_what_kl_makes_group_writable(tmp_path, umask, file, directory):
    root, umask = tmp_path / "root", int(umask, 8)
    root.mkdir()
    os.chmod(root, 0o2775)  # chmod g+s: the root says it is shared
    every_kind(root, umask)
    found = modes(root)
    assert set(found) == {f"file {file}", f"dir {directory}"}, found


def test_a_root_made_inside_a_shared_directory_is_shared(tmp_path):
    os.chmod(tmp_path, 0o2755)
    ok(tmp_path / "root", "topics", "create", "t", umask=0o022)
    assert set(modes(tmp_path)) == {"file 0664", "dir 2775"}


# ----------------------------------------------------------------- two users


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user can reach (pytest's own are its user's alone)."""
    if os.geteuid() != 0:
        pytest.skip(f"running kl as other users needs root (euid {os.geteuid()})")
    path = Path(tempfile.mkdtemp(prefix="kl-modes-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_a_team_root_two_users_share_whatever_their_umasks(place):
    root = place / "team"
    root.mkdir()
    os.chown(root, 0, TEAM)
    os.chmod(root, 0o2775)
    ok(root, "topics", "create", "t", "--partitions", "2", umask=0o022, user=ALICE)
    ok(root, "produce", "t", umask=0o022, user=ALICE, input=lines(100))
    ok(root, "produce", "t", umask=0o077, user=BOB, input=lines(100, 100))  # the same partitions and locks
    assert ok(root, "consume", "t", "--group", "g", umask=0o077, user=BOB).count(b"\n") == 200
    ok(root, "produce", "t", umask=0o022, user=ALICE, input=lines(10, 200))
    assert ok(root, "consume", "t", "--group", "g", umask=0o022, user=ALICE).count(b"\n") == 10  # Bob's commit
    assert ok(root, "consume", "t", "-c", "1", umask=0o022, user=OUTSIDER)  # Alice's umask lets others read (either partition)
    ok(root, "topics", "alter", "t", "--partitions", "3", umask=0o077, user=BOB)
    ok(root, "produce", "t", "-k", "k", umask=0o022, user=ALICE, input=lines(10, 210))
    ok(root, "recover", "--deep", umask=0o022, user=ALICE)
    ok(root, "retain", "--max-age", "0", umask=0o077, user=BOB)
    ok(root, "topics", "create", "secret", umask=0o077, user=BOB)
    ok(root, "produce", "secret", umask=0o077, user=BOB, input=b"for the team\n")
    assert ok(root, "consume", "secret", umask=0o022, user=ALICE) == b"for the team\n"
    refused = kl(root, "consume", "secret", umask=0o022, user=OUTSIDER)  # Bob's does not
    assert refused.returncode != 0 and refused.stderr.decode().startswith("Error: "), refused.stderr.decode()
    assert refused.stderr.decode().count("\n") == 1 and "ermission denied" in refused.stderr.decode()
    assert {os.stat(p).st_gid for p in root.rglob("*")} == {TEAM}
    ok(root, "topics", "delete", "secret", umask=0o022, user=ALICE)
    ok(root, "topics", "delete", "t", umask=0o077, user=BOB)
    assert ok(root, "topics", "list", umask=0o022, user=ALICE) == b""


def test_a_plain_root_under_umask_077_is_its_users_alone(place):
    os.mkdir(place / "alice")
    os.chown(place / "alice", ALICE, TEAM)
    root = place / "alice" / "root"
    ok(root, "topics", "create", "secret", umask=0o077, user=ALICE)
    ok(root, "produce", "secret", umask=0o077, user=ALICE, input=b"mine\n")
    for user in (BOB, OUTSIDER):  # in Alice's group, or not
        refused = kl(root, "consume", "secret", umask=0o022, user=user)
        assert refused.returncode != 0 and refused.stderr.decode().count("\n") == 1, refused.stderr.decode()
        assert refused.stderr.decode().startswith("Error: ") and "ermission denied" in refused.stderr.decode()
    assert ok(root, "consume", "secret", umask=0o022, user=ALICE) == b"mine\n"
