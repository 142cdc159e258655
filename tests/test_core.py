"""The compiled core (kl/log/_core.c) and its pure-Python twin (kl/log/pycore.py) give the same
answers for any input: message sets made valid, then cut short and bit-flipped, and
arbitrary bytes.  The rest of the suite's format, corruption and recovery tests run on
each core through the ``each_core`` fixture."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import zlib
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kl.log import core, pycore
from kl.log import message as m

compiled = core.compiled()
needs_compiled = pytest.mark.skipif(compiled is None, reason="kl's compiled core was not built here")


def cores() -> list:
    """The pure core, and the compiled one where it was built."""
    return [pycore] if compiled is None else [pycore, compiled]


TIMESTAMPS = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.sampled_from([0, -1, -(1 << 63), (1 << 63) - 1]))
VALUES = st.binary(max_size=300)
KEYS = st.one_of(st.none(), st.binary(max_size=40))
HEADER_KEYS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
HEADERS = st.lists(st.tuples(HEADER_KEYS, st.one_of(st.none(), st.binary(max_size=20))), max_size=4).map(tuple)


@st.composite
def stored(draw) -> bytes:
    """One stored message of any magic: plain, keyed, compressed-looking, padding, with
    headers or a null value (magic 3), and magic 3 whose checksum holds over any body."""
    value, kind = draw(VALUES), draw(st.sampled_from(["plain", "keyed", "attrs", "v0", "v1", "v3", "v3attrs", "v3any"]))
    ts = draw(TIMESTAMPS)
    if kind == "v3":
        return m.encode(draw(st.one_of(st.none(), VALUES)), draw(KEYS), ts, 0, draw(HEADERS))
    if kind == "v3attrs":
        return m.encode_v3(draw(st.one_of(st.none(), VALUES)), draw(KEYS), ts, draw(st.integers(0, 255)), draw(HEADERS))
    if kind == "v3any":  # fields that do not fit, keys that are not UTF-8, bytes left over
        body = bytearray(m.encode_v3(draw(st.one_of(st.none(), VALUES)), draw(KEYS), ts, 0, draw(HEADERS))[m.TIMESTAMP_OFFSET :])
        for _ in range(draw(st.integers(0, 3))):
            body[draw(st.integers(0, len(body) - 1))] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC0, 0xFF, 0xED]))
        body += draw(st.sampled_from([b"", b"\0", b"\xff" * 4]))
        crc = zlib.crc32(body, m.CRC_SEEDS_V3[0])
        return m.PREFIX.pack(len(body) + 6, m.HEADERS_MAGIC) + m.ATTRS_CRC.pack(0, crc) + bytes(body)
    if kind == "plain":
        return m.encode(value, None, ts)
    if kind == "keyed":
        return m.encode(value, draw(KEYS), ts)
    if kind == "attrs":
        return m.encode(value, draw(KEYS), ts, draw(st.integers(0, 255)))
    if kind == "v1":
        return m.encode_v1(value, draw(st.integers(0, 255)))
    return m.PREFIX.pack(len(value) + 5, 0) + m.CRC_V0.pack(zlib.crc32(value)) + value


@st.composite
def damaged_sets(draw) -> bytes:
    """Valid messages back to back, then maybe cut short, bit-flipped or followed by junk."""
    data = bytearray(b"".join(draw(st.lists(stored(), max_size=12))))
    for _ in range(draw(st.integers(0, 3))):
        if data:
            bit = draw(st.integers(0, len(data) * 8 - 1))
            data[bit // 8] ^= 0x80 >> (bit % 8)
    if data and draw(st.booleans()):
        del data[draw(st.integers(0, len(data) - 1)) :]
    data += draw(st.binary(max_size=30))
    return bytes(data)


MESSAGE_SETS = st.one_of(damaged_sets(), st.binary(max_size=400))
LIMITS = st.sampled_from([1 << 20, 64, 27, 5, 0, -3])
"""max_message_bytes: the usual one, and ones that cut valid messages or nothing fits."""


def same(name: str, *args) -> None:
    """Both cores answer ``name(*args)`` alike: the same result, or the same exception type."""
    answers = []
    for module in (pycore, compiled):
        try:
            answers.append(("ok", getattr(module, name)(*args)))
        except Exception as e:  # noqa: BLE001 - which one is the point
            answers.append(("raised", type(e)))
    assert answers[0] == answers[1], (name, args)


@needs_compiled
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # scripts/fuzz-core goes deeper
@given(MESSAGE_SETS, LIMITS, st.data())
def test_both_cores_check_walk_and_read_any_bytes_alike(data, limit, draw):
    for pos in range(0, len(data) + 1, max(1, len(data) // 16)):
        same("check", data, pos, len(data), limit)
        same("walk", data, pos, len(data), limit)
        same("plain_values", data, pos, limit)
        same("plain_columns", data, pos, limit)
        base = draw.draw(st.sampled_from([0, 1, 1 << 40, (1 << 63) - 1 - len(data), (1 << 63) - len(data), -1]))
        template = draw.draw(st.tuples(*[st.binary(max_size=40)] * 5))
        same("dump_lines", data, pos, len(data), base, draw.draw(st.integers(0, 1 << 62)), limit, template)
        same("plain_messages", data, pos, draw.draw(st.integers(0, 1 << 40)), limit)
    end = draw.draw(st.integers(0, len(data)))
    same("walk", data, 0, end, limit)
    same("check", data, 0, end, limit)
    same("recent", data, 0, end, limit, draw.draw(st.integers(-1, 5)))


@needs_compiled
@pytest.mark.parametrize("count", [1, 3, 1023, 1024, 5000])
def test_both_cores_keep_the_same_last_entries_across_runs_of_padding(count):
    """Padding holds no message: the entries kept grow past ``count`` (and past the
    compiled core's first 1024 slots) until enough that are not padding follow."""
    pad, plain = m.encode(b"", None, 0, m.ATTR_PADDING), m.encode(b"v")
    data = (plain * 3 + pad * 3000 + plain + pad * 2 + plain * 2000 + pad) * 2
    answer = compiled.recent(data, 0, len(data), 1 << 20, count)
    assert answer == pycore.recent(data, 0, len(data), 1 << 20, count)
    stop, kept = answer
    assert stop == len(data) and kept[-1] == (len(data) - len(pad), len(pad), m.ATTR_PADDING)
    held = [entry for entry in kept if not entry[2] & m.ATTR_PADDING]
    assert len(held) == min(count, 2 * 2004) and kept[0] == held[0]


@needs_compiled
def test_both_cores_give_the_columns_of_a_long_run_alike():
    """Past the compiled core's first 1024 slots; keyed messages too; a damaged one ends the run."""
    data = bytearray(b"".join(m.encode(b"v%d" % i, None if i % 3 else b"k", 1000 - i) for i in range(5000)))
    *columns, stop = compiled.plain_columns(data, 0, 1 << 20)
    assert (*columns, stop) == pycore.plain_columns(data, 0, 1 << 20) and stop == len(data)
    starts, stamps, key_lengths = (array("q", column) for column in columns)
    assert len(starts) == 5000 and starts[0] == 0 and starts[1] == len(m.encode(b"v0", b"k"))
    assert list(stamps[:3]) == [1000, 999, 998] and stamps[-1] == -3999 and list(key_lengths[:4]) == [1, -1, -1, 1]
    data[starts[3000] + 25] ^= 1
    assert compiled.plain_columns(data, 0, 1 << 20) == pycore.plain_columns(data, 0, 1 << 20)
    assert compiled.plain_columns(data, 0, 1 << 20)[3] == starts[3000]


ISO_ENDS = [-62135596800001, -62135596800000, 253402300799999, 253402300800000]
"""Around the first and last milliseconds ISO 8601 can write (years 1 and 9999)."""
BYTES = st.one_of(
    st.binary(max_size=30), st.text(max_size=12).map(lambda text: text.encode("utf-8", "surrogatepass"))
)  # text as UTF-8, and with surrogates: what strict UTF-8 refuses
RENDERED = st.lists(
    st.builds(
        m.Message,
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.integers(-(1 << 63), (1 << 63) - 1),
        st.one_of(st.none(), TIMESTAMPS, st.integers(ISO_ENDS[0], ISO_ENDS[-1]), st.sampled_from(ISO_ENDS)),
        st.one_of(st.none(), BYTES),
        st.one_of(st.none(), BYTES),
        st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), BYTES)), max_size=3).map(tuple),
    ),
    max_size=6,
)
PROGRAMS = st.lists(st.one_of(st.binary(max_size=4), st.tuples(st.integers(0, 11), st.binary(max_size=4))), max_size=8)


