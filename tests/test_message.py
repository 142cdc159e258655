"""The message format (man/kl-format.5): layout, checksums, old magics, damage detection."""

from __future__ import annotations

import itertools
import struct
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kl
from kl.log import message as m
from kl.log.messageset import INCOMPLETE, check

from conftest import MAX, flipped, message_set, v0, v1, values_of, with_length

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores

values = st.binary(max_size=300)
keys = st.none() | st.binary(max_size=40)
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def only(data: bytes, **kw) -> kl.Message:
    (msg,) = list(message_set(data, **kw))
    return msg


# ----------------------------------------------------------------- layout


def test_header_constants_match_the_documented_layout():
    assert (m.LENGTH_SIZE, m.MAGIC_OFFSET, m.ATTRIBUTES_OFFSET, m.CRC_OFFSET) == (4, 4, 5, 6)
    assert (m.TIMESTAMP_OFFSET, m.KEY_LENGTH_OFFSET, m.KEY_OFFSET, m.HEADER_SIZE) == (10, 18, 22, 22)
    assert (m.CRC_OFFSET_V0, m.PAYLOAD_OFFSET_V0, m.PAYLOAD_OFFSET_V1) == (5, 9, 10)
    assert m.HEADER.size == m.HEADER_SIZE
    assert m.CURRENT_MAGIC == 2
    assert m.MIN_LENGTH == (5, 6, 18, 26)
    assert (m.HEADERS_MAGIC, m.HEADERS_HEADER_SIZE, m.HEADER_FIELD_SIZE, m.NULL) == (3, 30, 8, -1)


def test_encode_lays_out_every_field_big_endian():
    data = m.encode(b"val", b"ke", timestamp=0x0102030405060708)
    length, magic, attrs, crc, ts, key_length = m.HEADER.unpack_from(data)
    assert length == len(data) - 4 == 18 + 2 + 3
    assert (magic, attrs, ts, key_length) == (2, 0, 0x0102030405060708, 2)
    assert data[m.KEY_OFFSET :] == b"keval"
    assert crc == zlib.crc32(data[m.MAGIC_OFFSET : m.CRC_OFFSET] + data[m.TIMESTAMP_OFFSET :])


def test_encode_without_key_stores_key_length_minus_one():
    data = m.encode(b"v")
    assert struct.unpack_from(">i", data, m.KEY_LENGTH_OFFSET)[0] == -1
    assert len(data) == m.HEADER_SIZE + 1


@given(value=values, timestamp=timestamps, attrs=st.integers(0, 255))
def test_encode_of_a_keyless_bytes_value_is_the_general_framing(value, timestamp, attrs):
    # bytes without a key take send()'s short way; a bytearray goes the general one
    assert m.encode(value, None, timestamp, attrs) == m.encode(bytearray(value), None, timestamp, attrs)
    data = m.encode(value, None, timestamp, attrs)
    assert m.HEADER.unpack_from(data)[:3] + m.HEADER.unpack_from(data)[4:] == (len(value) + 18, 2, attrs, timestamp, -1)
    assert m.HEADER.unpack_from(data)[3] == m.crc_of(2, attrs, data[m.TIMESTAMP_OFFSET :])


def test_encode_counts_a_wide_buffer_value_in_bytes():
    value = memoryview(bytes(range(8))).cast("i")  # 2 items, 8 bytes
    assert m.encode(value) == m.encode(bytes(value))
    assert len(m.encode(value)) == m.HEADER_SIZE + 8


def test_encode_matches_a_worked_example():
    assert m.encode(b"v", b"k", 1).hex() == "000000140200f3c169d00000000000000001000000016b76"


def test_crc_covers_magic_and_attributes():
    body = b"\x00" * 12 + b"x"
    assert m.crc_of(2, 0, body) == zlib.crc32(b"\x02\x00" + body)
    assert m.crc_of(2, 4, body) == zlib.crc32(b"\x02\x04" + body)
    assert m.crc_of(2, 0, body) != m.crc_of(2, 1, body)


