"""A real NFS lab for tests: one NFS server and two client hosts in a user-mode Linux.

This machine's kernel has neither an NFS server nor an NFS client, but Debian's
user-mode-linux package boots Linux 6.1 as an ordinary process, in about two seconds and
without KVM, with nfsd, the NFS client and veth as modules.  `Lab` boots such a guest
(scripts/nfs-guest/init is its PID 1): its root is this machine's / read-only through
hostfs, so it runs the same Python and venv; it exports an ext4 file system on a private
block device (a sparse file in the lab's directory), and two client hosts, "a" and "b"
(each its own network, UTS and mount namespace with its own NFSv4 client identifier,
joined to the server by a veth pair), mount that export at `MOUNT`: two distinct NFS
clients, over NFSv4.2 (`version="4.2"`, the default) or NFSv3 (`version="3"`, below).
The addresses exist only inside the guest (server 10.99.1.1 and 10.99.2.1, host a
10.99.1.2, host b 10.99.2.2); the guest has no network to the outside.

Needs Debian's packages user-mode-linux, nfs-kernel-server (which brings nfs-common), kmod,
e2fsprogs and iproute2, and rpcbind for NFSv3: scripts/nfs-guest/install installs them, as
root; the lab itself runs as any user.  `unavailable(version)` tells why the lab cannot run
here, for a skip.  The lab
is ready about 5 to 9 s after `start()` (the kernel boots in under 2 s; nfsd's start and the
two mounts take most of the rest), and a command in it takes 0.1 s, a Python one about 1 s.

    with Lab(tmp_path) as lab:                       # boots; the guest dies on exit
        lab.run("a", ["sh", "-c", "echo hi > f"])    # Result(returncode, stdout, stderr)
        lab.python("b", "print(open('f').read())")   # this interpreter, in host b
        producer = lab.spawn("a", [...])             # a Process, running concurrently
        producer.wait_for_output("ready")            # its stdout so far, once it has this
        producer.kill()                              # SIGKILL to its process group
        lab.disconnect("a"); lab.reconnect("a")      # cut host a off the server and back
        producer.wait(timeout=30)                    # Result
        lab.wait_all(timeout=60)                     # [Result] of every process started

Commands run in the guest with the given argv (no shell) in their own session, in `MOUNT`
unless `cwd` says otherwise, with a small fixed environment (PATH, HOME and TMPDIR on a
guest tmpfs, LANG=C.UTF-8, PYTHONDONTWRITEBYTECODE=1) plus `env`; host "server" is the
guest's root namespace, where the exported file system is at `EXPORT`.  Every path of this
machine is seen read-only at the same path, except the lab's directory, which is shared
read-write: a test can hand a guest command a file by writing it there first, but should
not change a file there that the guest has already read (the guest may cache it).

The NFS server's lease and grace time is `lease` seconds (10, nfsd's least, by default),
the grace period after its start is ended at once, and NFSv3 (so lockd) is off unless
`version` is "3".  nfsd hands out (read) delegations unless `delegations` is false, even to
a client that opened a file for writing.  A client cut off longer than its lease loses its state, but nfsd 6.1 is a
courteous server: it lets the expired client keep its locks and delegations until another
client asks for a conflicting one.  So while host a is cut off, host b's open() of a file a
holds a delegation on waits (the server answers "delay" while it cannot recall it) until
a's lease has run out, and b's lock on a file a has locked fails (F_SETLK) or waits
(F_SETLKW) until then too.  Once back, a finds its locks lost: its late writes fail with EIO,
at the latest on close().

With `version="3"` the server runs NFSv3 beside NFSv4 (rpcbind, rpc.statd, rpc.mountd, and
lockd through nfsd) and each host mounts `EXPORT` with vers=3, locking through NLM: each
host has its own rpcbind and rpc.statd (in its own /run and /var/lib/nfs), lockd being per
network namespace.  lockd refuses new locks for its grace period (10 s) after it starts,
so the lab is ready only once each host has had a lock: about 15 to 20 s after `start()`.
NLM has no leases: a cut-off host keeps its locks, and others wait for them, until it comes
back (and releases them) or reboots.  NFSv3 has no change attribute either: a host sees
that another changed a file by its size and times, so a file rewritten at the same size
within one tick of the server's clock (ext4: a jiffy) stays in its cache, stale, until it
changes again or the host takes a lock on it.

The guest dies when the lab is closed, when this process exits (atexit; and should it be
killed, the shell that started the guest sees its pipe from this process close and kills
the guest's process group) and, in any case, after `lifetime` seconds.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

UML = "/usr/bin/linux.uml"
MODULES = "/usr/lib/uml/modules"
GUEST = Path(__file__).resolve().parent.parent / "scripts" / "nfs-guest"
MOUNT = "/mnt/nfs"
EXPORT = "/srv/nfs"
HOSTS = ("a", "b", "server")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NAMES = {"a": "hostA", "b": "hostB"}
TOOLS = {
    "modprobe": "kmod",
    "rpc.nfsd": "nfs-kernel-server",
    "rpc.mountd": "nfs-kernel-server",
    "exportfs": "nfs-kernel-server",
    "mount.nfs": "nfs-common",
    "mkfs.ext4": "e2fsprogs",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "timeout": "coreutils",
    "flock": "util-linux",
}
VERSIONS = ("4.2", "3")
# What NFSv3 needs besides: NLM's rpcbind and rpc.statd, on the server and on each host.
TOOLS_V3 = {"rpcbind": "rpcbind", "rpc.statd": "nfs-common"}
# Runs the guest (its argv after the file to write its pid to) and kills it, with every
# process it left, when it ends or when this shell's standard input, a pipe from the
# process that booted the lab, is closed: when that process dies in any way.  The guest
# (linux.uml) makes a process group of its own, so both groups are killed.
SUPERVISE = """
exec 3<&0
pidfile=$1
shift
"$@" </dev/null 3<&- &
guest=$!
echo "$guest" >"$pidfile"
{ read -r _ <&3; kill -s KILL -- "-$guest" 2>/dev/null; kill -s KILL 0; } &
wait "$guest"
kill -s KILL -- "-$guest" 2>/dev/null
kill -s KILL 0
"""


class LabError(Exception):
    """The lab failed: the guest did not boot, died, or a command did not finish in time."""


@dataclass(frozen=True)
class Result:
    """How a command in the guest ended: its status (negative: the killing signal), output."""

    returncode: int
    stdout: str
    stderr: str


def unavailable(version: str = "4.2") -> str | None:
    """Why the lab cannot run on this machine with NFS `version`, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the NFS lab needs Linux"
    if not os.access(UML, os.X_OK) or not os.path.isdir(MODULES):
        return "user-mode-linux is not installed: apt-get install user-mode-linux"
    tools = {**TOOLS, **TOOLS_V3} if version == "3" else TOOLS
    missing = sorted({package for tool, package in tools.items() if _which(tool) is None})
    if missing:
        return f"the NFS lab needs Debian packages {', '.join(missing)}: apt-get install {' '.join(missing)}"
    return None


