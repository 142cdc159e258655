"""``kl serve --kafka`` serving Produce v0-2, Fetch v0-3 (message sets of magic 0 and 1)
and ListOffsets v0, which Kafka 4 no longer serves: request by request with kafka-python's protocol classes,
then kafka-python's producer and consumer pinned to the broker versions of that time."""

from __future__ import annotations

import struct
import time
import zlib

import cramjam
import pytest
import zstandard
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from test_kafka import built, produce

import kl
from kl.net.kafka import errors as kafka_errors

from conftest import read_all, write

T0 = 1_700_000_000_000
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3}


def legacy(values, *, magic: int = 1, keys=None, codec: int = 0, timestamp: int = T0) -> bytes:
    """A message set as kafka-python's producer of that time builds it."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 24)
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        builder.append(i, timestamp=timestamp + i if magic else None, key=key, value=value)
    return bytes(builder.build())


def old_fetch(client, topic: str, offset: int, version: int, *, max_bytes: int = 1 << 20, partition_max_bytes: int = 1 << 20):
    part = FetchRequest.FetchTopic.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=partition_max_bytes)
    response = client.call(FetchRequest, version, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
                           topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])])  # fmt: skip
    (answer,) = response.responses[0].partitions
    return answer


def messages_of(answer) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """(offset, magic, key, value, timestamp) of each message, read (crc checked) by
    kafka-python's reader of message sets."""
    out = []
    records = MemoryRecords(bytes(answer.records))
    while (batch := records.next_batch()) is not None:
        for r in batch:
            assert r.validate_crc()
            out.append((r.offset, batch.magic, r.key, r.value, r.timestamp))
    return out


def stored(root: kl.Root, topic: str) -> list[tuple[bytes | None, bytes | None, int | None]]:
    return [(m.key, m.value, m.timestamp) for m in read_all(root, topic)]


# ----------------------------------------------------------------- Produce v0-2


def test_api_versions_advertises_produce_and_fetch_from_version_0(served):
    _, client = served()
    answer = client.call(ApiVersionsRequest, 3, client_software_name="test", client_software_version="1")
    got = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert got[ProduceRequest.API_KEY] == (0, 9)
    assert got[FetchRequest.API_KEY] == (0, 16)


@pytest.mark.parametrize(("version", "magic"), [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1)])
def test_produce_v0_to_v2_stores_a_message_set_and_answers_the_first_records_kafka_offset(served, root, topic, version, magic):
    write(root, topic, [b"before"], timestamp=5)
    _, client = served(allow_produce=True)
    before = time.time() * 1000
    answer = produce(client, topic, legacy([b"one", b"two"], magic=magic, keys=[b"k", None]), version=version)
    assert (answer.error_code, answer.base_offset) == (0, 1)
    if version == 2:
        assert answer.log_append_time_ms == -1  # create time, as Kafka answers for such a topic
    got = stored(root, topic)[1:]
    assert [(k, v) for k, v, _ in got] == [(b"k", b"one"), (None, b"two")]
    if magic:
        assert [t for *_, t in got] == [T0, T0 + 1]
    else:  # magic 0 has no timestamp: the log's append time is its
        assert all(before <= t <= time.time() * 1000 for *_, t in got)
    assert produce(client, topic, legacy([b"three"], magic=magic), version=version).base_offset == 3


@pytest.mark.parametrize(("codec", "magic"), [("gzip", 0), ("gzip", 1), ("snappy", 0), ("snappy", 1), ("lz4", 1)])
def test_produce_takes_compressed_wrappers_and_stores_each_inner_record(served, root, topic, codec, magic):
    _, client = served(allow_produce=True)
    values = [b"v%d" % i * 10 for i in range(50)]
    keys = [b"k%d" % i for i in range(50)]
    data = legacy(values, magic=magic, keys=keys, codec=CODECS[codec])
    assert produce(client, topic, data, version=2).error_code == 0
    assert [(k, v) for k, v, _ in stored(root, topic)] == list(zip(keys, values, strict=True))
    assert produce(client, topic, data, version=2).base_offset == 50