def test_crc_of_old_magics_covers_the_payload_only():
    assert m.crc_of(0, 0, b"abc") == zlib.crc32(b"abc")
    assert m.crc_of(1, 3, b"abc") == zlib.crc32(b"abc")


def test_a_zero_filled_message_is_not_valid():
    zeros = bytes(64)
    assert check(zeros, 0, len(zeros), MAX).problem.reason == "bad length 0"
    with pytest.raises(kl.CorruptMessage):
        list(message_set(zeros))


def test_an_empty_magic_2_message_with_zero_crc_is_rejected():
    body = bytes(12)  # timestamp 0, key length 0, no value: a header of zeros
    data = struct.pack(">iBBI", 18, 2, 0, 0) + body
    assert check(data, 0, len(data), MAX).problem.reason == "checksum mismatch"


# ----------------------------------------------------------------- round trips


@given(value=values, key=keys, timestamp=timestamps)
def test_encode_then_iterate_round_trips(value, key, timestamp):
    msg = only(m.encode(value, key, timestamp))
    assert (msg.value, msg.key, msg.timestamp) == (value, key, timestamp)
    assert (msg.offset, msg.next_offset) == (0, len(m.encode(value, key, timestamp)))


@given(value=values, key=keys, timestamp=timestamps, offset=st.integers(0, 2**48))
def test_offsets_are_byte_positions_in_the_stream(value, key, timestamp, offset):
    data = m.encode(value, key, timestamp)
    msg = only(data, offset=offset)
    assert msg.offset == offset
    assert msg.next_offset == offset + 4 + struct.unpack_from(">i", data)[0]


@given(items=st.lists(st.tuples(values, keys, timestamps), max_size=20))
def test_many_messages_round_trip_in_order(items):
    data = b"".join(m.encode(v, k, t) for v, k, t in items)
    got = list(message_set(data))
    assert [(x.value, x.key, x.timestamp) for x in got] == items
    for a, b in itertools.pairwise(got):
        assert a.next_offset == b.offset


def test_key_none_and_empty_key_differ():
    assert only(m.encode(b"v", None)).key is None
    assert only(m.encode(b"v", b"")).key == b""


def test_empty_value_round_trips():
    msg = only(m.encode(b"", b"k"))
    assert (msg.key, msg.value) == (b"k", b"")


def test_binary_key_and_value_round_trip():
    key, value = bytes(range(256)), bytes(range(255, -1, -1)) * 3
    msg = only(m.encode(value, key, 7))
    assert (msg.key, msg.value, msg.timestamp) == (key, value, 7)


def test_negative_and_extreme_timestamps_round_trip():
    for ts in (-1, 0, 2**63 - 1, -(2**63)):
        assert only(m.encode(b"x", None, ts)).timestamp == ts


# ----------------------------------------------------------------- magic 0 and 1 (Kafka 0.7)


def test_magic_0_message_is_read():
    msg = only(v0(b"hello"))
    assert msg == kl.Message(0, 4 + 1 + 4 + 5, None, None, b"hello")


def test_magic_1_message_is_read():
    msg = only(v1(b"hello"))
    assert msg == kl.Message(0, 4 + 1 + 1 + 4 + 5, None, None, b"hello")


def test_magic_0_empty_payload_is_read():
    assert only(v0(b"")).value == b""


def test_magic_0_1_and_2_mix_in_one_set():
    data = v0(b"a") + v1(b"b") + m.encode(b"c", b"k", 5)
    got = list(message_set(data, offset=100))
    assert [(x.value, x.offset) for x in got] == [(b"a", 100), (b"b", 110), (b"c", 121)]
    assert [x.timestamp for x in got] == [None, None, 5]
    assert got[-1].next_offset == 100 + len(data)


