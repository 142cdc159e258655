"""Helpers for running today's Kafka clients against ``kl serve --kafka`` (tests/test_kafka_clients.py).

The clients run unmodified, each in a process of its own that prints JSON lines: the Python
ones through ``tests/kafka_driver.py``, KafkaJS through ``tests/kafkajs/driver.js``, kcat as
it is.  Everything has a deadline: a client that hangs is killed and the test fails with
what it printed.  Standard library only, so that ``scripts/test`` can run this file with
any python3 to install KafkaJS in the background (``python3 tests/kafka_clients.py``: silent
unless it cannot)::

    daemon = Daemon(root_path, log_path)        # kl serve --kafka 127.0.0.1:0 --allow-produce
    client = Client([sys.executable, DRIVER, "confluent", spec_file])
    client.line()                               # the next JSON line, or the test fails
    client.finish()                             # the rest, once it exited 0
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from installs import Unavailable, cached_install

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "kafka_driver.py"
KAFKAJS = HERE / "kafkajs"
KAFKAJS_CACHE = HERE.parent / ".cache" / "npm-kafkajs"
KL = [sys.executable, "-m", "kl_cli"]
NODE, NPM, KCAT = shutil.which("node"), shutil.which("npm"), shutil.which("kcat") or shutil.which("kafkacat")
NPM_TIMEOUT = 90.0
NPM_RETRIES = ("--fetch-retries=1", "--fetch-retry-mintimeout=1000", "--fetch-retry-maxtimeout=5000", "--fetch-timeout=30000")
NETWORK_ERRORS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH", "network")
SERVER_LOG_LINES = 20
TCP_CLOSE_WAIT = "08"
"""The state of a socket whose peer has closed its end, in /proc/net/tcp."""
CLIENT_TIMEOUT = 30.0
"""Seconds a client process may take for one operation before it is killed (its own deadline is shorter)."""


def install_kafkajs() -> Path:
    """KafkaJS's node_modules, installed by ``npm ci`` from ``tests/kafkajs``'s lock into the
    gitignored ``.cache/npm-kafkajs/<hash of the lock>`` on first use.  Raises Unavailable
    when node or npm is missing or the registry cannot be reached; RuntimeError when npm
    fails otherwise."""
    if not (NODE and NPM):
        raise Unavailable("node and npm are needed to run KafkaJS")
    return npm_install(KAFKAJS, KAFKAJS_CACHE, "kafkajs")


def npm_install(lock_dir: Path, cache: Path, package: str, *options: str, timeout: float = NPM_TIMEOUT) -> Path:
    """The node_modules of ``npm ci`` from ``lock_dir``'s package.json and lock (with
    ``options``, within ``timeout`` seconds), kept in ``cache`` (``installs.cached_install``);
    whole once ``package`` is in it."""
    assert NPM is not None
    names = ("package.json", "package-lock.json")

    def setup(work: Path) -> list[str]:
        for name in names:
            shutil.copy(lock_dir / name, work / name)
        return [NPM, "ci", "--no-audit", "--no-fund", "--ignore-scripts", *options, "--loglevel=error", *NPM_RETRIES]

    return cached_install(
        cache,
        b"".join((lock_dir / name).read_bytes() for name in names),
        "node_modules",
        lambda modules: (modules / package / "package.json").exists(),
        setup,
        tool="npm ci",
        source="the npm registry",
        timeout=timeout,
        network_errors=NETWORK_ERRORS,
    )


SETPRIV = shutil.which("setpriv")
"""util-linux's ``setpriv``: ``--pdeathsig KILL`` makes a daemon die with the test process."""


