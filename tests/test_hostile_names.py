"""No request of either protocol reaches a file outside the root: every request type of
today's Kafka protocol (``kafkawalk.walk``: a new one is walked as soon as kl serves it)
and kl's remote client over Kafka 0.7's, each naming its topic, group and transactional
id with ``..``, ``/``, NUL, long and odd forms.  The daemon keeps serving, nothing
outside the root changes, and what it made inside it is what a valid name would make."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafkaserver import InThread, Raw
from kafkawalk import walk

import kl
from kl.net import wire
from kl.net.daemon import Daemon
from kl.net.kafka07 import HANDLERS
from kl.net.remote import RemoteRoot
from kl.net.server import ServeConfig
from kl.topic import validate_name
from kl_cli.main import cli

HOSTILE = [
    "..", ".", "../escaped", "a/../../escaped", "/tmp/escaped", "a/b", "x\x00y", "", "%2e%2e", "..%2fescaped",
    "\u202eevil", "CON", "line\nbreak", "a" * 250, "b" * 10_000, "../" * 80 + "etc", "\\..\\escaped", "~root",
]  # fmt: skip
"""Topic names, group ids and transactional ids no request may turn into a path outside the root."""


def tree(top: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``top`` (symbolic links not followed), with its size and mtime."""
    found = {}
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            found[os.path.relpath(path, top)] = (st.st_size if not os.path.isdir(path) else 0, st.st_mtime_ns)
    return found


@pytest.fixture
def guarded(tmp_path: Path):
    """A root beside a sibling directory and a file the requests must never reach."""
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "kept").write_text("untouched")
    (tmp_path / "escaped").write_text("untouched")
    root = kl.Root(tmp_path / "root")
    root.create_topic("t", kl.TopicConfig(partitions=2))
    yield tmp_path, root
    root.close()


def escaped(top: Path, root: Path, before: dict[str, tuple[int, int]]) -> list[str]:
    """What changed outside the root, and what inside it lies outside once resolved."""
    after = tree(top)
    outside = [p for p in set(before) | set(after) if not p.startswith("root") and before.get(p) != after.get(p)]
    inside = [p for p in after if p.startswith("root") and not os.path.realpath(top / p).startswith(str(root))]
    return sorted(outside + inside)


def test_every_kafka_request_with_hostile_names_stays_in_the_root(guarded):
    top, root = guarded
    before = tree(top)
    s = InThread(root, allow_admin=True, auto_create=True)
    try:
        topic_id = uuid.uuid4()
        conn = Raw(s.address)
        answered = closed = 0
        for name in HOSTILE:
            for request, case in walk(topic_id, topic=name, group=name, tx=name).items():
                if case is None:
                    continue
                version, response, fields, _ = case
                try:
                    conn.call(request, version, response, **fields)
                    answered += 1
                except (ConnectionError, OSError):  # closed, as Kafka's brokers close on what they cannot take
                    closed += 1
                    conn.close()
                    conn = Raw(s.address)
        listed = conn.call(MetadataRequest, 12, MetadataResponse, topics=None, allow_auto_topic_creation=False,
                           include_cluster_authorized_operations=False, include_topic_authorized_operations=False)  # fmt: skip
        made = sorted(t.name for t in listed.topics)  # still serving
        assert answered > 10 * len(HOSTILE)
    finally:
        s.stop()
    assert root.topics() == made and "t" in made
    assert all(validate_name(name) == name for name in made)  # only names kl gives topics (e.g. "CON-new")
    assert not set(made) & set(HOSTILE) - {"CON", "~root", "%2e%2e", "a" * 249}
    assert escaped(top, Path(root.path), before) == []
    checked = CliRunner().invoke(cli, ["--root", root.path, "recover", "--deep", "--dry-run"])
    assert checked.exit_code == 0, checked.output


def test_kl_remote_clients_with_hostile_names_get_errors_and_stay_in_the_root(guarded):
    top, root = guarded
    before = tree(top)
    server = Daemon(root, ServeConfig(port=0, allow_produce=True))
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        remote = RemoteRoot(f"127.0.0.1:{server.port}")
        producer = kl.RemoteProducer(remote)
        consumer = kl.RemoteConsumer(RemoteRoot(f"127.0.0.1:{server.port}"))
        refused = 0
        for name in HOSTILE:
            for attempt in (
                lambda name=name: remote.config(name),
                lambda name=name: producer.send_batch(name, [b"x"], partition=0),
                lambda name=name: consumer.fetch(name, 0, 0, 1 << 20),
            ):
                with pytest.raises((kl.KlError, ValueError)):
                    attempt()
                refused += 1
        assert refused == 3 * len(HOSTILE)
        assert remote.topics() == ["t"]
        producer.close()
        consumer.close()
    finally:
        server.stop()
        thread.join(10)
    assert escaped(top, Path(root.path), before) == []


