"""The kl command line: round trips asserting exact bytes, exact error lines, signals.

Most cases run in-process through click's CliRunner; the ones that need real pipes,
file descriptors or signals run ``python -m kl_cli`` as a subprocess.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kl
from kl.log import core
from kl.timespec import TIME_FORMS, format_iso, parse_time
from kl_cli.main import COMMANDS, cli

from conftest import partition_locked_elsewhere

KL = [sys.executable, "-m", "kl_cli"]
MIXED = b"first\n\nthird \xff\xfe not utf-8\n\n\ttabs\tand spaces  \nlast\n"
"""Empty lines, bytes that are not UTF-8, and a final newline."""


# ----------------------------------------------------------------- helpers


@pytest.fixture
def kl_root(tmp_path: Path) -> str:
    """An empty root directory holding one-partition topic ``t``."""
    path = str(tmp_path / "root")
    kl.Root(path).create_topic("t")
    return path


def run(root: str | None, *args: str, input: bytes | None = None) -> Result:
    """``kl [--root ROOT] ARGS`` in-process, stdout and stderr kept apart."""
    argv = (["--root", root] if root is not None else []) + list(args)
    return CliRunner().invoke(cli, argv, input=input, env={"KL_ROOT": None}, catch_exceptions=False)


def ok(root: str | None, *args: str, input: bytes | None = None) -> bytes:
    """Run kl, assert it succeeded quietly, return its stdout bytes."""
    result = run(root, *args, input=input)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout_bytes


def fails(root: str | None, *args: str, input: bytes | None = None, code: int = 1) -> str:
    """Run kl, assert it failed with ``code`` and printed nothing on stdout; return the
    last stderr line."""
    result = run(root, *args, input=input)
    assert result.exit_code == code, result.output
    assert result.stdout_bytes == b""
    return result.stderr.splitlines()[-1]


def spawn(root: str, *args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "KL_ROOT": root}
    return subprocess.Popen(KL + list(args), env=env, **kwargs)


def shell(root: str, command: str) -> subprocess.CompletedProcess:
    """A shell command line where ``kl`` is this checkout's command line."""
    env = {**os.environ, "KL_ROOT": root, "KL": " ".join(KL)}
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, timeout=30)


def messages(root: str, topic: str = "t", *args: str) -> list[dict]:
    return [json.loads(line) for line in ok(root, "consume", topic, "--json", *args).splitlines()]


def lines(n: int, width: int = 40) -> bytes:
    """``n`` distinct newline-terminated records."""
    return b"".join(b"%08d" % i + b"." * (width - 9) + b"\n" for i in range(n))


# ----------------------------------------------------------------- round trips


def test_lines_round_trip_exactly(kl_root, tmp_path):
    f = tmp_path / "in"
    f.write_bytes(MIXED)
    done = shell(kl_root, f"$KL produce t < {f} && $KL consume t")
    assert (done.returncode, done.stdout, done.stderr) == (0, MIXED, b"")


def test_file_argument_and_dash(kl_root, tmp_path):
    f = tmp_path / "in"
    f.write_bytes(b"a\nb\n")
    ok(kl_root, "produce", "t", str(f))
    ok(kl_root, "produce", "t", "-", input=b"c\n")
    assert ok(kl_root, "consume", "t") == b"a\nb\nc\n"


def test_unterminated_last_line_is_a_message_and_gains_a_newline(kl_root):
    ok(kl_root, "produce", "t", input=b"a\n\nb")
    assert ok(kl_root, "consume", "t") == b"a\n\nb\n"


def test_empty_input_produces_nothing(kl_root):
    ok(kl_root, "produce", "t", input=b"")
    ok(kl_root, "produce", "t", "--binary", input=b"")
    assert ok(kl_root, "consume", "t") == b""


def test_single_newline_is_one_empty_message(kl_root):
    ok(kl_root, "produce", "t", input=b"\n")
    assert [m["value"] for m in messages(kl_root)] == [""]


@pytest.mark.parametrize(
    "data",
    [
        b"no trailing newline",
        b"\n\n\nempty lines\n\n",
        b"crlf\r\nline ends\r\n\r\n",
        b"\x00\xff\xfe\x80 not utf-8 \xc3\x28\n\xed\xa0\x80",
        bytes(range(256)) * 3,
    ],
    ids=["no-final-newline", "empty-lines", "crlf", "non-utf8", "all-bytes"],
)
def test_binary_round_trip_is_exact(kl_root, data):
    ok(kl_root, "produce", "t", "--binary", input=data)
    assert ok(kl_root, "consume", "t", "--binary") == data


def test_binary_round_trip_through_pipes(kl_root, tmp_path):
    data = os.urandom(3 << 20)  # several 1 MiB chunks, records cut at random newlines
    f = tmp_path / "in"
    f.write_bytes(data)
    done = shell(kl_root, f"cat {f} | $KL produce --binary t && $KL consume --binary t > {f}.out")
    assert (done.returncode, done.stderr) == (0, b"")
    assert (tmp_path / "in.out").read_bytes() == data


def test_binary_keeps_each_delimiter_in_its_message(kl_root):
    ok(kl_root, "produce", "t", "--binary", input=b"a\nb\n\nc")
    assert [m["value"] for m in messages(kl_root)] == ["a\n", "b\n", "\n", "c"]


def test_delimiter_split_across_chunks(kl_root):
    first = b"x" * ((1 << 20) - 2) + b"\r\n"  # '\r' ends the first 1 MiB chunk, '\n' starts the next
    data = first + b"second\r\nthird"
    ok(kl_root, "topics", "create", "big", "--max-message-bytes", str(2 << 20))
    ok(kl_root, "produce", "big", "-d", r"\r\n", input=data)
    assert [len(m["value"]) for m in messages(kl_root, "big")] == [(1 << 20) - 2, 6, 5]


def test_many_chunks_round_trip(kl_root):
    data = lines(60_000)  # 2.4 MB: records carried across 1 MiB chunks
    ok(kl_root, "produce", "t", input=data)
    assert ok(kl_root, "consume", "t") == data


def test_null_delimited_round_trip(kl_root):
    data = b"one\0two with\nnewline\0\0four\0"
    ok(kl_root, "produce", "t", "-0", input=data)
    assert [m["value"] for m in messages(kl_root)] == ["one", "two with\nnewline", "", "four"]
    assert ok(kl_root, "consume", "t", "--null") == data


def test_escaped_delimiter(kl_root):
    ok(kl_root, "produce", "t", "-d", r"\x1e", input=b"a\x1eb\x1e")
    assert ok(kl_root, "consume", "t", "-d", r"\t") == b"a\tb\t"
    assert ok(kl_root, "consume", "t", "--delimiter", r"\xff\\") == b"a\xff\\b\xff\\"


def test_key_delimiter(kl_root):
    data = b"k1:v1\nno key here\n:empty key\nk2:v:with:colons\n"
    ok(kl_root, "produce", "t", "-K", ":", input=data)
    assert [(m["key"], m["value"]) for m in messages(kl_root)] == [
        ("k1", "v1"),
        (None, "no key here"),
        ("", "empty key"),
        ("k2", "v:with:colons"),
    ]
    assert ok(kl_root, "consume", "t", "-K", ":") == data
    assert ok(kl_root, "consume", "t") == b"v1\nno key here\nempty key\nv:with:colons\n"


