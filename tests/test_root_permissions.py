"""The file system is the other door (kl(1), Access): a root made under umask 077 by its
owner cannot be opened by another Unix user, and ``kl serve``, run as the owner, is the
only way in.  Needs root, to run commands as another user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafka_clients import Daemon

if os.geteuid() != 0:
    pytest.skip("running a command as another Unix user needs root", allow_module_level=True)
try:
    OTHER = pwd.getpwnam("nobody")
except KeyError:
    pytest.skip("there is no user nobody to be the other user", allow_module_level=True)

KL = [sys.executable, "-m", "kl_cli"]
"""kl, run as the owner (root)."""


@pytest.fixture
def private_root() -> Iterator[Path]:
    """A root made under umask 077, in a directory every user may pass through."""
    top = Path(tempfile.mkdtemp(prefix="kl-private-"))
    top.chmod(0o755)
    root = top / "root"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for command in (["topics", "create", "secrets"], ["produce", "secrets"]):
        done = subprocess.run(["sh", "-c", 'umask 077; exec "$@"', "sh", *KL, "--root", str(root), *command],
                              input=b"the owner's\n", capture_output=True, env=env, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
    yield root
    shutil.rmtree(top)


def as_other(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), user=OTHER.pw_uid, group=OTHER.pw_gid, extra_groups=[], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip


def test_a_root_made_under_umask_077_opens_to_its_owner_alone(private_root):
    """(As the other user: ls and cat, what any program of theirs could do; kl itself lives
    in a virtualenv under /root here, which that user cannot run.)"""
    modes = {p: p.stat().st_mode & 0o777 for p in private_root.rglob("*")}
    assert modes and all(mode & 0o077 == 0 for mode in modes.values()), modes
    assert private_root.stat().st_mode & 0o777 == 0o700
    segment = next(p for p in private_root.rglob("*.kl"))
    listed = as_other("ls", str(private_root))
    assert listed.returncode != 0 and "ermission denied" in listed.stderr and "secrets" not in listed.stdout
    read = as_other("cat", str(segment))
    assert read.returncode != 0 and "ermission denied" in read.stderr and "the owner's" not in read.stdout


def test_the_owners_daemon_is_the_way_in(private_root, tmp_path):
    import confluent_kafka as ck

    daemon = Daemon(private_root, tmp_path / "serve.log")
    try:
        consumer = ck.Consumer({"bootstrap.servers": daemon.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"})
        consumer.assign([ck.TopicPartition("secrets", 0, ck.OFFSET_BEGINNING)])
        got = None
        for _ in range(100):
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                got = m.value()
                break
        consumer.close()
        assert got == b"the owner's"
    finally:
        assert daemon.stop() == 0
