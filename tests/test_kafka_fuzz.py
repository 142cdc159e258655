"""``kl serve --kafka`` against hostile input (built by kafkafuzz.py): random bytes, huge
and negative sizes, every request type and version with random bodies, real requests
flipped, cut and extended, record batches with a correct CRC and hostile content, and
decompression bombs.  The daemon, a subprocess, keeps serving; its memory stays
bounded; its log holds no bug; what its topics held is still there, whole; a produce it
refused appended nothing.  ``scripts/fuzz-kafka`` runs the same attacks for longer."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import kafkafuzz as fz
import pytest
from click.testing import CliRunner
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

import kl
from kl.log import producers
from kl.net.daemon import Daemon
from kl.net.kafka import errors as kafka_errors
from kl.net.kafka import fetch
from kl.net.server import ServeConfig
from kl_cli.main import cli

from conftest import write


@pytest.fixture
def daemon(root, tmp_path):
    started: list[fz.Daemon] = []

    def start(*args: str) -> fz.Daemon:
        started.append(fz.Daemon(root.path, tmp_path / f"log{len(started)}", *args))
        return started[-1]

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def consumed(root: kl.Root, topic: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["--root", root.path, "consume", topic, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


@pytest.fixture
def filled(root) -> list[bytes]:
    """kafkafuzz's topics t and f; what t/0 holds."""
    return fz.fill(root)


def test_hostile_requests_leave_it_serving_in_bounded_memory_with_its_data_whole(root, daemon, filled):
    d = daemon("--workers", "4", "--request-timeout", "2", "--advertise", "127.0.0.2", "--allow-admin")
    confluent = fz.captured(d.address[1], "f")  # what librdkafka sends, if installed: 5 x 20 messages
    appended = len(consumed(root, "f"))
    assert appended == (100 if confluent else 0)
    real = fz.requests("f")
    admin: list[tuple[str, int]] = []
    for label, request in real:  # every real request is answered; each produce appends
        answer = fz.call(d.address, request)
        if label.startswith("Produce"):
            (part,) = answer.responses[0].partition_responses
            assert part.error_code == 0, (label, part)
            appended += 30
        elif label.startswith(("CreateTopics", "CreatePartitions", "DeleteTopics")):
            (result,) = getattr(answer, "topics", None) or getattr(answer, "results", None) or answer.responses
            admin.append((label, result.error_code))
    again = {  # each family's first request does it; the others find it done
        "CreateTopics": kafka_errors.TOPIC_ALREADY_EXISTS,
        "CreatePartitions": kafka_errors.INVALID_PARTITIONS,
        "DeleteTopics": kafka_errors.UNKNOWN_TOPIC_OR_PARTITION,
    }
    families = [label.split()[0] for label, _ in admin]
    assert [code for _, code in admin] == [again[f] if f in families[:i] else 0 for i, f in enumerate(families)], admin
    before, held = consumed(root, "t"), consumed(root, "f")
    assert len(held) == appended
    fz.healthy(d.address, filled)
    start = d.memory_kb()
    rng = random.Random(20)
    for i, (kind, data) in enumerate(fz.attacks(rng, real + confluent, "f", 2400)):
        was = fz.ends(root, "f")
        answer = fz.attack(d.address, data)
        if fz.refused_whole(data, answer):
            assert fz.ends(root, "f") == was, (kind, answer)
        if i % 400 == 399:
            fz.healthy(d.address, filled)
    for key in range(-1, 82):  # every request type and version, a random body each
        for version in range(-1, 21):
            head = struct.pack(">hhih", key, version, 7, 4) + b"fuzz" + rng.randbytes(rng.randrange(0, 40))
            fz.attack(d.address, struct.pack(">i", len(head)) + head)
    fz.healthy(d.address, filled)
    assert d.memory_kb() - start < 40_000
    assert d.bugs() == []
    assert consumed(root, "t") == before
    now = consumed(root, "f")  # whole: every message reads back, the ones there before unchanged
    assert now[: len(held)] == held
    d.stop()
    checked = CliRunner().invoke(cli, ["--root", root.path, "recover", "--deep", "--dry-run"])  # what admin made is whole too
    assert checked.exit_code == 0, checked.output


def served(address) -> bool:
    """Whether a new connection is answered (not closed at once for --max-connections)."""
    try:
        return bool(list(fz.answers(fz.attack(address, fz.metadata(None), timeout=10))))
    except OSError:
        return False


def test_long_polls_of_clients_gone_free_their_connections_within_the_request_timeout(root, daemon, filled):
    d = daemon("--max-connections", "3", "--request-timeout", "1")
    poll = fz.fetch("t", fz.ends(root, "t")[0], max_wait_ms=(1 << 31) - 1)  # at the end: wait 24 days for more
    for _ in range(3):  # clients that ask for it, then go
        with socket.create_connection(d.address, timeout=10) as s:
            s.sendall(poll)
    deadline = time.monotonic() + 15
    while not served(d.address):
        assert time.monotonic() < deadline, "the long polls of clients gone still hold every connection"
        time.sleep(0.05)
    ((_, body),) = fz.answers(fz.attack(d.address, poll, timeout=10))  # one that stays is answered by then
    assert FetchResponse.decode(body[1:], version=12).responses[0].partitions[0].records in (None, b"")
    assert d.bugs() == []


