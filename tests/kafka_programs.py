"""The Go clients (franz-go, IBM/sarama, segmentio/kafka-go) and the Java reference client
(kafka-clients), each in a small program of the tests' own that serves JSON requests, for
the differential suite (tests/test_kafka_oracle.py).

Installed by the project's files only, into gitignored caches under the hash of what pins
them (``installs.cached_install``):

- ``tests/goclients`` (go.mod and go.sum pin the clients; drive/ is the programs' shared
  request loop, franz/, sarama/ and kafkago/ one program each) is built by ``go build``
  into ``.cache/goclients/<hash>/bin``; the modules it fetches from the Go module proxy
  and go's build cache are kept in ``.cache/go`` (about 450 MB), so that a changed
  program rebuilds in seconds.
- ``tests/kafka-java`` (pom.xml names kafka-clients, of the oracle broker's version, and
  Jackson; src/Driver.java is the driver) is compiled by ``mvn compile`` and its jars
  copied by ``mvn dependency:copy-dependencies`` into ``.cache/kafka-java/<hash>/driver``
  (Maven keeps its own copy in ``~/.m2``).
- Spark's Kafka source for the installed pyspark (``spark_kafka_jars``, for
  tests/test_spark_kafka.py) is copied by ``mvn dependency:copy-dependencies`` into
  ``.cache/spark-kafka/<hash>/jars``.

Standard library only, so that ``scripts/test`` can install both in the background with
any python3 (``python3 tests/kafka_programs.py``: silent unless it cannot)::

    programs = go_programs()                    # {"franz": path, ...}; Unavailable: no go, no proxy
    franz = Program([str(programs["franz"])])   # one process, many requests
    franz.ask({"op": "produce", "bootstrap": ..., "topic": ..., "records": [...], "timeout": 15})
    java = Program(java_command())
    franz.close()

A request's JSON and the observation each program prints are described in
``tests/goclients/drive/drive.go``; the Java driver's in its header.
"""

from __future__ import annotations

import importlib.util
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
from pathlib import Path
from typing import IO, Any

from installs import Unavailable, cached_install

HERE = Path(__file__).resolve().parent
GO_MODULE = HERE / "goclients"
GO_PROGRAMS = ("franz", "sarama", "kafkago")
GO_CACHE = HERE.parent / ".cache" / "goclients"
GO_TOOL_CACHE = HERE.parent / ".cache" / "go"
JAVA_PROJECT = HERE / "kafka-java"
JAVA_CACHE = HERE.parent / ".cache" / "kafka-java"
GO, JAVA, MVN = shutil.which("go"), shutil.which("java"), shutil.which("mvn")
GO_TIMEOUT = 900.0
"""Seconds go may take to fetch the modules and build: 70 s from nothing here on an idle
machine, 4.5 minutes with the machine's two cores busy with another test run; 3 s with the
module and build caches warm."""
GO_NETWORK_ERRORS = ("dial tcp", "no such host", "i/o timeout", "connection refused", "TLS handshake timeout",
                     "network is unreachable", "Forbidden", "Bad Gateway", "Service Unavailable")  # fmt: skip
"""What go says when the module proxy cannot be reached or refuses."""
MVN_TIMEOUT = 600.0
"""Seconds Maven may take to compile the driver and copy its jars (12 to 17 s here with
Maven's plugins and Kafka's jars to fetch)."""
MAVEN_COPY = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
"""By its full name, as tests/kafka_oracle.py says why."""
MAVEN_NETWORK_ERRORS = ("Could not transfer", "UnknownHost", "Unknown host", "Connection refused", "Connect timed out",
                        "Read timed out", "Network is unreachable", "status code: 4", "status code: 5")  # fmt: skip
SPARK_KAFKA_CACHE = HERE.parent / ".cache" / "spark-kafka"
SPARK_KAFKA_JARS = ("spark-sql-kafka-0-10", "spark-token-provider-kafka-0-10", "kafka-clients", "commons-pool2")
"""Spark's Kafka source and what it needs beyond pyspark's own jars (Scala's suffix added
to Spark's two)."""
SPARK_KAFKA_METADATA = "https://repo.maven.apache.org/maven2/org/apache/spark/spark-sql-kafka-0-10_{scala}/maven-metadata.xml"
SPARK_KAFKA_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kl.tests</groupId>
  <artifactId>spark-kafka</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""
JVM_OPTIONS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
"""As the oracle broker's (tests/kafka_oracle.py): a short life on two cores."""
ANSWER_MARGIN = 15.0
"""Seconds past a request's own deadline that its program may take to answer."""


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _key(root: Path, *more: str) -> bytes:
    """What pins an install: every file under ``root``, by its path and its bytes."""
    return b"".join(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() for p in _files(root)) + "\0".join(more).encode()


