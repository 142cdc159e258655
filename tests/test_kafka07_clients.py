"""Real third-party Kafka 0.7 clients from npm, unmodified, against a real ``kl serve``.

``tests/kafka07/package.json`` and its lock pin the clients: franz-kafka 0.7.5 (magic 1
messages, gzip, a Topic stream API) and kafka 0.2.3 (magic 0 messages, Kafka 0.6's
format, which Kafka 0.7 brokers served too).  They are installed once into
``.cache/npm-kafka07/<hash of the lock>`` (gitignored) with ``npm ci``; the node scripts
beside the lock drive each client's own API for one operation and print JSON.  Neither
client sends MULTIFETCH or MULTIPRODUCE (kl's own tests cover those).

Skips, saying why, when node or npm is missing or the npm registry cannot be reached;
anything a client gets wrong against the server fails.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from installs import Unavailable

import kl

from conftest import DATA
from kafka_clients import NODE, NPM, npm_install

HERE = Path(__file__).resolve().parent
CLIENTS = HERE / "kafka07"
CACHE = HERE.parent / ".cache" / "npm-kafka07"
KL = [sys.executable, "-m", "kl_cli"]
NPM_TIMEOUT = 60.0
NODE_TIMEOUT_MS = 10_000

pytestmark = pytest.mark.skipif(not (NODE and NPM), reason="node and npm are needed to run the npm Kafka 0.7 clients")


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def node_path() -> str:
    """The clients' node_modules, installed by ``npm ci`` from the lock on first use."""
    try:
        return str(npm_install(CLIENTS, CACHE, "franz-kafka", "--omit=optional", timeout=NPM_TIMEOUT))
    except Unavailable as e:
        pytest.skip(str(e))
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kl.Root]:
    r = kl.Root(tmp_path_factory.mktemp("kafka07") / "root")
    r.create_topic("kl-format", kl.TopicConfig())
    yield r
    r.close()


