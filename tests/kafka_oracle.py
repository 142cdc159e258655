"""Apache Kafka itself, one broker on loopback, as the oracle that ``kl serve --kafka`` is
held to (tests/test_kafka_oracle.py).

Installed by the project's files only: ``tests/kafka-oracle/pom.xml`` names Kafka's broker
and tools, and ``mvn dependency:copy-dependencies`` copies them with everything they need
from Maven Central into the gitignored ``.cache/kafka-oracle/<hash of the pom>/lib``
(about 55 MB; Maven keeps its own copy in its local repository, ``~/.m2``).  Once that
directory exists nothing is asked of Maven again: a changed pom is a new directory.
Standard library only, so that ``scripts/test`` can run this file with any python3 to
install Kafka in the background (``python3 tests/kafka_oracle.py``: silent unless it
cannot)::

    lib = install()                             # Unavailable: no java, no mvn, no registry
    broker = Broker(lib, directory)             # format, start, wait for "Kafka Server started"
    broker.bootstrap                            # "127.0.0.1:PORT"
    broker.stop()                               # SIGTERM, SIGKILL after 20 s
    tool(lib, "org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", bootstrap, ...)

The broker is KRaft's combined broker and controller of a one-node cluster, formatted
afresh in ``directory`` (``kafka.tools.StorageTool format --standalone``), started with
the ``kafka.Kafka`` main class on two free ports, topics created only when asked for.  It
dies with the process that started it (``setpriv --pdeathsig``, where util-linux has it),
so that a test run killed outright leaves no JVM behind.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from installs import Unavailable, cached_install

HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-oracle" / "pom.xml"
CACHE = HERE.parent / ".cache" / "kafka-oracle"
JAVA, MVN, SETPRIV = shutil.which("java"), shutil.which("mvn"), shutil.which("setpriv")
COPY = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
"""The goal, by its full name: Maven 3.8's own default plugin is 2.8, and a goal named by
its prefix alone fails where Maven Central is unreachable with "No plugin found for
prefix 'dependency'", which names no network."""
MVN_TIMEOUT = 600.0
"""Seconds Maven may take to copy Kafka and its dependencies (about 20 s from nothing here)."""
NETWORK_ERRORS = (
    "Could not transfer",
    "UnknownHost",
    "Unknown host",
    "Connection refused",
    "Connect timed out",
    "Read timed out",
    "Network is unreachable",
    "status code: 4",
    "status code: 5",
)
"""What Maven says when Maven Central cannot be reached or refuses (403, 5xx)."""
JVM_OPTIONS = (
    "-Xmx512m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
    "-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
)
"""A small heap; no optimizing JIT nor parallel GC threads, which cost more than they save
in a short life on two cores (as for the tests' Spark JVMs); a log of warnings and errors,
and the line that says the broker started."""
START_TIMEOUT = 90.0
"""Seconds the broker may take to answer after its JVM started (about 3 s here, alone)."""
STOP_TIMEOUT = 20.0
LOG_LINES = 30
STARTED = "Kafka Server started"
"""What kafka.Kafka logs once it serves."""
SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "log.flush.interval.messages": "9223372036854775807",
    "log.retention.ms": "-1",
}
"""server.properties but the ports and the data directory: one node, every internal
topic of one partition and one replica (created at the first group or transaction: 50
partitions by default), a group's first rebalance at once, Kafka's default durability
(page cache, no fsync per write) said out loud.  Records are kept whatever their
timestamps: the tests stamp theirs in 2023, and under the default 7 days Kafka's
retention check (30 s after the start, then every 5 min) deleted them between a
scenario's produce and its read."""


def install() -> Path:
    """The directory of Kafka's jars, copied by Maven as ``tests/kafka-oracle/pom.xml`` says
    into ``.cache/kafka-oracle/<hash of the pom>/lib`` on first use.  Raises Unavailable
    when java or mvn is missing or Maven Central cannot be reached; RuntimeError when
    Maven fails otherwise."""
    if not JAVA:
        raise Unavailable("Apache Kafka needs java (17 or newer), and no java is on PATH")
    pom = POM.read_bytes()

    def setup(work: Path) -> list[str]:
        if not MVN:
            raise Unavailable("Apache Kafka is installed by mvn, and no mvn is on PATH")
        (work / "pom.xml").write_bytes(pom)
        return [MVN, "-B", "-q", "-Dstyle.color=never", "-f", str(work / "pom.xml"), COPY, f"-DoutputDirectory={work / 'lib'}"]

    return cached_install(
        CACHE,
        pom + COPY.encode(),
        "lib",
        Path.is_dir,
        setup,
        tool="mvn",
        source="Maven Central",
        timeout=MVN_TIMEOUT,
        network_errors=NETWORK_ERRORS,
    )


def version(lib: Path) -> str:
    """Kafka's version, from its broker's jar name (kafka_2.13-4.4.0.jar)."""
    (jar,) = lib.glob("kafka_2.13-*.jar")
    return jar.stem.split("-", 1)[1]