def test_json_round_trip_into_another_topic(kl_root):
    ok(kl_root, "topics", "create", "copy")
    ok(kl_root, "produce", "t", "-K", r"\t", input=b"k\xff\tv\xfe\nplain\n\xe2\x82\xac\t\xe2\x82\xac\n")
    ok(kl_root, "produce", "t", "--binary", input=b"no newline")
    dump = ok(kl_root, "consume", "t", "--json")
    ok(kl_root, "produce", "copy", "--json", input=dump)

    def fields(topic):
        return [
            (m.get("key"), m.get("key_b64"), m.get("value"), m.get("value_b64"), m["timestamp"]) for m in messages(kl_root, topic)
        ]

    assert fields("copy") == fields("t")
    assert fields("t")[0] == (None, "a/8=", None, "dv4=", fields("t")[0][4])
    assert fields("t")[2][:3] == ("€", None, "€")


def test_json_output_is_exact(kl_root):
    ok(
        kl_root,
        "produce",
        "t",
        "--json",
        input=b'{"key": "k", "value": "v\\n\\u00e9", "timestamp": 1700000000000}\n'
        b'{"value_b64": "/w==", "timestamp": 1700000000001}\n',
    )
    assert ok(kl_root, "consume", "t", "--json").decode() == (
        '{"topic": "t", "partition": 0, "offset": 0, "next_offset": 27, "timestamp": 1700000000000, '
        '"key": "k", "value": "v\\n\u00e9"}\n'
        '{"topic": "t", "partition": 0, "offset": 27, "next_offset": 50, "timestamp": 1700000000001, '
        '"key": null, "value_b64": "/w=="}\n'
    )



TRICKY = [bytes([b]) for b in range(256)] + [
    b"", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82", "\u2028 \U0001f600 \"q\" \\ \x7f".encode(), b"\x00\x1f\t"
]
"""Every single byte, a surrogate, a code point past U+10FFFF, an overlong, a cut sequence,
and text JSON escapes: what --json must tell apart as json.dumps does."""


def test_consume_renders_json_format_and_keys_as_pythons_json_and_format_do(kl_root, each_core):
    """--json, --format and -K through the core give what json.dumps and str.format give."""
    r = kl.Root(kl_root)
    producer = kl.Producer(r)
    stamps = [-62135596800000, -1, 0, 1700000000123, 253402300799999]  # the range kl stores
    for i, value in enumerate(TRICKY):
        producer.send("t", value, key=None if i % 3 == 0 else TRICKY[-i], partition=0, timestamp=stamps[i % len(stamps)])
    got = list(kl.Consumer(r).fetch("t", 0, 0, 1 << 20))

    def member(name, data):
        if data is None:
            return {name: None}
        try:
            return {name: data.decode("utf-8")}
        except UnicodeDecodeError:
            return {name + "_b64": base64.b64encode(data).decode()}

    expected = "".join(
        json.dumps(
            {"topic": "t", "partition": 0, "offset": m.offset, "next_offset": m.next_offset, "timestamp": m.timestamp}
            | member("key", m.key) | member("value", m.value),
            ensure_ascii=False,
        ) + "\n"
        for m in got
    )
    assert len(got) == len(TRICKY) and ok(kl_root, "consume", "t", "--json") == expected.encode()
    shown = ok(kl_root, "consume", "t", "--format", "{topic}/{partition:>3}@{offset}+{next_offset} {timestamp:iso} {key}|{value}")
    assert shown == b"".join(
        b"t/  0@%d+%d %b %b|%b\n" % (m.offset, m.next_offset, format_iso(m.timestamp).encode(), m.key or b"", m.value)
        for m in got
    )
    padded = ok(kl_root, "consume", "t", "--format", "{offset:>8} {timestamp}", "-d", ";")  # a spec only Python writes
    assert padded == b"".join(b"%8d %d;" % (m.offset, m.timestamp) for m in got)
    assert ok(kl_root, "consume", "t", "-K", "=") == b"".join(
        (m.value if m.key is None else m.key + b"=" + m.value) + b"\n" for m in got
    )

@pytest.mark.parametrize("codec", ["zstd", "gzip"])
def test_compressed_round_trip(kl_root, codec):
    data = lines(20_000)
    ok(kl_root, "produce", "t", "-z", codec, input=data)
    assert ok(kl_root, "consume", "t") == data
    size = json.loads(ok(kl_root, "topics", "describe", "t", "--json"))["partitions"][0]["size_in_bytes"]
    assert size < len(data) // 4


def test_batch_size_bounds_each_append(kl_root):
    ok(kl_root, "produce", "t", "-z", "zstd", "--batch-size", "3", input=lines(10))
    offsets = [m["offset"] for m in messages(kl_root)]  # inner messages carry their batch's offset
    assert [offsets.count(o) for o in sorted(set(offsets))] == [3, 3, 3, 1]


def test_fsync(kl_root):
    ok(kl_root, "produce", "t", "--fsync", input=b"durable\n")
    assert ok(kl_root, "consume", "t") == b"durable\n"


# ----------------------------------------------------------------- consume: where and how much


@pytest.fixture
def ten(kl_root) -> str:
    """Topic ``t`` holding the lines m0 .. m9, appended one by one at times 1000 .. 10000."""
    records = "".join(json.dumps({"value": f"m{i}", "timestamp": 1000 * (i + 1)}) + "\n" for i in range(10))
    ok(kl_root, "produce", "t", "--json", input=records.encode())
    return kl_root


def test_count(ten):
    assert ok(ten, "consume", "t", "-c", "3") == b"m0\nm1\nm2\n"
    assert ok(ten, "consume", "t", "--count", "0") == b""
    assert ok(ten, "consume", "t", "-c", "3", "--json").count(b"\n") == 3


def test_last_n_messages(ten):
    assert ok(ten, "consume", "t", "-o", "-2") == b"m8\nm9\n"
    assert ok(ten, "consume", "t", "--from-offset=-20") == b"".join(b"m%d\n" % i for i in range(10))


def test_last_n_messages_inside_a_compressed_batch(kl_root):
    ok(kl_root, "produce", "t", "-z", "zstd", input=b"".join(b"%d\n" % i for i in range(1, 46)))
    assert ok(kl_root, "consume", "t", "-o", "-3", "-c", "3") == b"43\n44\n45\n"
    assert ok(kl_root, "consume", "t", "-o", "-3", "--json").count(b"\n") == 3
    ok(kl_root, "produce", "t", input=b"46\n47\n")
    assert ok(kl_root, "consume", "t", "-o", "-4") == b"44\n45\n46\n47\n"


def test_earliest_and_latest(ten):
    assert ok(ten, "consume", "t", "-o", "earliest", "-c", "1") == b"m0\n"
    assert ok(ten, "consume", "t", "-o", "latest") == b""