@pytest.fixture(scope="module")
def port(root: kl.Root, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A ``kl serve --allow-produce`` of the root on 127.0.0.1; at teardown it must stop
    cleanly on SIGTERM (it is killed otherwise, and the tests fail with its log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    env = {**os.environ, "KL_ROOT": str(root.path)}
    log = tmp_path_factory.mktemp("serve") / "stderr"
    with log.open("wb") as stderr:
        server = subprocess.Popen([*KL, "serve", "--allow-produce", "--port", str(free)], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + 20
        while True:
            if server.poll() is not None:
                pytest.fail(f"kl serve exited with {server.returncode}: {log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", free), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"kl serve did not listen within 20 s: {log.read_text()}")
                time.sleep(0.05)
        yield free
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert server.returncode == 0, f"kl serve did not stop cleanly on SIGTERM ({server.returncode}): {log.read_text()}"


def node(node_path: str, script: str, port: int, **spec: object) -> dict:
    """Run one operation of a client script; its JSON answer (a failing run fails the test)."""
    args = json.dumps({"port": port, "timeout": NODE_TIMEOUT_MS, **spec})
    env = {**os.environ, "NODE_PATH": node_path, "NODE_NO_WARNINGS": "1"}
    done = subprocess.run([NODE, str(CLIENTS / script), args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{script} {spec.get('op')} failed ({done.returncode}): {done.stderr}"
    return json.loads(done.stdout)


def b64(values: list[bytes]) -> list[str]:
    return [base64.b64encode(v).decode() for v in values]


def unb64(values: list[str]) -> list[bytes]:
    return [base64.b64decode(v) for v in values]


def create_07(root: kl.Root, name: str, **settings: int) -> None:
    root.create_topic(name, kl.TopicConfig(format="0.7", **settings))


def produce(root: kl.Root, topic: str, values: list[bytes], partition: int = 0, compression: str | None = None) -> list:
    """Append ``values`` through kl's Producer; one entry per append (a gzip message each when compressed)."""
    with kl.Producer(root, compression=compression) as p:
        return p.send_batch(topic, values, partition=partition)


def read_all(root: kl.Root, topic: str, partition: int = 0) -> list[bytes]:
    batches = kl.Consumer(root).consume(topic, [partition], values_only=True)
    return [value for batch in batches for value in batch.messages]  # type: ignore[misc]


def wait_for(root: kl.Root, topic: str, count: int, partition: int = 0) -> list[bytes]:
    """The partition's messages once it holds ``count`` (a PRODUCE has no answer to wait for)."""
    deadline = time.monotonic() + 10
    while len(values := read_all(root, topic, partition)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return values


# ----------------------------------------------------------------- franz-kafka


def test_franz_consumes_what_kl_produced_across_segments_and_partial_fetches(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "franz-read", segment_bytes=1000, max_message_bytes=1000)
    plain = [b"plain %d " % i + b"x" * (i % 37) for i in range(60)]
    zipped = [b"zipped %d" % i for i in range(20)]
    produce(root, "franz-read", plain)
    # One gzip message, last: franz-kafka unpacks it asynchronously, so messages after
    # it in the same fetch would overtake its inner ones.
    assert len(produce(root, "franz-read", zipped, compression="gzip")) == 1
    log = root.log("franz-read", 0)
    assert len(log.segments()) > 2
    end = log.offsets_before(-1, 1)[0]
    # 300-byte fetches end inside messages and at segment ends: the client keeps the
    # complete messages and asks again from the first incomplete one.
    got = node(node_path, "franz.js", port, op="consume", topic="franz-read", partition=0, offset=0, count=80, maxFetchSize=300)
    assert unb64(got["messages"]) == plain + zipped
    assert got["next"] == end


def test_franz_offsets_earliest_and_latest(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "franz-offsets", segment_bytes=200, max_message_bytes=64)
    produce(root, "franz-offsets", [b"m%02d" % i for i in range(40)])
    log = root.log("franz-offsets", 0)
    earliest = node(node_path, "franz.js", port, op="offsets", topic="franz-offsets", partition=0, time=-2, max=5)
    latest = node(node_path, "franz.js", port, op="offsets", topic="franz-offsets", partition=0, time=-1, max=100)
    assert earliest["offsets"] == [0]
    assert latest["offsets"] == log.offsets_before(-1, 100)
    assert latest["offsets"][0] == 40 * 13 and latest["offsets"][-1] == 0  # newest first: the end, each segment's start
    assert len(latest["offsets"]) == len(log.segments()) + 1


def test_franz_produces_plain_and_gzip_that_kl_reads(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "franz-write", partitions=2)
    plain = [b"from node %d" % i for i in range(25)]
    got = node(node_path, "franz.js", port, op="produce", topic="franz-write", partitions=1, messages=b64(plain))
    assert got == {"before": [0], "latest": [25 * 10 + sum(len(v) for v in plain)]}
    zipped = [b"gzip from node %d" % i for i in range(30)]
    got = node(
        node_path, "franz.js", port, op="produce", topic="franz-write", partitions=1, messages=b64(zipped), compression="gzip"
    )
    assert got["latest"][0] > got["before"][0]
    assert read_all(root, "franz-write", 0) == plain + zipped
    # Stored as the client sent them: magic 1, the second set one gzip message.
    segment = root.log("franz-write", 0).segments()[0]
    data = Path(segment.path).read_bytes()
    assert data[4:6] == b"\x01\x00"
    assert data[got["before"][0] + 4 : got["before"][0] + 6] == b"\x01\x01"
    # And the client reads back what it wrote, the gzip set unpacked.
    back = node(node_path, "franz.js", port, op="consume", topic="franz-write", partition=0, offset=0, count=55)
    assert unb64(back["messages"]) == plain + zipped


def test_franz_produces_to_every_partition(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "franz-spread", partitions=2)
    for batch in range(4):
        values = [b"batch %d message %d" % (batch, i) for i in range(5)]
        node(node_path, "franz.js", port, op="produce", topic="franz-spread", partitions=2, messages=b64(values))
    stored = read_all(root, "franz-spread", 0) + read_all(root, "franz-spread", 1)
    assert sorted(stored) == sorted(b"batch %d message %d" % (b, i) for b in range(4) for i in range(5))


def test_franz_fetch_edge_cases(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "franz-edges", partitions=2)
    produce(root, "franz-edges", [b"0123456789"] * 3)
    end = 3 * 20

    def fetch(topic: str = "franz-edges", partition: int = 0, offset: int = 0, size: int = 1000) -> dict:
        return node(node_path, "franz.js", port, op="fetch", topic=topic, partition=partition, offset=offset, maxFetchSize=size)

    assert fetch() == {"error": None, "messages": b64([b"0123456789"] * 3), "next": end}
    assert fetch(offset=end) == {"error": None, "messages": [], "next": end}  # at the log end: an empty set
    assert fetch(size=30) == {"error": None, "messages": b64([b"0123456789"]), "next": 20}  # ends inside the second
    assert fetch(size=19)["error"] == "message larger than buffer"  # not one whole message: ask with more
    assert fetch(offset=end + 20)["error"] == "OffsetOutOfRange"
    assert fetch(partition=2)["error"] == "WrongPartition"
    assert fetch(topic="no-such-topic") == {"error": None, "messages": [], "next": 0}  # Kafka 0.7: an empty set


def test_franz_fetching_a_kl_format_topic_gets_an_error(node_path: str, root: kl.Root, port: int) -> None:
    produce(root, "kl-format", [b"kl's own format"])
    got = node(node_path, "franz.js", port, op="fetch", topic="kl-format", partition=0, offset=0, maxFetchSize=1000)
    assert got == {"error": "Unknown Error 102", "messages": [], "next": 0}  # FORMAT_NOT_UNDERSTOOD, no bytes


# ----------------------------------------------------------------- kafka 0.2.3 (magic 0)


def test_kafka_client_consumes_an_imported_kafka07_segment(node_path: str, root: kl.Root, port: int) -> None:
    env = {**os.environ, "KL_ROOT": str(root.path)}
    imported = subprocess.run(
        [*KL, "topics", "import", "imported", str(DATA / "kafka-0.7" / "MagicByte0-0"), "--format", "0.7"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    got = node(node_path, "marcus.js", port, op="consume", topic="imported", partition=0, offset=0, count=100)
    assert got == {"messages": ["x" * 100] * 100, "next": 10_900}


def test_kafka_client_produces_magic0_that_kl_reads(node_path: str, root: kl.Root, port: int) -> None:
    create_07(root, "magic0")
    produce(root, "magic0", [b"from kl"])
    sent = ["one", "two", "three"]
    assert node(node_path, "marcus.js", port, op="produce", topic="magic0", partition=0, messages=sent) == {"sent": 3}
    assert wait_for(root, "magic0", 4) == [b"from kl", b"one", b"two", b"three"]
    data = Path(root.log("magic0", 0).segments()[0].path).read_bytes()
    assert data[17 + 4] == 0  # magic 0, as sent
    got = node(node_path, "marcus.js", port, op="consume", topic="magic0", partition=0, offset=17, count=3)
    assert got == {"messages": sent, "next": 17 + 3 * 9 + len("onetwothree")}


def test_kafka_client_fetching_a_kl_format_topic_gets_an_error(node_path: str, root: kl.Root, port: int) -> None:
    produce(root, "kl-format", [b"kl's own format"])
    got = node(node_path, "marcus.js", port, op="fetch", topic="kl-format", partition=0, offset=0)
    assert got == {"error": "102", "messages": []}
