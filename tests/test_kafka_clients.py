"""Today's Kafka clients, unmodified, against a real ``kl serve --kafka`` (issue 20, point 5).

The clients: confluent-kafka (librdkafka), kafka-python 3 and aiokafka from PyPI (the
``test`` extra), KafkaJS from npm (``tests/kafkajs``'s lock, installed by ``npm ci`` into a
gitignored cache), and Debian's kcat (``scripts/test`` installs it as root).  Each runs in a
process of its own with a deadline (tests/kafka_clients.py); a client that cannot be
installed here skips, saying why.  One daemon serves the whole module.

What a client got is compared with what ``kl consume --json`` prints, and what a client
wrote with the same; offsets are Kafka's, one per message from 0 (each topic here is
new), inside kl's compressed batches too.
KafkaJS has no ``assign()`` (its consumer always joins a group, and ``kl serve`` does not
coordinate groups): it produces, and finds offsets through its admin client.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import time
from importlib.util import find_spec
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

import kl
from kl_cli.main import cli

from kafka_clients import CLIENT_TIMEOUT, DRIVER, KAFKAJS, KCAT, NODE, Client, Daemon, module_fixtures

PYTHON_CLIENTS = ("confluent", "kafka-python", "aiokafka")
MODULES = {"confluent": "confluent_kafka", "kafka-python": "kafka", "aiokafka": "aiokafka"}
CODECS = (None, "gzip", "snappy", "lz4", "zstd")
KAFKAJS_CODECS = (None, "gzip", "snappy", "lz4")  # no zstd codec for KafkaJS installs without a native build
T0 = 1_700_000_000_000


class Stored(NamedTuple):
    """One message as kl or a client shows it; key and value as bytes (None: null)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None


# ----------------------------------------------------------------- fixtures


root, daemon, kafkajs, no_client_left = module_fixtures("kafka-clients")


# ----------------------------------------------------------------- helpers


def start(request: pytest.FixtureRequest, daemon: Daemon, client: str, **spec: Any) -> Client:
    """``client`` (a Python client, or ``kafkajs``) started for one operation of its driver."""
    spec_file = request.getfixturevalue("tmp_path") / f"{client}-{spec['op']}-{len(Client.started)}.json"
    spec_file.write_text(json.dumps({"bootstrap": daemon.bootstrap, "timeout": 20, **spec}))
    if client == "kafkajs":
        modules = request.getfixturevalue("kafkajs")
        env = {**os.environ, "NODE_PATH": str(modules), "NODE_NO_WARNINGS": "1"}
        return Client([str(NODE), str(KAFKAJS / "driver.js"), str(spec_file)], env=env, server_log=daemon.log)
    if find_spec(MODULES[client]) is None:
        pytest.skip(f"{client}: Python module {MODULES[client]} is not installed (pip install -e '.[test]')")
    return Client([sys.executable, str(DRIVER), client, str(spec_file)], server_log=daemon.log)


def run(request: pytest.FixtureRequest, daemon: Daemon, client: str, **spec: Any) -> Any:
    """The one JSON line ``client`` prints for an operation, once it exited 0."""
    c = start(request, daemon, client, **spec)
    answer = c.line()
    assert c.finish() == b"", c.report("printed more than one line")
    return answer


def run_consume(request: pytest.FixtureRequest, daemon: Daemon, client: str, **spec: Any) -> list[Stored]:
    """What ``client`` reads with ``assign()`` from ``start`` until ``count`` records came."""
    c = start(request, daemon, client, op="consume", **spec)
    assert "position" in c.line()
    got = from_client(c.line()["records"])
    c.finish()
    return got


def kcat(daemon: Daemon, *args: str, stdin: bytes = b"", timeout: float = CLIENT_TIMEOUT) -> bytes:
    """kcat's stdout for ``args`` against the daemon, once it exited 0 (killed after ``timeout`` s)."""
    if KCAT is None:
        pytest.skip("kcat is not installed (scripts/test installs Debian's kcat as root)")
    argv = [KCAT, "-b", daemon.bootstrap, "-X", "socket.timeout.ms=10000", *args]
    return Client(argv, stdin=stdin, server_log=daemon.log).finish(timeout)


KCAT_FORMAT = "%o %T %K %S:%k%s"
"""kcat -f: offset, timestamp, key and value lengths (-1: null), then the bytes of each."""

KCAT_HEADER = re.compile(rb"(\d+) (-?\d+) (-?\d+) (-?\d+):")
"""What KCAT_FORMAT prints before a message's key and value."""


