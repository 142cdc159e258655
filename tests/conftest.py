"""Shared fixtures and small helpers for kl's library tests (leveldb style).

Helpers are plain functions so tests read as one line each::

    write(root, "t", [b"a", b"b"])          # append through a Producer
    flip_bit(path, bit)                     # damage a file in place
    shrink_to(path, size)                   # cut a file (a torn tail)
    read_all(root, "t")                     # every message of a partition
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import hypothesis
import nfslab
import pytest

import kl
from kl.log import core, flusher

from faultlib import flip_bit, shrink_to  # shared with scripts/soak

DATA = Path(__file__).resolve().parent / "data"
"""Test data shipped with the tests (see ``tests/data/README.md``)."""

KAFKA07_SEGMENT = DATA / "kafka-0.7" / "MagicByte0-0" / "00000000000000000000.kafka"
"""A segment written by Kafka 0.7: 100 messages of magic 0, 109 bytes each."""

MAX = 1 << 20
"""A max_message_bytes for in-memory message sets."""

# No wall-clock deadline per example: timing targets live in the benchmarks, and on a
# loaded 2-core machine (the NFS lab's guests beside) an example of the pure core took
# 310 ms against hypothesis's default 200 ms and failed a run whose results were right.
hypothesis.settings.register_profile("kl", deadline=None)
hypothesis.settings.load_profile("kl")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lab",
        choices=nfslab.VERSIONS,
        help="run only the tests of the NFS lab of this NFS version (those of no versioned lab go with "
        "NFSv3's, the shorter run): scripts/test runs each lab's tests in a pytest of its own, beside the others",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    version = config.getoption("--lab")
    if version is None:
        return
    kept, other = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        mine = callspec.params.get("lab", nfslab.VERSIONS[-1]) if callspec is not None else nfslab.VERSIONS[-1]
        (kept if mine == version else other).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a shell without job control (``bash
    scripts/test &``, nohup) has SIGINT ignored, and an ignored signal stays ignored across
    exec: the kl processes the tests interrupt would not see their Ctrl-C.  Handled here,
    it is the default in them."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Every Spark JVM the tests start (theirs, kl load's, the docs'): short lives on two
    # cores, where the optimizing JIT and parallel GC threads cost more than they save
    # (a kl load run: 28-30 s of CPU, 18 s with these).  spark-submit adds them silently.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def command_paths(group: click.Group | None = None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of kl (or under ``group``): (), ("topics",), ("topics", "create"), ..."""
    if group is None:
        from kl_cli.main import cli as group
    found = [path]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            found += command_paths(command, path + (name,))
        else:
            found.append(path + (name,))
    return found


# ----------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _flushed_in_its_own_test() -> Iterator[None]:
    """A test's scheduled background flushes run before it ends, not in a later test."""
    yield
    flusher.flush_pending()