@needs_compiled
@given(RENDERED, PROGRAMS)
def test_both_cores_render_messages_alike(messages, program):
    assert compiled.render(messages, program) == pycore.render(messages, program)


def test_render_writes_what_the_consumers_output_shows():
    """The fields as ``kl consume`` writes them: -K, --format and --json (as json.dumps)."""
    messages = [m.Message(0, 23, 1700000000000, None, b"v"), m.Message(23, 51, -1, b"k\xff", b'a"\\\n\x01\xc3\xa9\x7f')]
    for module in cores():
        assert module.render(messages, [(pycore.KEYED, b":"), (pycore.VALUE, b"\n")]) == b"v\nk\xff:" + messages[1].value + b"\n"
        line = [(pycore.OFFSET, b" "), (pycore.NEXT_OFFSET, b" "), (pycore.TIMESTAMP, b" "), (pycore.TIMESTAMP_ISO, b"|")]
        assert module.render(messages, line) == b"0 23 1700000000000 2023-11-14T22:13:20.000Z|23 51 -1 1969-12-31T23:59:59.999Z|"
        json_line = [b'{"timestamp": ', (pycore.TIMESTAMP_JSON, b", "), (pycore.KEY_JSON, b", "), (pycore.VALUE_JSON, b"}\n")]
        rows = [json.loads(row) for row in module.render(messages, json_line).splitlines()]
        assert rows == [
            {"timestamp": 1700000000000, "key": None, "value": "v"},
            {"timestamp": -1, "key_b64": "a/8=", "value": 'a"\\\n\x01\xe9\x7f'},
        ]
        assert module.render([m.Message(0, 1, t, None, b"") for t in ISO_ENDS], [(pycore.TIMESTAMP_ISO, b" ")]) == (
            b"-62135596800001 0001-01-01T00:00:00.000Z 9999-12-31T23:59:59.999Z 253402300800000 "
        )