def test_arrays_sent_null_where_the_protocol_never_has_them_close_the_connection(root, daemon, filled):
    d = daemon()
    fetch_topic = FetchRequest.FetchTopic(topic="t", partitions=None)
    offsets_topic = ListOffsetsRequest.ListOffsetsTopic(name="t", partitions=None)
    produce_topic = ProduceRequest.TopicProduceData(name="f", partition_data=None)
    nulls = [
        fz.fetch("t", 0, topics=None),
        fz.fetch("t", 0, topics=[fetch_topic]),
        fz.framed(ListOffsetsRequest, 1, replica_id=-1, topics=None),
        fz.framed(ListOffsetsRequest, 1, replica_id=-1, topics=[offsets_topic]),
        fz.framed(ProduceRequest, 3, transactional_id=None, acks=1, timeout_ms=1000, topic_data=None),
        fz.framed(ProduceRequest, 9, transactional_id=None, acks=1, timeout_ms=1000, topic_data=[produce_topic]),
    ]
    for request in nulls:
        assert fz.attack(d.address, request) == b""
    fz.healthy(d.address, filled)
    assert d.bugs() == []
    nulls_logged = re.findall(r"malformed \w+ v\d+: its (\w+) array is null", d.log.read_text())
    assert nulls_logged == ["topics", "partitions", "topics", "partitions", "topic_data", "partition_data"]


@pytest.fixture
def in_process(root):
    """Start a ``Daemon`` of the Kafka protocol in a thread of the test process (where a
    test can change its constants and look at its state)."""
    started: list[tuple[Daemon, threading.Thread]] = []

    def start(**config) -> Daemon:
        server = Daemon(root, ServeConfig(port=None, kafka_port=0, allow_produce=True, **config))
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.stop()
        thread.join(10)


def test_a_fetch_answer_is_bounded_whatever_the_client_asks(root, in_process, monkeypatch):
    monkeypatch.setattr(fetch, "MAX_FETCH_BYTES", 64 << 10)
    root.create_topic("big")
    write(root, "big", fz.values(2000, 200, b"big"))
    address = ("127.0.0.1", in_process().kafka_port)
    part = FetchRequest.FetchTopic.FetchPartition
    greedy = [part(partition=0, fetch_offset=0, partition_max_bytes=(1 << 31) - 1, log_start_offset=-1)] * 20
    request = fz.fetch("big", 0, max_bytes=(1 << 31) - 1, topics=[FetchRequest.FetchTopic(topic="big", partitions=greedy)])
    ((_, body),) = fz.answers(fz.attack(address, request))
    parts = FetchResponse.decode(body[1:], version=12).responses[0].partitions
    sizes = [len(p.records or b"") for p in parts]
    assert 0 < sum(sizes) <= (64 << 10) + 300  # the bound, and the batch header past it
    assert fz.values_in(bytes(parts[0].records)) == fz.values(2000, 200, b"big")[: len(fz.values_in(bytes(parts[0].records)))]


def test_the_producers_remembered_for_retries_are_bounded(root, in_process, monkeypatch):
    """A flood of producer ids: each partition keeps the last ``MAX_PRODUCERS`` heard
    from (in memory and in its journal), and still answers their retries."""
    monkeypatch.setattr(producers, "MAX_PRODUCERS", 3)
    monkeypatch.setattr(producers, "COMPACT_RECORDS", 0)
    root.create_topic("f")
    server = in_process()
    address = ("127.0.0.1", server.kafka_port)
    sent = {pid: fz.produce("f", [fz.batch(fz.plain([b"%d" % pid]), 1, producer=(pid, 0, 0))]) for pid in range(1, 40)}
    first = {pid: fz.call(address, request).responses[0].partition_responses[0] for pid, request in sent.items()}
    assert [p.error_code for p in first.values()] == [0] * 39
    journal = server.root.log("f", 0)._journal
    assert journal is not None and len(journal.producers) <= 3 + producers.BATCHES * 3
    assert os.path.getsize(journal.path) <= (3 + producers.BATCHES * 3 + 1) * producers.SIZE
    retried = fz.call(address, sent[39]).responses[0].partition_responses[0]  # one of the last: known
    assert (retried.error_code, retried.base_offset) == (0, first[39].base_offset)
    assert [m["value"] for m in consumed(root, "f")] == [str(pid) for pid in range(1, 40)]


def produce_error(address, request: bytes) -> int:
    ((_, body),) = fz.answers(fz.attack(address, request))
    return ProduceResponse.decode(body[1:], version=9).responses[0].partition_responses[0].error_code


def test_decompression_bombs_are_refused_without_the_memory(root, daemon, filled):
    d = daemon("--workers", "4", "--max-request-bytes", str(2 << 20))  # batches inflate to 8 MiB at most
    start = d.memory_kb()
    inflated = {"gzip": 1 << 30, "zstd": 4 << 30, "lz4": 256 << 20, "snappy": 32 << 20, "xerial": 32 << 20}
    for codec, size in inflated.items():
        request = fz.produce("f", [fz.bomb(codec, size)])
        assert len(request) < 2 << 20
        with ThreadPoolExecutor(4) as pool:  # one for each worker at once
            errors = list(pool.map(produce_error, [d.address] * 4, [request] * 4))
        assert errors == [kafka_errors.CORRUPT_MESSAGE] * 4, codec
    assert d.memory_kb("VmHWM") - start < 100_000  # each of 4 workers stopped at 8 MiB
    assert fz.ends(root, "f") == [0, 0]
    fz.healthy(d.address, filled)
    assert d.bugs() == []
