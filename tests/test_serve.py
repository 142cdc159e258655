"""``kl serve``: Kafka 0.7's requests through a real server on 127.0.0.1, its safety bounds
against hostile input, and the daemon's life (registration, --list, SIGTERM)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import kl
from kl.log.messageset import frame
from kl.log.retention import retain
from kl.net import brokers, server, wire
from kl.net.daemon import Daemon as InProcess
from kl.net.server import ServeConfig
from kl.net.wire import Fetch
from kl_cli.main import cli

from conftest import read_all, write

KL = [sys.executable, "-m", "kl_cli"]
STARTED: list[subprocess.Popen[bytes]] = []
MAX = 1 << 20


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test():
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(check, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


class Running:
    """A ``Server`` in a thread of the test process."""

    def __init__(self, root: kl.Root, **config):
        self.server = InProcess(root, ServeConfig(port=0, **config))
        self.address = ("127.0.0.1", self.server.port)
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def connect(self, hello: bool = True) -> wire.Connection:
        return wire.Connection(self.address, timeout=10, hello=hello)

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def running(root):
    started: list[Running] = []

    def start(**config) -> Running:
        started.append(Running(root, **config))
        return started[-1]

    yield start
    for r in started:
        r.stop()


class Daemon:
    """``kl serve`` as a subprocess, its log lines in a file."""

    def __init__(self, root: kl.Root, log: Path, *args: str):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen([*KL, "--root", root.path, "serve", "--port", "0", *args], stderr=err)
        STARTED.append(self.proc)
        found = wait_for(self._listening, "the daemon to listen", timeout=120)  # a process start: slow on a busy machine
        self.address = ("127.0.0.1", int(found[1]))

    def _listening(self) -> re.Match[str] | None:
        found = re.search(r"serving \S+ on 127\.0\.0\.1:(\d+)", self.text())
        assert found or self.proc.poll() is None, f"kl serve exited with {self.proc.returncode}: {self.text()}"
        return found

    def text(self) -> str:
        return self.log.read_text()

    def rss_kb(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])

    def connect(self, hello: bool = True) -> wire.Connection:
        return wire.Connection(self.address, timeout=10, hello=hello)


def values(payload, offset: int = 0) -> list[bytes]:
    return [m.value for m in kl.MessageSet(bytes(payload), offset, max_message_bytes=MAX)]


def stored(root: kl.Root, topic: str, partition: int) -> list[bytes]:
    return [m.value for m in read_all(root, topic, partition)]


def fetch(conn: wire.Connection, topic: str, partition: int, offset: int, max_bytes: int = 1 << 16) -> memoryview:
    return conn.call(wire.FETCH, wire.fetch_body(Fetch(topic, partition, offset, max_bytes)))


def raw(conn: wire.Connection, kind: int, body: bytes) -> tuple[int, bytes]:
    conn.send(kind, body)
    code, payload = conn.receive()
    return code, bytes(payload)


def offsets(conn: wire.Connection, topic: str, partition: int, time_ms: int) -> list[int]:
    reader = wire.Reader(conn.call(wire.OFFSETS, wire.offsets_body(topic, partition, time_ms, 10)))
    return [reader.int64() for _ in range(reader.int32())]


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF or reset)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def three(root) -> list[list[bytes]]:
    """Topic ``t`` of 3 partitions, 100 messages each."""
    root.create_topic("t", kl.TopicConfig(partitions=3))
    data = [[b"p%d-%03d" % (p, i) for i in range(100)] for p in range(3)]
    for p, vs in enumerate(data):
        write(root, "t", vs, partition=p)
    return data


# ----------------------------------------------------------------- requests


def test_fetch_multifetch_offsets_topics(root, running, three):
    r = running()
    with r.connect() as c:
        assert c.server == "kl"
        got, offset = [], 0
        while len(got) < 100:  # fetches may end inside a message: the reader resumes at the last whole one
            msgs = list(kl.MessageSet(bytes(fetch(c, "t", 1, offset, 500)), offset, max_message_bytes=MAX))
            got += [m.value for m in msgs]
            offset = msgs[-1].next_offset
        assert got == three[1]
        end = root.log("t", 1).log_end_offset
        assert offset == end and bytes(fetch(c, "t", 1, end)) == b""  # at the log end: an empty set
        with pytest.raises(kl.OffsetOutOfRange) as e:
            fetch(c, "t", 1, end + 1)
        assert e.value.log_end_offset == end

        body = wire.multifetch_body([Fetch("t", p, 0, 1 << 16) for p in (2, 0, 1)])
        reader = wire.Reader(c.call(wire.MULTIFETCH, body))
        for p in (2, 0, 1):
            size, code = reader.unpack(wire.HEAD)
            assert (code, values(reader.take(size - 2))) == (0, three[p])
        reader.done()

        assert offsets(c, "t", 0, -1) == [end] and offsets(c, "t", 0, -2) == [0]
        reader = wire.Reader(c.call(wire.TOPICS, b""))
        assert reader.int32() == 1 and reader.string() == "t"
        assert json.loads(reader.string())["partitions"] == 3


def kafka_offset(conn: wire.Connection, topic: str, partition: int, offset: int) -> int:
    return wire.Reader(conn.call(wire.KAFKA_OFFSET, wire.partition_int64_body(topic, partition, offset))).int64()


def test_kafka_offset_names_the_kafka_offset_of_a_message_and_of_the_log_end(root, running):
    root.create_topic("k", kl.TopicConfig(partitions=1))
    write(root, "k", [b"a", b"b"])
    batch = write(root, "k", [b"z%d" % i for i in range(5)], compression="zstd")[0].offset
    write(root, "k", [b"c"])
    log = root.log("k", 0)
    r = running()
    with r.connect() as c:
        assert c.version == wire.VERSION >= 3  # (3: KAFKA_OFFSET)
        assert kafka_offset(c, "k", 0, 0) == 0
        assert kafka_offset(c, "k", 0, batch) == 2  # its first inner message's
        assert kafka_offset(c, "k", 0, batch + 3) == 7  # inside the batch: the next message's
        assert kafka_offset(c, "k", 0, log.log_end_offset) == 8
        with pytest.raises(kl.OffsetOutOfRange):
            kafka_offset(c, "k", 0, log.log_end_offset + 1)
        with pytest.raises(kl.TopicNotFound):
            kafka_offset(c, "k", 1, 0)


def test_a_fetch_never_spans_two_segments(root, running):
    root.create_topic("s", kl.TopicConfig(segment_bytes=4096, max_message_bytes=1024))
    write(root, "s", [bytes([65 + i % 26]) * 200 for i in range(100)])
    bases = [s.base_offset for s in root.log("s", 0).segments()]
    assert len(bases) > 3
    r = running()
    with r.connect() as c:
        assert len(fetch(c, "s", 0, 0, 1 << 20)) == bases[1]
        assert len(fetch(c, "s", 0, bases[1], 1 << 20)) == bases[2] - bases[1]


def multifetch(conn: wire.Connection, fetches: list[Fetch]) -> list[tuple[int, bytes]]:
    reader = wire.Reader(conn.call(wire.MULTIFETCH, wire.multifetch_body(fetches)))
    found = []
    for _ in fetches:
        size, code = reader.unpack(wire.HEAD)
        found.append((code, bytes(reader.take(size - 2))))
    reader.done()
    return found


def many_segments(root: kl.Root, name: str = "s", count: int = 60) -> list[int]:
    """A topic of ``count`` full 4 KiB segments (and an active one); their base offsets."""
    root.create_topic(name, kl.TopicConfig(segment_bytes=4096, max_message_bytes=1024))
    with kl.Producer(root) as producer:
        for k in range(count):
            producer.send_batch(name, [b"%03d-%02d" % (k, i) * 40 for i in range(12)], partition=0)
    bases = [s.base_offset for s in root.log(name, 0).segments()]
    assert len(bases) == count
    return bases


def test_a_multifetch_past_the_file_bound_opens_the_rest_in_turn(root, running):
    bases = many_segments(root)
    fetches = [Fetch("s", 0, base, 1 << 20) for base in bases[::-1] + bases]
    assert len(fetches) > 2 * server.FILES_PER_CONNECTION
    local = kl.Consumer(root)
    r = running()
    with r.connect() as c:
        assert multifetch(c, fetches) == [(0, local.fetch("s", 0, f.offset, f.max_bytes).buffer) for f in fetches]


def slow_reader(address: tuple[str, int]) -> socket.socket:
    """A kl connection that takes little at a time: an answer to it waits, parked.
    Its HELLO is answered and read."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(address)
    s.sendall(wire.request(wire.HELLO, wire.INT16.pack(wire.VERSION) + wire.string("slow")))
    assert answer(s)[0] == 0  # HELLO's: what arrives next answers the caller's request
    return s