def go_programs() -> dict[str, Path]:
    """The Go programs, by name (``GO_PROGRAMS``), built on first use.  Raises Unavailable
    when go is missing or the module proxy cannot be reached; RuntimeError when the build
    fails otherwise."""
    if not GO:
        raise Unavailable("the Go clients are built by go, and no go is on PATH")
    environment = {
        "GOMODCACHE": str(GO_TOOL_CACHE / "mod"),
        "GOCACHE": str(GO_TOOL_CACHE / "build"),
        "GOFLAGS": "-mod=readonly -modcacherw -buildvcs=false",
        "GOTOOLCHAIN": "local",  # the installed go, never one downloaded for go.mod's line
    }

    def setup(work: Path) -> list[str]:
        shutil.copytree(GO_MODULE, work / "src")
        settings = [f"{k}={v}" for k, v in environment.items()]
        return ["env", *settings, str(GO), "-C", "src", "build", "-o", str(work / "bin") + "/", *(f"./{p}" for p in GO_PROGRAMS)]

    made = cached_install(
        GO_CACHE,
        _key(GO_MODULE),
        "bin",
        lambda bin_: all((bin_ / p).is_file() for p in GO_PROGRAMS),
        setup,
        tool="go build",
        source="the Go module proxy",
        timeout=GO_TIMEOUT,
        network_errors=GO_NETWORK_ERRORS,
    )
    return {p: made / p for p in GO_PROGRAMS}


def java_command() -> list[str]:
    """The command that runs the Java driver, compiled on first use.  Raises Unavailable
    when java or mvn is missing or Maven Central cannot be reached; RuntimeError when Maven
    fails otherwise."""
    if not JAVA:
        raise Unavailable("the Java client needs java (17 or newer), and no java is on PATH")

    def setup(work: Path) -> list[str]:
        if not MVN:
            raise Unavailable("the Java client is built by mvn, and no mvn is on PATH")
        shutil.copytree(JAVA_PROJECT, work / "driver")
        pom = work / "driver" / "pom.xml"
        lib = work / "driver" / "lib"
        return [MVN, "-B", "-q", "-Dstyle.color=never", "-f", str(pom), "compile", MAVEN_COPY, f"-DoutputDirectory={lib}"]

    made = cached_install(
        JAVA_CACHE,
        _key(JAVA_PROJECT, MAVEN_COPY),
        "driver",
        lambda driver: (driver / "target" / "classes" / "Driver.class").is_file() and (driver / "lib").is_dir(),
        setup,
        tool="mvn",
        source="Maven Central",
        timeout=MVN_TIMEOUT,
        network_errors=MAVEN_NETWORK_ERRORS,
    )
    classpath = f"{made / 'lib' / '*'}{os.pathsep}{made / 'target' / 'classes'}"
    return [str(JAVA), *JVM_OPTIONS, "-cp", classpath, "Driver"]


