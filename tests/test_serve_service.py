"""``kl serve`` as a service: its config file (``--config``), SIGHUP's reload, SIGTERM's
drain, the registration gone on every exit path, retention by the daemon
(``--retain-every``), and the systemd unit it prints — with real processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import confluent_kafka
import pytest
import trustme
from click.testing import CliRunner
from test_serve import KL, wait_for
from test_tls import ca, client_context, metadata, pems, tls_connect  # noqa: F401 - ca and pems: fixtures

import kl
from kl.log import locks
from kl.log.log import DELETED_SUFFIX
from kl.net import brokers
from kl.net.retainer import LOCK_FILE
from kl_cli.main import cli
from kl_cli.options_file import ConfigCommand
from kl_cli.serve import NOT_IN_FILE

SERVING = re.compile(r"serving \S+ on 127\.0\.0\.1:(\d+)")
KAFKA = re.compile(r"to Kafka clients on 127\.0\.0\.1:(\d+)")


@pytest.fixture
def serving(tmp_path):
    """Start ``kl serve`` subprocesses (``Serving``); those still running at the end are killed."""
    started: list[Serving] = []

    def start(root: str, log: str, *args: str, **kwargs) -> Serving:
        started.append(Serving(root, tmp_path / log, *args, **kwargs))
        return started[-1]

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()


class Serving:
    """``kl serve ARGS`` as a subprocess, its log lines in a file; ``listening`` is the
    log line's pattern that says it serves (its port the first group)."""

    def __init__(self, root: str, log: Path, *args: str, listening: re.Pattern[str] = SERVING, command: list[str] | None = None):
        self.log = log
        with open(log, "wb") as err:
            argv = command or [*KL, "--root", root, "serve", *args]
            env = {**os.environ, "KL_ROOT": root}
            self.proc = subprocess.Popen(argv, stderr=err, stdin=subprocess.DEVNULL, env=env)
        self.port = int(wait_for(lambda: self._seen(listening), "the daemon to listen", timeout=120)[1])

    def _seen(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        found = pattern.search(self.text())
        assert found or self.proc.poll() is None, f"kl serve exited with {self.proc.returncode}: {self.text()}"
        return found

    def text(self) -> str:
        return self.log.read_text()

    def wait_log(self, what: str, after: int = 0) -> str:
        """The log from offset ``after`` once it holds ``what``."""
        return wait_for(lambda: what in self.text()[after:] and self.text()[after:], f"{what!r} in the log", timeout=60)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def registered(root: kl.Root) -> list[str]:
    return os.listdir(os.path.join(root.path, brokers.BROKERS_DIR))


# ----------------------------------------------------------------- the config file


def test_every_option_is_a_key_of_the_config_file():
    serve = cli.get_command(None, "serve")  # type: ignore[arg-type]
    assert isinstance(serve, ConfigCommand)
    names = {p.name for p in serve.params if p.name not in NOT_IN_FILE and p.name != "config"}
    assert {p.name for p in serve.keys().values()} == names
    assert {"max-connections", "listener", "allow", "log-level", "retain-every", "json"} <= set(serve.keys())


@pytest.mark.parametrize(
    "body, line",
    [
        ("max-connections = 0", "max-connections: 0 is not in the range x>=1."),
        ('max-connections = "10"', "max-connections: an integer is expected, not a string '10'"),
        ("max_connections = 10", "max_connections: not an option of kl serve (did you mean max-connections?)"),
        ("kafka = 9093", "kafka: a string is expected, not an integer 9093"),
        ('listener = "tcp://x"', "listener: 'tcp://x' is not PROTOCOL://HOST:PORT (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"),
        ("allow-produce = 1", "allow-produce: a boolean (true or false) is expected, not an integer 1"),
        ('topics = "("', "topics: '(' is not a regular expression: missing ), unterminated subpattern at position 0"),
        ("list = true", "list: not an option of kl serve (did you mean listener?)"),
        ("workers = [", "not valid TOML: "),
    ],
)
def test_a_bad_config_file_is_one_line_naming_the_file_and_key(root, tmp_path, body, line):
    path = tmp_path / "serve.toml"
    path.write_text(body + "\n")
    result = CliRunner().invoke(cli, ["--root", root.path, "serve", "--config", str(path)])
    assert result.exit_code == 2
    errors = [text for text in result.output.splitlines() if text.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith(f"Error: {path}: {line}"), result.output
    assert "Traceback" not in result.output


def test_an_unreadable_config_file(root, tmp_path):
    result = CliRunner().invoke(cli, ["--root", root.path, "serve", "--config", str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert f"Error: {tmp_path / 'none.toml'}: cannot read it: No such file or directory" in result.output


def test_the_file_sets_options_and_the_command_line_wins(root, tmp_path, serving):
    root.create_topic("t")
    config = tmp_path / "serve.toml"
    config.write_text('port = 0\ntopics = "t.*"\nallow-produce = true\nallow = "127.0.0.0/8"\n')
    daemon = serving(root.path, "log", "--config", str(config), "--topics", "x.*")
    (info,) = brokers.live(root.path)
    assert (info.port, info.topics, info.produce) == (daemon.port, "x.*", True)
    assert daemon.stop() == 0


# ----------------------------------------------------------------- SIGHUP


def test_sighup_applies_what_changes_live_and_keeps_the_rest(root, tmp_path, serving):
    root.create_topic("t")
    config = tmp_path / "serve.toml"
    config.write_text("port = 0\nmax-connections = 1024\n")
    daemon = serving(root.path, "log", "--config", str(config))
    first = socket_to(daemon.port)
    config.write_text(
        'port = 0\nmax-connections = 2\ntopics = "t.*"\nallow-produce = true\nworkers = 3\nlog-level = "debug"\nacls = true\n'
    )
    mark = len(daemon.text())
    daemon.proc.send_signal(signal.SIGHUP)
    text = daemon.wait_log("log-level info -> debug", mark)
    assert f"reloaded {config}: max-connections 1024 -> 2" in text
    assert f"reloaded {config}: topics (none) -> t.*" in text
    assert f"reloaded {config}: allow-produce false -> true" in text
    assert f"reloaded {config}: kept workers 8: a change to 3 needs a restart" in text
    (info,) = brokers.live(root.path)  # the registration says what is served now
    assert (info.topics, info.produce) == ("t.*", True)
    consumed = subprocess.run([*KL, "consume", "t", "--server", f"127.0.0.1:{daemon.port}"], capture_output=True, text=True)
    assert consumed.stderr == "Error: User:ANONYMOUS may not describe topic t (kl acls)\n"  # ACLs enforced now
    more = [socket_to(daemon.port) for _ in range(2)]
    daemon.wait_log("connections open (--max-connections)", mark)  # one of the three refused
    for s in (first, *more):
        s.close()
    config.write_text("port = 0\nmax-connections = many\n")
    mark = len(daemon.text())
    daemon.proc.send_signal(signal.SIGHUP)
    text = daemon.wait_log("kept the config in use", mark)
    assert f"kept the config in use: {config}: not valid TOML" in text
    assert "reloaded" not in text
    assert daemon.stop() == 0
    assert registered(root) == []


def test_sighup_reads_the_certificates_the_file_names_and_the_allow_list(root, tmp_path, serving, pems):  # noqa: F811
    root.create_topic("t")
    config = tmp_path / "serve.toml"
    first = f'listener = ["SSL://127.0.0.1:0"]\ntls-cert = "{pems["cert"]}"\ntls-key = "{pems["key"]}"\n'
    config.write_text(first)
    daemon = serving(root.path, "log", "--config", str(config), listening=KAFKA)
    with tls_connect(daemon.port, client_context(pems)) as old:
        assert metadata(old).brokers
    other = trustme.CA()
    renewed = other.issue_cert("127.0.0.1")
    cert, key, other_ca = tmp_path / "new-cert.pem", tmp_path / "new-key.pem", tmp_path / "other-ca.pem"
    renewed.cert_chain_pems[0].write_to_path(str(cert))
    renewed.private_key_pem.write_to_path(str(key))
    other.cert_pem.write_to_path(str(other_ca))
    config.write_text(first.replace(pems["cert"], str(cert)).replace(pems["key"], str(key)))
    mark = len(daemon.text())
    daemon.proc.send_signal(signal.SIGHUP)
    text = daemon.wait_log(f"TLS certificates reloaded from {cert}", mark)
    assert f"reloaded {config}: tls-cert {pems['cert']} -> {cert}" in text
    with tls_connect(daemon.port, ssl.create_default_context(cafile=str(other_ca))) as new:
        assert metadata(new).brokers
    config.write_text(config.read_text() + 'allow = "10.0.0.0/8"\n')
    mark = len(daemon.text())
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_log("allow (none) -> 10.0.0.0/8", mark)
    refused = socket_to(daemon.port)
    daemon.wait_log("not in --allow", mark)  # loopback is no longer served
    refused.close()
    assert daemon.stop() == 0


def test_sighup_without_a_config_file_reads_the_certificates_only(root, tmp_path, serving):
    root.create_topic("t")
    daemon = serving(root.path, "log", "--port", "0")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_log("no TLS listener: nothing to reload")
    assert "SIGHUP: no config file (kl serve --config): reading the TLS certificates only" in daemon.text()
    assert daemon.stop() == 0


def socket_to(port: int):
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=10)


# ----------------------------------------------------------------- SIGTERM


def test_sigterm_answers_a_long_polling_consumer_and_exits_0_at_once(root, tmp_path, serving):
    """A fetch parked for 20 s is answered at once: the daemon is gone long before it."""
    root.create_topic("t")
    daemon = serving(root.path, "log", "--kafka", "0", "--request-timeout", "60", listening=KAFKA)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": f"127.0.0.1:{daemon.port}", "group.id": "unused", "fetch.wait.max.ms": 20000,
         "enable.auto.commit": False, "log_level": 0}
    )  # fmt: skip
    consumer.assign([confluent_kafka.TopicPartition("t", 0, confluent_kafka.OFFSET_END)])
    polling = threading.Event()

    def poll():
        while not polling.is_set():
            consumer.poll(0.2)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        time.sleep(1.5)  # its fetch is parked by then ("draining 1 connections" below says it was)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(15) == 0  # 15 s: well short of the fetch's 20
    finally:
        polling.set()
        thread.join()
        consumer.close()
    text = daemon.text()
    assert re.search(r"info draining [1-9]\d* connections \(at most 60 s\)", text), text
    assert text.splitlines()[-1].endswith(" info stopped")
    assert registered(root) == []


def test_sigterm_tells_group_members_to_find_the_next_coordinator(root, tmp_path, serving):
    root.create_topic("t")
    first = serving(root.path, "first.log", "--kafka", "0", listening=KAFKA)
    second = serving(root.path, "second.log", "--kafka", "0", listening=KAFKA)
    producer = kl.Producer(root)
    producer.send("t", b"before")
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": f"127.0.0.1:{first.port}", "group.id": "g", "auto.offset.reset": "earliest",
         "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, "reconnect.backoff.max.ms": 500, "log_level": 0}
    )  # fmt: skip
    consumer.subscribe(["t"])
    try:
        _poll_until(consumer, b"before")
        first.wait_log("coordinating group g")
        assert first.stop() == 0
        assert "no longer the coordinator of g (members are told NOT_COORDINATOR)" in first.text()
        producer.send("t", b"after")
        _poll_until(consumer, b"after")  # its group joined again at the second daemon, its coordinator now
        second.wait_log("coordinating group g")
    finally:
        consumer.close()
        producer.close()
    assert second.stop() == 0