def tool(lib: Path, main: str, *args: str, timeout: float = 60, stdin: str = "") -> str:
    """What one of Kafka's tools (its main class, e.g. ``org.apache.kafka.tools.GetOffsetShell``,
    the class behind ``kafka-get-offsets.sh``) prints on stdout, once it exited 0, given
    ``stdin``; raises AssertionError with what it said otherwise (subprocess.TimeoutExpired
    past ``timeout``)."""
    command = [str(JAVA), *JVM_OPTIONS, "-cp", str(lib / "*"), main, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, input=stdin)
    if done.returncode != 0:
        raise AssertionError(f"{main} {' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def free_port() -> int:
    """A port nothing listens on now (the broker binds it a moment later: a small race)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Security:
    """What the broker's SSL, SASL_PLAINTEXT and SASL_SSL listeners take: its certificate
    chain and key in one PEM file, the CA of client certificates (asked for, not required:
    mTLS), and the users (name: password) known to PLAIN and to both SCRAM mechanisms;
    its ACLs are StandardAuthorizer's, ``SUPER_USERS`` unbound by them."""

    pem: Path
    ca: Path
    users: dict[str, str]


SECURE = ("SSL", "SASL_PLAINTEXT", "SASL_SSL")
PRINCIPAL_RULES = r"RULE:^CN=([^,]*),.*$/$1/,DEFAULT"
"""A client certificate's principal: its subject's CN (``User:alice``), as kl's endpoint maps it too."""
SUPER_USERS = ("User:ANONYMOUS", "User:admin")
"""With ``security``, the broker's ACLs bind every principal but these: the plaintext
listener's (ANONYMOUS, which the controller's and the other tests' connections have) and admin."""
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def secure_settings(security: Security, ports: dict[str, int]) -> dict[str, str]:
    """server.properties of the secure listeners (Kafka's names: see its security docs)."""
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in security.users.items())
    plain = f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    settings = {
        "listener.security.protocol.map": SETTINGS["listener.security.protocol.map"] + "".join(f",{p}:{p}" for p in SECURE),
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(security.pem),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(security.ca),
        "ssl.client.auth": "requested",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ";".join(SUPER_USERS),
        "ssl.principal.mapping.rules": PRINCIPAL_RULES,
    }
    for listener in ("sasl_plaintext", "sasl_ssl"):
        prefix = f"listener.name.{listener}"
        settings[f"{prefix}.plain.sasl.jaas.config"] = plain
        for mechanism in MECHANISMS[1:]:
            settings[f"{prefix}.{mechanism.lower()}.sasl.jaas.config"] = scram
    return settings


class Broker:
    """Kafka's broker and controller in one JVM, its data and log under ``directory``;
    with ``security``, SSL, SASL_PLAINTEXT and SASL_SSL listeners too (``listeners``:
    each protocol's ``HOST:PORT``).  Raises AssertionError, with the end of the broker's
    log, when it does not start."""

    def __init__(self, lib: Path, directory: Path, security: Security | None = None) -> None:
        self.directory = directory
        self.log = directory / "broker.log"
        port, controller = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        ports = {"PLAINTEXT": port} | ({p: free_port() for p in SECURE} if security else {})
        self.listeners = {p: f"127.0.0.1:{n}" for p, n in ports.items()}
        advertised = ",".join(f"{p}://{address}" for p, address in self.listeners.items())
        settings = {
            **SETTINGS,
            "listeners": f"{advertised},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": advertised,
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller}",
            "log.dirs": str(directory / "data"),
            **(secure_settings(security, ports) if security else {}),
        }
        config = directory / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        java = [str(JAVA), *JVM_OPTIONS, "-cp", str(lib / "*")]
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # One argument, "--cluster-id=ID": an id may start with "-".
        format_ = [*java, "kafka.tools.StorageTool", "format", "--standalone", f"--cluster-id={cluster}", f"--config={config}"]
        for name, password in (security.users if security else {}).items():  # SCRAM credentials, made at format
            format_ += [f"--add-scram={m}=[name={name},password={password}]" for m in MECHANISMS[1:]]
        done = subprocess.run(format_, capture_output=True, text=True, timeout=START_TIMEOUT, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise AssertionError(f"kafka-storage format failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        # Dies with this process (its thread, as the kernel counts: the one starting it).
        orphaned = [str(SETPRIV), "--pdeathsig", "KILL"] if SETPRIV else []
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*orphaned, *java, "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = time.monotonic()
        while STARTED not in self.text():
            if self.proc.poll() is not None or time.monotonic() > started + START_TIMEOUT:
                self.stop()
                raise AssertionError(self.report(f"Kafka did not start within {START_TIMEOUT:g} s"))
            time.sleep(0.05)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def report(self, why: str) -> str:
        """``why``, how the JVM ended if it did, and the last lines of the broker's log."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with {code}"
        tail = "\n".join(self.text().splitlines()[-LOG_LINES:])
        return f"{why}\nthe broker ({state}; {self.log}), its log's last {LOG_LINES} lines:\n{tail}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the JVM (a test of what the clients see when the broker dies)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        """Stop it with SIGTERM (SIGKILL after 20 s); its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


if __name__ == "__main__":
    try:
        install()
    except (Unavailable, RuntimeError) as e:
        sys.exit(f"scripts/test: the Kafka oracle's tests will be skipped or fail: {e}")
