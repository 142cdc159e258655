"""Headers and null values (magic 3) through the library: the topic's ``headers`` setting
and what older kl versions make of it, producers (sync, batch, async), consumers, the
checks of a received set, recovery, dump, time lookups and group lag."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_cli
from test_cli import fails, ok

import kl
from kl import groups
from kl.log import message as m
from kl.log.config import CONFIG_FILE, TopicConfig
from kl.log.dump import dump_file
from kl.log.recovery import recover
from kl.log.validate import validate
from kl.registry import Registry

from conftest import active_segment, flip_byte, read_all

kl_root = test_cli.kl_root
"""A root holding one-partition topic ``t`` (as a path), the CLI tests' fixture."""
HEADERS = (("trace", b"t-1"), ("trace", b"t-2"), ("schema", None), ("bin", bytes(range(256))))


def plain_topic(root: kl.Root, name: str = "old") -> str:
    """A topic as kl before headers made it (no ``headers`` setting)."""
    root.create_topic(name, kl.TopicConfig(headers=False))
    return name


# ----------------------------------------------------------------- the topic setting


def test_a_new_topic_of_format_kl_holds_headers_and_says_so_in_its_config(root, topic):
    assert root.config(topic).holds_headers
    assert json.loads((Path(root.path) / topic / CONFIG_FILE).read_text())["headers"] is True


def test_a_topic_without_headers_writes_no_setting_that_older_kl_would_refuse(root):
    plain_topic(root)
    assert "headers" not in json.loads((Path(root.path) / "old" / CONFIG_FILE).read_text())
    assert not root.config("old").holds_headers


def test_a_kl_before_headers_refuses_a_topic_with_them():
    """Older kl reads topic.json with a fixed set of settings: ``headers`` is unknown there."""
    known_before = {"partitions", "segment_bytes", "max_message_bytes", "flush_messages", "flush_ms", "retention_ms",
                    "retention_bytes", "format", "topic_id"}
    written = json.loads(TopicConfig(headers=True, topic_id="A" * 22).to_json())
    assert set(written) - known_before == {"headers"}
    assert set(json.loads(TopicConfig(headers=False, topic_id="A" * 22).to_json())) == known_before


def test_a_0_7_topic_cannot_hold_headers(root):
    root.create_topic("legacy", kl.TopicConfig(format="0.7"))
    assert not root.config("legacy").holds_headers
    with pytest.raises(kl.InvalidConfig, match="format 0.7 cannot hold headers or null values"):
        root.create_topic("legacy2", kl.TopicConfig(format="0.7", headers=True))
    with pytest.raises(kl.InvalidConfig, match="format 0.7 cannot hold headers"):
        root.alter_topic("legacy", headers=True)


def test_alter_turns_headers_on_never_off(root):
    plain_topic(root)
    assert root.alter_topic("old", headers=True).holds_headers
    assert json.loads((Path(root.path) / "old" / CONFIG_FILE).read_text())["headers"] is True
    with pytest.raises(kl.ConfigNotAlterable, match="headers cannot be turned off"):
        root.alter_topic("old", headers=False)


def test_a_headers_setting_that_is_not_a_boolean_makes_the_config_unreadable():
    with pytest.raises(kl.InvalidConfig, match="headers must be true or false"):
        TopicConfig.from_json(b'{"headers": 1}', "topic.json")


# ----------------------------------------------------------------- producing and consuming


def test_send_with_headers_and_a_null_value_reads_back(root, topic):
    producer = kl.Producer(root)
    first = producer.send(topic, b"v", key=b"k", headers=HEADERS, timestamp=5)
    producer.send(topic, None, key=b"k", timestamp=6)
    producer.send(topic, b"", timestamp=7)
    got = read_all(root, topic)
    assert [(msg.key, msg.value, msg.headers, msg.timestamp) for msg in got] == [
        (b"k", b"v", HEADERS, 5), (b"k", None, (), 6), (None, b"", (), 7),
    ]
    assert first.next_offset - first.offset == m.framed_size(b"v", b"k", HEADERS)
    assert kl.Consumer(root).fetch(topic, 0, 0, 1 << 16).values()[0] == [b"v", None, b""]


