"""The NFS lab guest's command agent (run by scripts/nfs-guest/init; see tests/nfslab.py).

It serves the spool directory DIR, shared with the host through hostfs:

- The host drops requests as DIR/req/SEQ.json (written aside and renamed in), taken in
  SEQ order: {"op": "run", "id": ID, "host": "a"|"b"|"server", "argv": [...], "cwd": DIR
  or null, "env": {...}} starts a process in its own session on that host, its output in
  DIR/out/ID.out and DIR/out/ID.err, its pid in DIR/out/ID.pid; {"op": "signal", "id": ID,
  "signal": N} signals the process group of a process started so; {"op": "shutdown"} ends
  the agent.
- When a process ends, its status (negative: the signal that killed it) is renamed in as
  DIR/out/ID.rc.

It only lists DIR/req and opens the names it finds there: hostfs caches a lookup of a
name that does not exist yet as missing, for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOSTS = {
    "a": ["nsenter", "--net=/run/netns/hostA", "--uts=/run/ns/hostA.uts", "--mount=/run/ns/hostA.mnt"],
    "b": ["nsenter", "--net=/run/netns/hostB", "--uts=/run/ns/hostB.uts", "--mount=/run/ns/hostB.mnt"],
    "server": ["nsenter"],
}
DEFAULT_CWD = {"a": "/mnt/nfs", "b": "/mnt/nfs", "server": "/srv/nfs"}
# nsenter --wd would take the directory from the namespace it starts in.
CHDIR = 'cd "$0" && exec "$@"'
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/run/tmp",
    "TMPDIR": "/run/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` by renaming a finished file in."""
    aside = path.with_name("." + path.name)
    aside.write_text(text)
    aside.rename(path)


def start(request: dict[str, Any], out: Path) -> subprocess.Popen[bytes]:
    """Start the process `request` asks for; its output goes to files under `out`."""
    ident, host = request["id"], request["host"]
    cwd = request.get("cwd") or DEFAULT_CWD[host]
    argv = [*HOSTS[host], "--", "sh", "-c", CHDIR, cwd, *request["argv"]]
    env = {**BASE_ENV, **request.get("env", {})}
    with open(out / f"{ident}.out", "wb") as stdout, open(out / f"{ident}.err", "wb") as stderr:
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env, start_new_session=True
            )
        except OSError as exc:
            stderr.write(f"nfslab agent: cannot start {argv}: {exc}\n".encode())
            write_atomic(out / f"{ident}.rc", "127")
            raise
    write_atomic(out / f"{ident}.pid", str(process.pid))
    return process


def serve(spool: Path) -> None:
    """Take requests from `spool` until a shutdown request."""
    requests, out = spool / "req", spool / "out"
    out.mkdir(exist_ok=True)
    running: dict[str, subprocess.Popen[bytes]] = {}
    groups: dict[str, int] = {}
    done: set[str] = set()
    write_atomic(spool / "agent.ready", str(os.getpid()))
    while True:
        for name in sorted(os.listdir(requests)):
            if name.startswith(".") or name in done:
                continue
            done.add(name)
            request = json.loads((requests / name).read_text())
            if request["op"] == "shutdown":
                return
            if request["op"] == "run":
                try:
                    running[request["id"]] = start(request, out)
                except OSError:
                    continue
                groups[request["id"]] = running[request["id"]].pid
            elif request["op"] == "signal" and request["id"] in groups:
                try:
                    os.killpg(groups[request["id"]], request["signal"])
                except ProcessLookupError:
                    pass
        for ident, process in list(running.items()):
            status = process.poll()
            if status is not None:
                write_atomic(out / f"{ident}.rc", str(status))
                del running[ident]
        time.sleep(0.05)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
