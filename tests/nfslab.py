"""A real NFS lab for tests: one NFS server and client hosts, each its own QEMU guest.

This machine's kernel has neither an NFS server nor an NFS client, and it may have no
hardware virtualization, so each host of the lab is a virtual machine under QEMU's
software emulation (TCG), booting Debian's own kernel (scripts/nfs-guest/kernel keeps it
in a cache, outside the repository).  Each guest's root is this machine's / read-only
over 9p under a tmpfs overlay, so it runs the same Python and venv; the lab's directory is
shared read-write at the same path.  The server guest exports an ext4 file system on a
virtual disk (a sparse file in the lab's directory); each client host mounts it at
`MOUNT`: by default hosts "a" and "b", each its own guest with its own kernel, page cache,
NFS client identity and clock; `hosts=("a", "b", "c")` adds a third.  With
`one_kernel=True` the client hosts are instead network namespaces of one client guest,
each with its own NFS mount, as two containers of one machine would be.  NFSv4.2
(`version="4.2"`, the default) or NFSv3 (`version="3"`, locking through NLM).  Host N's
link to the server is a pair of datagram sockets in the lab's directory (addresses
10.99.N.1 on the server, 10.99.N.2 on the host: a is 1, b 2, c 3); the guests have no
other network, and nothing of the lab is a device, bridge or namespace of this machine.

Needs QEMU (qemu-system-x86, its qboot firmware), busybox-static, and Debian's
nfs-kernel-server, nfs-common, rpcbind, kmod, e2fsprogs and iproute2, whose programs the
guests run: scripts/nfs-guest/install installs them and fills the kernel cache, as root;
the lab itself runs as any user.  `unavailable(version)` tells why the lab cannot run
here, for a skip: a missing package, or a probe guest (booted once per process) that
could not start its first process.  Under emulation a guest computes about 15 to 20
times slower than this machine: the lab is ready 10 to 20 s after `start()`, and Python
code started with `python`/`spawn_python` is forked from a guest agent that has kl
imported already (a fresh interpreter takes seconds there).

    with Lab(tmp_path) as lab:                       # boots; the guests die on exit
        lab.run("a", ["sh", "-c", "echo hi > f"])    # Result(returncode, stdout, stderr)
        lab.python("b", "print(open('f').read())")   # Python code on host b
        producer = lab.spawn_python("a", code)       # a Process, running concurrently
        producer.wait_for_output("ready")            # its stdout so far, once it has this
        producer.signal(signal.SIGSTOP)              # to its process group
        producer.kill()                              # SIGKILL to its process group
        lab.disconnect("a"); lab.reconnect("a")      # cut host a off the server and back
        lab.freeze("a"); lab.thaw("a")               # stop host a's whole guest, and go on
        lab.reset("a")                               # host a's guest killed and booted again
        producer.wait(timeout=30)                    # Result
        lab.wait_all(timeout=60)                     # [Result] of every process started

Commands run with the given argv (no shell) in their own session, in `MOUNT` unless `cwd`
says otherwise, with a small fixed environment (PATH, HOME and TMPDIR on a guest tmpfs,
LANG=C.UTF-8, PYTHONDONTWRITEBYTECODE=1) plus `env`; host "server" is the server guest,
where the exported file system is at `EXPORT`.  A test can hand a guest command a file
by writing it into the lab's directory first.  `clocks={"a": 300}` sets host a's clock
300 s ahead of this machine's.

The NFS server's lease and grace time is `lease` seconds (10, nfsd's least, by default),
the grace period after its start is ended at once, and NFSv3 (so lockd) is off unless
`version` is "3".  nfsd hands out (read) delegations unless `delegations` is false.  A
client cut off longer than its lease loses its state, but nfsd 6.1 is a courteous server:
it lets the expired client keep its locks and delegations until another client asks for a
conflicting one; once back, the host finds its locks lost and its late writes fail with
EIO, at the latest on close().  With `version="3"` each host runs its own rpcbind and
rpc.statd; lockd refuses new locks for 10 s after the server starts, so the lab is ready
only once each host has had a lock.  NLM has no leases: a cut-off host keeps its locks,
and others wait for them, until it comes back or reboots.  NFSv3 has no change attribute
either: a file rewritten at the same size within one tick of the server's clock may stay
stale in another host's cache until it changes again or that host takes a lock on it.

Every guest dies when the lab is closed, when this process exits (atexit; and should it
be killed, the shell that started each guest sees its pipe from this process close and
kills the guest) and, in any case, after `lifetime` seconds.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

QEMU = "qemu-system-x86_64"
FIRMWARE = "/usr/share/qemu/qboot.rom"
GUEST = Path(__file__).resolve().parent.parent / "scripts" / "nfs-guest"
MOUNT = "/mnt/nfs"
EXPORT = "/srv/nfs"
SERVER = "server"
NUMBERS = {"a": 1, "b": 2, "c": 3}
NAMES = {host: f"host{host.upper()}" for host in NUMBERS}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the guests run, from this machine's /, by the Debian package that has it.
TOOLS = {
    QEMU: "qemu-system-x86",
    "busybox": "busybox-static",
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
ACCEL = ["-accel", "tcg,tb-size=64"]
# Runs a guest (its argv after the file to write its pid to) and kills it when it ends or
# when this shell's standard input, a pipe from the process that booted the lab, is
# closed: when that process dies in any way.  The shell leads a process group of its own,
# with the guest in it.
SUPERVISE = """
exec 3<&0
pidfile=$1
shift
"$@" </dev/null 3<&- &
guest=$!
echo "$guest" >"$pidfile"
{ read -r _ <&3; kill -s KILL 0; } &
wait "$guest"
kill -s KILL 0
"""


class LabError(Exception):
    """The lab failed: a guest did not boot, died, or a command did not finish in time."""


@dataclass(frozen=True)
class Result:
    """How a command in the guest ended: its status (negative: the killing signal), output."""

    returncode: int
    stdout: str
    stderr: str


def cache_directory() -> Path:
    """Where scripts/nfs-guest/kernel keeps the guests' kernel: $KL_NFSLAB_CACHE, else
    kl-nfslab in the user's cache directory."""
    if os.environ.get("KL_NFSLAB_CACHE"):
        return Path(os.environ["KL_NFSLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kl-nfslab"


def unavailable(version: str = "4.2") -> str | None:
    """Why the lab cannot run on this machine with NFS `version`, or None when it can.

    Checks the packages and the kernel cache, then boots a probe guest (once per process):
    a machine whose guests cannot start their first process cannot run the lab."""
    if not sys.platform.startswith("linux"):
        return "the NFS lab needs Linux"
    tools = {**TOOLS, **TOOLS_V3} if version == "3" else TOOLS
    missing = sorted({package for tool, package in tools.items() if _which(tool) is None})
    if not os.path.exists(FIRMWARE):
        missing.append("qemu-system-data")
    if missing:
        return f"the NFS lab needs Debian packages {', '.join(missing)}: run scripts/nfs-guest/install as root"
    if not (cache_directory() / "ready").exists():
        return f"the NFS lab's guest kernel is not in {cache_directory()}: run scripts/nfs-guest/install as root"
    return probe()


def _which(tool: str) -> str | None:
    """Where `tool` is, looking in the system's sbin directories too (not on every PATH)."""
    return shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), *SYSTEM_PATH.split(":")]))


