"""A real Spark standalone cluster on loopback, from the Spark that pyspark installs.

A Master (on 127.0.0.1) and N Workers (127.0.0.2, .3, ...), each a ``spark-class`` JVM of pyspark's own installation
(``SPARK_HOME`` is pyspark's package directory: nothing is downloaded), each in a new
session (its own process group, which its executor JVM joins) and killed with this
process (``PR_SET_PDEATHSIG``); a Worker's executor exits when its Worker's connection
drops, and pyspark's Python daemon when its executor's pipe closes.  Each Worker offers
one core and ``memory``, so an application gets one executor per Worker, and has its own
work directory (``work/<app>/<executor>/stderr`` logs each task it runs) under the
cluster's directory.  ``close`` kills every process group and waits until no process
of the cluster is left (``processes``).

    with Cluster(tmp_path / "spark") as cluster:          # ready: every worker registered
        subprocess.run(["kl", "load", "t", "-o", out, "--master", cluster.url], env=cluster.env())
        cluster.kill_worker(0)                              # SIGKILL, executor included
        cluster.start_worker(0)

Drivers take ``env()``: ``SPARK_CONF_DIR`` names the cluster's ``spark-defaults.conf``
(the executors' memory and JVM options), ``SPARK_LOCAL_IP`` keeps them on loopback.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

import pyspark

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
SPARK_CLASS = os.path.join(SPARK_HOME, "bin", "spark-class")
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Short-lived JVMs on two cores: the optimizing JIT and parallel GC cost more than they save."""
START_SECONDS = 120.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def available() -> str | None:
    """Why a cluster cannot run here (for a skip), or None."""
    if not os.access(SPARK_CLASS, os.X_OK):
        return f"pyspark's {SPARK_CLASS} is missing"
    if not any(os.access(os.path.join(d, "java"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
        return "Spark needs Java, and no java is on PATH"
    return None


class Cluster:
    """A standalone Master and ``workers`` Workers (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], workers: int = 2, memory: str = "1g"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.memory = memory
        self.conf_dir = self.directory / "conf"
        self.conf_dir.mkdir(exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text(
            f"spark.executor.memory {memory}\n"
            f"spark.executor.extraJavaOptions {JVM_OPTIONS}\n"
            "spark.ui.enabled false\n"
            "spark.sql.shuffle.partitions 2\n"
            "spark.master.rest.enabled false\n"
            "spark.scheduler.minRegisteredResourcesRatio 1.0\n"
        )
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.url = ""
        self.ui = ""
        self._logs: list[IO[bytes]] = []

    def __enter__(self) -> Cluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- start

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver (or any Spark process) on this cluster."""
        env = dict(os.environ, SPARK_HOME=SPARK_HOME, SPARK_CONF_DIR=str(self.conf_dir), PYSPARK_PYTHON=sys.executable)
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env.update(extra)
        return env

    def start(self) -> None:
        """Start the Master and every Worker; return when every Worker is registered and alive."""
        self.master = self._daemon("master", [MASTER, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"])
        log = self.directory / "master.log"
        self.url = self._await(log, r"Starting Spark master at (spark://\S+)", self.master)
        self.ui = self._await(log, r"(?:MasterWebUI|Master WebUI).* at (http://\S+)", self.master)
        for i in range(len(self.workers)):
            self.start_worker(i, wait=False)
        self.wait_workers()

    def start_worker(self, i: int, *, wait: bool = True) -> None:
        """Start Worker ``i`` (again, after ``kill_worker``)."""
        work = self.work_dir(i)
        work.mkdir(exist_ok=True)
        host = self.host(i)
        args = [WORKER, "--host", host, "--port", "0", "--webui-port", "0", "--cores", "1", "--memory", self.memory]
        self.workers[i] = self._daemon(f"worker{i}", [*args, "--work-dir", str(work), self.url], host)
        if wait:
            self.wait_workers()

    def work_dir(self, i: int) -> Path:
        """Worker ``i``'s work directory: ``<app>/<executor>/`` per executor it ran."""
        return self.directory / f"worker{i}"

    @staticmethod
    def host(i: int) -> str:
        """Worker ``i``'s address: 127.0.0.<i + 2>, a host of its own to Spark (which never
        runs a speculative copy of a task on the host of a running attempt)."""
        return f"127.0.0.{i + 2}"

    def _daemon(self, name: str, args: list[str], host: str = "127.0.0.1") -> subprocess.Popen:
        log = open(self.directory / f"{name}.log", "ab")
        self._logs.append(log)
        env = self.env(SPARK_DAEMON_JAVA_OPTS=JVM_OPTIONS, SPARK_DAEMON_MEMORY="256m", SPARK_LOCAL_IP=host)
        return subprocess.Popen(
            [SPARK_CLASS, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def _await(self, log: Path, pattern: str, process: subprocess.Popen) -> str:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            found = re.search(pattern, log.read_text(errors="replace"))
            if found:
                return found.group(1).rstrip(".,")
            if process.poll() is not None:
                raise RuntimeError(f"the Spark {log.stem} exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"no {pattern!r} in {log} after {START_SECONDS:.0f} s")

    def state(self) -> dict:
        """The Master's JSON (``/json/``): workers, applications."""
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as response:
            return json.loads(response.read())

    def alive_workers(self) -> int:
        return sum(1 for w in self.state()["workers"] if w["state"] == "ALIVE")

    def wait_workers(self) -> None:
        """Until as many Workers are ALIVE at the Master as are running here."""
        want = sum(1 for w in self.workers if w is not None)
        deadline = time.monotonic() + START_SECONDS
        while self.alive_workers() < want:
            for i, w in enumerate(self.workers):
                if w is not None and w.poll() is not None:
                    raise RuntimeError(f"Spark worker {i} exited ({w.returncode}):\n{self._tail(f'worker{i}')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{want} workers not registered after {START_SECONDS:.0f} s")
            time.sleep(0.1)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until the Master runs no application (a driver's executors are gone with it)."""
        deadline = time.monotonic() + timeout
        while self.state()["activeapps"] and time.monotonic() < deadline:
            time.sleep(0.1)

    def _tail(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")[-3000:]

    # -------------------------------------------------------------- stop

    def kill_worker(self, i: int) -> None:
        """SIGKILL Worker ``i``'s process group (its executor JVM) and its executors' Python workers."""
        worker = self.workers[i]
        assert worker is not None
        doomed = descendants(worker.pid)
        _kill_group(worker.pid)
        for pid in doomed:
            _kill(pid)
        worker.wait()
        self.workers[i] = None

    def close(self) -> None:
        """Kill every process of the cluster and wait until they are gone."""
        daemons = [p for p in [*self.workers, self.master] if p is not None]
        doomed = {pid for p in daemons for pid in [p.pid, *descendants(p.pid)]}
        for p in daemons:
            _kill_group(p.pid)
        for pid in doomed:
            _kill(pid)
        for p in daemons:
            p.wait()
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in doomed) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.master, self.workers = None, [None] * len(self.workers)
        for log in self._logs:
            log.close()
        self._logs = []

    def processes(self) -> list[int]:
        """The processes of the cluster still alive (its daemons and their descendants)."""
        daemons = [p.pid for p in [*self.workers, self.master] if p is not None and p.poll() is None]
        return sorted({pid for d in daemons for pid in [d, *descendants(d)]})


# ------------------------------------------------------------------ processes


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (children, their children, ...)."""
    children = _children()
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :][:1] != b"Z"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