@pytest.fixture(scope="session", params=["4.2", "3"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[nfslab.Lab]:
    """The NFS lab (tests/nfslab.py) of each NFS version, shared by every test that asks for it
    (a test picks one version with ``@pytest.mark.parametrize("lab", ["4.2"], indirect=True)``):
    client hosts a and b; on NFSv4.2 also host c, whose clock is 300 s ahead
    (tests/test_nfs_hosts.py)."""
    reason = nfslab.unavailable(request.param)
    if reason:
        pytest.skip(reason)
    hosts, clocks = (("a", "b", "c"), {"c": 300}) if request.param == "4.2" else (("a", "b"), {})
    with nfslab.Lab(tmp_path_factory.mktemp("nfslab"), version=request.param, hosts=hosts, clocks=clocks) as lab:
        yield lab


@pytest.fixture(scope="session")
def one_kernel_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nfslab.Lab]:
    """An NFSv4.2 lab whose hosts a and b are network namespaces of one client guest."""
    reason = nfslab.unavailable()
    if reason:
        pytest.skip(reason)
    with nfslab.Lab(tmp_path_factory.mktemp("nfslab"), one_kernel=True) as lab:
        yield lab


@pytest.fixture(params=["compiled", "pure"])
def each_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test runs once on each core (kl.log.core): in this process, and through
    ``KL_PURE`` in the processes it starts."""
    if request.param == "compiled" and core.compiled() is None:
        pytest.skip("kl's compiled core was not built here (test_core.py says why that is a failure where it can be)")
    was = core.NAME
    monkeypatch.setenv("KL_PURE", "1" if request.param == "pure" else "0")
    core.use(request.param)
    yield request.param
    core.use(was)


@pytest.fixture
def served(root: kl.Root) -> Iterator[Callable[..., tuple[Any, Any]]]:
    """start(**config): a ``kl serve --kafka`` daemon over ``root`` in a thread of the test
    (``test_kafka.Running``, the ``ServeConfig`` given) and a client of it
    (``test_kafka.Client``); stopped at the end of the test."""
    from test_kafka import Client, Running

    started: list[Running] = []

    def start(**config: Any) -> tuple[Running, Client]:
        running = Running(root, **config)
        started.append(running)
        return running, Client(running.address)

    yield start
    for running in started:
        running.stop()


def output_lines(path: str, kind: str, fields: int) -> list[list[str]]:
    """The ``fields`` fields after ``kind`` (the last one holding the rest) of each complete
    line of a child process's output file ``path`` that starts with ``kind``; none while
    the file does not exist."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return []
    complete = text[: text.rfind("\n") + 1]
    return [line.split(" ", fields)[1:] for line in complete.splitlines() if line.startswith(kind + " ")]


def run_on_a_terminal(command: list[str], env: dict[str, str], stream: str = "stdout") -> tuple[int, bytes]:
    """Run ``command`` with its ``stream`` ("stdout" or "stderr") on a pseudo-terminal and
    the other to /dev/null; its exit status and what the terminal got."""
    master, slave = pty.openpty()
    streams = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, stream: slave}
    process = subprocess.Popen(command, env=env, **streams)  # type: ignore[call-overload]
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return process.wait(30), seen


@pytest.fixture
def root(tmp_path: Path) -> kl.Root:
    r = kl.Root(tmp_path / "root", lock_timeout=30)
    yield r
    r.close()


@pytest.fixture
def topic(root: kl.Root) -> str:
    """A one-partition topic with default settings."""
    root.create_topic("t")
    return "t"


# ----------------------------------------------------------------- building messages


def v0(payload: bytes) -> bytes:
    """A Kafka 0.7 magic 0 message: length magic crc payload."""
    return struct.pack(">iBI", 1 + 4 + len(payload), 0, zlib.crc32(payload)) + payload


def v1(payload: bytes, attrs: int = 0) -> bytes:
    """A Kafka 0.7 magic 1 message: length magic attrs crc payload."""
    return struct.pack(">iBBI", 1 + 1 + 4 + len(payload), 1, attrs, zlib.crc32(payload)) + payload


def with_length(message: bytes, length: int) -> bytes:
    """``message`` with its length field replaced (body unchanged)."""
    return struct.pack(">I", length & 0xFFFFFFFF) + message[4:]


def message_set(data: bytes, offset: int = 0, *, stable: int | None = None, eof: bool = False) -> kl.MessageSet:
    """An in-memory set; by default everything in it counts as committed (stable)."""
    return kl.MessageSet(
        data, offset, max_message_bytes=MAX, stable_offset=offset + len(data) if stable is None else stable, ends_at_eof=eof
    )


def values_of(messages) -> list[bytes]:
    return [msg.value for msg in messages]


# ----------------------------------------------------------------- writing and reading topics


def write(root: kl.Root, topic: str, values, *, partition: int = 0, keys=None, timestamp: int | None = None,
          compression: str | None = None) -> list[kl.Appended]:
    """Append ``values`` as one batch (one append per chunk) through a Producer."""
    producer = kl.Producer(root, compression=compression)
    return producer.send_batch(topic, list(values), keys=keys, partition=partition, timestamp=timestamp)


def write_each(root: kl.Root, topic: str, values, *, partition: int = 0, timestamp: int | None = None) -> list[int]:
    """Append ``values`` one message per append; returns their offsets."""
    producer = kl.Producer(root)
    return [producer.send(topic, v, partition=partition, timestamp=timestamp).offset for v in values]


def read_all(root: kl.Root, topic: str, partition: int = 0, offset: int | None = None, max_bytes: int = 1 << 16):
    """Every message from ``offset`` (the log start) to the published end."""
    consumer = kl.Consumer(root)
    if offset is None:
        offset = consumer.earliest_offset(topic, partition)
    end = consumer.latest_offset(topic, partition)
    out = []
    while offset < end:
        got = list(consumer.fetch(topic, partition, offset, max_bytes))
        assert got, f"no progress at offset {offset} (end {end})"
        out.extend(got)
        offset = got[-1].next_offset
    return out