def readable(s: socket.socket) -> bool:
    """Whether ``s`` has bytes to read now (poll: a test process may hold descriptors
    past select's 1024)."""
    waiting = select.poll()
    waiting.register(s, select.POLLIN)
    return bool(waiting.poll(0))


def answer(s: socket.socket) -> tuple[int, bytes]:
    """The next answer on a raw socket: its code and payload."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            assert chunk, "closed in the middle of an answer"
            data += chunk
        return data

    size, code = wire.HEAD.unpack(exactly(wire.HEAD.size))
    return code, exactly(size - 2)


def test_an_answer_parked_past_the_file_bound_survives_retention_setting_its_segments_aside(root, running):
    bases = many_segments(root)
    r = running()
    expected = [kl.Consumer(root).fetch("s", 0, base, 1 << 20).buffer for base in bases[:-1]]
    with slow_reader(r.address) as s:
        s.sendall(wire.request(wire.MULTIFETCH, wire.multifetch_body([Fetch("s", 0, b, 1 << 20) for b in bases[:-1]])))
        wait_for(lambda: readable(s), "the answer to begin")
        deleted = retain(root.log("s", 0), max_age_ms=0, max_bytes=1, delete_delay=3600).deleted
        assert len(deleted) == len(bases) - 1  # every segment the answer reads, set aside
        code, payload = answer(s)
    assert code == 0
    reader = wire.Reader(payload)
    for data in expected:
        size, part_code = reader.unpack(wire.HEAD)
        assert (part_code, bytes(reader.take(size - 2))) == (0, data)
    reader.done()


def big(root: kl.Root) -> list[Fetch]:
    """Topic "big" of 1 MB; 1,000 fetches of 1 GiB each from its start."""
    root.create_topic("big")
    write(root, "big", [os.urandom(10_000) for _ in range(100)])
    return [Fetch("big", 0, 0, 1 << 30)] * 1000


def test_an_answer_not_taken_within_the_request_timeout_is_dropped_with_its_files(root, running, caplog):
    fetches = big(root)
    r = running(request_timeout=0.5)
    with slow_reader(r.address) as s:
        s.sendall(wire.request(wire.MULTIFETCH, wire.multifetch_body(fetches)))
        wait_for(lambda: any("response not taken within the request timeout" in m for m in caplog.messages), "the drop")
        assert not r.server._connections
    with r.connect() as c:
        assert len(values(fetch(c, "big", 0, 0, 1 << 20))) == 100


def test_a_slow_reader_that_keeps_taking_bytes_gets_its_whole_answer_past_the_request_timeout(root, running, caplog):
    """The timeout counts idleness: 6 MB (more than the socket buffers hold) read a
    little at a time over seconds, past a request timeout of 0.5 s, comes whole."""
    fetches = big(root)[:6]
    r = running(request_timeout=0.5)
    with slow_reader(r.address) as s:
        s.sendall(wire.request(wire.MULTIFETCH, wire.multifetch_body(fetches)))
        got = bytearray()
        started = time.monotonic()
        while len(got) < 4 or len(got) < 4 + struct.unpack_from(">i", got)[0]:
            chunk = s.recv(256 << 10)
            assert chunk, f"closed after {len(got)} bytes, {time.monotonic() - started:.1f} s: {caplog.messages}"
            got += chunk
            time.sleep(0.002)
        took = time.monotonic() - started
    assert len(got) > 6_000_000 and took > 1.5, (len(got), took)  # whole, and well past the timeout
    assert not any("not taken" in m for m in caplog.messages)


def test_clients_that_never_read_hold_few_files_and_no_worker(root, tmp_path):
    """8 clients ask for 1,000 fetches of 1 GiB each and never read: their answers wait
    with a bounded number of open files, and a ninth client is answered at once."""
    fetches = big(root)
    daemon = Daemon(root, tmp_path / "log")
    base_files = len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))
    hogs = []
    for _ in range(8):
        s = slow_reader(daemon.address)
        s.sendall(wire.request(wire.MULTIFETCH, wire.multifetch_body(fetches)))
        hogs.append(s)
    for s in hogs:
        wait_for(lambda s=s: readable(s), "the answer to begin")
    started = time.monotonic()
    with daemon.connect() as ninth:
        assert len(values(fetch(ninth, "big", 0, 0, 1 << 20))) == 100
    assert time.monotonic() - started < 10  # generous: it used to wait for the request timeout (30 s)
    open_files = len(os.listdir(f"/proc/{daemon.proc.pid}/fd")) - base_files
    assert open_files <= 8 * (1 + server.FILES_PER_CONNECTION + 1)  # socket, parked files, the one being sent
    for s in hogs:
        s.close()
    wait_for(lambda: len(os.listdir(f"/proc/{daemon.proc.pid}/fd")) <= base_files, "the parked answers' files to close")
    assert daemon.proc.poll() is None


def test_kafka07_connection_gets_kafka07_answers(root, running, three):
    r = running()
    with r.connect(hello=False) as c:
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("nope", 0, 0, 100))) == (wire.NO_ERROR, b"")
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("t", 0, 0, 100)))[0] == wire.FORMAT_NOT_UNDERSTOOD
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("t", 7, 0, 100))) == (wire.WRONG_PARTITION, b"")
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("t", 0, 0, -1))) == (wire.INVALID_FETCH_SIZE, b"")
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("../t", 0, 0, 100))) == (wire.UNKNOWN, b"")
        assert raw(c, wire.OFFSETS, wire.offsets_body("nope", 0, -1, 5)) == (0, wire.INT32.pack(1) + wire.INT64.pack(0))
        assert raw(c, wire.OFFSETS, wire.offsets_body("t", 0, -2, 5)) == (0, wire.INT32.pack(1) + wire.INT64.pack(0))
    with r.connect() as c:  # the same questions on a kl connection: kl's errors
        with pytest.raises(kl.TopicNotFound):
            fetch(c, "nope", 0, 0)
        with pytest.raises(kl.TopicNotFound):
            fetch(c, "t", 7, 0)
        assert raw(c, wire.FETCH, wire.fetch_body(Fetch("t", 0, 0, -1)))[0] == wire.INVALID_FETCH_SIZE


def test_topic_names_that_leave_the_root_are_refused(root, running, three, tmp_path):
    outside = kl.Root(tmp_path / "outside")
    outside.create_topic("secret")
    write(outside, "secret", [b"do not serve"])
    os.symlink(os.path.join(outside.path, "secret"), os.path.join(root.path, "link"))
    r = running()
    names = ["../outside/secret", "..", ".", "a/b", ".groups", ".locks", "x" * 300, "", "link", "t\0"]
    with r.connect() as c:
        for name in names:
            with pytest.raises(kl.InvalidTopicName):
                fetch(c, name, 0, 0)
    with r.connect(hello=False) as c:
        for name in names:
            assert raw(c, wire.FETCH, wire.fetch_body(Fetch(name, 0, 0, 100))) == (wire.UNKNOWN, b"")
        c.send(wire.FETCH, b"\x00\x02\xff\xfe" + wire.PARTITION_OFFSET_SIZE.pack(0, 0, 100))  # not UTF-8
        assert closed(c.sock)
    with r.connect() as c:
        assert bytes(fetch(c, "t", 0, 0, 12))  # still serving


def test_topics_regex_limits_what_is_served(root, running, three):
    root.create_topic("other")
    r = running(topics=re.compile("t|u.*"))
    with r.connect() as c:
        reader = wire.Reader(c.call(wire.TOPICS, b""))
        assert reader.int32() == 1 and reader.string() == "t"
        with pytest.raises(kl.KlError, match="not served here"):
            fetch(c, "other", 0, 0)


# ----------------------------------------------------------------- produce


def test_produce_is_off_unless_allowed(root, running, three):
    r = running()
    data = frame([b"x"], 0)
    with r.connect() as c:
        with pytest.raises(kl.KlError, match="allow-produce"):
            c.call(wire.APPEND, wire.append_body("t", 0, data, 1, False))
    with r.connect(hello=False) as c:
        c.send(wire.PRODUCE, wire.produce_body(wire.Produce("t", 0, data)))
        assert closed(c.sock)
    assert root.log("t", 0).log_end_offset == len(b"".join(frame([v], 0) for v in three[0]))
    assert stored(root, "t", 0) == three[0]


def test_produce_appends_and_a_bad_set_is_refused_whole(root, running, three):
    r = running(allow_produce=True)
    ends = [root.log("t", p).log_end_offset for p in range(3)]
    good, bad = frame([b"a", b"b"], 0), bytearray(frame([b"c", b"d"], 0))
    bad[-1] ^= 1
    with r.connect() as c:
        offset = wire.INT64.unpack(c.call(wire.APPEND, wire.append_body("t", 0, good, 2, True)))[0]
        assert offset == ends[0]
        ends[0] += len(good)
        with pytest.raises(kl.InvalidMessageSet):
            c.call(wire.APPEND, wire.append_body("t", 1, bytes(bad), 2, False))
        with pytest.raises(kl.KlError, match="holds 2 messages, not 3"):
            c.call(wire.APPEND, wire.append_body("t", 1, good, 3, False))
    with r.connect(hello=False) as c:  # one good set and one bad: neither appended
        c.send(
            wire.MULTIPRODUCE,
            wire.INT16.pack(2)
            + wire.produce_body(wire.Produce("t", 2, good))
            + wire.produce_body(wire.Produce("t", 2, bytes(bad))),
        )
        assert closed(c.sock)
    assert [root.log("t", p).log_end_offset for p in range(3)] == ends
    with r.connect(hello=False) as c:
        for _ in range(30):  # Kafka 0.7's partition -1: a random one
            c.send(wire.PRODUCE, wire.produce_body(wire.Produce("t", -1, frame([b"r"], 0))))
        assert raw(c, wire.OFFSETS, wire.offsets_body("t", 0, -1, 1))[0] == 0  # answered after the produces
    grown = [root.log("t", p).log_end_offset - ends[p] for p in range(3)]
    assert sum(grown) == 30 * len(frame([b"r"], 0)) and all(grown)
    assert stored(root, "t", 0)[100:102] == [b"a", b"b"]


def test_produce_through_the_server_interleaves_with_a_local_producer(root, running):
    root.create_topic("i")
    r = running(allow_produce=True)
    script = (
        "import sys, kl\np = kl.Producer(kl.Root(sys.argv[1]))\nfor i in range(300): p.send('i', b'local-%d' % i, partition=0)\n"
    )
    local = subprocess.Popen([sys.executable, "-c", script, root.path])
    STARTED.append(local)
    with r.connect() as c:
        for i in range(300):
            c.call(wire.APPEND, wire.append_body("i", 0, frame([b"remote-%d" % i], 0), 1, False))
    assert local.wait(30) == 0
    got = stored(root, "i", 0)
    assert sorted(got) == sorted([b"local-%d" % i for i in range(300)] + [b"remote-%d" % i for i in range(300)])
    assert [v for v in got if v.startswith(b"remote")] == [b"remote-%d" % i for i in range(300)]


# ----------------------------------------------------------------- many clients, hostile clients


def test_100_concurrent_consumers_each_read_everything(root, running):
    root.create_topic("c", kl.TopicConfig(partitions=2))
    expected = [[b"%d-%05d-" % (p, i) + b"v" * 80 for i in range(1000)] for p in range(2)]
    for p in range(2):
        write(root, "c", expected[p], partition=p)
    r = running(workers=8)
    results: list[object] = []

    def consume() -> None:
        try:
            with r.connect() as c:
                got = []
                for p in range(2):
                    offset, mine = 0, []
                    while True:
                        msgs = list(kl.MessageSet(bytes(fetch(c, "c", p, offset, 32 << 10)), offset, max_message_bytes=MAX))
                        if not msgs:
                            break
                        mine += [m.value for m in msgs]
                        offset = msgs[-1].next_offset
                    got.append(mine)
                results.append(got == expected)
        except Exception as e:  # reported below
            results.append(e)

    threads = [threading.Thread(target=consume) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 100


def test_allow_serves_only_the_networks_named(root, running, three, caplog):
    r = running(allow=(ipaddress.ip_network("127.0.0.2/32"),))
    with caplog.at_level(logging.WARNING, logger="kl.serve"):
        refused = socket.socket()
        refused.bind(("127.0.0.1", 0))
        refused.connect(r.address)
        refused.settimeout(10)
        assert closed(refused)
        served = socket.create_connection(r.address, timeout=10, source_address=("127.0.0.2", 0))
        served.sendall(wire.request(wire.HELLO, wire.INT16.pack(1) + wire.string("test")))
        assert served.recv(4096)[4:6] == b"\0\0"
        served.close()
        refused.close()
    assert f"refused 127.0.0.1:{refused_port(caplog)}: not in --allow" in caplog.text


def refused_port(caplog) -> str:
    return re.search(r"refused 127\.0\.0\.1:(\d+)", caplog.text)[1]


def test_connections_beyond_the_cap_are_refused(root, running, three):
    r = running(max_connections=5)
    conns = [r.connect() for _ in range(5)]
    extra = socket.create_connection(r.address, timeout=10)
    assert closed(extra)
    conns.pop().close()
    wait_for(lambda: _served(r), "a place to free up")
    for c in conns:
        assert bytes(fetch(c, "t", 0, 0, 12))
        c.close()


def _served(r: Running) -> bool:
    try:
        with r.connect():
            return True
    except (kl.KlError, OSError):
        return False


def test_malformed_requests_and_oversize_prefixes_leave_it_serving_in_bounded_memory(root, three, tmp_path):
    daemon = Daemon(root, tmp_path / "log", "--workers", "4")
    legit = daemon.connect()
    for _ in range(50):
        assert len(values(fetch(legit, "t", 0, 0))) == 100
    before = daemon.rss_kb()
    rng = random.Random(9)
    sizes = [0, 1, -1, -(1 << 31), (1 << 31) - 1, (1 << 20) + 1, 1 << 30]
    for i in range(10_000):
        kind = rng.choice((*wire.NAMES, rng.randrange(-32768, 32768)))
        choice = i % 5
        if choice == 0:  # a length prefix too big, negative or too small
            data = struct.pack(">i", rng.choice(sizes)) + os.urandom(rng.randrange(0, 64))
        elif choice == 1:  # random bytes
            data = os.urandom(rng.randrange(1, 200))
        elif choice == 2:  # a well-framed request with a random body
            data = wire.request(kind, os.urandom(rng.randrange(0, 100)))
        elif choice == 3:  # a fetch with a hostile field
            topic = rng.choice(["t", "../t", "", "x" * 249, "nope"])
            fields = (rng.randrange(-5, 5), rng.choice([-1, 0, 1 << 62, -(1 << 63)]), rng.choice([-1, 0, (1 << 31) - 1]))
            data = wire.request(wire.FETCH, wire.string(topic) + wire.PARTITION_OFFSET_SIZE.pack(*fields))
        else:  # cut off in the middle
            data = wire.request(wire.MULTIFETCH, wire.INT16.pack(32767) + os.urandom(50))[: rng.randrange(1, 40)]
        with socket.create_connection(daemon.address, timeout=10) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
            s.sendall(data)
        if i % 1000 == 999:
            assert values(fetch(legit, "t", 0, 0)) == three[0]
    hoarders = [socket.create_connection(daemon.address, timeout=10) for _ in range(20)]
    for s in hoarders:  # a request announced as 1 GiB, and 4 MiB of it sent: nothing of it is kept
        with contextlib.suppress(OSError):
            s.sendall(struct.pack(">i", 1 << 30) + bytes(4 << 20))
    assert all(closed(s) for s in hoarders)
    assert values(fetch(legit, "t", 2, 0)) == three[2]
    assert daemon.rss_kb() - before < 30_000
    assert daemon.proc.poll() is None
    lines = daemon.text().splitlines()
    assert any(f"request of {1 << 30} bytes refused (limit {1 << 20})" in line for line in lines)
    assert all(re.match(r"\d{4}-\d\d-\d\dT\S+Z (info|warning) ", line) for line in lines), [
        line for line in lines if not re.match(r"\d{4}-\d\d-\d\dT\S+Z (info|warning) ", line)
    ][:3]
    legit.close()


def test_idle_connections_are_closed_while_a_client_is_served(root, three, tmp_path):
    daemon = Daemon(root, tmp_path / "log", "--idle-timeout", "1", "--json")
    idle = [socket.create_connection(daemon.address, timeout=10) for _ in range(200)]
    legit = daemon.connect()
    start = time.monotonic()
    while time.monotonic() - start < 2.5:
        assert values(fetch(legit, "t", 1, 0)) == three[1]
        time.sleep(0.1)
    assert all(closed(s) for s in idle)
    for s in idle:
        s.close()
    lines = [json.loads(line) for line in daemon.text().splitlines()]
    assert sum("idle for 1 s" in line["message"] for line in lines) == 200
    assert values(fetch(legit, "t", 1, 0)) == three[1]
    legit.close()


# ----------------------------------------------------------------- the daemon


def test_sigterm_finishes_the_response_under_way_and_exits_0(root, tmp_path):
    root.create_topic("big")
    chunk = os.urandom(60_000)
    write(root, "big", [chunk] * 300)
    end = root.log("big", 0).log_end_offset
    daemon = Daemon(root, tmp_path / "log")
    with daemon.connect() as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        c.send(wire.FETCH, wire.fetch_body(Fetch("big", 0, 0, end)))
        size, code = wire.HEAD.unpack(c._exactly(6))
        assert (size, code) == (end + 2, 0)
        time.sleep(0.3)  # most often the answer is parked by then; else the stop waits for its worker: the same end
        daemon.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _refused(daemon.address), "the daemon to stop accepting", timeout=60)
        payload = c._exactly(end)
        assert len(values(payload)) == 300
        assert closed(c.sock)
    assert daemon.proc.wait(60) == 0
    assert daemon.text().splitlines()[-1].endswith(" info stopped")


def _refused(address) -> bool:
    """Whether connections to ``address`` are no longer accepted: refused, or reset while
    connecting (the listener closed with this one still in its queue, never accepted)."""
    try:
        socket.create_connection(address, timeout=1).close()
        return False
    except (ConnectionRefusedError, ConnectionResetError):
        return True


def test_stop_after_the_loop_ended_is_harmless(root):
    """``stop`` sets the flag, then wakes the loop: the loop may see the flag and end
    first (a second SIGTERM likewise comes after it ended)."""
    r = Running(root)
    r.stop()
    r.server.stop()
    r.server.stop()


def test_registration_list_and_a_dead_registration(root, three, tmp_path):
    daemon = Daemon(root, tmp_path / "log", "--topics", "t.*", "--allow-produce")
    address = f"127.0.0.1:{daemon.address[1]}"
    listed = subprocess.run([*KL, "--root", root.path, "serve", "--list"], capture_output=True, check=True)
    assert listed.stdout.decode() == address + "\n"
    as_json = subprocess.run([*KL, "--root", root.path, "serve", "--list", "--json"], capture_output=True, check=True)
    found = json.loads(as_json.stdout)
    assert (found["address"], found["pid"], found["topics"], found["produce"]) == (address, daemon.proc.pid, "t.*", True)
    assert [b.address for b in brokers.live(root.path)] == [address]
    daemon.proc.kill()
    daemon.proc.wait()
    registrations = os.path.join(root.path, brokers.BROKERS_DIR)
    assert len(os.listdir(registrations)) == 1  # a dead daemon's registration stays ...
    listed = subprocess.run([*KL, "--root", root.path, "serve", "--list"], capture_output=True, check=True)
    assert listed.stdout == b""  # ... ignored, and removed by whoever lists
    assert os.listdir(registrations) == []


def test_library_registration_is_removed_on_close(root):
    root.create_topic("t")
    with brokers.register(root.path, brokers.info_for("127.0.0.1", 9999, None, False)) as reg:
        assert [b.port for b in brokers.live(root.path)] == [9999]
        assert os.path.exists(reg.path)
    assert brokers.live(root.path) == [] and not os.path.exists(reg.path)


def test_partitions_spread_over_daemons_and_move_only_to_one_that_comes():
    """Two daemons each lead some of a topic's few partitions about as often as a fair coin
    says (a CRC, being linear, gave whole topics to one daemon for 3 port pairs in 100), and a
    third daemon takes partitions only for itself."""
    ports = random.Random(7)
    pairs = [tuple(f"127.0.0.1:{port}" for port in ports.sample(range(30000, 60000), 2)) for _ in range(3000)]
    lopsided = sum(len({brokers.leader("t", p, pair) for p in range(8)}) == 1 for pair in pairs)
    assert lopsided < 2 * len(pairs) / 2**8 * 2  # twice what fairness expects (23 in 3,000); a CRC gave 90
    for pair in pairs[:100]:
        third = pair + ("10.0.0.1:9092",)
        for p in range(8):
            assert brokers.leader("t", p, third) in (brokers.leader("t", p, pair), "10.0.0.1:9092")


def test_a_crashed_daemons_temporary_file_goes_once_a_minute_old_by_the_file_systems_clock(root, monkeypatch):
    registrations = os.path.join(root.path, brokers.BROKERS_DIR)
    os.makedirs(registrations)
    Path(registrations, ".tmp-crashed").write_text("{")
    ahead = time.time() + 3600  # this host's clock: an hour ahead of the file system's
    monkeypatch.setattr(time, "time", lambda: ahead)
    monkeypatch.setattr(time, "time_ns", lambda: int(ahead * 1e9))
    assert brokers.live(root.path) == [] and os.listdir(registrations) == [".tmp-crashed"]
    old = time.clock_gettime(time.CLOCK_REALTIME) - brokers.LEFTOVER_AGE - 1  # the real clock: time.time is moved
    os.utime(os.path.join(registrations, ".tmp-crashed"), (old, old))
    assert brokers.live(root.path) == [] and os.listdir(registrations) == []


def test_cli_errors(root, three):
    runner = CliRunner()
    for args, message in [
        (["--allow", "10.0.0.300/8"], "does not appear to be an IPv4 or IPv6 network"),
        (["--topics", "("], "is not a regular expression"),
        (["--port", "70000"], "70000 is not in the range"),
    ]:
        result = runner.invoke(cli, ["--root", root.path, "serve", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    result = runner.invoke(cli, ["--root", root.path, "serve", "--bind", "0.0.0.0"])
    assert (result.exit_code, result.output) == (1, "Error: binding to 0.0.0.0 needs --allow CIDR naming who may connect\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([*KL, "--root", root.path, "serve", "--port", str(port)], capture_output=True, timeout=30)
    assert done.returncode == 1
    assert done.stderr.decode().splitlines()[-1] == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    done = subprocess.run([*KL, "--root", root.path + "-missing", "serve", "--port", "0"], capture_output=True, timeout=30)
    assert done.returncode == 1 and done.stderr.decode().startswith("Error: root ")


def test_a_topic_created_again_is_served_as_it_now_is(root, running, three):
    r = running()
    with r.connect() as c:
        assert values(fetch(c, "t", 2, 0)) == three[2]
        other = kl.Root(root.path)  # another process, as far as the server's caches know
        other.delete_topic("t")
        other.create_topic("t", kl.TopicConfig(partitions=5))
        write(other, "t", [b"new"], partition=4)
        assert values(fetch(c, "t", 4, 0)) == [b"new"]


def test_a_root_it_cannot_register_in_is_served_unregistered(root, three, tmp_path):
    Path(root.path, ".brokers").write_text("not a directory")
    daemon = Daemon(root, tmp_path / "log")
    assert "warning serving unregistered (kl serve --list will not show it)" in daemon.text()
    with daemon.connect() as c:
        assert values(fetch(c, "t", 0, 0)) == three[0]
    assert brokers.live(root.path) == []