def test_kcat_beginning_and_end(ten):
    assert ok(ten, "consume", "t", "-o", "beginning", "-c", "2") == b"m0\nm1\n"
    assert ok(ten, "consume", "t", "-o", "end") == b""


def test_byte_offset_from_next_offset(ten):
    third = messages(ten)[2]
    assert ok(ten, "consume", "t", "-o", str(third["offset"]), "-c", "2") == b"m2\nm3\n"
    assert ok(ten, "consume", "t", "-o", str(messages(ten)[-1]["next_offset"])) == b""


def test_from_time(ten):
    assert ok(ten, "consume", "t", "--from-time", "8000") == b"m7\nm8\nm9\n"
    assert ok(ten, "consume", "t", "--from-time", "7500") == b"m7\nm8\nm9\n"
    assert ok(ten, "consume", "t", "--from-time", "1970-01-01T00:00:09Z") == b"m8\nm9\n"
    assert ok(ten, "consume", "t", "--from-time", "1970-01-01T01:00:10+01:00") == b"m9\n"
    assert ok(ten, "consume", "t", "--from-time", "99999") == b""


def test_from_time_in_seconds_is_refused_naming_the_fix(ten):
    for option in ("--from-time", "--until-time"):
        line = fails(ten, "consume", "t", option, "1700000000", code=2)
        assert "1700000000 reads as milliseconds since the epoch (1970-01-20T16:13:20.000Z), but looks like seconds" in line
    assert "give 1700000000000" in run(ten, "consume", "t", "--from-time", "1700000000").stderr
    assert ok(ten, "consume", "t", "--from-time", "1700000000000") == b""


def test_print_null_writes_null_keys_and_values_as_kcat_does(kl_root):
    kl.Root(kl_root).create_topic("n")
    kl.Producer(kl.Root(kl_root)).send_batch("n", [b"v", None, b""], keys=[None, b"k", b"e"], partition=0)
    assert ok(kl_root, "consume", "n") == b"v\n\n\n"  # null and empty alike
    assert ok(kl_root, "consume", "n", "-Z") == b"v\nNULL\n\n"
    assert ok(kl_root, "consume", "n", "-Z", "-K", ":") == b"NULL:v\nk:NULL\ne:\n"
    assert ok(kl_root, "consume", "n", "-Z", "--format", "{offset} {key}={value}", "-d", ";").split(b";")[1].endswith(b" k=NULL")
    assert ok(kl_root, "consume", "n", "--print-null", "--format", "{value!r}") == b"'v'\n'NULL'\n''\n"
    assert "--print-null, --json cannot be used together" in fails(kl_root, "consume", "n", "-Z", "--json", code=2)


def test_from_time_ago_today_and_iso_local_time(kl_root, monkeypatch):
    now = time.time_ns() // 1_000_000
    stamps = [now - 3 * 86_400_000, now - 2 * 3_600_000, now - 30 * 60_000]
    records = "".join(json.dumps({"value": f"m{i}", "timestamp": ts}) + "\n" for i, ts in enumerate(stamps))
    ok(kl_root, "produce", "t", "--json", input=records.encode())
    assert ok(kl_root, "consume", "t", "--from-time", "-1h") == b"m2\n"
    assert ok(kl_root, "consume", "t", "--from-time=-2h30m") == b"m1\nm2\n"
    assert ok(kl_root, "consume", "t", "--from-time", "-1d") == b"m1\nm2\n"
    midnight = parse_time("today")  # shortly after it, m1 and even m2 were yesterday
    today = b"".join(b"m%d\n" % i for i, ts in enumerate(stamps) if ts >= midnight)
    assert ok(kl_root, "consume", "t", "--from-time", "today") == today
    assert ok(kl_root, "consume", "t", "--from-time", "yesterday").endswith(b"m2\n")
    assert ok(kl_root, "consume", "t", "--from-time", "now") == b""
    monkeypatch.setenv("TZ", "EST5")  # a time without a zone is local time
    time.tzset()
    try:
        assert ok(kl_root, "consume", "t", "--from-time", "1969-12-31T19:00:00") == b"m0\nm1\nm2\n"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_until_time_stops_before_the_first_message_stamped_at_or_after_it(ten):
    assert ok(ten, "consume", "t", "--until-time", "3000") == b"m0\nm1\n"
    assert ok(ten, "consume", "t", "--until-time", "2500") == b"m0\nm1\n"
    assert ok(ten, "consume", "t", "--from-time", "3000", "--until-time", "1970-01-01T00:00:05Z") == b"m2\nm3\n"
    assert ok(ten, "consume", "t", "--until-time", "0") == b""
    assert ok(ten, "consume", "t", "--until-time", "now") == b"".join(b"m%d\n" % i for i in range(10))


def test_until_offset_stops_before_the_message_there(ten):
    third = messages(ten)[2]
    assert ok(ten, "consume", "t", "--until-offset", str(third["offset"])) == b"m0\nm1\n"
    assert ok(ten, "consume", "t", "-o", "-9", "--until-offset", str(third["offset"] + 1)) == b"m1\nm2\n"
    assert ok(ten, "consume", "t", "-o", str(third["offset"]), "--until-offset", "0") == b""


def test_an_end_bound_ends_a_follow_with_exit_status_0(ten):
    bounded = spawn(ten, "consume", "t", "-f", "--until-time", "3000", stdout=subprocess.PIPE)
    assert bounded.communicate(timeout=30) == (b"m0\nm1\n", None) and bounded.returncode == 0
    by_offset = spawn(ten, "consume", "t", "-f", "--until-offset", "0", stdout=subprocess.PIPE)
    assert by_offset.communicate(timeout=30) == (b"", None) and by_offset.returncode == 0
    until = time.time_ns() // 1_000_000 + 500  # no message stamped after it: caught up once the clock passes it
    by_clock = spawn(ten, "consume", "t", "-f", "-o", "-1", "--until-time", str(until), stdout=subprocess.PIPE)
    assert by_clock.communicate(timeout=30) == (b"m9\n", None) and by_clock.returncode == 0
    assert time.time_ns() // 1_000_000 >= until


def test_format_timestamp_iso(ten):
    out = ok(ten, "consume", "t", "-c", "2", "--format", "{timestamp:iso} {timestamp} {timestamp:>6}|{value}")
    assert out == b"1970-01-01T00:00:01.000Z 1000   1000|m0\n1970-01-01T00:00:02.000Z 2000   2000|m1\n"
    ok(ten, "topics", "create", "old", "--format", "0.7")
    ok(ten, "produce", "old", input=b"x\n")
    assert ok(ten, "consume", "old", "--format", "[{timestamp:iso}][{timestamp}]{value}") == b"[][]x\n"


def test_format(kl_root):
    ok(kl_root, "produce", "t", "-K", "=", input=b"k=v\xff\nbare\n")
    out = ok(kl_root, "consume", "t", "--format", r"{partition}|{offset}|{next_offset}|{key}|{value}\t")
    assert out == b"0|0|25|k|v\xff\t\n0|25|51||bare\t\n"
    stamped = ok(kl_root, "consume", "t", "-c", "1", "-0", "--format", "{topic}:{timestamp}")
    assert stamped.startswith(b"t:") and stamped.endswith(b"\0") and stamped[2:-1].isdigit()