def test_magic_0_bad_crc_is_corrupt():
    data = bytearray(v0(b"hello"))
    data[-1] ^= 1
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        list(message_set(bytes(data)))


def test_magic_1_bad_crc_is_corrupt():
    data = bytearray(v1(b"hello"))
    data[-1] ^= 1
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        list(message_set(bytes(data)))


def test_magic_1_gzip_wrapper_is_read():
    inner = v1(b"one") + v1(b"two")
    data = v1(m.compress(m.CODEC_GZIP, inner), attrs=m.CODEC_GZIP)
    got = list(message_set(data))
    assert values_of(got) == [b"one", b"two"]
    assert [x.offset for x in got] == [0, 0]
    assert [x.next_offset for x in got] == [0, len(data)]


def test_magic_1_snappy_wrapper_raises_unsupported_codec():
    data = v1(b"not really snappy", attrs=m.CODEC_SNAPPY)
    with pytest.raises(kl.UnsupportedCodec, match="snappy"):
        list(message_set(data))


def test_unknown_magic_is_a_problem():
    data = bytearray(m.encode(b"x"))
    data[m.MAGIC_OFFSET] = 4
    assert check(bytes(data), 0, len(data), MAX).problem.reason == "unknown magic 4"


# ----------------------------------------------------------------- lengths


@pytest.mark.parametrize(
    "length, problem",
    [
        (0, "bad length 0"),
        (1, "bad length 1"),
        (17, "bad length 17"),  # below the magic 2 header
        (0x7FFFFFFF, f"bad length {0x7FFFFFFF}"),
        (0x80000000, f"bad length {-0x80000000}"),
        (0xFFFFFFFF, "bad length -1"),
    ],
)
def test_impossible_lengths_are_rejected(length, problem):
    data = with_length(m.encode(b"x" * 40), length)
    assert check(data, 0, len(data), MAX).problem.reason == problem


def test_length_below_magic_0_minimum_is_rejected():
    data = with_length(v0(b"abc"), 4)
    assert check(data, 0, len(data), MAX).problem.reason == "bad length 4"


def test_length_below_magic_1_minimum_is_rejected():
    data = with_length(v1(b"abc"), 5)
    assert check(data, 0, len(data), MAX).problem.reason == "bad length 5"


def test_length_above_max_message_bytes_is_rejected():
    data = m.encode(b"x" * 100)
    assert check(data, 0, len(data), len(data)).problem is None
    assert check(data, 0, len(data), len(data) - 1).problem.reason == f"bad length {len(data) - 4}"


def test_huge_length_is_rejected_without_allocating():
    data = with_length(m.encode(b"x"), 0x7FFFFFFF) + bytes(1000)
    tracemalloc.start()
    try:
        entry = check(data, 0, len(data), MAX)
        with pytest.raises(kl.CorruptMessage, match="bad length"):
            list(message_set(data))
        with pytest.raises(kl.CorruptMessage, match="bad length"):
            message_set(data).values()
        first = next(kl.MessageSet(data, max_message_bytes=MAX).entries())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert entry.problem.reason == first.problem.reason == f"bad length {0x7FFFFFFF}"
    assert peak < 1 << 20


def test_a_length_within_a_2_gib_limit_but_past_the_buffer_is_cut_off_without_allocating():
    data = with_length(m.encode(b"x"), 0x7FFFFF00) + bytes(1000)
    tracemalloc.start()
    try:
        entry = check(data, 0, len(data), 0x7FFFFFFF)
        got = list(kl.MessageSet(data, max_message_bytes=0x7FFFFFFF))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert entry.problem.kind is INCOMPLETE
    assert got == []
    assert peak < 1 << 20


def test_a_length_that_runs_past_the_buffer_is_incomplete():
    data = m.encode(b"x" * 10)
    assert check(data[:-1], 0, len(data) - 1, MAX).problem.kind is INCOMPLETE