class Daemon:
    """``kl --root ROOT serve --kafka 127.0.0.1:0 --allow-produce`` as a subprocess, its log
    in a file; killed with the process that started it, even by SIGKILL (``SETPRIV``)."""

    def __init__(self, root: Path, log: Path, *args: str, address: str = "127.0.0.1:0") -> None:
        self.log = log
        with open(log, "wb") as err:
            orphaned = [SETPRIV, "--pdeathsig", "KILL"] if SETPRIV else []
            command = [*orphaned, *KL, "--root", str(root), "serve", "--kafka", address, "--allow-produce", *args]
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60  # a process start: slow on a busy machine
        while not (found := re.search(r"to Kafka clients on 127\.0\.0\.1:(\d+)", self.text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"kl serve --kafka did not listen (exit {self.proc.returncode}): {self.text()}")
            time.sleep(0.02)
        self.bootstrap = f"127.0.0.1:{found[1]}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def hung_up(self) -> list[str]:
        """The daemon's connections whose client has closed its end (sockets on its port in
        CLOSE_WAIT, from /proc/net/tcp*), as ``local -> remote`` in hex."""
        port = f":{int(self.bootstrap.rsplit(':', 1)[1]):04X}"
        found = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                for line in list(lines)[1:]:
                    local, remote, state = line.split()[1:4]
                    if local.endswith(port) and state == TCP_CLOSE_WAIT:
                        found.append(f"{local} -> {remote}")
        return found

    def settle(self, timeout: float = 20) -> None:
        """Wait until the daemon has closed every connection its clients closed: it reads a
        connection's end only after answering the request it took from it, so whatever a
        killed client had sent whole is appended by then, and a request it cut short dropped."""
        deadline = time.monotonic() + timeout
        while hung_up := self.hung_up():
            if time.monotonic() > deadline:
                raise AssertionError(f"kl serve --kafka kept {hung_up} open for {timeout:g} s: {self.text()}")
            time.sleep(0.02)

    def stop(self) -> int:
        """Stop it with SIGTERM (SIGKILL after 20 s); its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class Client:
    """A client process that prints JSON lines: each read has a deadline; a client that
    misses it is killed and the test fails with everything it printed."""

    started: list[Client] = []
    """Every client started, for a fixture to kill those a failing test left running."""

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, stdin: bytes | None = None, server_log: Path | None = None
    ) -> None:
        self.argv = argv
        self.server_log = server_log
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, env=env, start_new_session=True
        )
        Client.started.append(self)
        self.printed: list[bytes] = []
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        assert self.proc.stdin is not None
        if stdin is not None:
            self.proc.stdin.write(stdin)
            self.proc.stdin.close()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self.lines.put(line)
        self.lines.put(None)

    def report(self, why: str) -> str:
        """``why``, the command, what it printed on stdout and stderr, and the end of the server's log."""
        self.stderr.seek(0)
        printed = b"".join(self.printed).decode(errors="replace")
        command = " ".join(self.argv)
        report = f"{why}\ncommand: {command}\nstdout:\n{printed}\nstderr:\n{self.stderr.read().decode(errors='replace')}"
        if self.server_log is not None:
            lines = self.server_log.read_text(errors="replace").splitlines()[-SERVER_LOG_LINES:]
            report += f"\nthe server's log, last {SERVER_LOG_LINES} lines:\n" + "\n".join(lines)
        return report

    def raw_line(self, timeout: float = CLIENT_TIMEOUT) -> bytes | None:
        """The next line it prints (None at its end); a client silent for ``timeout`` s is killed."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise AssertionError(self.report(f"no output within {timeout:g} s: killed")) from None
        if line is not None:
            self.printed.append(line)
        return line

    def line(self, timeout: float = CLIENT_TIMEOUT) -> Any:
        """The next JSON line; the client must print one."""
        line = self.raw_line(timeout)
        if line is None:
            self.proc.wait(timeout)
            raise AssertionError(self.report(f"exited with {self.proc.returncode} before printing a line"))
        try:
            return json.loads(line)
        except ValueError:
            raise AssertionError(self.report(f"printed a line that is not JSON: {line!r}")) from None

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = CLIENT_TIMEOUT) -> bytes:
        """Wait for it to exit 0 (killed after ``timeout`` s); the rest of its stdout."""
        end = time.monotonic() + timeout
        rest = []
        while (line := self.raw_line(max(0.0, end - time.monotonic()))) is not None:
            rest.append(line)
        try:
            self.proc.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(self.report(f"did not exit within {timeout:g} s: killed")) from None
        if self.proc.returncode != 0:
            raise AssertionError(self.report(f"exited with {self.proc.returncode}"))
        return b"".join(rest)

    def kill(self) -> None:
        """SIGKILL it (and whatever it started)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


if __name__ == "__main__":
    try:
        install_kafkajs()
    except (Unavailable, RuntimeError) as e:
        sys.exit(f"scripts/test: the KafkaJS tests will be skipped or fail: {e}")


def kcat_librdkafka(kcat: str | None) -> tuple[int, ...]:
    """The version of the librdkafka ``kcat`` runs on, as ``kcat -V`` says it ((): no kcat)."""
    if not kcat:
        return ()
    said = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"librdkafka (\d+)\.(\d+)\.(\d+)", said)
    return tuple(int(n) for n in found.groups()) if found else ()


def kafkajs_modules() -> Path:
    """KafkaJS's node_modules (``install_kafkajs``), or a test's skip saying why not."""
    import pytest

    try:
        return install_kafkajs()
    except Unavailable as e:
        pytest.skip(f"KafkaJS: {e}")


def module_fixtures(name: str) -> tuple[Any, Any, Any, Any]:
    """The fixtures of a test module of Kafka clients: ``root`` (a new root under a temporary
    directory ``name``), ``daemon`` (one ``kl serve --kafka`` over it for the module, which
    must stop cleanly on SIGTERM), ``kafkajs`` (KafkaJS's modules, or a skip saying why) and
    ``no_client_left`` (every client a test started is killed after it, stopped ones too)."""
    import pytest

    import kl

    @pytest.fixture(scope="module")
    def root(tmp_path_factory: pytest.TempPathFactory) -> Any:
        path = tmp_path_factory.mktemp(name) / "root"
        path.mkdir()
        r = kl.Root(path)
        yield r
        r.close()

    @pytest.fixture(scope="module")
    def daemon(root: kl.Root, tmp_path_factory: pytest.TempPathFactory) -> Any:
        d = Daemon(root.path, tmp_path_factory.mktemp("serve") / "stderr")
        yield d
        code = d.stop()
        assert code == 0, f"kl serve --kafka did not stop cleanly on SIGTERM ({code}): {d.text()}"

    @pytest.fixture(scope="module")
    def kafkajs() -> Path:
        return kafkajs_modules()

    @pytest.fixture(autouse=True)
    def no_client_left() -> Any:
        yield
        while Client.started:
            Client.started.pop().kill()  # SIGKILL: stopped ones too

    return root, daemon, kafkajs, no_client_left