def test_headers_may_be_given_as_lists(root, topic):
    kl.Producer(root).send(topic, b"v", headers=[["a", b"1"], ("b", None)])
    assert read_all(root, topic)[0].headers == (("a", b"1"), ("b", None))


def test_a_message_without_headers_is_still_magic_2(root, topic):
    kl.Producer(root).send(topic, b"v", headers=[])
    assert active_segment(root, topic).read_bytes()[m.MAGIC_OFFSET] == m.CURRENT_MAGIC


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_send_batch_takes_headers_per_message_as_keys(root, topic, compression):
    values = [b"a", None, b"c", b"d"]
    headers = [HEADERS, None, (), [("x", b"y")]]
    kl.Producer(root, compression=compression).send_batch(topic, values, keys=[None, b"k", None, b"k"], headers=headers)
    got = read_all(root, topic)
    assert [(msg.value, msg.key, msg.headers) for msg in got] == [
        (b"a", None, HEADERS), (None, b"k", ()), (b"c", None, ()), (b"d", b"k", (("x", b"y"),)),
    ]


def test_send_batch_with_keys_spreads_headers_with_their_messages(root):
    root.create_topic("many", kl.TopicConfig(partitions=4))
    keys = [b"k%d" % i for i in range(40)]
    kl.Producer(root).send_batch("many", [None] * 40, keys=keys, headers=[[("i", b"%d" % i)] for i in range(40)])
    got = [msg for p in range(4) for msg in read_all(root, "many", p)]
    assert sorted((msg.key, msg.headers) for msg in got) == sorted((k, (("i", b"%d" % i),)) for i, k in enumerate(keys))
    assert {msg.value for msg in got} == {None}


def test_send_batch_counts_headers_in_each_message_size(root):
    root.create_topic("small", kl.TopicConfig(max_message_bytes=100, segment_bytes=1000))
    room = 100 - m.framed_size(b"", None, [("h", b"")])
    kl.Producer(root).send_batch("small", [b""], headers=[[("h", b"x" * room)]])
    with pytest.raises(kl.MessageTooLarge, match="a message of 101 bytes"):
        kl.Producer(root).send_batch("small", [b""], headers=[[("h", b"x" * (room + 1))]])


@pytest.mark.parametrize("linger_ms", [0, 5])
def test_the_async_producer_carries_headers_and_null_values_in_order(root, topic, linger_ms):
    done = []
    with kl.Producer(root, linger_ms=linger_ms) as producer:
        for i in range(200):
            if i % 3 == 0:
                producer.send(topic, b"%d" % i, headers=[("i", b"%d" % i)], on_delivery=lambda e, a: done.append((a, e)))
            elif i % 3 == 1:
                producer.send(topic, None, key=b"%d" % i)
            else:
                producer.send(topic, b"%d" % i)
    got = read_all(root, topic)
    assert [msg.value for msg in got] == [None if i % 3 == 1 else b"%d" % i for i in range(200)]
    assert [msg.headers for msg in got][::3] == [(("i", b"%d" % i),) for i in range(0, 200, 3)]
    assert all(error is None for _, error in done) and len(done) == 67
    assert [a.next_offset - a.offset for a, _ in done] == [m.framed_size(b"%d" % i, None, [("i", b"%d" % i)])
                                                          for i in range(0, 200, 3)]


def test_headers_and_null_values_are_refused_for_a_topic_without_the_setting(root):
    plain_topic(root)
    producer = kl.Producer(root)
    fix = "allow them with kl topics alter old --headers"
    with pytest.raises(kl.FormatMismatch, match=f"topic 'old' was created without headers .*: {fix}"):
        producer.send("old", b"v", headers=[("h", b"1")])
    with pytest.raises(kl.FormatMismatch, match=fix):
        producer.send("old", None)
    with pytest.raises(kl.FormatMismatch, match=fix):
        producer.send_batch("old", [b"a", None])
    assert read_all(root, "old") == []
    root.alter_topic("old", headers=True)  # the producer's cached config is read again
    producer.send("old", None)
    assert [msg.value for msg in read_all(root, "old")] == [None]