def test_a_bad_key_length_is_a_problem_even_with_a_matching_crc():
    body = struct.pack(">qi", 0, 50) + b"short"
    data = struct.pack(">iBBI", 6 + len(body), 2, 0, m.crc_of(2, 0, body)) + body
    assert check(data, 0, len(data), MAX).problem.reason == "bad key length 50"
    with pytest.raises(kl.CorruptMessage, match="bad key length"):
        list(message_set(data))


def test_key_length_below_minus_one_is_a_problem():
    body = struct.pack(">qi", 0, -2) + b"v"
    data = struct.pack(">iBBI", 6 + len(body), 2, 0, m.crc_of(2, 0, body)) + body
    assert check(data, 0, len(data), MAX).problem.reason == "bad key length -2"


# ----------------------------------------------------------------- every single-bit flip is detected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=values, key=keys, timestamp=timestamps, data=st.data())
def test_every_single_bit_flip_of_a_magic_2_message_is_detected(value, key, timestamp, data):
    original = m.encode(value, key, timestamp)
    bit = data.draw(st.integers(0, len(original) * 8 - 1), label="bit")
    damaged = flipped(original, bit)
    try:
        got = list(message_set(damaged, stable=len(damaged) + 1))
    except kl.CorruptMessage:
        return
    assert got == [], f"bit {bit} flipped yet a message was returned: {got}"


def yielded(data: bytes) -> list:
    """What iterating ``data`` (all of it committed) returns; [] if it raises CorruptMessage."""
    try:
        return list(message_set(data))
    except kl.CorruptMessage:
        return []


def fast_values(data: bytes) -> list[bytes]:
    """What ``values()`` returns for ``data``; [] if it raises CorruptMessage."""
    try:
        return message_set(data).values()[0]
    except kl.CorruptMessage:
        return []


@pytest.mark.parametrize("key", [None, b"", b"k"])
def test_every_bit_of_a_small_message_is_covered(key):
    original = m.encode(b"value", key, 1234)
    for bit in range(len(original) * 8):
        damaged = flipped(original, bit)
        assert check(damaged, 0, len(damaged), MAX).problem is not None, f"bit {bit}"
        assert yielded(damaged) == [], f"bit {bit}"
        assert fast_values(damaged) == [], f"bit {bit}"


def test_every_bit_of_a_magic_0_message_is_covered():
    original = v0(b"kafka 0.7 payload")
    for bit in range(len(original) * 8):
        damaged = flipped(original, bit)
        assert yielded(damaged) == [], f"bit {bit}"
        assert fast_values(damaged) == [], f"bit {bit}"


@settings(max_examples=200)
@given(items=st.lists(st.tuples(values, keys), min_size=2, max_size=6), data=st.data())
def test_a_bit_flip_inside_a_set_never_changes_a_returned_message(items, data):
    frames = [m.encode(v, k, 1) for v, k in items]
    original = b"".join(frames)
    bit = data.draw(st.integers(0, len(original) * 8 - 1), label="bit")
    damaged = flipped(original, bit)
    expected = list(message_set(original))
    try:
        got = list(message_set(damaged))
    except kl.CorruptMessage:
        got = None
    if got is not None:
        assert got == expected[: len(got)]
        assert len(got) < len(expected)
    vals = fast_values(damaged)
    assert vals == [v for v, _ in items][: len(vals)]
    assert len(vals) < len(items)


# ----------------------------------------------------------------- codecs


@pytest.mark.parametrize("codec", [m.CODEC_GZIP, m.CODEC_ZSTD])
def test_compress_round_trips(codec):
    data = b"abc" * 1000
    assert m.decompress(codec, m.compress(codec, data), len(data)) == data


@pytest.mark.parametrize("codec", [m.CODEC_GZIP, m.CODEC_ZSTD])
def test_decompress_refuses_more_than_max_size(codec):
    data = bytes(10_000)
    with pytest.raises(ValueError, match="more than 9999"):
        m.decompress(codec, m.compress(codec, data), 9999)


