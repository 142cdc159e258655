"""man/kl-protocol.5 states kl/net/wire.py's numbers, and its byte dumps are what kl serve answers.

The request types and error codes are read out of the page's tables and held against
``kl.net.wire``; the example requests are sent, as the page shows their bytes, to a real
server (in a thread, on 127.0.0.1) and its answers compared with the page's bytes.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import kl
from kl.net import wire
from kl.net.daemon import Daemon
from kl.net.server import ServeConfig

PAGE = Path(__file__).resolve().parents[1] / "man" / "kl-protocol.5"
TEXT = PAGE.read_text()


def section(name: str) -> str:
    """A section of the roff source, from its ``.SH`` to the next."""
    return re.split(r"^\.SH ", TEXT.split(f"\n.SH {name}\n", 1)[1], maxsplit=1, flags=re.M)[0]


def dumps(text: str) -> list[bytes]:
    """The bytes of each example block (``.EX`` to ``.EE``, a blank line also ends one):
    every line's leading hex pairs, the rest of the line being its annotation."""
    found = []
    for block in re.findall(r"^\.EX\n(.*?)^\.EE", text, re.M | re.S):
        for part in block.split("\n\n"):
            pairs = [m.group(1) for line in part.splitlines() if (m := re.match(r"((?:[0-9a-f]{2} )*[0-9a-f]{2})(?:  |$)", line))]
            if pairs:
                found.append(bytes.fromhex(" ".join(pairs)))
    return found


def test_request_types_are_wire_s() -> None:
    rows = re.findall(r"^ *(\d+)  ([A-Z_]+) +(?:Kafka 0\.7|kl) +(?:yes|no)$", section("FRAMING"), re.M)
    assert {int(code): name for code, name in rows} == wire.NAMES


def test_error_codes_are_wire_s() -> None:
    rows = re.findall(r"^ *(\\-1|\d+)  ([A-Z_]+) ", section("ERRORS"), re.M)
    assert len(rows) == 11
    for code, name in rows:
        assert getattr(wire, name) == int(code.replace("\\-", "-")), name


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[kl.Root, int]]:
    root = kl.Root(tmp_path / "root")
    server = Daemon(root, ServeConfig(port=0))
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    yield root, server.port
    server.stop()
    thread.join()
    root.close()


def ask(port: int, request: bytes) -> bytes:
    """Send raw request bytes on a fresh (Kafka 0.7) connection; the raw response."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        head = sock.recv(6, socket.MSG_WAITALL)
        size = int.from_bytes(head[:4], "big")
        return head + (sock.recv(size - 2, socket.MSG_WAITALL) if size > 2 else b"")


def test_examples_are_what_the_server_answers(server: tuple[kl.Root, int]) -> None:
    root, port = server
    root.create_topic("events", kl.TopicConfig(format="0.7"))
    fetch, answer, offsets, offsets_answer = dumps(section("EXAMPLES"))
    assert fetch == wire.request(wire.FETCH, wire.fetch_body(wire.Fetch("events", 0, 0, 30)))
    assert offsets == wire.request(wire.OFFSETS, wire.offsets_body("events", 0, -1, 10))
    assert ask(port, fetch) == b"\0\0\0\2\0\0"  # nothing yet: the log end
    with kl.Producer(root) as producer:
        producer.send_batch("events", [b"hello", b"world"], partition=0)
    assert ask(port, fetch) == answer
    assert ask(port, fetch[:-4] + (20).to_bytes(4, "big")) == (22).to_bytes(4, "big") + b"\0\0" + answer[6:26]
    assert ask(port, offsets) == offsets_answer
    at_end = fetch[:-12] + (30).to_bytes(8, "big") + fetch[-4:]
    assert ask(port, at_end) == bytes.fromhex("00 00 00 02 00 00")
    root.create_topic("kl-events", kl.TopicConfig())
    with kl.Producer(root) as producer:
        producer.send("kl-events", b"hello", partition=0)
    assert ask(port, wire.request(wire.FETCH, wire.fetch_body(wire.Fetch("kl-events", 0, 0, 30)))) == bytes.fromhex(
        "00 00 00 02 00 66"
    )
    assert "00\\~00\\~00\\~02\\~00\\~66" in section("EXAMPLES") and "00\\~00\\~00\\~02\\~00\\~00" in section("EXAMPLES")
