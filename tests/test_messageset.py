"""Message sets: bulk framing, the values() fast path, compressed batches, torn tails."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kl
from kl.log import message as m
from kl.log.messageset import INCOMPLETE, check, frame, wrap

from conftest import MAX, message_set, v0, values_of

pytestmark = pytest.mark.usefixtures("each_core")  # the format and corruption rules hold on both cores


def batch(values, codec=m.CODEC_ZSTD, timestamp=5, keys=None) -> bytes:
    return wrap(frame(values, timestamp, keys), codec, timestamp)


# ----------------------------------------------------------------- framing in bulk


@given(st.lists(st.binary(max_size=200), max_size=50), st.integers(0, 2**40))
def test_frame_equals_encoding_each_message(vals, timestamp):
    assert frame(vals, timestamp) == b"".join(m.encode(v, None, timestamp) for v in vals)


@given(st.lists(st.tuples(st.binary(max_size=50), st.none() | st.binary(max_size=20)), max_size=30))
def test_frame_with_keys_equals_encoding_each_message(items):
    vals, ks = [v for v, _ in items], [k for _, k in items]
    assert frame(vals, 9, ks) == b"".join(m.encode(v, k, 9) for v, k in items)


def test_frame_accepts_any_iterable():
    assert frame(iter([b"a", b"b"]), 1) == frame([b"a", b"b"], 1)


def test_frame_of_nothing_is_empty():
    assert frame([], 1) == b""


@given(st.lists(st.binary(max_size=200), max_size=50), st.integers(0, 2**40))
def test_values_equals_iteration_values(vals, offset):
    data = frame(vals, 3)
    messages = message_set(data, offset=offset)
    got, next_offset = messages.values()
    assert got == values_of(messages) == vals
    assert next_offset == offset + len(data)


def test_values_reads_keyed_and_old_messages_through_the_slow_path():
    data = m.encode(b"a", b"k") + v0(b"b") + frame([b"c"], 1) + batch([b"d", b"e"])
    assert message_set(data).values() == ([b"a", b"b", b"c", b"d", b"e"], len(data))
    assert values_of(message_set(data)) == [b"a", b"b", b"c", b"d", b"e"]


def test_values_stops_at_a_torn_tail_and_says_where():
    data = frame([b"a", b"b", b"c"], 1)
    cut = data[:-1]
    assert message_set(cut, offset=10, stable=10).values() == ([b"a", b"b"], 10 + len(data) - 23)


def test_values_detects_a_damaged_magic_byte():
    data = bytearray(m.encode(b"value"))
    data[m.MAGIC_OFFSET] ^= 0x80
    with pytest.raises(kl.CorruptMessage, match="unknown magic 130"):
        message_set(bytes(data)).values()


def test_values_detects_a_damaged_attributes_byte():
    data = bytearray(m.encode(b"value"))
    data[m.ATTRIBUTES_OFFSET] ^= 0x01
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        message_set(bytes(data)).values()


def test_iteration_detects_a_damaged_magic_byte():
    data = bytearray(m.encode(b"value"))
    data[m.MAGIC_OFFSET] ^= 0x80
    with pytest.raises(kl.CorruptMessage, match="unknown magic 130"):
        list(message_set(bytes(data)))


def test_size_in_bytes_is_the_buffer_length():
    data = frame([b"a", b"bc"], 1)
    assert message_set(data).size_in_bytes == len(data)


def test_empty_set_yields_nothing():
    assert list(message_set(b"")) == []
    assert message_set(b"", offset=7).values() == ([], 7)


# ----------------------------------------------------------------- entries, check, valid_bytes


def test_entries_list_every_stored_message():
    data = frame([b"a", b"bb"], 1) + batch([b"c", b"d"])
    entries = list(message_set(data).entries())
    assert [(e.position, e.magic, e.attrs & m.CODEC_MASK, e.problem) for e in entries] == [
        (0, 2, 0, None),
        (23, 2, 0, None),
        (47, 2, m.CODEC_ZSTD, None),
    ]
    assert sum(e.size for e in entries) == len(data)


def test_entries_stop_at_the_first_problem_and_include_it():
    good = frame([b"a"], 1)
    data = good + bytes(30) + good
    entries = list(message_set(data).entries())
    assert [e.problem and e.problem.reason for e in entries] == [None, "bad length 0"]


def test_entries_report_a_cut_off_message_as_incomplete():
    data = frame([b"a", b"b"], 1)[:-3]
    assert [e.problem and e.problem.kind for e in message_set(data).entries()] == [None, INCOMPLETE]


def test_check_reports_a_header_cut_short_as_incomplete():
    data = m.encode(b"x")
    for cut in range(0, 5):
        assert check(data[:cut], 0, cut, MAX).problem.kind is INCOMPLETE


def test_valid_bytes_counts_complete_valid_messages():
    data = frame([b"a", b"b", b"c"], 1)
    assert message_set(data).valid_bytes() == len(data)
    assert message_set(data[:-1]).valid_bytes() == 46
    assert message_set(data[:46] + bytes(23)).valid_bytes() == 46


# ----------------------------------------------------------------- torn tails and corruption


def test_torn_buffer_end_yields_exactly_the_complete_messages():
    vals = [b"first", b"second", b"third message"]
    data = frame(vals, 1)
    last_start = len(frame(vals[:-1], 1))
    for cut in range(last_start, len(data)):
        torn = data[:cut]
        assert values_of(message_set(torn, stable=0)) == vals[:-1], cut
        assert values_of(message_set(torn, stable=len(data))) == vals[:-1], cut
        assert message_set(torn, stable=len(data)).values() == (vals[:-1], last_start), cut
    assert values_of(message_set(data)) == vals


def test_torn_buffer_end_of_a_compressed_batch_yields_the_earlier_messages():
    head = frame([b"a", b"b"], 1)
    data = head + batch([b"c", b"d"])
    for cut in range(len(head), len(data)):
        assert values_of(message_set(data[:cut])) == [b"a", b"b"], cut


def test_a_message_cut_off_at_end_of_file_below_the_stable_offset_is_corrupt():
    data = frame([b"a", b"b"], 1)[:-1]
    with pytest.raises(kl.CorruptMessage, match="file ends inside a message"):
        list(message_set(data, stable=len(data) + 1, eof=True))


def test_a_message_cut_off_at_end_of_file_past_the_stable_offset_is_a_torn_tail():
    data = frame([b"a", b"b"], 1)[:-1]
    assert values_of(message_set(data, stable=23, eof=True)) == [b"a"]


def test_garbage_below_the_stable_offset_raises_with_its_offset():
    data = frame([b"a"], 1) + bytes(23) + frame([b"b"], 1)
    with pytest.raises(kl.CorruptMessage) as e:
        list(message_set(data, offset=1000))
    assert e.value.offset == 1023
    assert e.value.position == 23
    assert e.value.reason == "bad length 0"
    assert "offset 1023" in str(e.value)


def test_garbage_at_the_stable_offset_ends_the_set():
    data = frame([b"a"], 1) + bytes(23) + frame([b"b"], 1)
    assert values_of(message_set(data, offset=1000, stable=1023)) == [b"a"]
    assert message_set(data, offset=1000, stable=1023).values() == ([b"a"], 1023)


def test_checksum_mismatch_below_the_stable_offset_raises():
    data = bytearray(frame([b"a", b"b"], 1))
    data[-1] ^= 0x01
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        list(message_set(bytes(data)))
    with pytest.raises(kl.CorruptMessage, match="checksum mismatch"):
        message_set(bytes(data)).values()


def test_corrupt_message_names_path_and_position():
    data = frame([b"a"], 1) + bytes(30)
    messages = kl.MessageSet(data, 500, max_message_bytes=MAX, stable_offset=10_000, path="/x/seg", position=200)
    with pytest.raises(kl.CorruptMessage) as e:
        list(messages)
    assert (e.value.path, e.value.position, e.value.offset) == ("/x/seg", 223, 523)
    assert str(e.value) == "corrupt message at offset 523 (/x/seg position 223): bad length 0"


def test_a_message_larger_than_max_message_bytes_is_corrupt_below_stable():
    data = m.encode(b"x" * 100)
    messages = kl.MessageSet(data, max_message_bytes=64, stable_offset=len(data))
    with pytest.raises(kl.CorruptMessage, match="bad length 118"):
        list(messages)


# ----------------------------------------------------------------- compressed batches


@pytest.mark.parametrize("codec", [m.CODEC_ZSTD, m.CODEC_GZIP])
@given(st.lists(st.binary(max_size=100), min_size=1, max_size=30))
def test_compressed_batch_round_trips(codec, vals):
    data = batch(vals, codec)
    got = list(message_set(data, offset=40))
    assert values_of(got) == vals
    assert all(x.offset == 40 for x in got)
    assert [x.next_offset for x in got] == [40] * (len(vals) - 1) + [40 + len(data)]
    assert all(x.timestamp == 5 for x in got)


@pytest.mark.parametrize("codec", [m.CODEC_ZSTD, m.CODEC_GZIP])
def test_compressed_batch_keeps_keys(codec):
    data = batch([b"a", b"b", b"c"], codec, keys=[b"k1", None, b""])
    assert [(x.key, x.value) for x in message_set(data)] == [(b"k1", b"a"), (None, b"b"), (b"", b"c")]


def test_compressed_batch_is_one_stored_message():
    data = batch([b"x" * 100] * 50)
    (entry,) = message_set(data).entries()
    assert entry.attrs & m.CODEC_MASK == m.CODEC_ZSTD
    assert entry.size == len(data) < 50 * 122


def test_compressed_batch_holding_a_compressed_message_is_corrupt():
    inner = batch([b"a"])
    data = wrap(inner, m.CODEC_ZSTD, 1)
    with pytest.raises(kl.CorruptMessage, match="itself compressed"):
        list(message_set(data))


def test_compressed_batch_of_nothing_is_corrupt():
    data = wrap(b"", m.CODEC_ZSTD, 1)
    with pytest.raises(kl.CorruptMessage, match="empty"):
        list(message_set(data))


def test_compressed_batch_with_a_damaged_inner_message_is_corrupt():
    inner = bytearray(frame([b"a", b"b"], 1))
    inner[-1] ^= 1
    data = wrap(bytes(inner), m.CODEC_ZSTD, 1)
    with pytest.raises(kl.CorruptMessage, match="inner message at \\+23: checksum mismatch"):
        list(message_set(data))


def test_compressed_batch_with_undecodable_payload_is_corrupt():
    data = m.encode(b"this is not zstd", None, 1, m.CODEC_ZSTD)
    with pytest.raises(kl.CorruptMessage, match="compressed batch: zstd"):
        list(message_set(data))


def test_compressed_batch_decompressing_past_max_message_bytes_is_corrupt():
    data = batch([bytes(1000)] * 10)
    messages = kl.MessageSet(data, max_message_bytes=4096, stable_offset=len(data))
    with pytest.raises(kl.CorruptMessage, match="more than 4096"):
        list(messages)


def test_compressed_batch_with_unknown_codec_raises_unsupported_codec():
    data = m.encode(b"payload", None, 1, m.CODEC_LZ4)
    with pytest.raises(kl.UnsupportedCodec):
        list(message_set(data))


def test_gzip_batch_written_by_another_tool_is_readable():
    import gzip

    data = m.encode(gzip.compress(frame([b"from", b"elsewhere"], 1)), None, 1, m.CODEC_GZIP)
    assert values_of(message_set(data)) == [b"from", b"elsewhere"]


def _consume_with_restarts(data: bytes, stops: list[int]) -> list[bytes]:
    """Read ``data`` from offset 0, stopping after the n-th message of each pass in
    ``stops`` and resuming from the last ``next_offset`` seen."""
    out, offset = [], 0
    for stop in stops + [None]:
        taken = 0
        for msg in message_set(data[offset:], offset=offset):
            if stop is not None and taken == stop:
                break
            out.append(msg.value)
            offset = msg.next_offset
            taken += 1
        if offset == len(data):
            break
    return out


def test_a_consumer_stopping_inside_a_batch_resumes_without_loss():
    before, inside, after = [b"a", b"b"], [b"c", b"d", b"e", b"f"], [b"g"]
    data = frame(before, 1) + batch(inside) + frame(after, 1)
    everything = before + inside + after
    batch_start, batch_end = len(before), len(before) + len(inside)
    for stop in range(1, len(everything)):
        restart = batch_start if batch_start < stop < batch_end else stop
        assert _consume_with_restarts(data, [stop]) == everything[:stop] + everything[restart:], stop


def test_next_offset_inside_a_batch_points_back_at_the_wrapper():
    data = frame([b"a"], 1) + batch([b"b", b"c", b"d"])
    got = list(message_set(data, offset=100))
    assert [(x.offset, x.next_offset) for x in got] == [(100, 123), (123, 123), (123, 123), (123, 100 + len(data))]


@given(
    st.lists(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=6), min_size=1, max_size=6),
    st.lists(st.integers(1, 8), max_size=5),
    st.data(),
)
def test_resuming_from_the_last_next_offset_redelivers_at_most_one_batch(batches, stops, data):
    codecs = data.draw(st.lists(st.sampled_from([None, m.CODEC_ZSTD, m.CODEC_GZIP]), min_size=len(batches),
                                max_size=len(batches)))
    stream, expected = b"", []
    for i, (vals, codec) in enumerate(zip(batches, codecs, strict=True)):
        vals = [b"%d:%d:" % (i, j) + v for j, v in enumerate(vals)]
        stream += frame(vals, 1) if codec is None else batch(vals, codec)
        expected.extend(vals)
    got = _consume_with_restarts(stream, stops)
    seen = []
    for value in got:  # remove re-deliveries: they repeat a suffix of what came before
        if value not in seen:
            seen.append(value)
    assert seen == expected
    largest = max(len(b) for b in batches)
    assert len(got) - len(expected) <= largest * len(stops)