_probed: list[str | None] = []
_probe_lock = threading.Lock()
PROBED = "nfslab-probe: the guest runs"


def probe(timeout: float = 180) -> str | None:
    """Boot one tiny guest (once per process): None when it ran its first process, else
    why not, with the last line it printed."""
    with _probe_lock:
        if not _probed:
            _probed.append(_probe(timeout))
        return _probed[0]


def _probe(timeout: float) -> str | None:
    with tempfile.TemporaryDirectory(prefix="nfslab-probe-") as directory:
        console = Path(directory) / "console.log"
        try:
            subprocess.run(
                [*_machine(256), "-serial", f"file:{console}", "-append", _command_line({"init": str(GUEST / "probe")})],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            pass
        except OSError as exc:
            return f"the NFS lab cannot start QEMU: {exc}"
        printed = console.read_text(errors="replace") if console.exists() else ""
    if PROBED in printed:
        return None
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "panic" in line.lower()), lines[-1] if lines else "nothing")
    return f"the NFS lab's QEMU guest cannot start its first process on this machine (it printed: {last})"


def _machine(memory_mb: int) -> list[str]:
    """The QEMU command line common to every guest: the kernel, the root, no devices."""
    cache = cache_directory()
    return [
        QEMU,
        *("-nodefaults", "-no-user-config", "-nographic", "-no-reboot", *ACCEL),
        *("-m", f"{memory_mb}M", "-smp", "1", "-bios", FIRMWARE),
        *("-kernel", str(cache / "vmlinux"), "-initrd", str(cache / "initramfs")),
        *("-virtfs", "local,path=/,mount_tag=root,security_model=none,readonly=on,multidevs=remap"),
    ]