def _pyspark() -> tuple[str, str]:
    """The installed pyspark's version and its Scala's binary version (of its
    scala-library jar), found without importing it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise Unavailable("Spark's Kafka source is for pyspark's Spark, and no pyspark is installed")
    jars = Path(spec.origin).parent / "jars"
    from importlib.metadata import version

    scala = [m[1] for p in jars.glob("scala-library-*.jar") if (m := re.match(r"scala-library-(\d+\.\d+)\.", p.name))]
    if not scala:
        raise RuntimeError(f"no scala-library jar in {jars}")
    return version("pyspark"), scala[0]


def _spark_kafka_version(spark: str, scala: str) -> str:
    """The connector's version for pyspark's: the same, where Maven Central has it, else the
    newest release before it of the same major version (Maven Central had no
    spark-sql-kafka-0-10 4.3.0 when pyspark 4.3.0 was out), from the artifact's
    maven-metadata.xml."""
    import urllib.error
    import urllib.request

    url = SPARK_KAFKA_METADATA.format(scala=scala)
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            listed = re.findall(r"<version>([^<]+)</version>", answer.read().decode())
    except (urllib.error.URLError, OSError) as e:
        raise Unavailable(f"cannot reach Maven Central ({url}): {e}") from None

    def number(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    released = [v for v in listed if re.fullmatch(r"\d+\.\d+\.\d+", v)]
    if spark in released:
        return spark
    older = [v for v in released if number(v) < number(spark) and number(v)[0] == number(spark)[0]]
    if not older:
        raise Unavailable(
            f"Maven Central has no spark-sql-kafka-0-10_{scala} for Spark {spark} nor an older {spark.split('.')[0]}.x"
        )
    return max(older, key=number)


def spark_kafka_jars() -> list[Path]:
    """The jars of Spark's Kafka source (``SPARK_KAFKA_JARS``) for the installed pyspark,
    fetched by mvn on first use into ``.cache/spark-kafka/<hash>/jars``.  Raises
    Unavailable when pyspark, java or mvn is missing or Maven Central cannot be reached;
    RuntimeError when Maven fails otherwise."""
    spark, scala = _pyspark()
    if not JAVA:
        raise Unavailable("Spark needs java (17 or newer), and no java is on PATH")
    if not MVN:
        raise Unavailable("Spark's Kafka source is fetched by mvn, and no mvn is on PATH")
    chosen = SPARK_KAFKA_CACHE / f"version-for-{spark}_{scala}"  # Maven Central asked once
    if not chosen.is_file():
        SPARK_KAFKA_CACHE.mkdir(parents=True, exist_ok=True)
        chosen.write_text(_spark_kafka_version(spark, scala))
    version = chosen.read_text()
    pom = SPARK_KAFKA_POM.format(scala=scala, version=version)
    names = [f"{n}_{scala}" if n.startswith("spark-") else n for n in SPARK_KAFKA_JARS]

    def setup(work: Path) -> list[str]:
        (work / "pom.xml").write_text(pom)
        copy = [
            MAVEN_COPY,
            f"-DoutputDirectory={work / 'jars'}",
            "-DincludeScope=runtime",
            "-DincludeArtifactIds=" + ",".join(names),
        ]
        return [MVN, "-B", "-q", "-Dstyle.color=never", "-f", str(work / "pom.xml"), *copy]

    def ready(jars: Path) -> bool:
        return jars.is_dir() and all(any(jars.glob(f"{n}-*.jar")) for n in names)

    made = cached_install(
        SPARK_KAFKA_CACHE,
        (pom + MAVEN_COPY + spark).encode(),
        "jars",
        ready,
        setup,
        tool="mvn",
        source="Maven Central",
        timeout=MVN_TIMEOUT,
        network_errors=MAVEN_NETWORK_ERRORS,
    )
    return sorted(made.glob("*.jar"))


class Program:
    """One of the programs as a process of its own: ``ask`` writes a request and waits for
    its answer (a program that misses the deadline is killed, and every later request
    fails).  Safe across threads: one request at a time."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.stderr = tempfile.TemporaryFile()
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=self.stderr, start_new_session=True)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.lock = threading.Lock()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            self.lines.put(line)
        self.lines.put(None)

    def said(self) -> str:
        """The end of what it wrote on stderr."""
        self.stderr.seek(0)
        return "\n".join(self.stderr.read().decode(errors="replace").splitlines()[-30:])

    def ask(self, request: dict[str, Any]) -> Any:
        """The program's answer to ``request`` (which names its own ``timeout``); raises
        AssertionError when it fails the request, exits, or is silent past the deadline."""
        name = Path(self.argv[0]).name if len(self.argv) == 1 else self.argv[-1]
        with self.lock:
            if self.proc.poll() is not None:
                raise AssertionError(f"{name} exited ({self.proc.returncode}) before {request['op']}:\n{self.said()}")
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            wait = request["timeout"] + ANSWER_MARGIN
            try:
                line = self.lines.get(timeout=wait)
            except queue.Empty:
                self.kill()
                raise AssertionError(f"{name} did not answer {request['op']} within {wait:g} s: killed\n{self.said()}") from None
            if line is None:
                raise AssertionError(f"{name} exited ({self.proc.wait()}) during {request['op']}:\n{self.said()}")
        answer = json.loads(line)
        if isinstance(answer, dict) and set(answer) == {"error"}:
            raise AssertionError(f"{name} failed {request['op']}: {answer['error']}\n{self.said()}")
        return answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def close(self) -> int:
        """End its input; its exit status (killed after 10 s)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


if __name__ == "__main__":
    failed = []
    # Spark's Kafka source matches pyspark's version: where this interpreter has none (scripts/test
    # runs this beside the virtualenv's making), the test session's spark fixture installs it.
    for what, install in (
        ("the Go clients", go_programs),
        ("the Java client", java_command),
        *([("Spark's Kafka source", spark_kafka_jars)] if importlib.util.find_spec("pyspark") else []),
    ):
        try:
            install()
        except (Unavailable, RuntimeError) as e:
            failed.append(f"scripts/test: the tests of {what} will be skipped or fail: {e}")
    if failed:
        sys.exit("\n".join(failed))