def _which(tool: str) -> str | None:
    """Where `tool` is, looking in the system's sbin directories too (not on every PATH)."""
    return shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATH.split(":")]))


class Process:
    """A command started in the guest by `Lab.spawn`."""

    def __init__(self, lab: Lab, ident: str, host: str, argv: list[str]) -> None:
        self.lab, self.ident, self.host, self.argv = lab, ident, host, argv

    def _read(self, suffix: str) -> str:
        try:
            return (self.lab.directory / "out" / f"{self.ident}.{suffix}").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def output(self) -> str:
        """Its standard output so far."""
        return self._read("out")

    def poll(self) -> int | None:
        """Its status once it has ended, else None."""
        status = self._read("rc")
        return int(status) if status else None

    def signal(self, signum: int) -> None:
        """Send `signum` to its process group (it runs in a session of its own)."""
        self.lab._request({"op": "signal", "id": self.ident, "signal": int(signum)})

    def kill(self) -> None:
        """Kill its process group with SIGKILL."""
        self.signal(signal.SIGKILL)

    def wait_for_output(self, text: str, timeout: float = 30) -> str:
        """Wait until its standard output holds `text`; return that output."""
        deadline = time.monotonic() + timeout
        while True:
            output = self.output()
            if text in output:
                return output
            if self.poll() is not None:
                raise LabError(f"{self!r} ended before printing {text!r}: {self.result()}")
            self._check(deadline, f"printing {text!r}")

    def wait(self, timeout: float = 60) -> Result:
        """Wait for it to end; its status and output."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            self._check(deadline, "ending")
        return self.result()

    def result(self) -> Result:
        """Its status (-1 while it runs) and its output so far."""
        status = self.poll()
        return Result(-1 if status is None else status, self.output(), self._read("err"))

    def _check(self, deadline: float, what: str) -> None:
        self.lab._check_alive()
        if time.monotonic() > deadline:
            raise LabError(f"{self!r} timed out {what}: {self.result()}")
        time.sleep(0.02)

    def __repr__(self) -> str:
        return f"<nfslab.Process {self.ident} on {self.host}: {' '.join(self.argv)}>"


class Lab:
    """The booted guest: an NFS server and client hosts "a" and "b" (see the module doc)."""

    def __init__(
        self,
        directory: Path,
        *,
        python: str = sys.executable,
        version: str = "4.2",
        lease: int = 10,
        delegations: bool = True,
        memory_mb: int = 512,
        disk_mb: int = 256,
        lifetime: float = 600,
        boot_timeout: float = 60,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"the NFS lab mounts NFS version {' or '.join(VERSIONS)}, not {version!r}")
        self.directory = Path(directory).resolve()
        self.python_path = python
        self.version = version
        self.lease, self.delegations = lease, delegations
        self.memory_mb, self.disk_mb = memory_mb, disk_mb
        self.lifetime, self.boot_timeout = lifetime, boot_timeout
        self.boot_seconds = 0.0
        self._process: subprocess.Popen[bytes] | None = None
        self._sequence = itertools.count(1)
        self._spawned: list[Process] = []

    def start(self) -> None:
        """Boot the guest and wait until both hosts have mounted the export."""
        reason = unavailable(self.version)
        if reason:
            raise LabError(reason)
        for value in (str(self.directory), self.python_path):
            if any(c in value for c in " ,\t\n\"'"):
                raise LabError(f"the lab cannot pass a path with blanks, commas or quotes to the guest: {value!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "req").mkdir()
        (self.directory / "uml").mkdir()
        disk = self.directory / "disk.ext4"
        with open(disk, "wb") as file:
            file.truncate(self.disk_mb << 20)
        subprocess.run([_which("mkfs.ext4") or "mkfs.ext4", "-q", "-F", str(disk)], check=True, capture_output=True)
        command = [
            UML,
            f"mem={self.memory_mb}M",
            f"ubd0={disk}",
            f"uml_dir={self.directory / 'uml'}",
            "umid=nfslab",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rootflags=/",
            "ro",
            f"init={GUEST / 'init'}",
            f"nfslab_dir={self.directory}",
            f"nfslab_python={self.python_path}",
            f"nfslab_lease={self.lease}",
            f"nfslab_delegations={int(self.delegations)}",
            f"nfslab_lifetime={int(self.lifetime)}",
            f"nfslab_version={self.version}",
            "con=null",
            "ssl=null",
            "con0=fd:0,fd:1",
            "quiet",
        ]
        started = time.monotonic()
        with open(self.directory / "console.log", "wb") as console:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", SUPERVISE, "nfslab-guest", str(self.directory / "guest.pid"), *command],
                stdin=subprocess.PIPE,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": SYSTEM_PATH, "TMPDIR": self._memory_directory()},
            )
        atexit.register(self.close)
        deadline = started + self.boot_timeout
        while not (self.directory / "agent.ready").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                self.close()
                raise LabError(f"the NFS lab did not boot in {self.boot_timeout} s:\n{self.log()}")
            time.sleep(0.02)
        self.boot_seconds = time.monotonic() - started

    def _memory_directory(self) -> str:
        """Where the guest keeps the file behind its memory: /dev/shm if it has the room."""
        try:
            shm = os.statvfs("/dev/shm")
        except OSError:
            return str(self.directory)
        room = shm.f_bavail * shm.f_frsize
        return "/dev/shm" if room > self.memory_mb << 20 and os.access("/dev/shm", os.W_OK) else str(self.directory)

    def close(self) -> None:
        """Kill the guest, every process of it."""
        process, self._process = self._process, None
        if process is None:
            return
        atexit.unregister(self.close)
        # Once the shell has ended, so has the guest's group (and its pid may be reused).
        groups = [process.pid] if process.poll() is not None else [self.guest_pid(), process.pid]
        for group in groups:
            if group > 0:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        process.communicate()

    def guest_pid(self) -> int:
        """The pid of the guest's kernel (linux.uml), also its process group; 0 before the boot."""
        try:
            return int((self.directory / "guest.pid").read_text() or 0)
        except FileNotFoundError:
            return 0

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self.close()

    def log(self) -> str:
        """The guest's log of its setup, then its console."""
        texts = []
        for name in ("guest.log", "console.log"):
            path = self.directory / name
            if path.exists():
                texts.append(path.read_text(errors="replace"))
        return "\n".join(texts)

    def spawn(self, host: str, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        """Start `argv` on `host` ("a", "b" or "server") and return at once."""
        if host not in HOSTS:
            raise ValueError(f"no host {host!r} in the lab: {', '.join(HOSTS)}")
        ident = str(next(self._sequence))
        self._request(
            {"op": "run", "id": ident, "host": host, "argv": [str(a) for a in argv], "cwd": cwd, "env": env or {}},
            ident,
        )
        process = Process(self, ident, host, list(argv))
        self._spawned.append(process)
        return process

    def run(
        self,
        host: str,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Result:
        """Run `argv` on `host` to its end."""
        return self.spawn(host, argv, cwd=cwd, env=env).wait(timeout)

    def wait_all(self, timeout: float = 60) -> list[Result]:
        """Wait for every process started so far to end; their results, in the order started."""
        deadline = time.monotonic() + timeout
        return [process.wait(max(0.0, deadline - time.monotonic())) for process in self._spawned]

    def python(self, host: str, code: str, *args: str, timeout: float = 60) -> Result:
        """Run Python `code` (with `args` in sys.argv[1:]) on `host` in the lab's interpreter."""
        return self.run(host, [self.python_path, "-c", code, *args], timeout=timeout)

    def spawn_python(self, host: str, code: str, *args: str) -> Process:
        """Start Python `code` on `host` in the lab's interpreter."""
        return self.spawn(host, [self.python_path, "-c", code, *args])

    def disconnect(self, host: str) -> None:
        """Cut `host` off the server: take the server's end of its veth pair down."""
        self._link(host, "down")

    def reconnect(self, host: str) -> None:
        """Join `host` to the server again."""
        self._link(host, "up")

    def _link(self, host: str, state: str) -> None:
        result = self.run("server", ["ip", "link", "set", f"veth{NAMES[host]}", state])
        if result.returncode:
            raise LabError(f"cannot set host {host}'s link {state}: {result.stderr}")

    def _request(self, request: dict[str, object], ident: str | None = None) -> None:
        self._check_alive()
        name = f"{next(self._sequence):08d}.json" if ident is None else f"{int(ident):08d}.json"
        aside = self.directory / "req" / f".{name}"
        aside.write_text(json.dumps(request))
        aside.rename(self.directory / "req" / name)

    def _check_alive(self) -> None:
        if self._process is None:
            raise LabError("the NFS lab is not running")
        if self._process.poll() is not None:
            self.close()
            raise LabError(f"the NFS lab's guest died:\n{self.log()[-4000:]}")