def _command_line(parameters: dict[str, str]) -> str:
    """The kernel command line: a serial console, no reboot, no test of the timer's
    interrupt (under TCG on a loaded host the emulated timer can miss the kernel's short
    window: "IO-APIC + timer doesn't work!", a panic at boot), no CPU vulnerability
    mitigations (QEMU's emulated CPU claims none of the fixes, so the kernel would isolate
    its page tables and flush the TLB on every system call, which TCG emulates at a high
    cost: a guest spent about a third more CPU time on the same appends to NFS), and
    nfslab_* parameters."""
    fixed = ["console=ttyS0", "quiet", "panic=-1", "no_timer_check", "mitigations=off"]
    return " ".join([*fixed, *(f"nfslab_{key}={value}" for key, value in parameters.items())])


class Process:
    """A command started in the lab by `Lab.spawn` or `Lab.spawn_python`."""

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
        self.lab._request(self.host, {"op": "signal", "id": self.ident, "signal": int(signum)})

    def kill(self) -> None:
        """Kill its process group with SIGKILL."""
        self.signal(signal.SIGKILL)

    def wait_for_output(self, text: str, timeout: float = 60) -> str:
        """Wait until its standard output holds `text`; return that output."""
        deadline = time.monotonic() + timeout
        while True:
            output = self.output()
            if text in output:
                return output
            if self.poll() is not None:
                raise LabError(f"{self!r} ended before printing {text!r}: {self.result()}")
            self._check(deadline, f"printing {text!r}")

    def wait(self, timeout: float = 120) -> Result:
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


@dataclass
class Guest:
    """One virtual machine of the lab: the server, or a client holding `hosts`."""

    name: str
    hosts: tuple[str, ...]
    memory_mb: int
    shell: subprocess.Popen[bytes] | None = None
    wake: socket.socket | None = None
    """Connected to the guest agent's virtio serial port: a byte wakes it for a request."""
    processes: list[Process] = field(default_factory=list)

    def spool(self, lab: Lab) -> Path:
        return lab.directory / "guests" / self.name