@pytest.mark.parametrize("codec", [m.CODEC_GZIP, m.CODEC_ZSTD])
def test_decompress_rejects_garbage(codec):
    with pytest.raises(ValueError):
        m.decompress(codec, b"definitely not compressed data", 1000)


def test_decompress_rejects_a_truncated_gzip_stream():
    packed = m.compress(m.CODEC_GZIP, b"hello world" * 100)
    with pytest.raises(ValueError, match="truncated"):
        m.decompress(m.CODEC_GZIP, packed[:-8], 10_000)


@pytest.mark.parametrize("codec", [m.CODEC_SNAPPY, m.CODEC_LZ4, 7])
def test_unsupported_codecs_raise(codec):
    with pytest.raises(kl.UnsupportedCodec):
        m.compress(codec, b"x")
    with pytest.raises(kl.UnsupportedCodec):
        m.decompress(codec, b"x", 10)


def test_codec_names_and_numbers_agree():
    assert m.CODECS == {"none": 0, "gzip": 1, "zstd": 4}
    assert all(m.CODEC_NAMES[number] == name for name, number in m.CODECS.items())


# ----------------------------------------------------------------- magic 3: headers and null values

header_lists = st.lists(
    st.tuples(st.text(st.characters(blacklist_categories=("Cs",)), max_size=10), st.none() | st.binary(max_size=30)), max_size=5
).map(tuple)


def v3(body_after_crc: bytes, attrs: int = 0) -> bytes:
    """A magic 3 message around ``body_after_crc`` whose checksum holds, whatever the body says."""
    return struct.pack(">iBBI", 6 + len(body_after_crc), 3, attrs, m.crc_of(3, attrs, body_after_crc)) + body_after_crc


def test_a_message_with_headers_or_a_null_value_is_magic_3_and_any_other_magic_2():
    assert m.encode(b"v")[m.MAGIC_OFFSET] == 2
    assert m.encode(b"v", headers=[("h", b"1")])[m.MAGIC_OFFSET] == 3
    assert m.encode(None)[m.MAGIC_OFFSET] == 3
    assert m.encode(b"v", headers=()) == m.encode(b"v")


@given(value=st.none() | values, key=keys, timestamp=timestamps, headers=header_lists)
def test_magic_3_round_trips_headers_in_order_and_null_values(value, key, timestamp, headers):
    data = m.encode(value, key, timestamp, headers=headers)
    assert len(data) == m.framed_size(value, key, headers)
    (msg,) = list(message_set(data, 100))
    assert msg == kl.Message(100, 100 + len(data), timestamp, key, value, headers)


def test_a_null_value_an_empty_value_and_a_null_header_value_stay_distinct():
    data = m.encode(None) + m.encode(b"") + m.encode(b"", headers=[("a", None), ("a", b""), ("a", b"x")])
    got = list(message_set(data))
    assert [msg.value for msg in got] == [None, b"", b""]
    assert got[2].headers == (("a", None), ("a", b""), ("a", b"x"))
    assert message_set(data).values()[0] == [None, b"", b""]


def test_header_keys_are_utf8_strings():
    (msg,) = list(message_set(m.encode(b"v", headers=[("größe", b"\xff")])))
    assert msg.headers == (("größe", b"\xff"),)
    assert b"gr\xc3\xb6\xc3\x9fe" in m.encode(b"v", headers=[("größe", b"\xff")])


@pytest.mark.parametrize(
    "headers, problem",
    [
        ([("k",)], "a header is a"),
        ([5], "a header is a"),
        ([(b"k", b"v")], "a header is a"),
        ([("k", "text")], "its value is bytes or None"),
        ([("\udc80", b"v")], "cannot be written as UTF-8"),
    ],
)
def test_bad_headers_are_refused_when_encoding(headers, problem):
    with pytest.raises(kl.InvalidHeaders, match=problem):
        m.encode(b"v", headers=headers)