@pytest.mark.parametrize(
    "program", [[b"a", "text"], [(12, b"")], [(-1, b"")], [(2**70, b"")], [(True, b"")], [(0, "text")], [(0,)], 7]
)
def test_a_program_that_is_not_one_is_refused_alike(program):
    same("render", [m.Message(0, 1, 2, None, b"v")], program)
    with pytest.raises((TypeError, ValueError)):
        pycore.render([m.Message(0, 1, 2, None, b"v")], program)


@needs_compiled
@pytest.mark.parametrize(
    "message",
    [(0, 1, 2, None), (0, 1, 2, None, "v"), (0, 1, 2, 3, b"v"), (0.5, 1, 2, None, b"v"), (2**64, 1, 2, None, b"v"), b"abc", None],
)
def test_the_compiled_render_refuses_what_is_not_a_message(message):
    with pytest.raises((TypeError, OverflowError), match="^render: "):
        compiled.render([m.Message(0, 1, 2, None, b"v"), message], [(pycore.VALUE, b"\n")])


VARINTS = [  # Kafka's ByteUtilsTest: zigzag, then 7 bits a byte, low first
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (8191, "fe7f"),
    (-8192, "ff7f"),
    (8192, "808001"),
    (2**31 - 1, "feffffff0f"),
    (-(2**31), "ffffffff0f"),
    (2**63 - 1, "feffffffffffffffff01"),
    (-(2**63), "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "encoded"), VARINTS)
def test_varints_are_kafkas_in_both_cores(value, encoded):
    for module in cores():
        assert module.varint(value).hex() == encoded
        assert module.read_varint(b"\xaa" + bytes.fromhex(encoded) + b"\xbb", 1) == (value, 1 + len(encoded) // 2)


@pytest.mark.parametrize(
    ("data", "pos", "problem"),
    [
        (b"", 0, "the buffer ends inside the varint at 0"),
        (b"\x80\x80", 0, "the buffer ends inside the varint at 0"),
        (b"\x01\xff", 1, "the buffer ends inside the varint at 1"),
        (b"\xff" * 9 + b"\x02", 0, "the varint at 0 runs past 64 bits"),
        (b"\xff" * 10 + b"\x01", 0, "the varint at 0 runs past 64 bits"),
        (b"\x00", 2, "position 2 outside a buffer of 1 bytes"),
        (b"\x00", -1, "position -1 outside a buffer of 1 bytes"),
    ],
)
def test_a_damaged_varint_is_refused_in_both_cores(data, pos, problem):
    for module in cores():
        with pytest.raises(ValueError, match=re.escape(f"read_varint: {problem}")):
            module.read_varint(data, pos)


def test_a_varint_outside_64_bits_is_refused_in_both_cores():
    for module in cores():
        for value in (2**63, -(2**63) - 1):
            with pytest.raises(OverflowError, match="does not fit 64 bits"):
                module.varint(value)


CONTINUED = st.lists(st.one_of(st.integers(0x80, 0xFF), st.integers(0, 3)), max_size=14).map(bytes)
"""Bytes mostly with the continuation bit: long varints, cut ones, ones past 64 bits."""


@needs_compiled
@given(st.integers(-(2**63), 2**63 - 1), st.one_of(st.binary(max_size=24), CONTINUED), st.integers(-2, 26))
def test_both_cores_write_and_read_varints_alike(value, data, pos):
    encoded = pycore.varint(value)
    assert compiled.varint(value) == encoded and pycore.read_varint(encoded, 0) == (value, len(encoded))
    answers = []
    for module in (pycore, compiled):
        try:
            answers.append(module.read_varint(data, pos))
        except ValueError as e:
            answers.append(str(e))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"123456789", 0xE3069283),  # the check value of CRC-32C
        (bytes(32), 0x8A9136AA),  # RFC 3720's test vectors (iSCSI)
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"", 0),
    ],
)
def test_crc32c_gives_the_published_check_values_in_both_cores(data, expected):
    assert pycore.crc32c(data) == expected
    if compiled is not None:
        assert compiled.crc32c(data) == expected