def kcat_records(out: bytes) -> list[Stored]:
    """What kcat printed with -f KCAT_FORMAT."""
    records, at = [], 0
    while at < len(out):
        found = KCAT_HEADER.match(out, at)
        assert found, f"kcat printed {out[at : at + 80]!r} at byte {at}"
        offset, timestamp, key_length, value_length = map(int, found.groups())
        at = found.end()
        key = None if key_length < 0 else out[at : at + key_length]
        at += max(key_length, 0)
        value = None if value_length < 0 else out[at : at + value_length]
        at += max(value_length, 0)
        records.append(Stored(offset, timestamp, key, value))
    return records


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def from_client(records: list[dict]) -> list[Stored]:
    """A driver's records (base64) as Stored."""
    return [Stored(r["offset"], r["timestamp"], unb64(r["key"]), unb64(r["value"])) for r in records]


def field(message: dict, name: str) -> bytes | None:
    """kl consume --json's key or value: text, base64 (``NAME_b64``) or null."""
    if f"{name}_b64" in message:
        return base64.b64decode(message[f"{name}_b64"])
    return None if message[name] is None else message[name].encode()


def kl_cli(root: kl.Root, *argv: str, input: bytes | None = None) -> bytes:
    """What ``kl --root ROOT ARGV...`` writes to stdout (run in-process), once it exited 0."""
    result = CliRunner().invoke(cli, ["--root", str(root.path), *argv], input=input, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout_bytes


def kl_json(root: kl.Root, topic: str, partition: int = 0) -> list[dict]:
    """``kl consume --json`` of one partition, one dict a message."""
    return [json.loads(line) for line in kl_cli(root, "consume", "--json", "-p", str(partition), topic).splitlines()]


def kl_stored(root: kl.Root, topic: str, partition: int = 0) -> list[Stored]:
    """What ``kl consume --json`` shows of one partition, each message at its Kafka offset
    (its place: the partition is new)."""
    shown = kl_json(root, topic, partition)
    return [Stored(i, m["timestamp"], field(m, "key"), field(m, "value")) for i, m in enumerate(shown)]


def kl_produce(
    root: kl.Root, topic: str, records: list[tuple[bytes | None, bytes, int]], partition: int = 0, compression: str = "none"
) -> None:
    """Append (key, value, timestamp) records with ``kl produce --json`` (one batch, compressed or not)."""
    lines = [
        json.dumps({**({"key": None} if k is None else {"key_b64": b64(k)}), "value_b64": b64(v), "timestamp": t})
        for k, v, t in records
    ]
    kl_cli(root, "produce", "--json", "-p", str(partition), "-z", compression, topic, input="\n".join(lines).encode() + b"\n")


def read_all(root: kl.Root, topic: str) -> list[kl.Message]:
    """Partition 0's messages, read in-process (cheap, to wait for them)."""
    return [m for batch in kl.Consumer(root).consume(topic, [0]) for m in batch.messages]


def create(root: kl.Root, topic: str, partitions: int = 1) -> None:
    root.create_topic(topic, kl.TopicConfig(partitions=partitions))


def sample(count: int = 10, at: int = T0) -> list[tuple[bytes | None, bytes, int]]:
    """``count`` (key, value, timestamp) records: binary and empty values, null and binary keys,
    one compressible value, timestamps a second apart from ``at``."""
    values = [bytes(range(256)), b"", "ünïcode ✓".encode(), b"x" * 3000, b"\n\r\0 line breaks\n"]
    keys = [b"key-%d" % i if i % 3 else None for i in range(count)]
    keys[1] = b"\x00\xff binary key"
    return [(keys[i], values[i % len(values)] + b"#%d" % i, at + 1000 * i) for i in range(count)]


def as_sent(records: list[tuple[bytes | None, bytes, int]]) -> list[dict]:
    """Records in the drivers' spec form."""
    return [{"key": b64(k), "value": b64(v), "timestamp": t} for k, v, t in records]


def without_offsets(stored: list[Stored]) -> list[tuple[bytes | None, bytes | None, int]]:
    """(key, value, timestamp) of each, as ``sample`` makes them."""
    return [(s.key, s.value, s.timestamp) for s in stored]


@pytest.fixture(scope="module")
def written_by_kl(root: kl.Root) -> list[Stored]:
    """Topic ``from-kl``: ten records written by ``kl produce --json``, as kl shows them."""
    create(root, "from-kl")
    records = sample()
    kl_produce(root, "from-kl", records)
    stored = kl_stored(root, "from-kl")
    assert without_offsets(stored) == records
    return stored


@pytest.fixture(scope="module")
def compressed_by_kl(root: kl.Root) -> list[Stored]:
    """Topic ``zipped-by-kl``: a gzip batch of four records, a zstd batch of four, two plain,
    written by ``kl produce -z``; kl serves a compressed batch expanded, each of its
    messages at its own Kafka offset.  A batch has one timestamp (its messages', kl splits
    the others)."""
    create(root, "zipped-by-kl")
    records = [(k, v, T0 + 1000 * max(i // 4, i - 6)) for i, (k, v, _) in enumerate(sample())]
    kl_produce(root, "zipped-by-kl", records[:4], compression="gzip")
    kl_produce(root, "zipped-by-kl", records[4:8], compression="zstd")
    kl_produce(root, "zipped-by-kl", records[8:])
    stored = kl_stored(root, "zipped-by-kl")
    assert without_offsets(stored) == records
    assert len({m["offset"] for m in kl_json(root, "zipped-by-kl")}) == 4  # two batches, two plain messages
    return stored


def python_and_js() -> list[Any]:
    """(client, codec) cases: every Python client with every codec, KafkaJS with those it has."""
    cases = [pytest.param(c, z, id=f"{c}-{z or 'none'}") for c in PYTHON_CLIENTS for z in CODECS]
    return cases + [pytest.param("kafkajs", z, id=f"kafkajs-{z or 'none'}") for z in KAFKAJS_CODECS]


# ----------------------------------------------------------------- produce


def test_a_murmur2_topic_puts_each_key_where_the_java_partitioner_and_librdkafkas_murmur2_do(request, daemon, root) -> None:
    """kafka-python partitions keys as the Java client does (murmur2), librdkafka with
    ``partitioner=murmur2_random``; kl's producers on a topic of ``partitioner`` murmur2
    put every key in the same partition as both."""
    topic = "murmur2-keys"
    create(root, topic, partitions=7)
    root.alter_topic(topic, partitioner="murmur2")
    keys = [b"user-%d" % i for i in range(60)] + [b"", b"\xff" * 9, "clé".encode()]
    records = [{"key": b64(key), "value": b64(b"from a client")} for key in keys]
    run(request, daemon, "kafka-python", op="produce", topic=topic, partition=None, records=records)
    run(request, daemon, "confluent", op="produce", topic=topic, partition=None, partitioner="murmur2_random", records=records)
    with kl.Producer(root) as producer:
        producer.send_batch(topic, [b"from kl"] * len(keys), keys)
        for key in keys[:5]:
            producer.send(topic, b"from kl", key=key)
    where: dict[bytes | None, set[int]] = {}
    for partition in range(7):
        for stored in kl_stored(root, topic, partition):
            where.setdefault(stored.key, set()).add(partition)
    assert {key: len(partitions) for key, partitions in where.items()} == {key: 1 for key in keys}
    assert len(set().union(*where.values())) == 7  # spread over every partition
    assert {key: p for key, (p,) in where.items()} == {key: kl.murmur2_partitioner(key, 7) for key in keys}


@pytest.mark.parametrize(("client", "codec"), python_and_js())
def test_produce_is_stored_as_sent(request, daemon, root, client, codec) -> None:
    topic = f"produced-{client}-{codec or 'none'}"
    create(root, topic)
    records = sample(6)
    spec = {"topic": topic, "partition": 0, "compression": codec}
    first = run(request, daemon, client, op="produce", records=as_sent(records), **spec)
    second = run(request, daemon, client, op="produce", records=as_sent(records[:1]), **spec)
    stored = kl_stored(root, topic)
    assert without_offsets(stored) == records + records[:1]
    # Delivery reports: each record's Kafka offset (clients number a batch base + 1, base + 2,
    # ...; KafkaJS reports each record of a batch at its base offset).
    reported = first["offsets"] + second["offsets"]
    assert reported == ([0] * 6 + [6] if client == "kafkajs" else [s.offset for s in stored])


@pytest.mark.parametrize("client", [*PYTHON_CLIENTS, "kafkajs"])
def test_idempotent_producer_stores_each_record_once(request, daemon, root, client) -> None:
    """With idempotence on (InitProducerId, sequence numbers), as kafka-python 3 has it by default."""
    topic = f"idempotent-{client}"
    create(root, topic)
    records = sample(6)
    run(request, daemon, client, op="produce", topic=topic, partition=0, idempotent=True, records=as_sent(records))
    run(request, daemon, client, op="produce", topic=topic, partition=0, idempotent=True, records=as_sent(records[:2]))
    assert without_offsets(kl_stored(root, topic)) == records + records[:2]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_produce_and_consume_one_partition_of_several(request, daemon, root, client) -> None:
    topic = f"partitions-{client}"
    create(root, topic, partitions=3)
    records = sample(3)
    run(request, daemon, client, op="produce", topic=topic, partition=2, records=as_sent(records))
    assert (kl_json(root, topic, 0), kl_json(root, topic, 1)) == ([], [])
    stored = kl_stored(root, topic, 2)
    assert without_offsets(stored) == records
    got = run_consume(request, daemon, client, topic=topic, partition=2, start="earliest", count=3)
    assert got == stored


@pytest.mark.parametrize("client", [*PYTHON_CLIENTS, "kafkajs"])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_with_each_acks_setting_appends(request, daemon, root, client, acks) -> None:
    topic = f"acks-{client}-{acks}"
    create(root, topic)
    records = sample(3)
    spec = {"topic": topic, "partition": 0, "acks": acks, "idempotent": False}  # idempotence needs acks=-1
    run(request, daemon, client, op="produce", records=as_sent(records), **spec)
    # acks=0 has no answer to wait for: the messages come when the daemon has appended them.
    deadline = time.monotonic() + 10
    while len(read_all(root, topic)) < len(records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert without_offsets(kl_stored(root, topic)) == records


@pytest.mark.parametrize("client", [*PYTHON_CLIENTS, "kafkajs"])
def test_produce_with_headers_is_stored_with_them(request, daemon, root, client) -> None:
    topic = f"headers-{client}"
    create(root, topic)
    headers = [["trace", b64(b"abc-123")], ["schema", b64(b"7")]]
    records = [{"key": b64(b"k"), "value": b64(b"with headers"), "headers": headers}, {"key": None, "value": b64(b"none")}]
    run(request, daemon, client, op="produce", topic=topic, partition=0, records=records)
    shown = kl_json(root, topic)
    assert [m["value"] for m in shown] == ["with headers", "none"]
    assert [m.get("headers") for m in shown] == [[{"key": "trace", "value": "abc-123"}, {"key": "schema", "value": "7"}], None]


@pytest.mark.parametrize("client", [*PYTHON_CLIENTS, "kafkajs"])
def test_produce_of_a_null_value_is_stored_as_null(request, daemon, root, client) -> None:
    topic = f"tombstone-{client}"
    create(root, topic)
    records = [{"key": b64(b"gone"), "value": None}, {"key": b64(b"empty"), "value": b64(b"")}]
    run(request, daemon, client, op="produce", topic=topic, partition=0, records=records)
    assert [(m["key"], m["value"]) for m in kl_json(root, topic)] == [("gone", None), ("empty", "")]


# ----------------------------------------------------------------- consume with assign()


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
@pytest.mark.parametrize("start_at", ["earliest", "offset", "next", "timestamp"])
def test_consume_from(request, daemon, written_by_kl, client, start_at) -> None:
    """From the first message, a message's offset, the one after it (a client's last + 1),
    and the first message stamped at or after a time; byte for byte as kl wrote."""
    starts = {
        "earliest": ("earliest", 0),
        "offset": ({"offset": written_by_kl[4].offset}, 4),
        "next": ({"offset": written_by_kl[4].offset + 1}, 5),
        "timestamp": ({"timestamp": written_by_kl[6].timestamp - 500}, 6),
    }
    start_spec, first = starts[start_at]
    got = run_consume(request, daemon, client, topic="from-kl", partition=0, start=start_spec, count=10 - first)
    assert got == written_by_kl[first:]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_consume_past_the_end_is_out_of_range_and_resets(request, daemon, root, written_by_kl, client) -> None:
    """A fetch past the end gets OFFSET_OUT_OF_RANGE, and the client resets as configured (to
    the start here), as after retention deleted its position.  Kafka answers the error with
    empty records (size 0): librdkafka cannot parse null ones (size -1; "Protocol parse
    failure for Fetch ... invalid MessageSetSize -1") and fetches again and again."""
    past = len(written_by_kl) + 1000
    spec = {"topic": "from-kl", "partition": 0, "start": {"offset": past}, "reset": "earliest", "timeout": 10}
    got = run_consume(request, daemon, client, count=10, **spec)
    assert got == written_by_kl


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
@pytest.mark.parametrize("start_at", ["earliest", "inside-a-batch"])
def test_consume_what_kl_compressed(request, daemon, compressed_by_kl, client, start_at) -> None:
    """kl's gzip and zstd batches come expanded, byte for byte; a client can start at a
    message inside a batch (the third of the zstd one)."""
    first = 0 if start_at == "earliest" else 6
    start_spec = "earliest" if start_at == "earliest" else {"offset": compressed_by_kl[6].offset}
    got = run_consume(request, daemon, client, topic="zipped-by-kl", partition=0, start=start_spec, count=10 - first)
    assert got == compressed_by_kl[first:]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_consume_from_latest_gets_only_what_comes_after(request, daemon, root, client) -> None:
    topic = f"latest-{client}"
    create(root, topic)
    kl_produce(root, topic, sample(3))
    c = start(request, daemon, client, op="consume", topic=topic, partition=0, start="latest", count=2)
    assert c.line() == {"position": 3}  # the high watermark: the log's end
    kl_produce(root, topic, sample(2, at=T0 + 10**6))
    got = from_client(c.line()["records"])
    c.finish()
    assert got == kl_stored(root, topic)[3:]


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_fifty_consumers_at_once_read_every_message(request, daemon, written_by_kl, client) -> None:
    c = start(request, daemon, client, op="consumers", n=50, topic="from-kl", partition=0, count=10, timeout=40)
    results = c.line(timeout=60)["records"]
    c.finish()
    assert len(results) == 50
    for got in results:
        assert from_client(got) == written_by_kl


def test_kafkajs_admin_finds_earliest_latest_and_a_timestamps_offset(request, daemon, root, written_by_kl) -> None:
    when = written_by_kl[6].timestamp - 500
    answer = run(request, daemon, "kafkajs", op="offsets", topic="from-kl", partition=0, timestamp=when)
    assert answer == {"earliest": 0, "latest": len(written_by_kl), "timestamp": written_by_kl[6].offset}


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_consume_gets_the_headers_kl_wrote(request, daemon, root, client) -> None:
    topic = f"kl-headers-{client}"
    create(root, topic)
    line = {"key": "k", "value": "v", "headers": [{"key": "trace", "value": "abc-123"}, {"key": "trace", "value": "again"}]}
    kl_cli(root, "produce", "--json", topic, input=json.dumps(line).encode())
    c = start(request, daemon, client, op="consume", topic=topic, partition=0, start="earliest", count=1)
    assert "position" in c.line()
    (got,) = c.line()["records"]
    c.finish()
    assert got["headers"] == [["trace", b64(b"abc-123")], ["trace", b64(b"again")]]


# ----------------------------------------------------------------- kcat


def test_kcat_lists_brokers_topics_and_partitions(daemon, root) -> None:
    create(root, "kcat-listed", partitions=3)
    listing = json.loads(kcat(daemon, "-L", "-J"))
    (broker,) = listing["brokers"]
    assert broker["name"].split("/")[0] == daemon.bootstrap
    topics = {t["topic"]: t for t in listing["topics"]}
    assert sorted(topics) == sorted(root.topics())
    listed = topics["kcat-listed"]
    assert [p["partition"] for p in listed["partitions"]] == [0, 1, 2]
    assert {p["leader"] for p in listed["partitions"]} == {broker["id"]}


def test_kcat_reads_what_kl_wrote_byte_for_byte_and_exits_at_the_end(daemon, written_by_kl) -> None:
    out = kcat(daemon, "-C", "-t", "from-kl", "-p", "0", "-o", "beginning", "-e", "-f", KCAT_FORMAT)
    assert kcat_records(out) == written_by_kl


@pytest.mark.parametrize("start_at", ["beginning", "inside-a-batch"])
def test_kcat_reads_what_kl_compressed(daemon, compressed_by_kl, start_at) -> None:
    first = 0 if start_at == "beginning" else 6
    offset = "beginning" if start_at == "beginning" else str(compressed_by_kl[6].offset)
    out = kcat(daemon, "-C", "-t", "zipped-by-kl", "-p", "0", "-o", offset, "-e", "-f", KCAT_FORMAT)
    assert kcat_records(out) == compressed_by_kl[first:]


@pytest.mark.parametrize("where", ["end", "offset", "last", "tail", "timestamp", "past-the-end"])
def test_kcat_starts_at(daemon, root, written_by_kl, where) -> None:
    """kcat -o: ``end`` (nothing, then -e exits), an offset, ``-1`` (the last message, then
    exit: kcat's most common idiom), ``-3`` (the last three), ``s@TIME``, and an offset past
    the end (OFFSET_OUT_OF_RANGE: librdkafka resets to the end, its default, and -e exits;
    with null records in the error's answer it cannot parse it, and fetches again until
    killed)."""
    end = len(written_by_kl)
    starts = {
        "end": ("end", 10),
        "offset": (str(written_by_kl[3].offset), 3),
        "last": ("-1", 9),
        "tail": ("-3", 7),
        "timestamp": (f"s@{written_by_kl[8].timestamp - 1}", 8),
        "past-the-end": (str(end + 1000), 10),
    }
    offset, first = starts[where]
    out = kcat(daemon, "-C", "-t", "from-kl", "-p", "0", "-o", offset, "-e", "-f", KCAT_FORMAT, timeout=10)
    assert kcat_records(out) == written_by_kl[first:]


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produces_keyed_lines(daemon, root, codec) -> None:
    topic = f"kcat-produced-{codec or 'none'}"
    create(root, topic)
    lines = b"k1:first\nno delimiter, so no key\nk:v:w\nk4:" + b"y" * 2000 + b"\n"
    kcat(daemon, "-P", "-t", topic, "-p", "0", "-K", ":", "-z", codec or "none", stdin=lines)
    stored = kl_stored(root, topic)
    assert [(s.key, s.value) for s in stored] == [
        (b"k1", b"first"),
        (None, b"no delimiter, so no key"),
        (b"k", b"v:w"),
        (b"k4", b"y" * 2000),
    ]
    out = kcat(daemon, "-C", "-t", topic, "-p", "0", "-e", "-f", KCAT_FORMAT)
    assert [(r.offset, r.key, r.value) for r in kcat_records(out)] == [(s.offset, s.key, s.value) for s in stored]


def test_kcat_produces_and_reads_headers(daemon, root) -> None:
    create(root, "kcat-headers")
    kcat(daemon, "-P", "-t", "kcat-headers", "-p", "0", "-H", "trace=abc", "-H", "schema=7", stdin=b"with headers\n")
    (shown,) = kl_json(root, "kcat-headers")
    assert shown.get("headers") == [{"key": "trace", "value": "abc"}, {"key": "schema", "value": "7"}]
    out = kcat(daemon, "-C", "-t", "kcat-headers", "-p", "0", "-e", "-f", "%h\\n")
    assert out == b"trace=abc,schema=7\n"


# ----------------------------------------------------------------- failures and changes while running


@pytest.mark.parametrize("client", PYTHON_CLIENTS)
def test_producer_killed_mid_produce_then_restarted_stores_each_message_once(request, daemon, root, client) -> None:
    """An idempotent producer sends 40 records of 32 KiB, one acknowledged at a time, and is
    SIGKILLed after the sixth acknowledgement (a request may be on the wire): once the
    daemon is done with its connections, kl holds a prefix of them, each whole and once.
    A new idempotent producer sends the rest."""
    topic = f"killed-{client}"
    create(root, topic)
    records = [(b"id-%02d" % i, b"%02d:" % i + os.urandom(16) * 2048, T0 + i) for i in range(40)]
    spec = {"topic": topic, "partition": 0, "idempotent": True}
    c = start(request, daemon, client, op="produce", each=True, records=as_sent(records), **spec)
    while c.line()["acked"] < 5:
        pass
    c.kill()
    daemon.settle()
    stored = kl_stored(root, topic)
    assert 6 <= len(stored) <= len(records)
    assert without_offsets(stored) == records[: len(stored)]
    rest = records[len(stored) :]
    run(request, daemon, client, op="produce", records=as_sent(rest), **spec)
    assert without_offsets(kl_stored(root, topic)) == records


@pytest.mark.parametrize("client", [*PYTHON_CLIENTS, "kafkajs"])
def test_topic_created_while_a_client_runs_is_found_through_metadata(request, daemon, root, client) -> None:
    topic = f"born-{client}"
    c = start(request, daemon, client, op="watch", topic=topic)
    seen = c.line()["topics"]
    assert topic not in seen
    kl_cli(root, "topics", "create", topic, "--partitions", "3")
    c.send("created")
    assert c.line() == {"partitions": 3}
    c.finish()