def append_time(entry: bytes) -> bytes:
    """A one-message magic 1 set whose attributes say log append time (its crc mended)."""
    body = entry[16:17] + bytes([entry[17] | 0x08]) + entry[18:]
    return entry[:12] + struct.pack(">I", zlib.crc32(body)) + body


def test_messages_that_say_log_append_time_are_stamped_when_appended(served, root, topic):
    _, client = served(allow_produce=True)
    before = time.time() * 1000
    gzip = wrapper(1, zlib.compress(legacy([b"in", b"side"], timestamp=5), wbits=31))
    data = append_time(gzip) + append_time(legacy([b"plain"], timestamp=5))
    assert produce(client, topic, data, version=2).error_code == 0
    got = stored(root, topic)
    assert [v for _, v, _ in got] == [b"in", b"side", b"plain"]
    assert all(before <= t <= time.time() * 1000 for *_, t in got)


def test_a_null_value_is_stored_in_a_topic_that_holds_them_and_refused_elsewhere(served, root):
    root.create_topic("plain", kl.TopicConfig(headers=False))
    root.create_topic("tombstones", kl.TopicConfig(headers=True))
    _, client = served(allow_produce=True)
    assert produce(client, "plain", legacy([None], keys=[b"k"]), version=2).error_code == kafka_errors.INVALID_RECORD
    assert produce(client, "tombstones", legacy([None], keys=[b"k"]), version=2).error_code == 0
    assert stored(root, "tombstones") == [(b"k", None, T0)]


def test_produce_v2_takes_record_batches_too_and_v3_still_refuses_message_sets(served, root, topic):
    """Kafka's brokers before 4 took either in Produce v0-2; from v3 only record batches."""
    _, client = served(allow_produce=True)
    assert produce(client, topic, built([b"batch"]), version=2).error_code == 0
    assert produce(client, topic, legacy([b"set"]), version=3).error_code == kafka_errors.CORRUPT_MESSAGE
    assert [v for _, v, _ in stored(root, topic)] == [b"batch"]


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


def with_size(data: bytes, size: int) -> bytes:
    return data[:8] + struct.pack(">i", size) + data[12:]


def wrapper(codec: int, value: bytes, magic: int = 1) -> bytes:
    """A wrapper of ``codec`` whose value is ``value`` (its crc good)."""
    body = bytes((magic, codec)) + (struct.pack(">q", T0) if magic else b"") + struct.pack(">ii", -1, len(value)) + value
    return struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body


def header_checksum_flipped(frame: bytes) -> bytes:
    """An lz4 frame (no content size) whose header checksum is wrong, as Kafka 0.8's and
    0.9's were (KAFKA-3160)."""
    return flip(frame, 6)


HOSTILE = {
    "cut short": legacy([b"one", b"two"])[:-3],
    "a header only": legacy([b"one"])[:15],
    "a bad crc": flip(legacy([b"one", b"two"]), 72),  # in the second one's value
    "a size too small": with_size(legacy([b"one"]), 3),
    "a size past the end": with_size(legacy([b"one"]), 1 << 30),
    "an unknown magic": flip(legacy([b"one"]), 16),
    "a key length past the message": legacy([b"one"])[:30] + b"\x7f" + legacy([b"one"])[31:],
    "garbage compressed": flip(legacy([b"one" * 100], codec=1), 60),
    "nested compression": wrapper(1, zlib.compress(legacy([b"x"], codec=1), wbits=31)),
    "a gzip wrapper of no set": wrapper(1, zlib.compress(b"", wbits=31)),
    "a zstd wrapper (magic 2's codec)": wrapper(4, zstandard.ZstdCompressor().compress(legacy([b"x"]))),
    "an lz4 frame of Kafka 0.8": wrapper(3, header_checksum_flipped(bytes(cramjam.lz4.compress(legacy([b"x"], magic=0)))), 0),
    "nothing": b"",
}


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_malformed_message_set_is_refused_as_corrupt_and_nothing_is_appended(served, root, topic, data):
    running, client = served(allow_produce=True)
    good = legacy([b"good"])
    topic_data = [
        ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=data + good),
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=data),
            ],
        )
    ]
    response = client.call(ProduceRequest, 2, transactional_id=None, acks=1, timeout_ms=1000, topic_data=topic_data)
    codes = [p.error_code for p in response.responses[0].partition_responses]
    if data:  # a good message after damage is no excuse
        assert codes == [kafka_errors.CORRUPT_MESSAGE, kafka_errors.CORRUPT_MESSAGE]
    else:
        assert codes == [0, kafka_errors.CORRUPT_MESSAGE]
    assert stored(root, topic) == ([] if data else [(None, b"good", T0)])
    assert produce(client, topic, good, version=2).error_code == 0  # the same connection goes on