def test_partition(kl_root):
    ok(kl_root, "topics", "create", "three", "--partitions", "3")
    ok(kl_root, "produce", "three", "-p", "1", input=b"one\n")
    ok(kl_root, "produce", "three", "--partition", "2", input=b"two\n")
    assert ok(kl_root, "consume", "three", "-p", "1") == b"one\n"
    assert ok(kl_root, "consume", "three", "-p", "0") == b""
    assert sorted(ok(kl_root, "consume", "three").splitlines()) == [b"one", b"two"]


def test_multi_partition_keys_keep_order_per_partition(kl_root):
    ok(kl_root, "topics", "create", "three", "--partitions", "3")
    data = b"".join(b"key%d:%05d\n" % (i % 7, i) for i in range(3000))
    ok(kl_root, "produce", "three", "-K", ":", input=data)
    got = messages(kl_root, "three")
    assert sorted((m["key"], m["value"]) for m in got) == sorted(tuple(line.decode().split(":")) for line in data.splitlines())
    assert {m["partition"] for m in got} == {0, 1, 2}
    for key in {m["key"] for m in got}:
        mine = [m for m in got if m["key"] == key]
        assert len({m["partition"] for m in mine}) == 1
        assert [m["value"] for m in mine] == sorted(m["value"] for m in mine)
    assert ok(kl_root, "consume", "three", "-K", ":", "-o", "-1").count(b"\n") == 3