def _poll_until(consumer: confluent_kafka.Consumer, value: bytes) -> None:
    """Poll until ``value`` comes (what was not committed may come again before it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None and message.value() == value:
            return
    raise AssertionError(f"{value!r} did not come within 60 s")


# ----------------------------------------------------------------- the registration


def test_sigint_removes_the_registration(root, tmp_path, serving):
    root.create_topic("t")
    daemon = serving(root.path, "log", "--port", "0")
    assert len(registered(root)) == 1
    assert daemon.stop(signal.SIGINT) in (130, -signal.SIGINT)
    assert registered(root) == []


INJECT = """
import json, sys
import kl.net.brokers, kl.net.retainer, kl.net.server
from kl_cli.main import main

def fail(self):
    print(json.dumps([b.pid for b in kl.net.brokers.live(sys.argv[2])]), flush=True)
    raise RuntimeError("injected")

setattr({target}, {name!r}, fail)
sys.argv = ["kl", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    "target, name, args",
    [("kl.net.server.Server", "serve_forever", ()), ("kl.net.retainer.Retainer", "start", ("--retain-every", "1h"))],
    ids=["an exception out of serve_forever", "a failure after registering"],
)
def test_a_failure_removes_the_registration(root, tmp_path, target, name, args):
    root.create_topic("t")
    code = INJECT.format(target=target, name=name)
    done = subprocess.run(
        [sys.executable, "-c", code, "--root", root.path, "serve", "--port", "0", *args], capture_output=True, timeout=60
    )
    assert len(json.loads(done.stdout)) == 1, done.stderr  # it was registered when it failed ...
    assert done.returncode == 1 and b"RuntimeError: injected" in done.stderr
    assert registered(root) == []  # ... and is no longer