def test_the_async_producer_fails_only_the_messages_a_topic_cannot_hold(root):
    plain_topic(root)
    producer = kl.Producer(root, linger_ms=0)
    with pytest.raises(kl.FormatMismatch, match="created without headers"):
        producer.send("old", None)
    producer.send("old", b"fine")
    producer.close()
    assert [msg.value for msg in read_all(root, "old")] == [b"fine"]


def test_a_0_7_topic_refuses_headers_and_null_values(root):
    root.create_topic("legacy", kl.TopicConfig(format="0.7"))
    with pytest.raises(kl.FormatMismatch, match="Kafka 0.7 messages, which cannot hold headers or null values"):
        kl.Producer(root).send("legacy", b"v", headers=[("h", b"1")])
    with pytest.raises(kl.FormatMismatch, match="cannot hold headers or null values"):
        kl.Producer(root).send_batch("legacy", [None])


def test_bad_headers_are_refused_before_anything_is_written(root, topic):
    with pytest.raises(kl.InvalidHeaders, match="a header is a"):
        kl.Producer(root).send(topic, b"v", headers=[("a", b"1", b"2")])
    with pytest.raises(kl.InvalidHeaders, match="its value is bytes or None"):
        kl.Producer(root).send_batch(topic, [b"v"], headers=[[("a", 1)]])
    assert read_all(root, topic) == []


# ----------------------------------------------------------------- the storage layer's readers


def test_a_received_set_may_hold_magic_3_only_where_the_topic_has_headers():
    data = m.encode(b"v", headers=[("h", b"1")]) + m.encode(None)
    assert validate(data, "kl", 1 << 20, headers=True).count == 2
    with pytest.raises(kl.InvalidMessageSet, match="magic 3 .* without the headers setting"):
        validate(data, "kl", 1 << 20)
    inner = m.encode(m.compress(m.CODEC_ZSTD, data), None, 0, m.CODEC_ZSTD)
    assert validate(inner, "kl", 1 << 20, headers=True).count == 2
    with pytest.raises(kl.InvalidMessageSet, match="inner message of magic 3"):
        validate(inner, "kl", 1 << 20)
    with pytest.raises(kl.InvalidMessageSet, match="magic 3 in a topic of format 0.7"):
        validate(data, "0.7", 1 << 20, headers=True)


def test_deep_recovery_accepts_magic_3_and_still_finds_damage_in_it(root, topic):
    producer = kl.Producer(root)
    producer.send(topic, b"v", headers=HEADERS)
    producer.send(topic, None, key=b"k")
    producer.close()
    assert recover(root.log(topic, 0), deep=True, dry_run=True).findings == []
    flip_byte(active_segment(root, topic), m.framed_size(b"v", None, HEADERS) - 1)  # the last header value's last byte
    findings = recover(kl.Root(root.path).log(topic, 0), deep=True, dry_run=True).findings
    assert [(f.offset, f.kind) for f in findings] == [(0, "CHECKSUM")]


def test_dump_lists_headers_and_null_values(root, topic):
    producer = kl.Producer(root)
    producer.send(topic, b"v", headers=[("h", b"1")], timestamp=3)
    producer.send(topic, None, timestamp=4)
    records = list(dump_file(str(active_segment(root, topic))))
    assert [(r.magic, r.value, r.headers, r.valid) for r in records] == [(3, b"v", (("h", b"1"),), True), (3, None, (), True)]


def test_time_lookups_and_group_lag_see_magic_3_timestamps(root, topic):
    producer = kl.Producer(root)
    for ts in (10, 20, 30):
        producer.send(topic, None, timestamp=ts)
    consumer = kl.Consumer(root)
    assert consumer.offset_for_time(topic, 0, 20) == read_all(root, topic)[1].offset
    Registry(root.path, "g").write_offset(topic, 0, 0, "test")
    (row,) = groups.describe(root, "g").partitions
    assert (row.lag_messages, row.lag_ms is not None) == (3, True)


# ----------------------------------------------------------------- the command line