@pytest.mark.parametrize(
    "data, expected",
    [  # Kafka's UtilsTest.testMurmur2: what the Java client hashes these keys to
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
        (b"", 275646681),
    ],
)
def test_murmur2_gives_the_java_clients_hashes_in_both_cores(data, expected):
    assert pycore.murmur2(data) == expected
    if compiled is not None:
        assert compiled.murmur2(data) == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_murmur2_is_kafka_pythons_in_both_cores(data):
    from kafka.partitioner.default import murmur2  # the same hash, unsigned

    signed = murmur2(data) - (1 << 32) if murmur2(data) >= 1 << 31 else murmur2(data)
    assert pycore.murmur2(data) == signed
    if compiled is not None:
        assert compiled.murmur2(data) == signed
        assert compiled.murmur2(memoryview(data)) == signed


FOLD_LENGTHS = [767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 2 * 3 * 8192 + 3 * 256 + 13, 100_003]
"""Around the compiled core's three-stream blocks (kl/log/_crc32c_fold.h: 3 x 256 and 3 x 8192 bytes)."""


@needs_compiled
@pytest.mark.parametrize("length", FOLD_LENGTHS)
def test_both_cores_compute_crc32c_alike_across_the_three_stream_blocks(length):
    data = bytes(random.Random(length).getrandbits(8) for _ in range(length + 7))
    for at in range(8):  # every alignment
        piece = memoryview(data)[at : at + length]
        assert compiled.crc32c(piece) == pycore.crc32c(piece)
        assert compiled.crc32c(piece, 0x12345678) == pycore.crc32c(piece, 0x12345678)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF), st.data())
