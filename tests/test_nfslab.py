"""The NFS lab (tests/nfslab.py): two client hosts of one real NFS server share files and locks."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nfslab
import pytest

REASON = nfslab.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
REASON_V3 = nfslab.unavailable("3")

LOCK = """
import fcntl, os, signal, struct, sys
# sys.argv[1]: the file; [2]: "posix" (a process's lock) or "ofd" (an open file
# description's); [3], if given: hold the lock until SIGTERM.
hold = len(sys.argv) > 3
if hold:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
def lock(kind):
    if sys.argv[2] == "ofd":
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", kind, 0, 0, 0, 0))
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB if kind == fcntl.F_WRLCK else fcntl.LOCK_UN)
try:
    lock(fcntl.F_WRLCK)
except OSError as exc:
    print("blocked", exc.errno)
    sys.exit(1)
print("locked", flush=True)
if hold:
    signal.sigwait({signal.SIGTERM})
    lock(fcntl.F_UNLCK)
    print("released")
"""

# Holds a lock on cut-off until SIGTERM, then writes, unlocks and closes: prints each step's
# outcome.
LATE_WRITER = """
import errno, fcntl, os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
fd = os.open("cut-off", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
signal.sigwait({signal.SIGTERM})
for step, call in (("write", lambda: os.write(fd, b"from a\\n")), ("unlock", lambda: fcntl.lockf(fd, fcntl.LOCK_UN)),
                   ("close", lambda: os.close(fd))):
    try:
        call()
        print(step, "ok")
    except OSError as exc:
        print(step, errno.errorcode[exc.errno])
"""

# Takes the lock on cut-off (waiting for it) and writes.
TAKER = """
import fcntl, os
fd = os.open("cut-off", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
os.write(fd, b"from b\\n")
os.close(fd)
"""


# Appends sys.argv[2] numbered lines to sys.argv[1], each under an exclusive lock.
APPENDER = """
import fcntl, os, socket, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
for number in range(int(sys.argv[2])):
    fcntl.lockf(fd, fcntl.LOCK_EX)
    os.lseek(fd, 0, os.SEEK_END)
    os.write(fd, f"{socket.gethostname()} {number}\\n".encode())
    fcntl.lockf(fd, fcntl.LOCK_UN)
os.close(fd)
"""


@pytest.fixture(scope="module", params=nfslab.VERSIONS)
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[nfslab.Lab]:
    """One lab per NFS version, shared by the module's tests of that version."""
    if request.param == "3" and REASON_V3 is not None:
        pytest.skip(REASON_V3)
    with nfslab.Lab(tmp_path_factory.mktemp("nfslab"), version=request.param) as lab:
        yield lab


def test_hosts_are_distinct_nfs_clients(lab: nfslab.Lab) -> None:
    names = [lab.run(host, ["hostname"]).stdout.strip() for host in ("a", "b")]
    assert names == ["hostA", "hostB"]
    mounts = lab.run("a", ["grep", f" {nfslab.MOUNT} ", "/proc/self/mountinfo"]).stdout
    if lab.version == "3":
        assert f" nfs 10.99.1.1:{nfslab.EXPORT} " in mounts and "vers=3" in mounts and "local_lock=none" in mounts
        # The server's statd watches each host that took a lock (the lab's first, at boot).
        watched = lab.run("server", ["ls", "/var/lib/nfs/sm"]).stdout.split()
        assert watched == ["10.99.1.2", "10.99.2.2"]
        return
    assert " nfs4 10.99.1.1:/ " in mounts and "vers=4.2" in mounts and "local_lock=none" in mounts
    clients = lab.run("server", ["sh", "-c", "cat /proc/fs/nfsd/clients/*/info"]).stdout
    assert '"Linux NFSv4.2 nfslab-hostA/hostA"' in clients
    assert '"Linux NFSv4.2 nfslab-hostB/hostB"' in clients


def test_the_guest_has_no_network_but_its_own(lab: nfslab.Lab) -> None:
    def links(host: str) -> list[str]:
        listing = lab.run(host, ["ip", "-o", "link", "show"]).stdout
        return sorted(line.split(": ")[1].split("@")[0] for line in listing.splitlines())

    assert links("server") == ["lo", "vethhostA", "vethhostB"]
    assert links("a") == links("b") == ["eth0", "lo"]


def test_a_file_written_on_one_host_is_read_on_the_other(lab: nfslab.Lab) -> None:
    written = lab.python("a", "open('greeting', 'w').write('hello from a')")
    assert written.returncode == 0, written
    assert lab.python("b", "print(open('greeting').read())").stdout == "hello from a\n"
    assert lab.run("server", ["cat", f"{nfslab.EXPORT}/greeting"]).stdout == "hello from a"


@pytest.mark.parametrize("kind", ["posix", "ofd"])
def test_an_fcntl_lock_on_one_host_excludes_the_other(lab: nfslab.Lab, kind: str) -> None:
    holder = lab.spawn_python("a", LOCK, f"lock-{kind}", kind, "hold")
    holder.wait_for_output("locked")
    blocked = lab.python("b", LOCK, f"lock-{kind}", kind)
    assert (blocked.returncode, blocked.stdout.split()) == (1, ["blocked", str(errno.EAGAIN)]), blocked
    holder.signal(signal.SIGTERM)
    assert holder.wait().stdout == "locked\nreleased\n"
    taken = lab.python("b", LOCK, f"lock-{kind}", kind)
    assert (taken.returncode, taken.stdout) == (0, "locked\n"), taken


def test_appends_under_locks_from_both_hosts_at_once_all_land_whole(lab: nfslab.Lab) -> None:
    appenders = [lab.spawn_python(host, APPENDER, "appended", "100") for host in ("a", "b")]
    lab.wait_all()
    assert [appender.poll() for appender in appenders] == [0, 0], [appender.result() for appender in appenders]
    lines = lab.run("server", ["cat", f"{nfslab.EXPORT}/appended"]).stdout.splitlines()
    for host in ("hostA", "hostB"):
        assert [line for line in lines if line.split()[0] == host] == [f"{host} {n}" for n in range(100)]
    assert len(lines) == 200


@pytest.mark.parametrize("kind", ["posix", "ofd"])
def test_a_killed_holder_loses_its_lock(lab: nfslab.Lab, kind: str) -> None:
    holder = lab.spawn_python("a", LOCK, f"killed-{kind}", kind, "hold")
    holder.wait_for_output("locked")
    holder.kill()
    assert holder.wait().returncode == -signal.SIGKILL
    taken = lab.python("b", LOCK, f"killed-{kind}", kind)
    assert (taken.returncode, taken.stdout) == (0, "locked\n"), taken


@pytest.mark.parametrize("lab", ["4.2"], indirect=True)
def test_a_host_cut_off_past_its_lease_loses_its_lock_and_its_late_writes(lab: nfslab.Lab) -> None:
    holder = lab.spawn_python("a", LATE_WRITER)
    holder.wait_for_output("locked")
    lab.disconnect("a")
    taker = lab.python("b", TAKER, timeout=120)
    assert taker.returncode == 0, taker
    lab.reconnect("a")
    holder.signal(signal.SIGTERM)
    late = holder.wait(timeout=120)
    assert "EIO" in late.stdout, late
    assert lab.run("b", ["cat", "cut-off"]).stdout == "from b\n"
    assert lab.run("a", ["cat", "cut-off"]).stdout == "from b\n"


@pytest.mark.parametrize("lab", ["3"], indirect=True)
def test_a_host_cut_off_on_nfsv3_keeps_its_lock_and_its_late_writes(lab: nfslab.Lab) -> None:
    holder = lab.spawn_python("a", LATE_WRITER)
    holder.wait_for_output("locked")
    lab.disconnect("a")
    time.sleep(lab.lease + 2)  # NLM has no lease: the server keeps the lock of a silent host
    blocked = lab.python("b", LOCK, "cut-off", "posix")
    assert (blocked.returncode, blocked.stdout.split()) == (1, ["blocked", str(errno.EAGAIN)]), blocked
    taker = lab.spawn_python("b", TAKER)
    lab.reconnect("a")
    time.sleep(1)
    assert taker.poll() is None, taker.result()
    holder.signal(signal.SIGTERM)
    assert holder.wait(timeout=120).stdout == "locked\nwrite ok\nunlock ok\nclose ok\n"
    assert taker.wait(timeout=120).returncode == 0
    assert lab.run("server", ["cat", f"{nfslab.EXPORT}/cut-off"]).stdout == "from b\n"
    # NFSv3 has no change attribute: host a may have the same size and times cached for the
    # file (b wrote in the same clock tick) and keep serving its own write from its cache;
    # a lock makes it read the file again.
    read = "import fcntl; f = open('cut-off', 'r+'); fcntl.lockf(f, fcntl.LOCK_SH); print(f.read(), end='')"
    assert lab.python("a", read).stdout == "from b\n"


@pytest.mark.parametrize("lab", ["3"], indirect=True)
def test_on_nfsv3_a_holder_killed_while_its_host_is_cut_off_frees_its_lock_when_the_host_is_back(lab: nfslab.Lab) -> None:
    holder = lab.spawn_python("a", LOCK, "killed-away", "ofd", "hold")
    holder.wait_for_output("locked")
    lab.disconnect("a")
    holder.kill()
    time.sleep(3)
    # It cannot even end: its exit waits to tell the server's lockd that it unlocks.
    assert holder.poll() is None, holder.result()
    blocked = lab.python("b", LOCK, "killed-away", "ofd")
    assert (blocked.returncode, blocked.stdout.split()) == (1, ["blocked", str(errno.EAGAIN)]), blocked
    lab.reconnect("a")
    assert holder.wait(timeout=120).returncode == -signal.SIGKILL
    taken = lab.python("b", LOCK, "killed-away", "ofd")
    assert (taken.returncode, taken.stdout) == (0, "locked\n"), taken


def test_the_guest_dies_with_the_process_that_booted_it(tmp_path: Path) -> None:
    boot = "import os, sys, nfslab; lab = nfslab.Lab(sys.argv[1]); lab.start(); print(lab.guest_pid(), flush=True); os.abort()"
    child = subprocess.run(
        [sys.executable, "-c", boot, str(tmp_path)], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == -signal.SIGABRT, child.stderr
    group = int(child.stdout)
    assert group > 0
    for _ in range(500):
        if not living(group):
            return
        time.sleep(0.02)
    pytest.fail(f"the guest's processes {living(group)} outlived the process that booted it")


def living(group: int) -> list[int]:
    """The processes of process group `group` that are not zombies."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
