"""The NFS lab (tests/nfslab.py): client hosts of one real NFS server, each its own QEMU guest
(or network namespaces of one guest), share files and locks, and nothing of the lab reaches
outside it or outlives the process that booted it."""

from __future__ import annotations

import errno
import signal
import subprocess
import sys
import time
from pathlib import Path

import nfslab
import pytest

REASON = nfslab.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

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


def test_hosts_are_distinct_nfs_clients_with_kernels_of_their_own(lab: nfslab.Lab) -> None:
    names = [lab.run(host, ["hostname"]).stdout.strip() for host in ("a", "b")]
    assert names == ["hostA", "hostB"]
    boots = {lab.run(host, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout for host in ("a", "b", "server")}
    assert len(boots) == 3, "two hosts share a kernel"
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


def test_the_guests_have_no_network_but_the_labs(lab: nfslab.Lab) -> None:
    def links(host: str) -> list[str]:
        listing = lab.run(host, ["ip", "-o", "link", "show"]).stdout
        return sorted(line.split(": ")[1].split("@")[0] for line in listing.splitlines())

    def routes(host: str) -> list[str]:
        return lab.run(host, ["ip", "-o", "route", "show"]).stdout.split("\n")[:-1]

    assert links("server") == ["lo", *(f"to{nfslab.NAMES[host]}" for host in lab.hosts)]
    assert all(links(host) == ["eth0", "lo"] for host in lab.hosts)
    assert [route.split()[0] for route in routes("server")] == [f"10.99.{nfslab.NUMBERS[host]}.0/24" for host in lab.hosts]
    assert [route.split()[0] for route in routes("a")] == ["10.99.1.0/24"]
    # Host b is not even reachable from host a: each link joins one host to the server.
    reach = "import socket; print(socket.socket().connect_ex((sys.argv[1], 2049)))"
    assert lab.python("a", f"import sys; {reach}", "10.99.2.2").stdout == f"{errno.ENETUNREACH}\n"
    assert lab.python("a", f"import sys; {reach}", "10.99.1.1").stdout == "0\n"


def test_hosts_in_one_kernel_are_distinct_nfs_clients_in_namespaces_of_their_own(one_kernel_lab: nfslab.Lab) -> None:
    lab = one_kernel_lab
    assert [lab.run(host, ["hostname"]).stdout.strip() for host in ("a", "b")] == ["hostA", "hostB"]
    boots = {lab.run(host, ["cat", "/proc/sys/kernel/random/boot_id"]).stdout for host in ("a", "b")}
    assert len(boots) == 1
    clients = lab.run("server", ["sh", "-c", "cat /proc/fs/nfsd/clients/*/info"]).stdout
    assert '"Linux NFSv4.2 nfslab-hostA/hostA"' in clients and '"Linux NFSv4.2 nfslab-hostB/hostB"' in clients
    assert lab.python("a", "open('shared', 'w').write('from a')").returncode == 0
    assert lab.python("b", "print(open('shared').read())").stdout == "from a\n"


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


BOOT = """
import os, signal, sys, nfslab
lab = nfslab.Lab(sys.argv[1])
lab.launch()
print(" ".join(str(lab.guest_pid(guest)) for guest in lab.guests), flush=True)
if sys.argv[2] == "abort":
    os.abort()
os.kill(os.getpid(), {"kill": signal.SIGKILL, "interrupt": signal.SIGINT}[sys.argv[2]])
"""
DEATHS = {"abort": -signal.SIGABRT, "kill": -signal.SIGKILL, "interrupt": -signal.SIGINT}


@pytest.mark.parametrize("death", DEATHS)
def test_no_guest_outlives_the_process_that_booted_it(tmp_path: Path, death: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", BOOT, str(tmp_path), death], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == DEATHS[death], child.stderr
    guests = [int(pid) for pid in child.stdout.split()]
    assert len(guests) == 3 and all(pid > 0 for pid in guests)
    for _ in range(500):
        if not living(guests):
            return
        time.sleep(0.02)
    pytest.fail(f"the guests {living(guests)} outlived the process that booted them")


def living(pids: list[int]) -> list[int]:
    """The processes of `pids` that live and are QEMU (not zombies, not reused)."""
    found = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z" and "qemu" in stat.split(") ")[0]:
            found.append(pid)
    return found