# ----------------------------------------------------------------- Fetch v0-3


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_fetch_v0_to_v3_answers_a_message_set_of_the_versions_magic_with_kafka_offsets(served, root, topic, version):
    write(root, topic, [b"one", b"two"], keys=[b"k", None], timestamp=T0)
    write(root, topic, [b"three"], timestamp=T0 + 1)
    _, client = served()
    answer = old_fetch(client, topic, 0, version)
    assert (answer.error_code, answer.high_watermark) == (0, 3)
    if version <= 1:  # magic 0: no timestamps
        assert messages_of(answer) == [(0, 0, b"k", b"one", None), (1, 0, None, b"two", None), (2, 0, None, b"three", None)]
    else:
        assert messages_of(answer) == [(0, 1, b"k", b"one", T0), (1, 1, None, b"two", T0), (2, 1, None, b"three", T0 + 1)]
    assert [m[0] for m in messages_of(old_fetch(client, topic, 1, version))] == [1, 2]
    assert old_fetch(client, topic, 3, version).records == b""
    assert old_fetch(client, topic, 4, version).error_code == kafka_errors.OFFSET_OUT_OF_RANGE


def entries(answer) -> list[tuple[int, int]]:
    """(offset, attributes) of each entry of a message set as it is on the wire."""
    data, out = bytes(answer.records), []
    while data:
        offset, size, _, _, attrs = struct.unpack_from(">qiIBB", data)
        out.append((offset, attrs))
        data = data[12 + size :]
    return out


@pytest.mark.parametrize("version", [1, 2])
def test_a_gzip_kl_batch_is_served_as_a_gzip_wrapper_numbered_as_the_versions_clients_expect(served, root, topic, version):
    """From the record asked for on; the wrapper's offset is its last record's; kafka-python
    counts the inner offsets (magic 0 absolute, magic 1 relative) back to Kafka offsets."""
    write(root, topic, [b"first"])
    write(root, topic, [b"v%d" % i for i in range(10)], compression="gzip", timestamp=T0)
    write(root, topic, [b"last"])
    _, client = served()
    answer = old_fetch(client, topic, 4, version)
    assert entries(answer) == [(10, 1), (11, 0)]
    got = messages_of(answer)
    assert [(o, v) for o, _, _, v, _ in got] == [(i, b"v%d" % (i - 1)) for i in range(4, 11)] + [(11, b"last")]
    assert {t for *_, t in got[:-1]} == ({None} if version == 1 else {T0})


def test_a_zstd_kl_batch_which_those_clients_cannot_read_is_served_as_plain_messages(served, root, topic):
    write(root, topic, [b"first"])
    write(root, topic, [b"v%d" % i for i in range(10)], compression="zstd", timestamp=T0)
    _, client = served()
    answer = old_fetch(client, topic, 4, 3)
    assert entries(answer) == [(i, 0) for i in range(4, 11)]
    assert [v for *_, v, _ in messages_of(answer)] == [b"v%d" % (i - 1) for i in range(4, 11)]


def test_headers_are_dropped_and_null_values_served_as_null(served, root):
    root.create_topic("h", kl.TopicConfig(headers=True))
    kl.Producer(root).send("h", None, key=b"gone", headers=[("trace", b"1")], timestamp=T0)
    kl.Producer(root).send("h", b"kept", headers=[("trace", b"2")], timestamp=T0)
    _, client = served()
    assert messages_of(old_fetch(client, "h", 0, 3)) == [(0, 1, b"gone", None, T0), (1, 1, None, b"kept", T0)]