# ----------------------------------------------------------------- retention by the daemon


def test_two_daemons_over_one_root_retain_it_one_at_a_time(root, tmp_path, serving):
    root.create_topic("t", kl.TopicConfig(segment_bytes=1024, max_message_bytes=512, retention_bytes=2048))
    producer = kl.Producer(root)
    for n in range(60):
        producer.send("t", b"%03d" % n + b"x" * 97)
    log = root.log("t", 0)
    args = ("--port", "0", "--retain-every", "200ms", "--log-level", "debug")
    daemons = [serving(root.path, f"{n}.log", *args) for n in range(2)]
    wait_for(lambda: sum(s.size_in_bytes for s in log.segments()) <= 2048, "retention", timeout=60)
    deleted = [sum(int(n) for n in re.findall(r"retention: t/0: deleted (\d+) segments", d.text())) for d in daemons]
    set_aside = [n for n in os.listdir(log.directory) if n.endswith(DELETED_SUFFIX)]
    assert sum(deleted) == len(set_aside) > 0  # each segment deleted once, by the daemon whose log says so
    path = os.path.join(root.path, LOCK_FILE)
    fd = os.open(path, os.O_RDWR)
    locks.lock_file(fd, path, 5)  # while another holds the lock, neither daemon retains
    try:
        marks = [len(d.text()) for d in daemons]
        for n in range(30):
            producer.send("t", b"%03d" % n + b"y" * 97)
        for d, mark in zip(daemons, marks, strict=True):
            d.wait_log("retention: skipped this round: another daemon holds", mark)
        before = [s.base_offset for s in log.segments()]
        assert all("deleted" not in d.text()[mark:] for d, mark in zip(daemons, marks, strict=True))
    finally:
        os.close(fd)
    wait_for(lambda: [s.base_offset for s in log.segments()][0] > before[0], "retention once the lock is free", timeout=60)
    for d in daemons:
        assert d.stop() == 0
    producer.close()