def test_follow_prints_new_messages(kl_root):
    ok(kl_root, "produce", "t", input=b"old\n")
    follower = spawn(kl_root, "consume", "t", "--follow", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert follower.stdout.readline() == b"old\n"
        ok(kl_root, "produce", "t", input=b"new 1\nnew 2\n")
        got = []
        timer = threading.Timer(10, follower.kill)
        timer.start()
        got += [follower.stdout.readline(), follower.stdout.readline()]
        timer.cancel()
        assert got == [b"new 1\n", b"new 2\n"]
        assert follower.poll() is None
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(10) == -signal.SIGINT
    assert follower.stderr.read() == b""


def test_ctrl_c_stops_a_script_running_kl_not_only_the_kl_it_lands_in(kl_root):
    """Ctrl-C reaches the script's whole process group, and bash goes on after a child
    that exited by itself (status 130 included): only a kl ended by SIGINT stops the
    loop.  Each follower says it started; the script is interrupted during the first."""
    ok(kl_root, "produce", "t", input=b"old\n")
    loop = 'for i in 1 2 3; do echo "follower $i"; $KL consume t --follow; done; echo "the loop went on"'
    script = subprocess.Popen(
        ["bash", "-c", loop], env={**os.environ, "KL_ROOT": kl_root, "KL": " ".join(KL)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        assert script.stdout.readline() == b"follower 1\n"
        assert script.stdout.readline() == b"old\n"  # kl runs, past its start-up
        os.killpg(script.pid, signal.SIGINT)  # the terminal's Ctrl-C
        out, err = script.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
    assert (script.returncode, out, err) == (-signal.SIGINT, b"", b"")


def test_follow_stops_after_count(kl_root):
    ok(kl_root, "produce", "t", input=b"a\nb\n")
    assert ok(kl_root, "consume", "t", "-f", "-c", "2") == b"a\nb\n"


def test_caught_up_is_fixed_at_start(kl_root):
    """A topic that keeps growing still ends: a producer runs all the time here."""
    stop = threading.Event()

    def keep_producing():
        producer = kl.Producer(kl_root)
        while not stop.is_set():
            producer.send_batch("t", [b"more"] * 100, partition=0)

    writer = threading.Thread(target=keep_producing)
    writer.start()
    try:
        done = subprocess.run(KL + ["--root", kl_root, "consume", "t"], capture_output=True, timeout=20)
    finally:
        stop.set()
        writer.join()
    assert done.returncode == 0 and set(done.stdout.splitlines()) <= {b"more"}


def test_closed_pipe_exits_quietly(kl_root):
    ok(kl_root, "produce", "t", input=lines(200_000))
    done = shell(kl_root, "$KL consume t | head -n 1; echo ${PIPESTATUS[0]} >&2")
    assert done.stdout == lines(1)
    assert done.stderr == b"%d\n" % (128 + signal.SIGPIPE)


def test_ctrl_c_leaves_a_prefix_of_whole_messages(kl_root):
    producer = spawn(kl_root, "produce", "t", "--batch-size", "500", stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    data = lines(2_000_000)  # 80 MB: far more than is appended before the interrupt

    def feed():
        try:
            producer.stdin.write(data)
        except (BrokenPipeError, ValueError):
            pass

    feeder = threading.Thread(target=feed)
    feeder.start()
    consumer = kl.Consumer(kl_root)
    deadline = time.monotonic() + 20
    while consumer.latest_offset("t", 0) < 1_000_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    producer.send_signal(signal.SIGINT)
    assert producer.wait(20) == -signal.SIGINT
    feeder.join()
    assert producer.stderr.read() == b""
    out = ok(kl_root, "consume", "t")
    assert 1_000_000 // 80 < out.count(b"\n") < 2_000_000
    assert data.startswith(out)


# ----------------------------------------------------------------- topics


def test_topics_create_list_describe_delete(tmp_path):
    root = str(tmp_path / "new-root")
    ok(root, "topics", "create", "b", "--partitions", "2", "--segment-bytes", "2000000", "--max-message-bytes", "1000")
    ok(root, "topics", "create", "a", "--flush-messages", "0", "--flush-ms", "0", "--retention-ms", "5", "--retention-bytes", "7")
    assert ok(root, "topics", "list") == b"a\nb\n"
    ok(root, "produce", "b", "-p", "1", input=b"hello\n")
    b_id = kl.Root(root).config("b").topic_id
    assert ok(root, "topics", "describe", "b").decode() == (
        "topic              b\n"
        "partitions         2\n"
        "segment_bytes      2000000                 segment.bytes=2000000\n"
        "max_message_bytes  1000                    max.message.bytes=1000\n"
        "flush_messages     0                       flush.messages=9223372036854775807\n"
        "flush_ms           1000                    flush.ms=1000\n"
        "retention_ms       604800000               retention.ms=604800000\n"
        "retention_bytes    0                       retention.bytes=-1\n"
        "format             kl\n"
        "headers            true\n"
        "partitioner        crc32\n"
        f"topic_id           {b_id}\n"
        "                                           cleanup.policy=delete\n"
        "                                           compression.type=uncompressed\n"
        "                                           follower.replication.throttled.replicas=\n"
        "                                           leader.replication.throttled.replicas=\n"
        "                                           message.timestamp.type=CreateTime\n"
        "                                           min.insync.replicas=1\n"
        "                                           preallocate=false\n"
        "                                           remote.storage.enable=false\n"
        "                                           segment.ms=9223372036854775807\n"
        "                                           unclean.leader.election.enable=false\n"
        "\n"
        "partition  segments  log_start_offset  log_end_offset  size_in_bytes\n"
        "0          1         0                 0               0\n"
        "1          1         0                 27              27\n"
    )
    described = json.loads(ok(root, "topics", "describe", "a", "--json"))
    assert described == {
        "topic": "a",
        "config": {
            "partitions": 1,
            "segment_bytes": 1 << 30,
            "max_message_bytes": 1 << 20,
            "flush_messages": 0,
            "flush_ms": 0,
            "retention_ms": 5,
            "retention_bytes": 7,
            "format": "kl",
            "headers": True,
            "partitioner": "crc32",
            "topic_id": kl.Root(root).config("a").topic_id,
        },
        "kafka_config": {
            "cleanup.policy": "delete",
            "compression.type": "uncompressed",
            "flush.messages": "9223372036854775807",  # kl's 0: never
            "flush.ms": "9223372036854775807",
            "follower.replication.throttled.replicas": "",
            "leader.replication.throttled.replicas": "",
            "max.message.bytes": str(1 << 20),
            "message.timestamp.type": "CreateTime",
            "min.insync.replicas": "1",
            "preallocate": "false",
            "remote.storage.enable": "false",
            "retention.bytes": "7",
            "retention.ms": "5",
            "segment.bytes": str(1 << 30),
            "segment.ms": "9223372036854775807",
            "unclean.leader.election.enable": "false",
        },
        "partitions": [{"partition": 0, "segments": 1, "log_start_offset": 0, "log_end_offset": 0, "size_in_bytes": 0}],
    }
    ok(root, "topics", "delete", "b")
    assert ok(root, "topics", "list") == b"a\n"


# ----------------------------------------------------------------- errors: exact lines, exit codes


def test_missing_root_is_a_usage_error():
    result = run(None, "topics", "list")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == "Error: no root directory: pass --root or set KL_ROOT"


def test_root_from_environment(kl_root):
    result = CliRunner().invoke(cli, ["topics", "list"], env={"KL_ROOT": kl_root})
    assert (result.exit_code, result.stdout) == (0, "t\n")


def test_unknown_topic(kl_root):
    commands = [["consume", "nope"], ["produce", "nope"], ["topics", "describe", "nope"], ["topics", "delete", "nope"]]
    for args in commands:
        assert fails(kl_root, *args, input=b"x\n") == f"Error: topic 'nope' does not exist in {kl_root}"


def test_unknown_partition(kl_root):
    assert fails(kl_root, "consume", "t", "-p", "3") == "Error: topic 't' has partitions 0 to 0, not 3"
    assert fails(kl_root, "produce", "t", "-p", "1", input=b"x\n") == "Error: topic 't' has partitions 0 to 0, not 1"
    assert ok(kl_root, "consume", "t") == b""


def test_bad_topic_name(kl_root):
    expected = "Error: invalid topic name {!r}: use 1-249 characters from A-Z a-z 0-9 . _ - not starting with a dot"
    for name in ("../x", "a/b", ".hidden", "sp ace", "x" * 250):
        assert fails(kl_root, "topics", "create", name) == expected.format(name)
    assert fails(kl_root, "consume", "../t") == expected.format("../t")


def test_topic_exists(kl_root):
    assert fails(kl_root, "topics", "create", "t") == f"Error: topic 't' already exists in {kl_root}"


@pytest.mark.parametrize("count", ["0", "-1", "10001"])
def test_bad_config(kl_root, count):
    assert fails(kl_root, "topics", "create", "z", "--partitions", count) == (
        f"Error: partitions must be between 1 and 10000, not {count}"
    )


def test_offset_out_of_range(ten):
    end = messages(ten)[-1]["next_offset"]
    assert fails(ten, "consume", "t", "-o", "999999") == (
        f"Error: offset 999999 is out of range: {ten}/t/0 holds offsets 0 to {end}"
    )


def test_offset_inside_a_message(ten):
    second = messages(ten)[1]["offset"]
    assert fails(ten, "consume", "t", "-o", "5") == (
        f"Error: offset 5 is not the start of a message in {ten}/t/0; the nearest messages start at 0 and {second}"
    )


def test_byte_offset_needs_a_partition(kl_root):
    ok(kl_root, "topics", "create", "three", "--partitions", "3")
    assert fails(kl_root, "consume", "three", "-o", "0", code=2) == (
        "Error: an offset needs --partition: topic 'three' has 3 partitions"
    )
    assert ok(kl_root, "consume", "three", "-o", "0", "-p", "2") == b""
    assert fails(kl_root, "consume", "three", "--until-offset", "0", code=2) == (
        "Error: an offset needs --partition: topic 'three' has 3 partitions"
    )
    assert ok(kl_root, "consume", "three", "--until-offset", "0", "-p", "2") == b""


@pytest.mark.parametrize(
    "line, error",
    [
        (b"not json", "line 2: invalid JSON: Expecting value: line 1 column 1 (char 0)"),
        (b"[1]", "line 2: expected a JSON object"),
        (b'{"value": "v", "colour": "red"}', "line 2: unknown field 'colour'"),
        (b'{"key": "k"}', "line 2: no 'value' or 'value_b64'"),
        (b'{"value": "v", "value_b64": "dg=="}', "line 2: both 'value' and 'value_b64'"),
        (b'{"value_b64": "***"}', "line 2: 'value_b64' is not valid base64"),
        (b'{"value": 5}', "line 2: 'value' must be a string or null"),
        (
            b'{"value": "v", "timestamp": "noon"}',
            "line 2: 'timestamp' must be milliseconds since the epoch, not 'noon'",
        ),
        (b"", "line 2: invalid JSON: Expecting value: line 1 column 1 (char 0)"),
    ],
)
def test_a_bad_json_line_is_reported_after_the_lines_before_it_are_committed(kl_root, line, error):
    assert fails(kl_root, "produce", "t", "--json", input=b'{"value": "fine"}\n' + line + b"\n") == (
        f"Error: {error}; 1 line before it was committed"
    )
    assert ok(kl_root, "consume", "t") == b"fine\n"


def test_message_too_large(kl_root):
    ok(kl_root, "topics", "create", "small", "--max-message-bytes", "100")
    assert fails(kl_root, "produce", "small", input=b"x" * 200) == (
        "Error: line 1: a message of 222 bytes exceeds max_message_bytes 100 of topic 'small'; 0 lines before it were committed"
    )


@pytest.mark.parametrize("args", [[], ["-K", ":"], ["-z", "zstd"], ["--batch-size", "7"], ["-p", "1"]])
def test_a_message_too_large_is_reported_after_every_line_before_it_is_committed(kl_root, args):
    ok(kl_root, "topics", "create", "small", "--max-message-bytes", "100", "--partitions", "2")
    before = lines(1233, width=60)
    assert fails(kl_root, "produce", "small", *args, input=before + b"y" * 200 + b"\n" + lines(5)) == (
        "Error: line 1234: a message of 222 bytes exceeds max_message_bytes 100 of topic 'small'; "
        "1233 lines before it were committed"
    )
    assert sorted(ok(kl_root, "consume", "small").splitlines(keepends=True)) == before.splitlines(keepends=True)


def test_a_failing_record_is_named_by_its_number_with_another_delimiter(kl_root):
    ok(kl_root, "topics", "create", "small", "--max-message-bytes", "100")
    assert fails(kl_root, "produce", "small", "-0", input=b"a\0b\0" + b"y" * 200) == (
        "Error: record 3: a message of 222 bytes exceeds max_message_bytes 100 of topic 'small'; "
        "2 records before it were committed"
    )


def test_a_message_too_large_in_a_big_file_through_a_real_process(kl_root, tmp_path):
    ok(kl_root, "topics", "create", "small", "--max-message-bytes", "1048576")
    f = tmp_path / "in"
    f.write_bytes(lines(100_000) + b"z" * 2_000_000 + b"\n" + lines(10))
    done = shell(kl_root, f"$KL produce small < {f}")
    assert (done.returncode, done.stdout, done.stderr.decode()) == (
        1,
        b"",
        "Error: line 100001: a message of 2000022 bytes exceeds max_message_bytes 1048576 of topic 'small'; "
        "100000 lines before it were committed\n",
    )
    assert ok(kl_root, "consume", "small") == lines(100_000)


def test_a_lock_timeout_is_reported_after_the_lines_before_it_are_committed(kl_root, monkeypatch):
    ok(kl_root, "topics", "create", "two", "--partitions", "2")
    with partition_locked_elsewhere(kl_root, "two", 1):
        monkeypatch.setitem(kl.Root.__init__.__kwdefaults__, "lock_timeout", 0.2)
        records = b"".join(b'{"partition": %d, "value": "%d"}\n' % (p, i) for i, p in enumerate([0, 0, 0, 1, 0]))
        error = fails(kl_root, "produce", "two", "--json", input=records)
    assert error.startswith("Error: line 4: ") and error.endswith("; 3 lines before it were committed"), error
    assert "lock" in error
    assert ok(kl_root, "consume", "two", "-p", "0") == b"0\n1\n2\n"
    assert ok(kl_root, "consume", "two", "-p", "1") == b""


def test_deeply_nested_json_is_one_error_line(kl_root):
    result = run(kl_root, "produce", "t", "--json", input=b'{"value": "a"}\n' + b"[" * 100_000 + b"\n")
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        "",
        "Error: line 2: invalid JSON: nested too deeply; 1 line before it was committed\n",
    )


def test_closed_stdin_is_one_error_line(kl_root):
    done = shell(kl_root, "$KL produce t <&-")
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        b"",
        b"Error: standard input is closed: give a FILE, or redirect the input\n",
    )


@pytest.mark.parametrize(
    "record, error",
    [
        ('{"value": "v", "topic": 5}', "'topic' must be a string, not 5"),
        ('{"value": "v", "partition": "0"}', "'partition' must be a whole number >= 0, not '0'"),
        ('{"value": "v", "partition": -1}', "'partition' must be a whole number >= 0, not -1"),
        ('{"value": "v", "partition": true}', "'partition' must be a whole number >= 0, not True"),
        (
            '{"value": "v", "partition": 2}',
            "'partition' 2 is out of range: topic 'two' has partitions 0 to 1 (give -p N to choose one)",
        ),
        ('{"value": "v", "offset": 1.5}', "'offset' must be a byte offset (a whole number >= 0), not 1.5"),
        ('{"value": "v", "next_offset": -3}', "'next_offset' must be a byte offset (a whole number >= 0), not -3"),
        (
            '{"value": "v", "timestamp": 9223372036854775808}',
            "'timestamp': timestamp 9223372036854775808 is outside the range kl stores, -62135596800000 to 253402300799999 "
            "ms since the epoch (years 1 to 9999, what Spark and Parquet can hold)",
        ),
    ],
)
def test_every_json_field_is_checked(kl_root, record, error):
    ok(kl_root, "topics", "create", "two", "--partitions", "2")
    assert fails(kl_root, "produce", "two", "--json", input=record.encode() + b"\n") == (
        f"Error: line 1: {error}; 0 lines before it were committed"
    )


def test_json_partition_is_used_unless_p_is_given(kl_root):
    ok(kl_root, "topics", "create", "two", "--partitions", "2")
    records = (
        b'{"topic": "elsewhere", "partition": 1, "offset": 7, "next_offset": 30, "value": "a"}\n'
        b'{"partition": 0, "key": "k", "value": "b"}\n{"partition": 1, "value": "c"}\n'
    )
    ok(kl_root, "produce", "two", "--json", input=records)
    assert (ok(kl_root, "consume", "two", "-p", "0"), ok(kl_root, "consume", "two", "-p", "1")) == (b"b\n", b"a\nc\n")
    ok(kl_root, "produce", "t", "--json", "-p", "0", input=records.replace(b'"partition": 1', b'"partition": 9'))
    assert ok(kl_root, "consume", "t") == b"a\nb\nc\n"


def test_keyless_appends_go_round_the_partitions_from_a_random_one(kl_root):
    ok(kl_root, "topics", "create", "two", "--partitions", "2")
    ok(kl_root, "produce", "two", input=b"small\n")
    sizes = [p["size_in_bytes"] for p in json.loads(ok(kl_root, "topics", "describe", "two", "--json"))["partitions"]]
    assert sorted(sizes) == [0, 27]
    data = lines(26_000)  # 61 bytes a message: 7 appends of up to 256 KiB (4297 messages)
    ok(kl_root, "produce", "two", input=data)
    got = [ok(kl_root, "consume", "two", "-p", str(p)).replace(b"small\n", b"").splitlines(keepends=True) for p in (0, 1)]
    first = 0 if got[0][0] == data[:40] else 1
    blocks = [data.splitlines(keepends=True)[i : i + 4297] for i in range(0, 26_000, 4297)]
    assert got[first] == sum(blocks[0::2], [])
    assert got[1 - first] == sum(blocks[1::2], [])


def on_a_terminal(root: str, args: list[str], fd: str, stdin=None, typed: bytes = b"") -> tuple[int, bytes, bytes]:
    """Run kl with ``fd`` ("stdin", "stdout" or "stderr") a terminal; returns its exit
    status, what it wrote on the terminal, and on stderr (when stderr is not the terminal)."""
    master, slave = pty.openpty()
    streams = {"stdin": stdin, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, fd: slave}
    process = subprocess.Popen(KL + args, env={**os.environ, "KL_ROOT": root}, **streams)
    os.close(slave)
    os.write(master, typed)
    seen = b""
    with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
        while select.select([master], [], [], 30)[0] and (chunk := os.read(master, 1 << 16)):
            seen += chunk
    os.close(master)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"kl {' '.join(args)} did not finish; it wrote {seen!r}")
    return code, seen, process.stderr.read() if process.stderr else b""


def test_reading_from_a_terminal_says_so_once(kl_root):
    code, _, stderr = on_a_terminal(kl_root, ["produce", "t"], "stdin", typed=b"hello\nworld\n\x04")
    assert (code, stderr) == (0, b"kl produce: reading messages from the terminal, one per line; end with Ctrl-D\n")
    assert ok(kl_root, "consume", "t") == b"hello\nworld\n"


def test_a_big_file_shows_progress_on_a_terminal_only(kl_root, tmp_path):
    f = tmp_path / "big.log"
    f.write_bytes(lines(150_000))  # 6 MB
    with open(f, "rb") as stdin:
        code, seen, _ = on_a_terminal(kl_root, ["produce", "t"], "stderr", stdin=stdin)
    assert code == 0
    assert b"6.0/6.0 MB" in seen  # the bar, once all is read
    assert b"produced 150000 messages to t" in seen
    assert ok(kl_root, "consume", "t") == lines(150_000)


@pytest.mark.parametrize("command", ["recover", "retain"])
def test_recover_and_retain_show_progress_on_a_terminal(kl_root, command):
    ok(kl_root, "topics", "create", "three", "--partitions", "3")
    code, seen, _ = on_a_terminal(kl_root, [command], "stderr")
    assert code == 0
    assert b"4/4" in seen  # the bar, once every partition is done
    assert ok(kl_root, command).count(b"\n") == 4  # and nothing when stderr is not a terminal


@pytest.mark.parametrize(
    "args",
    [
        ["topics", "list"],
        ["topics", "describe", "t"],
        ["topics", "delete", "t"],
        ["consume", "t"],
        ["produce", "t"],
        ["recover"],
        ["retain"],
    ],
)
def test_a_missing_root_is_an_error(tmp_path, args):
    result = run(str(tmp_path / "gone"), *args, input=b"x\n")
    assert (result.exit_code, result.stdout, result.stderr) == (
        1,
        "",
        f"Error: root {tmp_path}/gone does not exist (is it mounted?)\n",
    )
    assert not (tmp_path / "gone").exists()


def test_a_root_that_is_a_file_is_an_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    assert fails(str(tmp_path / "file"), "topics", "list") == f"Error: root {tmp_path}/file is not a directory"


def test_topics_create_makes_a_missing_root(tmp_path):
    ok(str(tmp_path / "new" / "root"), "topics", "create", "t")
    assert ok(str(tmp_path / "new" / "root"), "topics", "list") == b"t\n"


def test_topics_list_leaves_out_what_is_not_a_topic(kl_root):
    os.mkdir(os.path.join(kl_root, "junk"))
    os.mkdir(os.path.join(kl_root, ".deleting-0a1b"))
    assert ok(kl_root, "topics", "list") == b"t\n"
    ok(kl_root, "topics", "create", "bad")
    Path(kl_root, "bad", "topic.json").write_text("{")
    code, seen, stderr = on_a_terminal(kl_root, ["topics", "list"], "stdout")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode()).replace("\r\n", "\n")
    assert (code, stderr) == (0, b"")
    assert [line.split() for line in text.splitlines()[:3]] == [
        ["topic", "partitions", "bytes"],
        ["bad", "?", "?"],
        ["t", "1", "0"],
    ]
    assert "junk: not a topic: no topic.json" in text
    assert any(line.startswith(f"bad: topic config {kl_root}/bad/topic.json is unreadable: ") for line in text.splitlines())


