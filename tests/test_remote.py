"""kl's network client: RemoteConsumer, RemoteProducer and ``--server`` against their local forms.

A ``kl.net.server.Server`` over the test's root runs in a thread on 127.0.0.1 (a port of the
kernel's choosing); each case compares what the remote form gives with what the local
one gives on the same root: the same messages, offsets, errors and output bytes.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

import kl
from kl.net.daemon import Daemon
from kl.net.remote import RemoteRoot
from kl.net.server import ServeConfig
from kl_cli.main import cli

from conftest import flip_byte
from faultlib import failing_writes

VALUES = [b"v%03d" % i * (1 + i % 7) for i in range(300)]


def serve(root: kl.Root, **options: object) -> Iterator[str]:
    server = Daemon(root, ServeConfig(port=0, **options))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        server.stop()
        thread.join(10)


@pytest.fixture
def address(root: kl.Root) -> Iterator[str]:
    yield from serve(root, allow_produce=True)


@pytest.fixture
def two(root: kl.Root) -> str:
    """Topic ``t`` of two partitions, small segments (reads cross them), keyed and keyless messages."""
    root.create_topic("t", kl.TopicConfig(partitions=2, segment_bytes=2048, max_message_bytes=1024))
    with kl.Producer(root) as producer:
        for i, value in enumerate(VALUES):
            producer.send("t", value, key=b"k%d" % i if i % 3 == 0 else None, partition=i % 2)
        producer.send_batch("t", VALUES[:50], partition=1)
    return "t"


@pytest.fixture
def remote(address: str) -> Iterator[kl.RemoteConsumer]:
    with kl.RemoteConsumer(address) as consumer:
        yield consumer


def outcome(call) -> object:  # type: ignore[no-untyped-def]
    """What a call gives: its result, or its exception's class and text."""
    try:
        result = call()
    except kl.KlError as e:
        return type(e), str(e)
    return list(result) if isinstance(result, kl.MessageSet) else result


def batches(consumer: kl.Consumer, *args: object, **kwargs: object) -> list[tuple[int, int, int, list[object]]]:
    return [(b.partition, b.offset, b.next_offset, b.messages) for b in consumer.consume(*args, **kwargs)]  # type: ignore[arg-type]


# ----------------------------------------------------------------- RemoteConsumer