# ----------------------------------------------------------------- the systemd unit


def printed_unit() -> str:
    return subprocess.run([*KL, "serve", "--print-unit"], capture_output=True, check=True, text=True).stdout


def test_the_printed_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    path = tmp_path / "kl-serve.service"
    path.write_text(printed_unit())
    done = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_printed_units_command_line_serves_both_protocols(root, tmp_path, serving):
    unit = printed_unit()
    for line in ("ExecReload=/bin/kill -HUP $MAINPID", "ProtectSystem=strict", "NoNewPrivileges=yes", "ReadWritePaths=/data/kl"):
        assert line in unit.splitlines()
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    argv = shlex.split(exec_start)
    assert argv == [sys.executable, "-m", "kl_cli", "serve", "--config", "/etc/kl/serve.toml"]
    example = subprocess.run([*KL, "serve", "--print-config"], capture_output=True, check=True, text=True).stdout
    assert re.search(r"^port = 9092$", example, re.M) and re.search(r'^kafka = "9093"$', example, re.M)
    config = tmp_path / "serve.toml"
    config.write_text(example.replace("port = 9092", "port = 0").replace('kafka = "9093"', 'kafka = "0"'))
    root.create_topic("t")
    argv[argv.index("/etc/kl/serve.toml")] = str(config)
    daemon = serving(root.path, "log", command=argv, listening=KAFKA)
    assert SERVING.search(daemon.text())  # Kafka 0.7's protocol too
    assert json.loads(daemon.text().splitlines()[0])["level"] == "info"  # json = true
    assert daemon.stop() == 0