def partition_dir(root: kl.Root, topic: str, partition: int = 0) -> Path:
    return Path(root.path) / topic / str(partition)


def segment_files(root: kl.Root, topic: str, partition: int = 0) -> list[Path]:
    return sorted(p for p in partition_dir(root, topic, partition).iterdir() if p.suffix in (".kl", ".kafka"))


def active_segment(root: kl.Root, topic: str, partition: int = 0) -> Path:
    return segment_files(root, topic, partition)[-1]


# ----------------------------------------------------------------- damaging files


@contextlib.contextmanager
def partition_locked_elsewhere(root_path: str, topic: str, partition: int) -> Iterator[None]:
    """Another process holds the partition's lock for the ``with`` block."""
    code = f"import time, kl\nwith kl.Root({root_path!r}).log({topic!r}, {partition}).locked():\n"
    code += "    print('held', flush=True)\n    time.sleep(60)\n"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        yield
    finally:
        holder.kill()
        holder.wait()


def flip_byte(path: Path | str, position: int) -> None:
    """Invert every bit of one byte of a file."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def grow_by(path: Path | str, data: bytes) -> None:
    """Append raw bytes past a file's end (what a crashed writer leaves)."""
    with open(path, "ab") as f:
        f.write(data)


def flipped(data: bytes, bit: int) -> bytes:
    """``data`` with one bit inverted (same numbering as ``flip_bit``)."""
    out = bytearray(data)
    out[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(out)


__all__ = [
    "DATA", "KAFKA07_SEGMENT", "MAX", "active_segment", "flip_bit", "flip_byte", "flipped", "grow_by",
    "message_set", "partition_dir", "read_all", "segment_files", "shrink_to", "v0", "v1", "values_of",
    "with_length", "write", "write_each",
]


SPARK_KAFKA_MISSING: list[Exception] = []
"""Why the ``spark`` session has no Kafka source, if it has none."""


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole test run (start-up takes seconds)."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java, and no java is on PATH")
    from kl.spark.session import session

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "1g"}
    # Spark's Kafka source on the classpath, for tests/test_spark_kafka.py: installed by
    # tests/kafka_programs.py (in scripts/test's background); why not, kept for those tests.
    import kafka_programs
    from installs import Unavailable

    try:
        conf["spark.jars"] = ",".join(str(p) for p in kafka_programs.spark_kafka_jars())
    except (Unavailable, RuntimeError) as e:
        SPARK_KAFKA_MISSING.append(e)
    spark = session("local[2]", app_name="kl-tests", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


class SparkGateway:
    """A Spark JVM that the processes a test starts (``kl load``, a Python script) use,
    as they would under ``spark-submit``, instead of starting one each: ``env`` makes
    pyspark connect to it.  One process at a time runs a SparkContext in it (``kl load``
    stops its own; ``stop_context`` ends one a process left)."""

    def __init__(self) -> None:
        from pyspark import SparkConf
        from pyspark.java_gateway import launch_gateway

        from kl.spark.session import quiet_conf

        settings = {"spark.master": "local[2]", "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
        self.gateway = launch_gateway(SparkConf().setAll([*settings.items(), *quiet_conf().items()]))
        parameters = self.gateway.gateway_parameters
        self.env = {"PYSPARK_GATEWAY_PORT": str(parameters.port), "PYSPARK_GATEWAY_SECRET": parameters.auth_token}

    def stop_context(self) -> None:
        session = self.gateway.jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
        if session.isDefined():
            session.get().stop()

    def close(self) -> None:
        self.gateway.shutdown()
        self.gateway.proc.stdin.close()  # the JVM exits when its standard input ends
        self.gateway.proc.wait()


@pytest.fixture(scope="session")
def spark_gateway() -> Iterator[SparkGateway]:
    """One Spark JVM for the test run's ``kl load`` processes (a JVM start takes seconds)."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs Java, and no java is on PATH")
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the JVM's Python workers, its source lookup too
    gateway = SparkGateway()
    yield gateway
    gateway.close()