@pytest.mark.parametrize(
    "args, fd, before",
    [
        (["topics", "list"], "stdout", "bad: "),
        (["topics", "describe", "bad"], "stderr", "Error: "),
        (["recover", "--dry-run"], "stdout", "bad: error: "),
    ],
    ids=["a problem under a table", "an Error line", "a report's line"],
)
def test_a_message_on_a_terminal_is_one_line_however_long_its_path(tmp_path, monkeypatch, args, fd, before):
    """An error or warning naming a path longer than the terminal is wide stays one line
    (rich would wrap it at the width, even inside the path)."""
    root = str(tmp_path.joinpath(*["d" * 60] * 6, "root"))
    assert len(root) > 300
    kl.Root(root).create_topic("bad")
    Path(root, "bad", "topic.json").write_text("{")
    with pytest.raises(kl.KlError) as error:
        kl.Root(root).config("bad")
    monkeypatch.setenv("COLUMNS", "80")
    _, seen, _ = on_a_terminal(root, args, fd)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode()).replace("\r\n", "\n")
    assert before + str(error.value) in text.splitlines()


@pytest.mark.parametrize(
    "args, error",
    [
        (
            ["consume", "t", "-o", "soon"],
            "Invalid value for '-o' / '--from-offset': 'soon' is not N, kafka:N, earliest, latest or -N",
        ),
        (
            ["consume", "t", "--from-time", "noon"],
            f"Invalid value for '--from-time': 'noon' is not a time: give {TIME_FORMS}",
        ),
        (
            ["consume", "t", "--until-time", "2026-02-30"],
            f"Invalid value for '--until-time': '2026-02-30' is not a time (day is out of range for month): give {TIME_FORMS}",
        ),
        (["consume", "t", "--until-offset", "-1"], "Invalid value for '--until-offset': -1 is not in the range x>=0."),
        (
            ["consume", "t", "--group", "g", "--until-time", "now"],
            "--until-offset and --until-time read partitions from a start to an end: not with --group",
        ),
        (["consume", "t", "-o", "0", "--from-time", "0"], "--from-offset, --from-time cannot be used together"),
        (["consume", "t", "--json", "--binary"], "--json, --binary cannot be used together"),
        (["consume", "t", "--json", "-0"], "--json, --null cannot be used together"),
        (["consume", "t", "--format", "{nope}"], "Invalid value for '--format': KeyError: 'nope'"),
        (["consume", "t", "-d", ""], "Invalid value for '-d' / '--delimiter': must not be empty"),
        (
            ["consume", "t", "-d", r"\q"],
            "Invalid value for '-d' / '--delimiter': unknown escape '\\q' (use \\n \\t \\r \\0 \\\\ or \\xNN)",
        ),
        (["produce", "t", "-K", ":", "-0", "-d", ","], "--delimiter, --null cannot be used together"),
        (["produce", "t", "--json", "--binary"], "--json, --binary cannot be used together"),
        (
            ["produce", "t", "-z", "lz4"],
            "Invalid value for '-z' / '--compression': 'lz4' is not one of 'none', 'zstd', 'gzip'.",
        ),
        (["produce", "t", "--batch-size", "0"], "Invalid value for '--batch-size': 0 is not in the range x>=1."),
    ],
)
def test_usage_errors(kl_root, args, error):
    assert fails(kl_root, *args, input=b"", code=2) == f"Error: {error}"