def test_every_call_gives_what_the_local_consumer_gives(root, two, remote):
    local = kl.Consumer(root)
    end = local.latest_offset("t", 0)
    middle = local.offset_back("t", 0, 40)
    calls = [
        lambda c: c.earliest_offset("t", 1),
        lambda c: c.latest_offset("t", 1),
        lambda c: c.offsets_before("t", 0, kl.LATEST, 5),
        lambda c: c.offsets_before("t", 0, time.time_ns() // 1_000_000 + 10_000, 100),
        lambda c: c.offset_for_time("t", 1, 0),
        lambda c: c.offset_back("t", 0, 40),
        lambda c: c.check_offset("t", 0, middle),
        lambda c: c.fetch("t", 0, 0),
        lambda c: c.fetch("t", 0, middle, 333),
        lambda c: c.fetch("t", 1, 0, 1),
        lambda c: c.fetch("t", 0, end),
        lambda c: c.fetch("t", 0, end + 1),
        lambda c: c.fetch("t", 0, middle + 1),
        lambda c: c.check_offset("t", 0, middle + 1),
        lambda c: c.fetch("t", 2, 0),
        lambda c: c.latest_offset("nope", 0),
        lambda c: c.fetch("../x", 0, 0),
    ]
    for call in calls:
        assert outcome(lambda call=call: call(remote)) == outcome(lambda call=call: call(local))


def test_position_back_inside_a_compressed_batch_gives_what_the_local_one_gives(root, remote):
    root.create_topic("z")
    kl.Producer(root, compression="zstd").send_batch("z", [b"%d" % i for i in range(1, 46)], partition=0)
    for count in (0, 1, 3, 45, 99):
        assert remote.position_back("z", 0, count) == kl.Consumer(root).position_back("z", 0, count)
    assert [v for b in remote.consume("z", start=remote.position_back("z", 0, 3), values_only=True) for v in b.messages] == [
        b"43",
        b"44",
        b"45",
    ]


def test_out_of_range_carries_the_range(root, two, remote):
    with pytest.raises(kl.OffsetOutOfRange) as e:
        remote.fetch("t", 1, 10**9)
    assert (e.value.offset, e.value.log_start_offset, e.value.log_end_offset) == (10**9, 0, root.log("t", 1).log_end_offset)


@pytest.mark.parametrize("max_bytes", [1, 37, 1000, 1 << 20])
def test_consume_gives_the_same_batches_at_any_fetch_size(root, two, remote, max_bytes):
    """Fetches that end inside messages and at segment ends, continued from bytes read ahead."""
    for values_only in (False, True):
        expected = batches(kl.Consumer(root), "t", values_only=values_only, max_bytes=max_bytes)
        assert batches(remote, "t", values_only=values_only, max_bytes=max_bytes) == expected
    assert sum(len(b[3]) for b in expected) == len(VALUES) + 50


def test_fetches_that_jump_back_and_forth_give_what_local_ones_give(root, two, remote):
    local = kl.Consumer(root)
    starts = [m.offset for b in local.consume("t", [0]) for m in b.messages]
    for offset in [starts[0], starts[40], starts[3], starts[4], starts[100], starts[5], starts[120], starts[121]]:
        assert list(remote.fetch("t", 0, offset, 200)) == list(local.fetch("t", 0, offset, 200))


def test_a_message_larger_than_max_bytes_comes_whole(root, address):
    root.create_topic("big")
    kl.Producer(root).send_batch("big", [b"x" * 5000, b"y"], partition=0)
    with kl.RemoteConsumer(address, max_bytes=100) as consumer:
        assert [m.value for m in consumer.fetch("big", 0, 0)] == [b"x" * 5000]
        assert [m.value for b in consumer.consume("big") for m in b.messages] == [b"x" * 5000, b"y"]


def test_multifetch_gives_each_fetch_in_order(root, two, remote):
    requests = [("t", 1, 0, 200), ("t", 0, 0, None), ("t", 1, remote.offset_back("t", 1, 3), 10)]
    assert [list(s) for s in remote.multifetch(requests)] == [list(s) for s in kl.Consumer(root).multifetch(requests)]
    assert outcome(lambda: remote.multifetch([("t", 0, 0, 10), ("t", 0, 10**9, 10)])) == outcome(
        lambda: kl.Consumer(root).fetch("t", 0, 10**9)
    )


def test_damage_is_the_same_offset_and_reason_and_skips_alike(root, two, remote):
    segment = root.log("t", 0).segments()[1]
    flip_byte(segment.path, 30)
    local = kl.Consumer(root)
    with pytest.raises(kl.CorruptMessage) as here:
        batches(local, "t", [0])
    with pytest.raises(kl.CorruptMessage) as there:
        batches(remote, "t", [0])
    assert (there.value.offset, there.value.reason) == (here.value.offset, here.value.reason)
    where = f"({remote.remote.path}/t/0 position {here.value.offset})"
    assert str(there.value) == str(here.value).replace(f"({segment.path} position {here.value.position})", where)
    skipped: tuple[list[kl.Skipped], list[kl.Skipped]] = ([], [])
    got = [batches(c, "t", [0], skip_corrupt=True, on_skip=s.append) for c, s in zip((local, remote), skipped, strict=True)]
    assert got[0] == got[1]
    assert skipped[0] == skipped[1] and len(skipped[0]) == 1


def test_follow_sees_messages_produced_later(root, two, address):
    end = root.log("t", 1).log_end_offset

    def later() -> None:
        time.sleep(0.3)
        with kl.RemoteProducer(address) as producer:
            producer.send("t", b"late", partition=1)

    thread = threading.Thread(target=later)
    thread.start()
    with kl.RemoteConsumer(address) as consumer:
        follow = consumer.consume("t", [1], start=end, follow=True, max_messages=1, idle_timeout=30, poll_interval=0.05)
        seen = [m.value for b in follow for m in b.messages]
    thread.join()
    assert seen == [b"late"]


def test_threads_share_a_consumer_each_on_its_own_connection(root, two, remote):
    expected = batches(kl.Consumer(root), "t", max_bytes=500)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(batches(remote, "t", max_bytes=500))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4
    assert len(remote.remote._connections) == 4


def test_a_broken_connection_is_replaced_for_a_read(root, two, remote):
    assert remote.latest_offset("t", 0) == root.log("t", 0).log_end_offset
    remote.remote._local.conn.sock.shutdown(socket.SHUT_RDWR)
    assert remote.latest_offset("t", 0) == root.log("t", 0).log_end_offset


def test_a_forked_child_reads_on_its_own_connection(root, two, remote):
    end = remote.latest_offset("t", 0)
    parents = remote.remote._local.conn
    pid = os.fork()
    if pid == 0:
        os._exit(0 if remote.latest_offset("t", 0) == end and remote.remote._local.conn is not parents else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert remote.latest_offset("t", 1) == root.log("t", 1).log_end_offset


def test_an_unreachable_server_is_a_network_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(kl.net.wire.NetworkError, match=f"cannot connect to 127.0.0.1:{port}"):
        kl.RemoteConsumer(f"127.0.0.1:{port}").latest_offset("t", 0)


# ----------------------------------------------------------------- RemoteProducer


def test_send_and_send_batch_land_where_they_say(root, two, address):
    local = kl.Consumer(root)
    with kl.RemoteProducer(address) as producer:
        keyed = producer.send("t", b"hello", key=b"user-1")
        batch = producer.send_batch("t", [b"a", b"b", b"c"], partition=0, timestamp=7)
    assert keyed.partition == zlib.crc32(b"user-1") % 2
    [message] = list(local.fetch("t", keyed.partition, keyed.offset, keyed.next_offset - keyed.offset))
    assert (message.key, message.value, message.next_offset) == (b"user-1", b"hello", keyed.next_offset)
    [appended] = batch
    got = list(local.fetch("t", 0, appended.offset))
    assert [(m.value, m.timestamp) for m in got] == [(b"a", 7), (b"b", 7), (b"c", 7)]
    assert (got[-1].next_offset, appended.count) == (appended.next_offset, 3)


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_batches_round_trip(root, two, address, compression):
    with kl.RemoteProducer(address, compression=compression) as producer:
        [appended] = producer.send_batch("t", [b"x" * 100] * 5, keys=[b"k"] * 5)
    got = list(kl.Consumer(root).fetch("t", appended.partition, appended.offset))
    assert [(m.key, m.value) for m in got] == [(b"k", b"x" * 100)] * 5
    assert appended.next_offset - appended.offset < 5 * 100


def test_the_partitioner_and_async_mode_with_callbacks(root, two, address):
    told: list[tuple[kl.Appended | None, BaseException | None]] = []
    with kl.RemoteProducer(address, linger_ms=5, partitioner=lambda key, n: n - 1) as producer:
        for i in range(100):
            producer.send("t", b"m%d" % i, on_delivery=lambda e, a: told.append((a, e)))
    assert len(told) == 100 and all(e is None and a is not None and a.partition == 1 for a, e in told)
    start = told[0][0].offset  # type: ignore[union-attr]
    values = [m.value for b in kl.Consumer(root).consume("t", [1], start=start) for m in b.messages]
    assert values == [b"m%d" % i for i in range(100)]


def test_errors_are_the_local_ones(root, two, address):
    with kl.RemoteProducer(address) as producer:
        with pytest.raises(kl.MessageTooLarge, match="exceeds max_message_bytes [0-9]+ of topic 't'"):
            producer.send("t", b"x" * 2000)
        with pytest.raises(kl.TopicNotFound, match="topic 'nope' does not exist"):
            producer.send("nope", b"x")
        with pytest.raises(kl.TopicNotFound, match="has partitions 0 to 1, not 9"):
            producer.send("t", b"x", partition=9)


@pytest.mark.parametrize("version", [2, 1], ids=["APPEND_ALL", "older-server"])
def test_a_keyed_batch_over_partitions_lands_as_the_local_one_does(root, two, address, version):
    """APPEND_ALL, or one APPEND after the other for a server of protocol version 1."""
    keys = [b"k%d" % (i % 9) for i in range(60)]
    local = kl.Producer(root)
    with kl.RemoteProducer(address) as producer:
        producer.remote._connection().version = version
        remote = producer.send_batch("t", VALUES[:60], keys, timestamp=5)
    mine = local.send_batch("t", VALUES[:60], keys, timestamp=5)
    consumer = kl.Consumer(root)

    def landed(appends: list[kl.Appended]) -> list[tuple[int, list[tuple[object, object, object]]]]:
        return [
            (
                a.partition,
                [(m.key, m.value, m.timestamp) for m in consumer.fetch("t", a.partition, a.offset, a.next_offset - a.offset)],
            )
            for a in appends
        ]

    assert len(remote) == 2 and landed(remote) == landed(mine)


def test_a_keyed_batch_the_server_cannot_write_whole_is_not_appended_at_all(root, two, address, monkeypatch):
    ends = [root.log("t", p).log_end_offset for p in range(2)]
    failing_writes(monkeypatch, root.log("t", 1).directory)
    with kl.RemoteProducer(address) as producer:
        with pytest.raises(kl.KlError, match="no space left on device"):
            producer.send_batch("t", [b"x%d" % i for i in range(20)], [b"k%d" % i for i in range(20)])
    assert [kl.Root(root.path).log("t", p).log_end_offset for p in range(2)] == ends


def test_append_all_refuses_a_partition_named_twice(root, two, address):
    from kl.net import wire

    end = root.log("t", 0).log_end_offset
    with wire.Connection(address) as conn:
        data = kl.log.message.encode(b"x")
        body = wire.append_all_body([("t", 0, data, 1), ("t", 0, data, 1)], False)
        with pytest.raises(kl.KlError, match="names a partition twice"):
            conn.call(wire.APPEND_ALL, body)
    assert kl.Root(root.path).log("t", 0).log_end_offset == end


def test_produce_needs_allow_produce(root, two):
    for address in serve(root):
        with pytest.raises(kl.KlError, match=re.escape("produce is off on this server (kl serve --allow-produce)")):
            kl.RemoteProducer(address).send("t", b"x")


# ----------------------------------------------------------------- the command line


def run(*args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env={"KL_ROOT": None}, catch_exceptions=False)


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--json"],
        ["--binary"],
        ["-K", "="],
        ["-p", "1", "-o", "-7", "--format", "{offset} {key} {value}"],
        ["-c", "9"],
        ["--from-time", "0"],
    ],
)
def test_kl_consume_server_writes_the_same_bytes(root, two, address, options):
    here = run("--root", root.path, "consume", "t", *options)
    there = run("consume", "t", "--server", address, *options)
    assert (there.exit_code, there.stdout_bytes, there.stderr) == (0, here.stdout_bytes, "")
    assert here.stdout_bytes