def test_produce_H_gives_every_message_the_headers_and_consume_json_shows_them(kl_root):
    ok(kl_root, "produce", "t", "-H", "trace=1", "-H", "gone", "-H", "trace=", "-k", "k", input=b"a\nb\n")
    lines = [json.loads(line) for line in ok(kl_root, "consume", "t", "--json").splitlines()]
    shown = [{"key": "trace", "value": "1"}, {"key": "gone", "value": None}, {"key": "trace", "value": ""}]
    assert [(line["key"], line["value"], line["headers"]) for line in lines] == [("k", "a", shown), ("k", "b", shown)]


def test_consume_json_leaves_headers_out_of_a_message_without_them(kl_root):
    ok(kl_root, "produce", "t", input=b"a\n")
    assert b"headers" not in ok(kl_root, "consume", "t", "--json")


def test_consume_format_headers_writes_them_as_kcats_h(kl_root):
    ok(kl_root, "produce", "t", "-H", "a=1", "-H", "b", "-H", "c=", input=b"v\n")
    ok(kl_root, "produce", "t", input=b"w\n")
    assert ok(kl_root, "consume", "t", "--format", "[{headers}] {value}") == b"[a=1,b,c=] v\n[] w\n"
    assert ok(kl_root, "consume", "t", "--format", "{headers!s:>12}|") == b"    a=1,b,c=|\n" + b" " * 12 + b"|\n"


def test_a_null_value_is_null_in_json_and_empty_in_plain_output(kl_root):
    ok(kl_root, "produce", "t", "--json", input=b'{"value": null, "key": "k"}\n{"value": ""}\n')
    lines = [json.loads(line) for line in ok(kl_root, "consume", "t", "--json").splitlines()]
    assert [line["value"] for line in lines] == [None, ""]
    assert ok(kl_root, "consume", "t") == b"\n\n"
    assert ok(kl_root, "consume", "t", "--binary") == b""


def test_json_round_trips_every_byte_value_of_values_and_headers(kl_root, tmp_path):
    every = [bytes([b]) for b in range(256)] + [bytes(range(256)), b"", None]
    kl.Producer(kl.Root(kl_root)).send_batch(
        "t", every, headers=[[("k\u00e9", v), ("n", None), ("e", b"")] for v in every]
    )
    printed = ok(kl_root, "consume", "t", "--json")
    kl.Root(kl_root).create_topic("copy")
    ok(kl_root, "produce", "copy", "--json", input=printed)
    original, copied = read_all(kl.Root(kl_root), "t"), read_all(kl.Root(kl_root), "copy")
    assert [(msg.key, msg.value, msg.headers, msg.timestamp) for msg in copied] == [
        (msg.key, msg.value, msg.headers, msg.timestamp) for msg in original
    ]
    assert [msg.value for msg in copied] == every
    assert ok(kl_root, "consume", "copy", "--json").replace(b'"topic": "copy"', b'"topic": "t"') == printed


@pytest.mark.parametrize(
    "line, problem",
    [
        (b'{"value": "v", "headers": {"a": "b"}}', "'headers' must be a list of"),
        (b'{"value": "v", "headers": [["a", "b"]]}', "a header must be an object with a string 'key'"),
        (b'{"value": "v", "headers": [{"key": 1, "value": "b"}]}', "a header must be an object with a string 'key'"),
        (b'{"value": "v", "headers": [{"key": "a"}]}', "header 'a': no 'value' or 'value_b64'"),
        (b'{"value": "v", "headers": [{"key": "a", "value": "b", "extra": 1}]}', "a header must be an object"),
        (b'{"value": "v", "headers": [{"key": "a", "value": "b", "value_b64": "Yg=="}]}', "both 'value' and 'value_b64'"),
        (b'{"value": "v", "headers": [{"key": "a", "value_b64": "!"}]}', "'value_b64' is not valid base64"),
        (b'{"value": "v", "headers": [{"key": "\\udc80", "value": "b"}]}', "is not valid Unicode"),
    ],
)
def test_produce_json_refuses_headers_that_are_not_what_consume_writes(kl_root, line, problem):
    assert problem in fails(kl_root, "produce", "t", "--json", input=line + b"\n")