def test_both_cores_compute_crc32c_alike_and_continue_from_a_crc(data, seed, draw):
    assert compiled.crc32c(data, seed) == pycore.crc32c(data, seed)
    cut = draw.draw(st.integers(0, len(data)))
    assert compiled.crc32c(data[cut:], compiled.crc32c(data[:cut])) == pycore.crc32c(data)
    for bad in (1 << 32, -1, 1 << 64):
        same("crc32c", data, bad)
        with pytest.raises(ValueError, match="crc must be a 32-bit value"):
            compiled.crc32c(data, bad)


@needs_compiled
def test_both_cores_checksum_every_length_alike():
    """The compiled core folds 16-byte blocks where the CPU can (bodies of 64 bytes and
    more), zlib does the rest: every length, and every alignment of a body in memory."""
    data = bytes(random.Random(7).randrange(256) for _ in range(5000))
    for n in [*range(0, 300), 1 << 12, (1 << 16) + 15, 1 << 20]:
        value = (data * (1 + n // len(data)))[:n]
        assert compiled.frame([value], n) == pycore.frame([value], n), n
    framed = pycore.frame([data[k : k + 200] for k in range(17)], 0)
    for shift in range(16):
        buf = bytes(shift) + framed
        assert compiled.walk(buf, shift, len(buf), 1 << 20) == (len(buf), 17)
    assert compiled.walk(framed[:-1] + bytes([framed[-1] ^ 1]), 0, len(framed), 1 << 20)[1] == 16


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(st.lists(VALUES, max_size=30), TIMESTAMPS)
def test_both_cores_frame_alike_and_the_frames_read_back(values, ts):
    framed = compiled.frame(values, ts)
    assert framed == pycore.frame(values, ts) == compiled.frame(tuple(bytearray(v) for v in values), ts)
    assert framed == b"".join(m.encode(v, None, ts) for v in values)  # send() frames one value so
    assert compiled.walk(framed, 0, len(framed), 1 << 20) == (len(framed), len(values))
    assert compiled.plain_values(framed, 0, 1 << 20) == (values, len(framed))
    messages, end = compiled.plain_messages(framed, 0, 100, 1 << 20)
    assert end == len(framed) and [(msg.timestamp, msg.key, msg.value) for msg in messages] == [(ts, None, v) for v in values]
    assert type(messages[0]) is m.Message if messages else True


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from([b"\n", b"ab", b"a", b"b", b"\n\n", b"xyz" * 20]), max_size=40).map(b"".join),
    st.sampled_from([b"\n", b"ab", b"\n\n", b"\x00"]),
    st.booleans(),
    TIMESTAMPS,
    st.sampled_from([1 << 20, 64, 30, 23]),
    st.integers(0, 300),
    st.integers(0, 5),
    st.data(),
)
def test_both_cores_split_and_frame_records_alike(data, delimiter, keep, ts, limit, piece_bytes, piece_count, draw):
    pos = draw.draw(st.integers(0, len(data)))
    args = (data, pos, delimiter, keep, ts, limit, piece_bytes, piece_count)
    same("frame_records", *args)
    pieces, stop, blocked = compiled.frame_records(*args)
    framed = b"".join(f for f, _, _ in pieces)
    values, _ = pycore.plain_values(framed, 0, 1 << 20)
    records = data[pos:stop].split(delimiter)[:-1]
    assert values == ([r + delimiter for r in records] if keep else records)
    assert blocked == (delimiter in data[stop:])
    assert all(n == 1 or (len(f) <= piece_bytes and (not piece_count or n <= piece_count)) for f, n, _ in pieces)