@pytest.mark.parametrize("options", [["nope"], ["t", "-p", "0", "-o", "5"], ["t", "-p", "0", "-o", "999999"], ["t", "-p", "4"]])
def test_kl_consume_server_fails_with_the_same_line(root, two, address, options):
    here = run("--root", root.path, "consume", *options)
    there = run("consume", "--server", address, *options)
    assert (there.exit_code, there.stderr) == (here.exit_code, here.stderr)
    assert here.stderr.startswith("Error: ")


def test_kl_produce_server_then_local_consume_gives_the_input_back(root, two, address):
    data = b"one\ntwo\n\nfour \xff\n"
    root.create_topic("u")
    assert run("produce", "u", "--server", address, "--binary", input=data).exit_code == 0
    assert run("produce", "t", "--server", address, "-K", ":", "-z", "zstd", input=b"a:1\nb:2\n").exit_code == 0
    assert run("--root", root.path, "consume", "u", "--binary").stdout_bytes == data
    assert run("--root", root.path, "consume", "t", "-o", "-2", "-K", ":").stdout_bytes.endswith(b"a:1\nb:2\n")


def test_usage_errors(root, two, address):
    group = run("consume", "t", "--server", address, "--group", "g")
    assert group.exit_code == 2 and "--group needs the root" in group.stderr
    bad = run("consume", "t", "--server", "nohost:port")
    assert bad.exit_code == 2 and "server address 'nohost:port' is not HOST:PORT" in bad.stderr
    refused = run("produce", "nope", "--server", address, input=b"x\n")
    assert (refused.exit_code, refused.stderr) == (1, f"Error: topic 'nope' does not exist in {root.path}\n")


def test_remote_root_lists_what_is_served(root, two, address):
    remote = RemoteRoot(address)
    assert remote.topics() == ["t"] and remote.config("t") == root.config("t")
    remote.close()


@pytest.mark.parametrize(
    "address, expected",
    [
        ("host:9000", ("host", 9000)),
        ("host", ("host", 9092)),
        ("::1", ("::1", 9092)),
        ("[::1]:9000", ("::1", 9000)),
        ("[::1]", ("::1", 9092)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
    ],
)
def test_server_addresses_are_parsed(address, expected):
    assert kl.net.wire.parse_address(address) == expected


@pytest.mark.parametrize("address", ["", ":9000", "host:0", "host:65536", "host:x"])
def test_bad_server_addresses_are_refused(address):
    with pytest.raises(kl.InvalidConfig, match="is not HOST:PORT"):
        kl.net.wire.parse_address(address)