def test_a_magic_3_message_checksums_its_magic_attributes_and_everything_after_the_crc():
    data = m.encode(b"v", b"k", 7, headers=[("h", b"1")])
    assert struct.unpack_from(">I", data, m.CRC_OFFSET)[0] == zlib.crc32(data[4:6] + data[10:])


@pytest.mark.parametrize(
    "body, position",
    [
        (struct.pack(">qiii", 0, -1, 9, 0), 22),  # a value length past the end
        (struct.pack(">qiii", 0, -1, -2, 0), 22),  # below -1
        (struct.pack(">qiii", 0, -1, -1, 1), 26),  # a header count with no room for it
        (struct.pack(">qiii", 0, -1, -1, -1), 26),
        (struct.pack(">qiiiiBi", 0, -1, -1, 1, 1, 0xFF, -1), 30),  # a header key that is not UTF-8
        (struct.pack(">qiiiii", 0, -1, -1, 1, 5, -1), 30),  # a header key longer than what is left
        (struct.pack(">qiiiiBi", 0, -1, -1, 1, 1, 0x61, 5), 35),  # a header value past the end
        (struct.pack(">qiiiiBi", 0, -1, -1, 1, 1, 0x61, -2), 35),
        (struct.pack(">qiii", 0, -1, -1, 0) + b"x", 30),  # a byte left over
    ],
)
def test_magic_3_fields_that_do_not_fit_are_a_problem_even_with_a_matching_crc(body, position):
    data = v3(body)
    assert check(data, 0, len(data), MAX).problem.reason == f"bad field at byte {position}"
    with pytest.raises(kl.CorruptMessage, match=f"bad field at byte {position}"):
        list(message_set(data))


def test_a_compressed_magic_3_message_is_a_problem():
    data = m.encode_v3(b"v", None, 0, m.CODEC_ZSTD, ())
    assert check(data, 0, len(data), MAX).problem.reason == "bad field at byte 5"


def test_a_magic_3_key_length_must_leave_room_for_the_value_length_and_header_count():
    data = v3(struct.pack(">qi", 0, 4) + b"kkkk" + struct.pack(">i", -1))  # no room for the count
    assert check(data, 0, len(data), MAX).problem.reason == "bad key length 4"
    assert check(b"\x00\x00\x00\x19\x03" + bytes(25), 0, 29, MAX).problem.reason == "bad length 25"


@pytest.mark.parametrize("value, headers", [(None, ()), (b"value", [("h", b"1"), ("n", None)])])
def test_every_bit_of_a_small_magic_3_message_is_covered(value, headers):
    original = m.encode(value, b"k", 1234, headers=headers)
    for bit in range(len(original) * 8):
        damaged = flipped(original, bit)
        assert check(damaged, 0, len(damaged), MAX).problem is not None, f"bit {bit}"
        assert yielded(damaged) == [], f"bit {bit}"
        assert fast_values(damaged) == [], f"bit {bit}"


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_compressed_batch_holds_magic_3_messages(codec):
    inner = m.encode(b"a", headers=[("h", b"1")]) + m.encode(None, b"k") + m.encode(b"c")
    data = m.encode(m.compress(m.CODECS[codec], inner), None, 5, m.CODECS[codec])
    got = list(message_set(data))
    expected = [(b"a", None, (("h", b"1"),)), (None, b"k", ()), (b"c", None, ())]
    assert [(msg.value, msg.key, msg.headers) for msg in got] == expected
    assert message_set(data).values()[0] == [b"a", None, b"c"]


def test_a_magic_3_value_of_a_wide_buffer_counts_its_bytes():
    value = memoryview(bytes(range(8))).cast("i")
    assert m.encode(value, headers=[("h", b"")]) == m.encode(bytes(value), headers=[("h", b"")])