@needs_compiled
def test_positions_outside_the_buffer_are_refused_not_read():
    data = m.encode(b"x")
    for args in [(data, -1, len(data), 100), (data, 0, len(data) + 1, 100), (data, 5, 4, 100)]:
        with pytest.raises(ValueError, match="outside a buffer"):
            compiled.walk(*args)
        with pytest.raises(ValueError, match="outside a buffer"):
            compiled.check(*args)
    with pytest.raises(ValueError, match="outside a buffer"):
        compiled.plain_values(data, len(data) + 1, 100)
    with pytest.raises(ValueError, match="outside a buffer"):
        compiled.plain_columns(data, -1, 100)
    with pytest.raises(TypeError, match="value 1 is int"):
        compiled.frame([b"a", 3], 0)


@needs_compiled
def test_a_memoryview_and_an_mmap_read_as_bytes_do(tmp_path):
    import mmap

    data = pycore.frame([b"a", b"bb", b"ccc"], 7) + b"\x00junk"
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for buffer in (memoryview(data), mapped, bytearray(data)):
            assert compiled.walk(buffer, 0, len(data), 1 << 20) == pycore.walk(data, 0, len(data), 1 << 20) == (3 * 22 + 6, 3)
            assert compiled.plain_values(buffer, 0, 1 << 20) == ([b"a", b"bb", b"ccc"], 72)