@pytest.mark.parametrize("version", [0, 2])
def test_kafka_0_7s_messages_are_served_without_timestamps_and_refused_from_producers(served, root, version):
    root.create_topic("old", kl.TopicConfig(format="0.7"))
    write(root, "old", [b"a", b"b"])
    write(root, "old", [b"c", b"d"], compression="gzip")
    _, client = served(allow_produce=True)
    magic = 0 if version == 0 else 1
    stamp = None if version == 0 else -1
    answer = old_fetch(client, "old", 1, version)
    assert entries(answer) == [(1, 0), (3, 1)]
    assert messages_of(answer) == [(1, magic, None, b"b", stamp), (2, magic, None, b"c", stamp), (3, magic, None, b"d", stamp)]
    assert produce(client, "old", legacy([b"e"]), version=2).error_code == kafka_errors.INVALID_RECORD


MESSAGE_V1 = 35
"""Bytes of a magic 1 entry with a null key and a one-byte value: offset and size 12,
crc 4, magic and attributes 2, timestamp 8, the two lengths 8, the value 1."""


@pytest.mark.parametrize("version", [2, 3])
def test_an_answer_ends_at_the_last_whole_message_within_max_bytes_and_the_next_fetch_goes_on(served, root, topic, version):
    """Also inside a zstd kl batch, which is read whole and answered in parts."""
    write(root, topic, [b"%d" % (i % 10) for i in range(10)])
    write(root, topic, [b"%d" % (i % 10) for i in range(10)], compression="zstd")
    _, client = served()
    offset, seen, sizes = 0, [], []
    while offset < 20:
        answer = old_fetch(client, topic, offset, version, partition_max_bytes=3 * MESSAGE_V1 + 5)
        assert len(answer.records) % MESSAGE_V1 == 0  # whole messages only
        seen += [o for o, *_ in messages_of(answer)]
        sizes.append(len(answer.records) // MESSAGE_V1)
        offset = seen[-1] + 1
    assert seen == list(range(20))
    assert sizes[-4:] == [3, 3, 3, 1]  # the batch's ten


def test_a_first_message_over_the_limit_is_cut_in_v0_to_v2_and_whole_in_v3(served, root, topic):
    write(root, topic, [b"x" * 1000])
    _, client = served()
    cut = old_fetch(client, topic, 0, 2, partition_max_bytes=100)
    assert len(cut.records) == 100 and messages_of(cut) == []  # the client of that time: "larger than the fetch size"
    assert [len(v) for *_, v, _ in messages_of(old_fetch(client, topic, 0, 3, partition_max_bytes=100))] == [1000]
    assert [len(v) for *_, v, _ in messages_of(old_fetch(client, topic, 0, 3, max_bytes=100))] == [1000]


# ----------------------------------------------------------------- ListOffsets v0


def old_offsets(client, topic: str, timestamp: int, max_num_offsets: int, partition: int = 0):
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
        partition_index=partition, timestamp=timestamp, max_num_offsets=max_num_offsets
    )
    topics = [ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])]
    response = client.call(ListOffsetsRequest, 0, replica_id=-1, topics=topics)
    (answer,) = response.topics[0].partitions
    return answer.error_code, list(answer.old_style_offsets)


def test_list_offsets_v0_answers_segment_starts_newest_first_as_kafka_0_10_did(served, root):
    """Kafka offsets of the segments that begin at or before the time, and of the log end
    when all of it does; -1 the log end, -2 the log start; at most ``max_num_offsets``."""
    root.create_topic("seg", kl.TopicConfig(segment_bytes=256, max_message_bytes=256))
    for i in range(4):
        write(root, "seg", [b"%d-%d-%s" % (i, j, b"x" * 10) for j in range(5)], timestamp=T0 + 1000 * i)
    assert len(root.log("seg", 0).segments()) == 4  # a segment a batch, each starting 5 records on
    _, client = served()
    assert old_offsets(client, "seg", -1, 1) == (0, [20])
    assert old_offsets(client, "seg", -2, 1) == (0, [0])
    assert old_offsets(client, "seg", T0 + 1500, 10) == (0, [5, 0])
    assert old_offsets(client, "seg", T0 + 3000, 3) == (0, [15, 10, 5])
    assert old_offsets(client, "seg", T0 - 1, 10) == (0, [])
    assert old_offsets(client, "seg", -1, 0) == (0, [])
    assert old_offsets(client, "seg", -1, 1, partition=7)[0] == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    assert old_offsets(client, "nosuch", -1, 1)[0] == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION


# ----------------------------------------------------------------- the clients of that time


def polled(consumer: KafkaConsumer, count: int) -> list:
    """``count`` records polled (waiting up to 10 s for them)."""
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        for records in consumer.poll(200).values():
            got += records
    return got


@pytest.mark.parametrize("api_version", [(0, 10, 1), (0, 10, 0), (0, 9), (0, 8, 2)], ids=str)
def test_kafka_pythons_clients_of_old_brokers_produce_and_consume_with_dense_offsets(served, root, topic, api_version):
    """(0, 10, 1) speaks Produce v2 and Fetch v3, (0, 10, 0) Fetch v2, (0, 9) Produce and
    Fetch v1 (magic 0), (0, 8, 2) v0; gzip, keys; timestamps from magic 1 on.  kl's own
    batches first, zstd (served as plain messages) and gzip (as a wrapper)."""
    running, _ = served(allow_produce=True)
    bootstrap = f"{running.address[0]}:{running.address[1]}"
    write(root, topic, [b"kl-%d" % i for i in range(3)], compression="zstd", timestamp=T0 - 10)
    write(root, topic, [b"kl-%d" % i for i in range(3, 5)], compression="gzip", timestamp=T0 - 10)
    producer = KafkaProducer(bootstrap_servers=bootstrap, api_version=api_version, compression_type="gzip",
                             linger_ms=20, acks=1, retries=0)  # fmt: skip
    try:
        futures = [producer.send(topic, b"value-%d" % i, key=b"key-%d" % i, timestamp_ms=T0 + i) for i in range(20)]
        producer.flush(10)
        assert [f.get(10).offset for f in futures] == list(range(5, 25))
    finally:
        producer.close(5)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=api_version, group_id=None,
                             enable_auto_commit=False, fetch_max_wait_ms=50)  # fmt: skip
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        ends = consumer.beginning_offsets([tp]), consumer.end_offsets([tp])  # by ListOffsets v0 before (0, 10, 1)
        assert ends == ({tp: 0}, {tp: 25})
        consumer.seek_to_beginning(tp)
        got = polled(consumer, 25)
        consumer.seek(tp, 4)  # inside kl's gzip batch
        again = polled(consumer, 21)
    finally:
        consumer.close()
    assert again == got[4:]
    assert [r.offset for r in got] == list(range(25))
    assert [(r.key, r.value) for r in got] == [(None, b"kl-%d" % i) for i in range(5)] + [
        (b"key-%d" % i, b"value-%d" % i) for i in range(20)
    ]
    with_time = api_version >= (0, 10)
    assert [r.timestamp for r in got] == ([T0 - 10] * 5 + [T0 + i for i in range(20)] if with_time else [None] * 25)


@pytest.mark.parametrize("codec", ["snappy", "lz4"])
def test_kafka_pythons_producer_of_0_10_sends_each_codec_of_its_time(served, root, topic, codec):
    running, _ = served(allow_produce=True)
    producer = KafkaProducer(bootstrap_servers=f"{running.address[0]}:{running.address[1]}", api_version=(0, 10, 1),
                             compression_type=codec, linger_ms=20, retries=0)  # fmt: skip
    try:
        futures = [producer.send(topic, b"value-%d" % i * 20, timestamp_ms=T0 + i) for i in range(30)]
        producer.flush(10)
        assert [f.get(10).offset for f in futures] == list(range(30))
    finally:
        producer.close(5)
    assert stored(root, topic) == [(None, b"value-%d" % i * 20, T0 + i) for i in range(30)]