class Lab:
    """The booted guests: an NFS server and client hosts (see the module doc)."""

    def __init__(
        self,
        directory: Path,
        *,
        python: str = sys.executable,
        version: str = "4.2",
        lease: int = 10,
        delegations: bool = True,
        hosts: tuple[str, ...] = ("a", "b"),
        one_kernel: bool = False,
        clocks: dict[str, int] | None = None,
        memory_mb: int = 384,
        disk_mb: int = 256,
        lifetime: float = 1800,
        boot_timeout: float = 180,
    ) -> None:
        if version not in VERSIONS:
            raise ValueError(f"the NFS lab mounts NFS version {' or '.join(VERSIONS)}, not {version!r}")
        unknown = [host for host in hosts if host not in NUMBERS]
        if unknown or not hosts:
            raise ValueError(f"the NFS lab's client hosts are some of {', '.join(NUMBERS)}, not {hosts!r}")
        self.directory = Path(directory).resolve()
        self.python_path = python
        self.version = version
        self.lease, self.delegations = lease, delegations
        self.hosts, self.one_kernel = tuple(hosts), one_kernel
        self.clocks = dict(clocks or {})
        self.disk_mb, self.lifetime, self.boot_timeout = disk_mb, lifetime, boot_timeout
        self.boot_seconds = 0.0
        clients = [Guest("".join(hosts), self.hosts, memory_mb)] if one_kernel else [Guest(h, (h,), memory_mb) for h in hosts]
        self.guests = {SERVER: Guest(SERVER, (SERVER,), 256), **{guest.name: guest for guest in clients}}
        self._guest_of = {host: guest for guest in self.guests.values() for host in guest.hosts}
        self._sequence = itertools.count(1)
        self._spawned: list[Process] = []
        self._spool_fds: dict[str, int] = {}
        self._started = False

    # ----------------------------------------------------------------- life

    def start(self) -> None:
        """Boot the guests and wait until every host has mounted the export."""
        reason = unavailable(self.version)
        if reason:
            raise LabError(reason)
        started = time.monotonic()
        self.launch()
        self._wait_ready(list(self.guests.values()), started + self.boot_timeout)
        self.boot_seconds = time.monotonic() - started

    def launch(self) -> None:
        """Start the guests' virtual machines (`start` waits for them too)."""
        for value in (str(self.directory), self.python_path):
            if any(c in value for c in " ,\t\n\"'="):
                raise LabError(f"the lab cannot pass a path with blanks, commas, quotes or '=' to a guest: {value!r}")
        self.directory.mkdir(parents=True, exist_ok=True)
        for sub in ("out", "net"):
            (self.directory / sub).mkdir()
        disk = self.directory / "disk.ext4"
        with open(disk, "wb") as file:
            file.truncate(self.disk_mb << 20)
        subprocess.run([_which("mkfs.ext4") or "mkfs.ext4", "-q", "-F", str(disk)], check=True, capture_output=True)
        self._started = True
        atexit.register(self.close)
        for guest in self.guests.values():
            (guest.spool(self) / "req").mkdir(parents=True)
            self._boot(guest)
        while not all(self.guest_pid(guest) for guest in self.guests):
            self._check_alive()
            time.sleep(0.01)

    def _boot(self, guest: Guest) -> None:
        spool = guest.spool(self)
        for name in ("ready", "console.log", "guest.pid"):
            (spool / name).unlink(missing_ok=True)
        served = self.hosts if guest.name == SERVER else guest.hosts
        parameters = {
            "init": str(GUEST / "init"),
            "dir": str(self.directory),
            "guest": guest.name,
            "hosts": ",".join(f"{host}:{NUMBERS[host]}" for host in served),
            "python": self.python_path,
            "modules": str(cache_directory() / "modules"),
            "release": (cache_directory() / "ready").read_text().strip(),
            "version": self.version,
            "lease": str(self.lease),
            "delegations": str(int(self.delegations)),
            "clock": str(sum(self.clocks.get(host, 0) for host in guest.hosts if host in NUMBERS)),
            "lifetime": str(int(self.lifetime)),
        }
        command = [
            *_machine(guest.memory_mb),
            *("-name", f"nfslab-{guest.name}", "-append", _command_line(parameters)),
            *("-serial", f"file:guests/{guest.name}/console.log"),
            *("-qmp", f"unix:guests/{guest.name}/qmp,server=on,wait=off"),
            *("-virtfs", f"local,path={self.directory},mount_tag=lab,security_model=none,multidevs=remap"),
            *("-device", "virtio-serial-pci,id=serial"),
            *("-chardev", f"socket,id=wake,path=guests/{guest.name}/wake,server=on,wait=off"),
            *("-device", "virtserialport,bus=serial.0,chardev=wake,name=nfslab.wake"),
        ]
        for host in served:
            n = NUMBERS[host]
            side, peer, mac = (f"s{host}", f"{host}s", 1) if guest.name == SERVER else (f"{host}s", f"s{host}", 2)
            command += [
                "-netdev",
                f"dgram,id=n{host},local.type=unix,local.path=net/{side},remote.type=unix,remote.path=net/{peer}",
                "-device",
                f"virtio-net-pci,netdev=n{host},mac=52:54:00:99:0{n}:0{mac}",
            ]
            (self.directory / "net" / side).unlink(missing_ok=True)
        if guest.name == SERVER:
            command += ["-drive", "file=disk.ext4,format=raw,if=virtio,cache=writeback"]
        with open(spool / "qemu.log", "ab") as log:
            guest.shell = subprocess.Popen(
                ["/bin/sh", "-c", SUPERVISE, "nfslab-guest", str(spool / "guest.pid"), *command],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,
                env={"PATH": SYSTEM_PATH, "TMPDIR": self._memory_directory(guest.memory_mb)},
            )

    def _wait_ready(self, guests: list[Guest], deadline: float) -> None:
        for guest in guests:
            while not (guest.spool(self) / "ready").exists():
                self._check_alive()
                if time.monotonic() > deadline:
                    log = self.log()
                    self.close()
                    raise LabError(f"the NFS lab's guest {guest.name} did not boot in {self.boot_timeout} s:\n{log[-6000:]}")
                time.sleep(0.05)
            guest.wake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            guest.wake.connect(self._short(guest, "wake"))
            guest.wake.setblocking(False)  # a byte already waiting will do

    def _memory_directory(self, memory_mb: int) -> str:
        """Where QEMU keeps temporary files: /dev/shm if it has the room."""
        try:
            shm = os.statvfs("/dev/shm")
        except OSError:
            return str(self.directory)
        room = shm.f_bavail * shm.f_frsize
        return "/dev/shm" if room > memory_mb << 20 and os.access("/dev/shm", os.W_OK) else str(self.directory)

    def close(self) -> None:
        """Kill every guest."""
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.close)
        for guest in self.guests.values():
            self._kill(guest)
        for fd in self._spool_fds.values():
            os.close(fd)
        self._spool_fds.clear()

    @staticmethod
    def _kill(guest: Guest) -> None:
        if guest.wake is not None:
            guest.wake.close()
            guest.wake = None
        shell, guest.shell = guest.shell, None
        if shell is None:
            return
        if shell.poll() is None:  # once the shell has ended, so has its group (and its id may be reused)
            try:
                os.killpg(shell.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shell.communicate()

    def guest_pid(self, guest: str = SERVER) -> int:
        """The pid of `guest`'s QEMU (a client guest is named after its hosts); 0 before the boot."""
        try:
            return int((self.guests[guest].spool(self) / "guest.pid").read_text() or 0)
        except FileNotFoundError:
            return 0

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self.close()

    def log(self) -> str:
        """Each guest's log of its setup, then its console."""
        texts = []
        for guest in self.guests.values():
            for name in ("guest.log", "console.log", "qemu.log"):
                path = guest.spool(self) / name
                if path.exists():
                    texts.append(f"--- {guest.name}: {name}\n{path.read_text(errors='replace')}")
        return "\n".join(texts)

    # ----------------------------------------------------------------- commands

    def spawn(self, host: str, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None) -> Process:
        """Start `argv` on `host` (a client host or "server") and return at once."""
        return self._spawn(host, {"op": "run", "argv": [str(a) for a in argv], "cwd": cwd, "env": env or {}}, list(argv))

    def spawn_python(self, host: str, code: str, *args: str) -> Process:
        """Start Python `code` (with `args` in sys.argv[1:]) on `host`, in the lab's interpreter."""
        return self._spawn(
            host,
            {"op": "python", "code": code, "args": [str(a) for a in args], "cwd": None, "env": {}},
            [self.python_path, "-c", "...", *args],
        )

    def _spawn(self, host: str, request: dict[str, object], argv: list[str]) -> Process:
        if host not in self._guest_of:
            raise ValueError(f"no host {host!r} in the lab: {', '.join(self._guest_of)}")
        ident = str(next(self._sequence))
        self._request(host, {**request, "id": ident, "host": host}, ident)
        process = Process(self, ident, host, argv)
        self._spawned.append(process)
        self._guest_of[host].processes.append(process)
        return process

    def run(
        self,
        host: str,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
    ) -> Result:
        """Run `argv` on `host` to its end."""
        return self.spawn(host, argv, cwd=cwd, env=env).wait(timeout)

    def python(self, host: str, code: str, *args: str, timeout: float = 120) -> Result:
        """Run Python `code` (with `args` in sys.argv[1:]) on `host` to its end."""
        return self.spawn_python(host, code, *args).wait(timeout)

    def wait_all(self, timeout: float = 120) -> list[Result]:
        """Wait for every process started so far to end; their results, in the order started."""
        deadline = time.monotonic() + timeout
        return [process.wait(max(0.0, deadline - time.monotonic())) for process in self._spawned]

    # ----------------------------------------------------------------- faults

    def disconnect(self, host: str) -> None:
        """Cut `host` off the server: its link goes down at the server's end."""
        self._monitor(SERVER, "set_link", name=f"n{host}", up=False)

    def reconnect(self, host: str) -> None:
        """Join `host` to the server again."""
        self._monitor(SERVER, "set_link", name=f"n{host}", up=True)

    def freeze(self, host: str) -> None:
        """Stop `host`'s whole guest (every host in it): a virtual machine paused."""
        self._monitor(self._guest_of[host].name, "stop")

    def thaw(self, host: str) -> None:
        """Let `host`'s guest run again."""
        self._monitor(self._guest_of[host].name, "cont")

    def reset(self, host: str) -> None:
        """Kill `host`'s guest (its QEMU, with SIGKILL: a power cut) and boot it again; its
        processes end with -9.  Only for a host that is a guest of its own."""
        guest = self._guest_of[host]
        if guest.name == SERVER or len(guest.hosts) > 1:
            raise ValueError(f"host {host!r} is not a guest of its own: it cannot be reset alone")
        self._kill(guest)
        for process in guest.processes:
            if process.poll() is None:
                (self.directory / "out" / f"{process.ident}.rc").write_text(str(-signal.SIGKILL))
        guest.processes.clear()
        shutil.rmtree(guest.spool(self) / "req")
        (guest.spool(self) / "req").mkdir()
        self._boot(guest)
        self._wait_ready([guest], time.monotonic() + self.boot_timeout)

    def _monitor(self, guest: str, command: str, **arguments: object) -> None:
        """Run `command` on `guest`'s QEMU through its QMP socket."""
        self._check_alive()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as qmp:
            qmp.settimeout(30)
            qmp.connect(self._short(self.guests[guest], "qmp"))
            replies = qmp.makefile("rb")
            json.loads(replies.readline())  # the greeting
            for execute, args in (("qmp_capabilities", {}), (command, arguments)):
                qmp.sendall(json.dumps({"execute": execute, "arguments": args}).encode() + b"\n")
                while "event" in (reply := json.loads(replies.readline() or b'{"error": "closed"}')):
                    pass
                if "return" not in reply:
                    raise LabError(f"QEMU of guest {guest} refused {command} {arguments}: {reply}")

    def _short(self, guest: Guest, name: str) -> str:
        """A short path to socket `name` in `guest`'s spool, whatever the lab's path (a socket's
        path has at most 107 bytes): through a descriptor of the spool, kept open for it."""
        if self._spool_fds.get(guest.name) is None:
            self._spool_fds[guest.name] = os.open(guest.spool(self), os.O_PATH | os.O_CLOEXEC)
        return f"/proc/self/fd/{self._spool_fds[guest.name]}/{name}"

    # ----------------------------------------------------------------- plumbing

    def _request(self, host: str, request: dict[str, object], ident: str | None = None) -> None:
        self._check_alive()
        number = next(self._sequence) if ident is None else int(ident)
        requests = self._guest_of[host].spool(self) / "req"
        aside = requests / f".{number:08d}.json"
        aside.write_text(json.dumps(request))
        aside.rename(requests / f"{number:08d}.json")
        guest = self._guest_of[host]
        if guest.wake is not None:
            try:
                guest.wake.send(b"!")
            except BlockingIOError:
                pass
            except OSError:  # the agent looks at its spool now and then all the same
                guest.wake.close()
                guest.wake = None

    def _check_alive(self) -> None:
        if not self._started:
            raise LabError("the NFS lab is not running")
        for guest in self.guests.values():
            if guest.shell is not None and guest.shell.poll() is not None:
                log = self.log()
                self.close()
                raise LabError(f"the NFS lab's guest {guest.name} died:\n{log[-6000:]}")