def test_a_hostile_name_sent_raw_on_kafka07s_port_is_refused(guarded):
    """A FETCH whose topic is ``../escaped``, framed by hand (no client checks it first)."""
    top, root = guarded
    server = Daemon(root, ServeConfig(port=0))
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        name = b"../escaped"
        body = (1).to_bytes(2, "big") + len(name).to_bytes(2, "big") + name + (0).to_bytes(4, "big") + (0).to_bytes(8, "big")
        body += (1 << 20).to_bytes(4, "big")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(len(body).to_bytes(4, "big") + body)
            answer = sock.recv(6)
        assert len(answer) == 6 and answer[4:6] != b"\0\0"  # an error code, no bytes of any file
    finally:
        server.stop()
        thread.join(10)
    assert (top / "escaped").read_text() == "untouched"


def _string(name: bytes) -> bytes:
    return len(name).to_bytes(2, "big") + name


NAMED_07 = {
    wire.PRODUCE: lambda t: _string(t) + (0).to_bytes(4, "big") + (0).to_bytes(4, "big"),
    wire.FETCH: lambda t: _string(t) + (0).to_bytes(4, "big") + (0).to_bytes(8, "big") + (1 << 20).to_bytes(4, "big"),
    wire.MULTIFETCH: lambda t: (1).to_bytes(2, "big") + NAMED_07[wire.FETCH](t),
    wire.MULTIPRODUCE: lambda t: (1).to_bytes(2, "big") + NAMED_07[wire.PRODUCE](t),
    wire.OFFSETS: lambda t: _string(t) + (0).to_bytes(4, "big") + (-1).to_bytes(8, "big", signed=True) + (1).to_bytes(4, "big"),
    wire.OFFSET_FOR_TIME: lambda t: _string(t) + (0).to_bytes(4, "big") + (0).to_bytes(8, "big"),
    wire.APPEND: lambda t: _string(t) + (0).to_bytes(4, "big") + b"\0" + (0).to_bytes(4, "big") * 2,
    wire.OFFSET_BACK: lambda t: _string(t) + (0).to_bytes(4, "big") + (1).to_bytes(8, "big"),
    wire.CHECK_OFFSET: lambda t: _string(t) + (0).to_bytes(4, "big") + (0).to_bytes(8, "big"),
    wire.DESCRIBE: _string,
    wire.APPEND_ALL: lambda t: b"\0" + (1).to_bytes(2, "big") + _string(t) + (0).to_bytes(4, "big") * 3,
    wire.KAFKA_OFFSET: lambda t: _string(t) + (0).to_bytes(4, "big") + (0).to_bytes(8, "big"),
}  # fmt: skip
"""Each Kafka 0.7 request kind that names a topic, framed by hand with the topic ``t``."""


def test_every_kafka07_request_kind_with_hostile_names_framed_by_hand(guarded):
    """Every request kind of Kafka 0.7's port (``HANDLERS``: a new one must be framed here)
    naming each hostile topic: no answer carries NO_ERROR with bytes of a file, the daemon
    keeps serving, nothing outside the root changes."""
    top, root = guarded
    assert set(HANDLERS) - set(NAMED_07) == {wire.HELLO, wire.TOPICS, wire.AUTHENTICATE}  # the three that name no topic
    before = tree(top)
    server = Daemon(root, ServeConfig(port=0, allow_produce=True))
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        for kind, body in NAMED_07.items():
            for name in HOSTILE:
                request = kind.to_bytes(2, "big") + body(name.encode("utf-8", "surrogatepass")[:32_000])
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                    sock.sendall(len(request).to_bytes(4, "big") + request)
                    if kind in (wire.PRODUCE, wire.MULTIPRODUCE):
                        continue  # Kafka 0.7 answers no produce
                    answer = b""
                    while len(answer) < 6 and (got := sock.recv(6 - len(answer))):
                        answer += got
                if len(answer) == 6 and answer[4:6] == b"\0\0":
                    assert kind in (wire.FETCH, wire.MULTIFETCH, wire.OFFSETS), (wire.NAMES[kind], name[:20])
                    assert int.from_bytes(answer[:4], "big") <= 2 + 4 + 8 + 2, "bytes of a file"  # empty set or [0]
            assert RemoteRoot(f"127.0.0.1:{server.port}").topics() == ["t"], wire.NAMES[kind]
    finally:
        server.stop()
        thread.join(10)
    assert escaped(top, Path(root.path), before) == []
    assert sorted(p.name for p in Path(root.path).iterdir() if not p.name.startswith(".")) == ["t"]