@pytest.mark.parametrize(
    "args, code, stderr",
    [
        (["consume", "nope"], 1, "Error: topic 'nope' does not exist in {root}\n"),
        (["produce", "t"], 0, ""),
        (["consume", "t"], 0, ""),
        (["topics", "list"], 0, ""),
    ],
)
def test_no_traceback_and_no_rich_when_piped(kl_root, args, code, stderr):
    program = f"""
import sys
from kl_cli.main import main
sys.argv = ["kl", *{args!r}]
try:
    main()
except SystemExit as e:
    assert "rich" not in sys.modules, "rich imported"
    sys.exit(e.code)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], input=b"x\n", env={**os.environ, "KL_ROOT": kl_root}, capture_output=True
    )
    assert (done.returncode, done.stderr.decode()) == (code, stderr.format(root=kl_root))


def test_version():
    result = run(None, "--version")
    assert (result.exit_code, result.stdout) == (0, f"kl, version {kl_version()}, {core.describe()}\n")


def kl_version() -> str:
    from importlib.metadata import version

    return version("kl")


@pytest.mark.parametrize("render", [[], ["--format", "{value}"]], ids=["values", "format"])
def test_consume_stops_at_a_damaged_message_after_writing_the_ones_before(tmp_path, render):
    root = kl.Root(tmp_path / "root")
    root.create_topic("t")
    with kl.Producer(root) as producer:
        for value in (b"one", b"two", b"three"):
            producer.send("t", value, partition=0)
    segment = root.log("t", 0).segments()[0].path
    data = bytearray(Path(segment).read_bytes())
    data[25 + 24] ^= 1  # inside "two", the second 25-byte message; the third keeps it committed
    Path(segment).write_bytes(bytes(data))
    result = CliRunner().invoke(cli, ["--root", str(root.path), "consume", "t", *render])
    assert result.exit_code == 1
    assert result.stdout_bytes == b"one\n"
    assert result.stderr.endswith(f"Error: corrupt message at offset 25 ({segment} position 25): checksum mismatch\n")
    skipped = CliRunner().invoke(cli, ["--root", str(root.path), "consume", "t", "--skip-corrupt", *render])
    assert skipped.exit_code == 0
    assert skipped.stdout_bytes == b"one\nthree\n"
    assert skipped.stderr == ("Warning: skipped damaged data of t/0 from offset 25 to 50: checksum mismatch\n")


# ----------------------------------------------------------------- the README and the shell

README = Path(__file__).resolve().parents[1] / "README.md"
TOUR_SKIPS = {
    "export KL_ROOT=": "the test gives kl a root of its own",
    "--follow": "it waits for new messages until Ctrl-C",
}
"""Lines of the tour that are not run, and why."""


def tour() -> list[str]:
    """The command lines of the README's tour, as written."""
    block = README.read_text().split("## A 5-minute tour", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_tour_runs_as_written(tmp_path):
    run_lines = [line for line in tour() if not any(pattern in line for pattern in TOUR_SKIPS)]
    assert len(tour()) - len(run_lines) == len(TOUR_SKIPS), "each skip matches one line"
    assert "kl produce events < samples/access.log          # one message per line" in run_lines
    script = ['kl() { "$PYTHON" -m kl_cli "$@"; }', "set -o pipefail"]
    for line in run_lines:
        script += [line, f"status=$?; [ $status = 0 ] || {{ printf 'exit %s: %s\\n' $status {shlex.quote(line)} >&2; exit 1; }}"]
    env = {**os.environ, "KL_ROOT": str(tmp_path / "kl"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=README.parent, env=env, capture_output=True, timeout=300)
    assert (done.returncode, done.stderr.decode()) == (0, "")
    assert done.stdout.count(b"GET ") > 10


@pytest.mark.parametrize(
    "shell, last_line",
    [
        ("bash", "_kl_completion_setup;"),
        ("zsh", "fi"),
        ("fish", 'complete --no-files --command kl --arguments "(_kl_completion)";'),
    ],
)
def test_shell_completion_prints_a_script(shell, last_line):
    done = subprocess.run(KL, env={**os.environ, "_KL_COMPLETE": f"{shell}_source"}, capture_output=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.decode().strip().splitlines()[-1] == last_line


def test_shell_completion_completes_commands_and_options():
    def complete(words: str) -> str:
        env = {**os.environ, "_KL_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        return subprocess.run(KL, env=env, capture_output=True, timeout=30, check=True).stdout.decode()

    assert complete("kl top") == "plain,topics\n"
    assert complete("kl produce t --com") == "plain,--compression\n"


# ------------------------------------------------------------------ start-up


@pytest.mark.parametrize("argv", [["topics", "list"], ["produce", "t"], ["consume", "t"], ["--version"]])
def test_a_command_imports_only_its_own_module(tmp_path, argv):
    """kl starts in ~0.15 s: a command does not import the others' modules (Spark loads,
    the daemon, ...), nor importlib.metadata unless it shows the version."""
    kl.Root(str(tmp_path)).create_topic("t")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['kl', '--root', {str(tmp_path)!r}, *{argv!r}]\n"
        "try:\n    runpy.run_module('kl_cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith(('kl_cli.', 'kl.spark', 'importlib.metadata')))))"
    )
    done = subprocess.run([sys.executable, "-c", code], input=b"x\n", capture_output=True, timeout=60, check=True)
    loaded = set(done.stdout.decode().split("\n")[-2].split())
    command = COMMANDS.get(argv[0], ":").partition(":")[0]
    others = loaded - {"kl_cli.main", "kl_cli.common", "kl_cli.output", "kl_cli.complete", command}
    if argv == ["--version"]:
        others = {m for m in others if not m.startswith("importlib.metadata")}
    assert not others


LIBRARY_ABOVE_TOPICS = {"kl.consumer", "kl.follow", "kl.group", "kl.groups", "kl.net.remote", "kl.producer", "kl.registry"}


@pytest.mark.parametrize(
    ("argv", "used"),
    [
        (["topics", "list", "--json"], set()),
        (["recover"], set()),
        (["retain"], set()),
        (["consume", "t", "--group", "g", "-c", "1"], {"kl.consumer", "kl.follow", "kl.group", "kl.registry"}),
    ],
)
def test_a_command_loads_only_the_library_modules_it_uses(tmp_path, argv, used):
    """``import kl`` loads the errors only; ``kl.Root`` and the others load at first use,
    so listing a root of 10,000 topics does not start by loading groups and producers."""
    root = kl.Root(str(tmp_path))
    root.create_topic("t")
    kl.Producer(root).send("t", b"x")
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['kl', '--root', {str(tmp_path)!r}, *{argv!r}]\n"
        "try:\n    runpy.run_module('kl_cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('kl.'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    loaded = set(done.stdout.decode().split("\n")[-2].split())
    assert "kl.topic" in loaded and loaded & LIBRARY_ABOVE_TOPICS == used


def test_the_library_names_load_at_first_use():
    code = "import sys, kl; was = 'kl.topic' in sys.modules; kl.Root; print(was, 'kl.topic' in sys.modules, kl.groups.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    assert done.stdout.split() == [b"False", b"True", b"kl.groups"]
    assert set(kl.__all__) <= set(dir(kl))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kl.nothing  # noqa: B018


def test_ctrl_c_while_kl_starts_ends_it_by_sigint_without_a_traceback():
    """A SIGINT that lands while kl imports its modules (the first ~0.1 s of every
    command) is a Ctrl-C like any other."""
    code = (
        "import sys, kl_cli\n"
        "class Interrupted:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'kl_cli.main':\n            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupted())\n"
        "kl_cli.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (-signal.SIGINT, b"", b"")
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert re.search(r'^kl = "kl_cli:main"$', pyproject, re.M)  # the program's entry point is this guard