def test_the_compiled_core_is_built_where_a_compiler_and_the_headers_are():
    """``pip install`` builds it optionally: a compile error would otherwise pass unseen."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    zlib_header = Path("/usr/include/zlib.h")
    if shutil.which("cc") is None or not headers.exists() or not zlib_header.exists():
        pytest.skip("no C compiler, Python.h or zlib.h here: kl installs its pure-Python core")
    assert compiled is not None, "kl.log._core did not build (or does not import) although cc and the headers are here"


@pytest.mark.parametrize("pure, says", [("1", "pure-Python core (KL_PURE is set)"), ("0", None)])
def test_version_names_the_core_and_kl_pure_forces_the_pure_one(pure, says):
    env = {**os.environ, "KL_PURE": pure}
    done = subprocess.run([sys.executable, "-m", "kl_cli", "--version"], env=env, capture_output=True, text=True)
    expected = says or ("compiled core (C)" if compiled is not None else "pure-Python core (the compiled one was not built)")
    assert done.returncode == 0, done
    assert re.fullmatch(rf"kl, version \S+, {re.escape(expected)}, crc32c: .+", done.stdout.rstrip()), done.stdout


def test_use_switches_every_caller_and_refuses_an_unknown_core():
    was = core.NAME
    try:
        core.use("pure")
        assert core.walk is pycore.walk
        if compiled is not None:
            core.use("compiled")
            assert core.walk is compiled.walk
    finally:
        core.use(was)
    with pytest.raises(ValueError, match="no core named"):
        core.use("fast")


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.one_of(VALUES, st.just(bytearray(b"ab")), st.just(None), st.binary(min_size=90, max_size=120)), max_size=30),
    TIMESTAMPS,
    st.sampled_from([1 << 20, 140, 64, 23, 22, 0]),
    st.integers(-5, 400),
    st.data(),
)
def test_both_cores_frame_runs_of_values_alike_in_the_same_pieces(values, ts, limit, piece_bytes, draw):
    pos = draw.draw(st.integers(-1, len(values) + 1))
    same("frame_values", values, pos, ts, limit, piece_bytes)
    if not 0 <= pos <= len(values):
        return
    pieces, stop = compiled.frame_values(values, pos, ts, limit, piece_bytes)
    run = values[pos:stop]
    assert all(type(v) is bytes and len(v) + m.HEADER_SIZE <= limit for v in run)
    assert stop == len(values) or type(values[stop]) is not bytes or len(values[stop]) + m.HEADER_SIZE > limit
    assert b"".join(framed for framed, _ in pieces) == pycore.frame(run, ts)
    assert sum(n for _, n in pieces) == len(run) and all(n == 1 or len(f) <= piece_bytes for f, n in pieces)


SEND_CALLS = st.lists(
    st.tuples(
        st.sampled_from(["events", "other", "copy"]),  # "copy": equal to the lane's topic, another object
        st.one_of(st.binary(max_size=12), st.just(bytearray(b"ab")), st.just("text")),
        st.sampled_from([(), (None,), (b"k",)]),  # a key: none, None, one
        st.dictionaries(
            st.sampled_from(["partition", "timestamp", "callback", "headers", "bogus"]),
            st.sampled_from([None, 0, 1, 1 << 70, True, print, (), [], (("h", b"v"),)]),
            max_size=2,
        ),
        st.booleans(),  # from another thread
    ),
    max_size=25,
)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(SEND_CALLS, st.integers(-1, 10), st.integers(-1, 6), st.sampled_from([None, 0, 1, 1 << 70]))
def test_both_cores_send_through_the_lane_alike(calls, room, wake_at, partition):
    """The async producer's lane queues exactly the same bare values, calls ``slow`` at the
    same moments and hands every other call to ``general`` with the same arguments (or
    raises the same error for a call ``send``'s signature refuses)."""

    def run(module) -> list:
        seen: list = []
        queue: list = []

        def general(topic, value, key=None, partition=None, timestamp=None, callback=None, headers=()):
            seen.append(("general", topic, value, key, partition, timestamp, callback, headers))

        def send(lane, args, kwargs):
            try:
                lane.send(*args, **kwargs)
            except TypeError:
                seen.append("TypeError")

        lane = module.Lane(queue, lambda value: seen.append(("slow", value, len(queue))), general)
        lane.aim("events", partition, room)
        lane.owner, lane.wake_at = threading.get_ident(), wake_at
        for topic, value, key, kwargs, elsewhere in calls:
            args = ("".join(["eve", "nts"]) if topic == "copy" else topic, value, *key)
            if elsewhere:
                thread = threading.Thread(target=send, args=(lane, args, kwargs))
                thread.start()
                thread.join()
            else:
                send(lane, args, kwargs)
        return [seen, queue, lane.owner, lane.wake_at, lane.room, lane.partition]

    assert run(compiled) == run(pycore)


# ----------------------------------------------------------------- Kafka record batches

STAMPS = st.one_of(st.integers(m.MIN_TIMESTAMP, m.MAX_TIMESTAMP), st.sampled_from([-1, 0, -(2**63), 2**63 - 1]))
MESSAGES = st.lists(
    st.tuples(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=8)), STAMPS, st.sampled_from([0, 0, 0, 1])),
    max_size=12,
)
"""Messages as (value, key, timestamp, attrs): mostly plain, some marked gzip (the run ends there)."""


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.integers(0, 2**40), st.data())
def test_both_cores_make_the_same_record_batch_from_a_run_of_messages(messages, base, draw):
    buf = bytearray(b"".join(m.encode(v, k, t, attrs) for v, k, t, attrs in messages))
    if buf and draw.draw(st.booleans()):
        buf[draw.draw(st.integers(0, len(buf) - 1))] ^= 1 << draw.draw(st.integers(0, 7))
    pos = draw.draw(st.integers(0, len(buf)))
    assert compiled.kafka_batch(bytes(buf), pos, base, 1 << 20) == pycore.kafka_batch(bytes(buf), pos, base, 1 << 20)


