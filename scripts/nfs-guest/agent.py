"""An NFS lab guest's command agent (run by scripts/nfs-guest/init; see tests/nfslab.py).

    agent.py DIR GUEST HOSTS [PORT]   # HOSTS: NAME=NAMESPACES,...  (NAMESPACES empty: the guest's own)

It serves the spool directory DIR/guests/GUEST/req, shared with the machine over 9p:

- The machine drops requests there as SEQ.json (written aside and renamed in), taken in
  SEQ order: {"op": "run", "id": ID, "host": NAME, "argv": [...], "cwd": DIR or null,
  "env": {...}} starts a process in its own session on that host, its output in
  DIR/out/ID.out and DIR/out/ID.err; {"op": "python", ..., "code": CODE, "args": [...]}
  does the same for Python code, forked from this agent, which has kl imported already
  (a new interpreter takes seconds under emulation); {"op": "signal", "id": ID,
  "signal": N} signals the process group of a process started so; {"op": "shutdown"}
  ends the agent.
- When a process ends, its status (negative: the signal that killed it) is renamed in as
  DIR/out/ID.rc.

The machine writes a byte to the virtio serial PORT after each request, so the agent
sleeps until there is something to do (a child's end wakes it too), looking at the spool
on its own only every 5 s (each look is a few 9p requests: looking 4 times a second kept
an idle guest 4 times as busy); without PORT, or while nobody listens at the machine's
end, it looks every 50 ms.

A host with namespaces of its own (hostA in a guest of two hosts) is entered with
nsenter, or for forked Python with setns(2) on /run/netns/hostA, /run/ns/hostA.uts and
/run/ns/hostA.mnt.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import kl  # noqa: F401  (imported once, here: forked Python finds it loaded)
import kl.log.recovery  # noqa: F401
import kl_cli  # noqa: F401

DEFAULT_CWD = {"server": "/srv/nfs"}
# nsenter --wd would take the directory from the namespace it starts in.
CHDIR = 'cd "$0" && exec "$@"'
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/run/tmp",
    "TMPDIR": "/run/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWNET = 0x00020000, 0x04000000, 0x40000000


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` by renaming a finished file in."""
    aside = path.with_name("." + path.name)
    aside.write_text(text)
    aside.rename(path)


def namespaces(name: str) -> list[tuple[str, int]]:
    """The namespace files of host namespace set `name` and their kinds."""
    return [
        (f"/run/netns/{name}", CLONE_NEWNET),
        (f"/run/ns/{name}.uts", CLONE_NEWUTS),
        (f"/run/ns/{name}.mnt", CLONE_NEWNS),
    ]


class Agent:
    def __init__(self, spool: Path, guest: str, hosts: dict[str, str], port: str | None = None) -> None:
        self.spool, self.guest, self.hosts, self.port = spool, guest, hosts, port
        self.requests = spool / "guests" / guest / "req"
        self.out = spool / "out"
        self.running: dict[str, subprocess.Popen[bytes] | int] = {}
        self.groups: dict[str, int] = {}

    def argv(self, request: dict[str, Any]) -> list[str]:
        """The command line that runs `request`'s argv on its host, in its directory."""
        entered = self.hosts[request["host"]]
        cwd = request.get("cwd") or DEFAULT_CWD.get(request["host"], "/mnt/nfs")
        command = ["sh", "-c", CHDIR, cwd, *request["argv"]]
        if not entered:
            return command
        entering = [
            f"{option}={path}" for option, (path, _) in zip(("--net", "--uts", "--mount"), namespaces(entered), strict=True)
        ]
        return ["nsenter", *entering, "--", *command]

    def start(self, request: dict[str, Any]) -> None:
        """Start the process `request` asks for; its output goes to files under DIR/out."""
        ident = request["id"]
        env = {**BASE_ENV, **request.get("env", {})}
        with open(self.out / f"{ident}.out", "wb") as stdout, open(self.out / f"{ident}.err", "wb") as stderr:
            if request["op"] == "python":
                pid = os.fork()
                if pid == 0:
                    self.python(request, env, stdout.fileno(), stderr.fileno())
                self.running[ident] = self.groups[ident] = pid
                return
            argv = self.argv(request)
            try:
                process = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env, start_new_session=True
                )
            except OSError as exc:
                stderr.write(f"nfslab agent: cannot start {argv}: {exc}\n".encode())
                write_atomic(self.out / f"{ident}.rc", "127")
                return
        self.running[ident] = process
        self.groups[ident] = process.pid

    def python(self, request: dict[str, Any], env: dict[str, str], stdout: int, stderr: int) -> None:
        """In the forked child: become the host's process, run the code, exit."""
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            entered = self.hosts[request["host"]]
            if entered:
                libc = ctypes.CDLL(None, use_errno=True)
                for path, kind in namespaces(entered):
                    fd = os.open(path, os.O_RDONLY)
                    if libc.setns(fd, kind) != 0:
                        raise OSError(ctypes.get_errno(), f"setns {path}")
                    os.close(fd)
            os.chdir(request.get("cwd") or DEFAULT_CWD.get(request["host"], "/mnt/nfs"))
            os.environ.clear()
            os.environ.update(env)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
            sys.argv = ["-c", *request["args"]]
            try:
                exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
                status = 0
            except SystemExit as exc:  # as Python's own exit: sys.exit("message") prints it and gives 1
                if exc.code is None or isinstance(exc.code, int):
                    status = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    status = 1
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status)

    def serve(self) -> None:
        """Take requests until a shutdown request."""
        self.out.mkdir(exist_ok=True)
        done: set[str] = set()
        wakeup, woken = os.pipe()
        os.set_blocking(woken, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(woken)
        port = os.open(self.port, os.O_RDONLY | os.O_NONBLOCK) if self.port else None
        port_back = 0.0  # while nobody listens at the machine's end, the port reads as ended
        write_atomic(self.spool / "guests" / self.guest / "ready", str(os.getpid()))
        while True:
            for name in sorted(os.listdir(self.requests)):
                if name.startswith(".") or name in done:
                    continue
                done.add(name)
                request = json.loads((self.requests / name).read_text())
                if request["op"] == "shutdown":
                    return
                if request["op"] in ("run", "python"):
                    self.start(request)
                elif request["op"] == "signal" and request["id"] in self.groups:
                    try:
                        os.killpg(self.groups[request["id"]], request["signal"])
                    except ProcessLookupError:
                        pass
            self.reap()
            watched = [wakeup] + ([port] if port is not None and time.monotonic() >= port_back else [])
            for fd in select.select(watched, [], [], 5 if port in watched else 0.05)[0]:
                try:
                    if not os.read(fd, 4096) and fd == port:
                        port_back = time.monotonic() + 1
                except BlockingIOError:  # the port said ready with nothing to read (the machine's end connected)
                    pass

    def reap(self) -> None:
        for ident, process in list(self.running.items()):
            if isinstance(process, int):
                pid, status = os.waitpid(process, os.WNOHANG)
                code = None if pid == 0 else os.waitstatus_to_exitcode(status)
            else:
                code = process.poll()
            if code is not None:
                write_atomic(self.out / f"{ident}.rc", str(code))
                del self.running[ident]


def parse_hosts(spec: str) -> dict[str, str]:
    """NAME=NAMESPACES,... as a dict."""
    return dict(entry.split("=", 1) for entry in spec.split(","))


if __name__ == "__main__":
    Agent(Path(sys.argv[1]), sys.argv[2], parse_hosts(sys.argv[3]), (sys.argv[4:] or [None])[0]).serve()