def test_headers_to_a_topic_without_them_fail_naming_the_fix(kl_root):
    ok(kl_root, "topics", "create", "old", "--no-headers")
    fix = "allow them with kl topics alter old --headers (kl versions before headers then refuse the topic)"
    assert fails(kl_root, "produce", "old", "-H", "a=b", input=b"v\n") == (
        f"Error: topic 'old' was created without headers and cannot hold headers or null values: {fix}"
    )
    failed = fails(kl_root, "produce", "old", "--json", input=b'{"value": null}\n')
    assert failed.endswith(f"{fix}; 0 lines before it were committed")
    ok(kl_root, "topics", "alter", "old", "--headers")
    ok(kl_root, "produce", "old", "-H", "a=b", input=b"v\n")
    assert ok(kl_root, "consume", "old", "--format", "{headers}") == b"a=b\n"


def test_a_0_7_topic_refuses_the_headers_option(kl_root):
    assert fails(kl_root, "topics", "create", "legacy", "--format", "0.7", "--headers") == (
        "Error: a topic of format 0.7 cannot hold headers or null values (Kafka 0.7 messages have neither)"
    )
    ok(kl_root, "topics", "create", "legacy", "--format", "0.7")
    assert "cannot hold headers or null values" in fails(kl_root, "topics", "alter", "legacy", "--headers")
    assert "which cannot hold headers" in fails(kl_root, "produce", "legacy", "-H", "a", input=b"v\n")


def test_json_and_H_do_not_mix(kl_root):
    assert "--json" in fails(kl_root, "produce", "t", "--json", "-H", "a=b", input=b"", code=2)


def test_a_producer_of_magic_3_killed_mid_write_leaves_whole_messages_only(root, topic):
    script = (
        "import sys, kl\n"
        "p = kl.Producer(kl.Root(sys.argv[1]))\n"
        "i = 0\n"
        "while True:\n"
        "    p.send_batch('t', [None, b'v%d' % i], headers=[[('i', b'%d' % i)], [('n', None), ('i', b'%d' % i)]])\n"
        "    i += 1\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, root.path])
    consumer = kl.Consumer(root)
    try:
        while consumer.latest_offset(topic, 0) < 200_000 and child.poll() is None:
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    fresh = kl.Root(root.path)
    recover(fresh.log(topic, 0), deep=True)  # cuts a torn tail, if the kill left one
    assert recover(kl.Root(root.path).log(topic, 0), deep=True, dry_run=True).findings == []
    got = read_all(kl.Root(root.path), topic, max_bytes=1 << 20)
    assert len(got) > 1000 and len(got) % 2 == 0
    for i, (null, value) in enumerate(zip(got[::2], got[1::2], strict=True)):
        assert (null.value, null.headers) == (None, (("i", b"%d" % i),))
        assert (value.value, value.headers) == (b"v%d" % i, (("n", None), ("i", b"%d" % i)))


def test_dump_shows_headers_and_null_values_in_text_and_json(kl_root):
    ok(kl_root, "produce", "t", "--json", input=(
        b'{"value": "v", "timestamp": 5, "headers": [{"key": "a", "value": "1"}, {"key": "b", "value": null},'
        b' {"key": "c", "value_b64": "/w=="}]}\n{"value": null, "key": "k", "timestamp": 6}\n'
    ))
    assert ok(kl_root, "dump", "t", "--print-data").decode().splitlines()[1:] == [
        r"offset: 0 position: 0 size: 60 magic: 3 codec: none timestamp: 5 valid: yes key: - headers: a=1,b,c=\xff value: v",
        "offset: 60 position: 60 size: 31 magic: 3 codec: none timestamp: 6 valid: yes key: k value: (null)",
    ]
    first, second = map(json.loads, ok(kl_root, "dump", "t", "--print-data", "--json").splitlines())
    assert first["headers"] == [{"key": "a", "value": "1"}, {"key": "b", "value": None}, {"key": "c", "value_b64": "/w=="}]
    assert (second["value"], "headers" in second) == (None, False)