def test_a_record_batch_of_a_run_gives_each_record_the_next_offset_and_ends_at_the_run(each_core):
    from kafka.record.default_records import DefaultRecordBatch

    buf = m.encode(b"", b"k", 5) + m.encode(b"v" * 300, None, 3) + m.encode(b"x", None, 9, 1)  # gzip-marked: not plain
    batch, count, stop = core.kafka_batch(b"pad" + buf, 3, 1000, 1 << 20)
    first = len(m.encode(b"", b"k", 5))
    assert (count, stop) == (2, 3 + first + len(m.encode(b"v" * 300, None, 3)))
    read = DefaultRecordBatch(batch)
    read.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value) for r in read] == [(1000, 5, b"k", b""), (1001, 3, None, b"v" * 300)]
    assert read.next_offset == 1002
    assert core.kafka_batch(buf, stop - 3, 0, 1 << 20) == (b"", 0, stop - 3)


RECORD_FIELDS = st.one_of(st.none(), st.binary(max_size=12))


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(RECORD_FIELDS, RECORD_FIELDS, st.integers(-(2**40), 2**40), st.booleans()), min_size=1, max_size=8),
    st.sampled_from([-1, 0, 1_700_000_000_000, m.MAX_TIMESTAMP, 2**63 - 1]),
    st.sampled_from([-1, 1_700_000_000_000]),
    st.integers(30, 200),
    st.data(),
)
def test_both_cores_read_a_batchs_records_alike(records, base_ts, append_ts, max_message_bytes, draw):
    from kl.net.kafka import records as kafka_records

    rows = [(i, ts, k, v, [("h", b"v")] if headers else ()) for i, (k, v, ts, headers) in enumerate(records)]
    body = bytearray(kafka_records.batch(rows, len(rows))[61:])
    cut = draw.draw(st.sampled_from(["whole", "flip", "cut", "extend"]))
    if cut == "flip" and body:
        body[draw.draw(st.integers(0, len(body) - 1))] = draw.draw(st.integers(0, 255))
    elif cut == "cut":
        body = body[: draw.draw(st.integers(0, len(body)))]
    elif cut == "extend":
        body += b"\x00"
    answers = []
    for module in (pycore, compiled):
        try:
            answers.append(module.kafka_records(bytes(body), len(rows), base_ts, append_ts, 42, max_message_bytes))
        except ValueError as e:
            answers.append(str(e))
    assert answers[0] == answers[1]


def test_records_become_kl_messages_unless_kl_must_look_closer(each_core):
    from kl.net.kafka import records as kafka_records

    body = kafka_records.batch([(0, 7, b"k", b"v", ()), (1, -1, None, b"", ())], 2)[61:]
    data, count = core.kafka_records(body, 2, 7, -1, 99, 1 << 20)  # 7: the batch's base timestamp
    assert count == 2 and data == m.encode(b"v", b"k", 7) + m.encode(b"", None, 99)  # -1, no timestamp: now
    assert core.kafka_records(body, 2, 7, 5, 99, 1 << 20)[0] == m.encode(b"v", b"k", 5) + m.encode(b"", None, 5)
    null = kafka_records.batch([(0, 7, None, None, ())], 1)[61:]
    assert core.kafka_records(null, 1, 0, -1, 99, 1 << 20) is None  # a null value
    assert core.kafka_records(body, 2, m.MAX_TIMESTAMP + 1, -1, 99, 1 << 20) is None  # past the years kl stores
    assert core.kafka_records(body, 2, 0, -1, 99, 23) is None  # larger than max_message_bytes
    with pytest.raises(ValueError, match="bytes follow the batch's 1 records"):
        core.kafka_records(body, 1, 0, -1, 99, 1 << 20)
    with pytest.raises(ValueError, match="record 1 claims"):
        core.kafka_records(body[:-2], 2, 0, -1, 99, 1 << 20)
