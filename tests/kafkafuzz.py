"""Hostile input for ``kl serve --kafka``, shared by tests/test_kafka_fuzz.py and
``scripts/fuzz-kafka``.

Real requests, as today's clients send them, are built with kafka-python's
schema-generated classes (``requests``): ApiVersions, Metadata, Produce (record batches
in each codec, idempotent or not, and the message sets of versions 0-2), Fetch,
ListOffsets, InitProducerId and the admin requests (``admin``, ``inspections``), in
every version kl serves.  ``attacks`` turns them, and random bytes, into hostile ones, each a
(kind, bytes to send) pair; ``bomb`` is a batch that inflates far past any limit.
``attack`` sends one on a connection of its own and returns what came back before the
daemon closed it.  ``Daemon`` runs ``kl serve --kafka`` as a subprocess over a root that
``fill`` sets up; ``healthy`` checks it still answers as it should.  This module imports
nothing from pytest, so scripts can use it (``sys.path`` the tests dir).
"""

from __future__ import annotations

import contextlib
import gzip
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import cramjam
import zstandard
from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeLogDirsRequest
from kafka.protocol.admin.configs import DescribeConfigsRequest, IncrementalAlterConfigsRequest
from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    ElectLeadersRequest,
    ListPartitionReassignmentsRequest,
)
from kafka.protocol.admin.transactions import DescribeProducersRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatchBuilder

import kl
from kl.log import core
from kl.net.kafka import frontend, records
from kl.net.kafka.list_offsets import EARLIEST, LATEST

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "xerial": 2, "lz4": 3, "zstd": 4}
"""Each way a client may compress a batch (snappy raw, as librdkafka sends it, or in
snappy-java's framing, as the Java client does) and its codec number."""
SIZES = (0, 1, -1, -(1 << 31), (1 << 31) - 1, (1 << 20) + 1, (8 << 20) + 1, 1 << 30)
"""Size prefixes: too small, negative, past either request limit, huge."""
INTS = (0, -1, 1, -(1 << 31), (1 << 31) - 1, 0x7FFF, -0x8000, 0xFFFF, 0x8000)
"""What an overwritten field is set to."""
TIMESTAMP = 1_700_000_000_000
KL = [sys.executable, "-m", "kl_cli"]
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\dT\S+Z (info|warning) ")
BUG = re.compile(r": unexpected [A-Z]\w*: |Traceback")
"""What the daemon logs when a request meets a bug (it closes that connection and goes on)."""


# ----------------------------------------------------------------------------- batches


def record(index: int, value: bytes | None, key: bytes | None = None, headers=()) -> bytes:
    """One record of a batch (offset delta ``index``, timestamp delta ``index``)."""
    body = [b"\0", core.varint(index), core.varint(index)]
    for field in (key, value):
        body.append(core.varint(-1) if field is None else core.varint(len(field)) + field)
    body.append(core.varint(len(headers)))
    for name, hvalue in headers:
        body.append(core.varint(len(name)) + name)
        body.append(core.varint(-1) if hvalue is None else core.varint(len(hvalue)) + hvalue)
    data = b"".join(body)
    return core.varint(len(data)) + data


def compress(codec: str, data: bytes) -> bytes:
    if codec == "gzip":
        return gzip.compress(data, 6)
    if codec == "snappy":
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == "xerial":
        blocks = [bytes(cramjam.snappy.compress_raw(data[i : i + 32768])) for i in range(0, len(data), 32768)]
        return records.XERIAL + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    if codec == "lz4":
        return bytes(cramjam.lz4.compress(data))
    if codec == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def batch(body: bytes, count: int, codec: str = "none", producer: tuple[int, int, int] = (-1, -1, -1), attrs: int = 0) -> bytes:
    """A magic-2 batch of ``count`` records whose encoding is ``body`` (compressed here),
    with a correct CRC-32C whatever the rest says."""
    data = compress(codec, body)
    header = records.BATCH.pack(
        0,
        records.BATCH.size - records.LENGTH_END + len(data),
        0,
        records.MAGIC,
        0,
        CODECS[codec] | attrs,
        count - 1,
        TIMESTAMP,
        TIMESTAMP + count,
        *producer,
        count,
    )
    return with_crc(header + data)


def with_crc(data: bytes | bytearray) -> bytes:
    """The batch ``data`` with its CRC-32C set to match what it holds now."""
    out = bytearray(data)
    out[17 : records.CRC_END] = core.crc32c(bytes(out[records.CRC_END :])).to_bytes(4, "big")
    return bytes(out)


def values(count: int, size: int = 20, tag: bytes = b"fuzz") -> list[bytes]:
    return [(b"%s-%06d-" % (tag, i)).ljust(size, b"v") for i in range(count)]


def plain(vals: list[bytes]) -> bytes:
    return b"".join(record(i, v, key=b"k%d" % i) for i, v in enumerate(vals))


def message_set(vals: list[bytes], magic: int, codec: str = "none") -> bytes:
    """A message set of magic 0 or 1 as kafka-python's producer of that time builds it
    (keyed, timestamps from magic 1 on)."""
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=CODECS[codec], batch_size=1 << 24)
    for i, v in enumerate(vals):
        builder.append(i, timestamp=TIMESTAMP + i if magic else None, key=b"k%d" % i, value=v)
    return bytes(builder.build())


def hostile_set(rng: random.Random) -> bytes:
    """A message set whose messages' CRC-32s are correct and whose content is hostile: a
    size, length, magic or attributes field set to an extreme, or a wrapper's compressed
    value damaged."""
    magic = rng.randrange(2)
    codec = rng.choice(["none", "gzip", "snappy"] + ["lz4"] * magic)
    out = bytearray(message_set(values(rng.randint(1, 20), rng.randint(0, 50)), magic, codec))
    if rng.random() < 0.5:  # magic, attributes, a length (a wrapper's key or value)
        at, width = rng.choice([(16, 1), (17, 1), (18 + 8 * magic, 4), (22 + 8 * magic, 4)])
        value = rng.choice(INTS + (2, 5, 0x0F, 0x08))
        out[at : at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    else:
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(26 + 8 * magic, len(out))] ^= 1 << rng.randrange(8)
    if rng.random() < 0.2:  # its size too
        out[8:12] = struct.pack(">i", rng.choice(INTS))
    first = 12 + struct.unpack_from(">i", out, 8)[0]
    out[12:16] = zlib.crc32(bytes(out[16:first])).to_bytes(4, "big") if 16 <= first <= len(out) else out[12:16]
    return bytes(out)


def bomb(codec: str, inflated: int) -> bytes:
    """A batch of one record of ``inflated`` zeros, compressed by hand so that it is never
    inflated here: gzip and lz4 repeat one compressed block of zeros, zstd repeats RLE
    blocks (4 bytes each for 128 KiB), snappy repeats copies of 64 bytes and snappy-java's
    framing a snappy block (both ~21:1 at most: keep ``inflated`` to ~100 MiB for them).
    Checksums past the limit that matters (gzip's and lz4's at the end) are left zero."""
    if codec == "snappy":
        inflated = inflated // 64 * 64 + 1  # a zero, then copies of 64
    head = b"\0" + core.varint(0) + core.varint(0) + core.varint(-1) + core.varint(inflated - 1)
    head = core.varint(len(head) + inflated) + head  # the value's zeros, then a 0: no headers
    if codec == "gzip":
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
        block = deflate.compress(bytes(1 << 20)) + deflate.flush(zlib.Z_FULL_FLUSH)  # the same bytes each time
        data = GZIP + data + block * (inflated >> 20) + deflate.flush() + bytes(8)  # crc and size: not reached
    elif codec == "zstd":
        rle = (1 << 1 | (128 << 10) << 3).to_bytes(3, "little") + b"\0"
        raw = (len(head) << 3).to_bytes(3, "little") + head
        last = (1 | 1 << 1 | (inflated & 0x1FFFF) << 3).to_bytes(3, "little") + b"\0"
        data = ZSTD + raw + rle * (inflated >> 17) + last
    elif codec == "lz4":
        frame = bytes(cramjam.lz4.compress(head + bytes(3 << 16)))
        blocks, pos = [], 7
        while (size := int.from_bytes(frame[pos : pos + 4], "little") & 0x7FFFFFFF) != 0:
            blocks.append(frame[pos : pos + 8 + size])  # size, data, block checksum
            pos += 8 + size
        data = frame[:7] + blocks[0] + blocks[1] * (inflated >> 16) + bytes(8)
    elif codec == "snappy":
        literal = bytes([len(head) << 2]) + head + b"\0"  # the head and one zero
        data = _uvarint(len(head) + inflated) + literal + b"\xfe\x01\x00" * (inflated >> 6)  # 64 zeros each
    else:
        block = bytes(cramjam.snappy.compress_raw(bytes(32768)))
        first = bytes(cramjam.snappy.compress_raw(head))
        blocks = [first] + [block] * (inflated >> 15)
        data = records.XERIAL + struct.pack(">ii", 1, 1) + b"".join(struct.pack(">i", len(b)) + b for b in blocks)
    header = records.BATCH.pack(
        0, records.BATCH.size - records.LENGTH_END + len(data), 0, 2, 0, CODECS[codec], 0, TIMESTAMP, TIMESTAMP,
        -1, -1, -1, 1,
    )  # fmt: skip
    return with_crc(header + data)


GZIP = b"\x1f\x8b\x08\0\0\0\0\0\0\xff"
ZSTD = b"\x28\xb5\x2f\xfd\x00\x38"
"""A zstd frame's magic, and a header with a window of 128 KiB and no content size."""


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


# ----------------------------------------------------------------------------- requests


def framed(request, version: int, correlation: int = 1, **fields) -> bytes:
    message = request[version](**fields)
    message.with_header(correlation_id=correlation, client_id="fuzz")
    return bytes(message.encode(header=True, framed=True))


def produce(topic: str, batches: list[bytes], version: int = 9, partition: int = 0, acks: int = 1, **extra) -> bytes:
    part = ProduceRequest.TopicProduceData.PartitionProduceData
    data = [ProduceRequest.TopicProduceData(name=topic, partition_data=[part(index=partition, records=b) for b in batches])]
    fields = dict(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=data) | extra
    return framed(ProduceRequest, version, **fields)


def fetch(topic: str, offset: int, version: int = 12, partition: int = 0, **extra) -> bytes:
    fields = fetch_fields(topic, offset, partition, extra.pop("partition_max_bytes", 1 << 20))
    return framed(FetchRequest, version, **(fields | extra))


def fetch_fields(topic: str | None, offset: int, partition: int = 0, max_bytes: int = 1 << 20, topic_id=None) -> dict:
    """A Fetch request's fields: one partition of a topic (by name, or by id from v13)."""
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=partition,
        fetch_offset=offset,
        partition_max_bytes=max_bytes,
        log_start_offset=-1,
        current_leader_epoch=-1,
        last_fetched_epoch=-1,
    )
    return dict(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=[part])],
        forgotten_topics_data=[],
        rack_id="",
    )


def list_offsets(topic: str, timestamp: int, version: int = 6, partition: int = 0) -> bytes:
    topics = ListOffsetsRequest.ListOffsetsTopic
    part = topics.ListOffsetsPartition(partition_index=partition, timestamp=timestamp, current_leader_epoch=-1, max_num_offsets=1)
    return framed(ListOffsetsRequest, version, replica_id=-1, isolation_level=0, topics=[topics(name=topic, partitions=[part])])


def metadata(names: list[str] | None, version: int = 12) -> bytes:
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    return framed(
        MetadataRequest,
        version,
        topics=topics,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


ADMIN_TOPIC = "admin-made"
"""What the admin requests create, grow and delete: a name no mutation of theirs turns into t or f."""


def versions(request) -> range:
    return range(frontend.APIS[request.API_KEY].low, frontend.APIS[request.API_KEY].high + 1)


def admin() -> list[tuple[str, bytes]]:
    """(label, request): creating ``ADMIN_TOPIC`` (2 partitions, or as validate-only),
    growing it to 3 and deleting it, in each version served."""
    out = []
    creatable = CreateTopicsRequest.CreatableTopic
    for v in versions(CreateTopicsRequest):
        for only in (True, False) if v else (False,):
            made = creatable(name=ADMIN_TOPIC, num_partitions=2, replication_factor=-1, assignments=[], configs=[])
            out.append((f"CreateTopics v{v}", framed(CreateTopicsRequest, v, topics=[made], timeout_ms=1000, validate_only=only)))
    for v in versions(CreatePartitionsRequest):
        grown = CreatePartitionsRequest.CreatePartitionsTopic(name=ADMIN_TOPIC, count=3, assignments=None)
        grow = framed(CreatePartitionsRequest, v, topics=[grown], timeout_ms=1000, validate_only=False)
        out.append((f"CreatePartitions v{v}", grow))
    out += inspections()
    for v in versions(DeleteTopicsRequest):
        named = {"topics": [DeleteTopicsRequest.DeleteTopicState(name=ADMIN_TOPIC)]} if v >= 6 else {"topic_names": [ADMIN_TOPIC]}
        out.append((f"DeleteTopics v{v}", framed(DeleteTopicsRequest, v, timeout_ms=1000, **named)))
    return out


def inspections() -> list[tuple[str, bytes]]:
    """(label, request): describing and altering ``ADMIN_TOPIC``'s configs (validate-only),
    deleting its records, describing the cluster, its log dirs, producers, elections and
    reassignments, in each version served."""
    out = []
    topic = DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=ADMIN_TOPIC, configuration_keys=None)
    for v in versions(DescribeConfigsRequest):
        described = framed(DescribeConfigsRequest, v, resources=[topic], include_synonyms=True, include_documentation=True)
        out.append((f"DescribeConfigs v{v}", described))
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    change = resource.AlterableConfig(name="retention.ms", config_operation=0, value="7200000")
    for v in versions(IncrementalAlterConfigsRequest):
        altered = [resource(resource_type=2, resource_name=ADMIN_TOPIC, configs=[change])]
        alter = framed(IncrementalAlterConfigsRequest, v, resources=altered, validate_only=True)
        out.append((f"IncrementalAlterConfigs v{v}", alter))
    cut = DeleteRecordsRequest.DeleteRecordsTopic
    for v in versions(DeleteRecordsRequest):
        topics = [cut(name=ADMIN_TOPIC, partitions=[cut.DeleteRecordsPartition(partition_index=0, offset=-1)])]
        out.append((f"DeleteRecords v{v}", framed(DeleteRecordsRequest, v, topics=topics, timeout_ms=1000)))
    for v in versions(DescribeClusterRequest):
        cluster = {"include_cluster_authorized_operations": True, "endpoint_type": 1, "include_fenced_brokers": True}
        out.append((f"DescribeCluster v{v}", framed(DescribeClusterRequest, v, **cluster)))
    for v in versions(DescribeLogDirsRequest):
        dirs = [DescribeLogDirsRequest.DescribableLogDirTopic(topic=ADMIN_TOPIC, partitions=[0, 1])]
        out.append((f"DescribeLogDirs v{v}", framed(DescribeLogDirsRequest, v, topics=dirs)))
    named = [DescribeProducersRequest.TopicRequest(name=ADMIN_TOPIC, partition_indexes=[0, 7])]
    out.append(("DescribeProducers v0", framed(DescribeProducersRequest, 0, topics=named)))
    elected = [ElectLeadersRequest.TopicPartitions(topic=ADMIN_TOPIC, partitions=[0])]
    for v in versions(ElectLeadersRequest):
        elect = framed(ElectLeadersRequest, v, election_type=0, topic_partitions=elected, timeout_ms=1000)
        out.append((f"ElectLeaders v{v}", elect))
    out.append(("ListPartitionReassignments v0", framed(ListPartitionReassignmentsRequest, 0, timeout_ms=1000, topics=None)))
    return out


def requests(topic: str) -> list[tuple[str, bytes]]:
    """(label, request) of every kind kl serves, in every version it serves, as today's
    clients build them; the produce requests append to ``topic``'s partition 0."""
    out = []
    for v in versions(ApiVersionsRequest):
        out.append((f"ApiVersions v{v}", framed(ApiVersionsRequest, v, client_software_name="fuzz", client_software_version="1")))
    for v in versions(MetadataRequest):
        out.append((f"Metadata v{v}", metadata([topic, "nope"], v)))
        out.append((f"Metadata v{v} all", metadata(None if v else [], v)))
    for v in versions(FetchRequest):
        out.append((f"Fetch v{v}", fetch(topic, 0, v)))
    for v in versions(ListOffsetsRequest):
        for ts in (EARLIEST, LATEST, TIMESTAMP):
            out.append((f"ListOffsets v{v} {ts}", list_offsets(topic, ts, v)))
    for v in versions(InitProducerIdRequest):
        out.append(
            (f"InitProducerId v{v}", framed(InitProducerIdRequest, v, transactional_id=None, transaction_timeout_ms=-1,
                                            producer_id=-1, producer_epoch=-1))
        )  # fmt: skip
    low, high = versions(ProduceRequest).start, versions(ProduceRequest).stop - 1
    for i, codec in enumerate(CODECS):
        vals = values(30, 40, codec.encode())
        body = b"".join(record(j, v, key=b"k", headers=[(b"h", b"x")] if j % 7 == 6 else ()) for j, v in enumerate(vals))
        for v in range(low, high + 1):
            producer = (1000 + i, 0, 30 * ((v - low) // 2)) if (v - low) % 2 == 0 else (-1, -1, -1)
            out.append((f"Produce v{v} {codec}", produce(topic, [batch(plain(vals), 30, codec, producer)], v)))
        out.append((f"Produce {codec} headers", produce(topic, [batch(body, 30, codec)])))
        for v in range(low, 3):
            magic = min(v, 1)
            if codec in ("none", "gzip", "snappy") or codec == "lz4" and magic:
                out.append((f"Produce v{v} message set {codec}", produce(topic, [message_set(vals, magic, codec)], v)))
    return out + admin()


def captured(port: int, topic: str) -> list[tuple[str, bytes]]:
    """(label, request) of what confluent-kafka (librdkafka) sends to produce to ``topic``
    in each codec (idempotent) and to read it back from an offset, the end and a time,
    caught by a proxy on 127.0.0.2:``port`` that forwards to 127.0.0.1:``port`` (the
    daemon must advertise 127.0.0.2).  Empty when confluent-kafka is not installed."""
    try:
        import confluent_kafka
    except ImportError:
        return []
    streams: list[bytearray] = []
    listener = socket.create_server(("127.0.0.2", port))
    threading.Thread(target=_proxy, args=(listener, port, streams), daemon=True).start()
    config = {"bootstrap.servers": f"127.0.0.2:{port}", "socket.timeout.ms": 10000}
    try:
        for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
            producer = confluent_kafka.Producer(
                config | {"compression.type": codec, "enable.idempotence": True, "message.timeout.ms": 60000}
            )
            for i in range(20):
                producer.produce(topic, value=values(1, 30, codec.encode())[0] * (i + 1), key=b"k%d" % i, partition=0)
            assert producer.flush(90) == 0
        partition = confluent_kafka.TopicPartition
        for start in (partition(topic, 0, 0), partition(topic, 0, confluent_kafka.OFFSET_END)):
            consumer = confluent_kafka.Consumer(config | {"group.id": "fuzz", "enable.auto.commit": False})
            consumer.offsets_for_times([partition(topic, 0, TIMESTAMP)], 10)
            consumer.assign([start])
            consumer.consume(5, 1)
            consumer.close()
    finally:
        listener.close()
    out = []
    for stream in streams:
        out.extend((f"confluent-kafka {key} v{version}", data) for key, version, data in _frames(bytes(stream)))
    return out


def _proxy(listener: socket.socket, port: int, streams: list[bytearray]) -> None:
    """Forward each connection to 127.0.0.1:``port``, keeping what clients send."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        server = socket.create_connection(("127.0.0.1", port))
        streams.append(bytearray())
        threading.Thread(target=_pump, args=(client, server, streams[-1]), daemon=True).start()
        threading.Thread(target=_pump, args=(server, client, None), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket, kept: bytearray | None) -> None:
    try:
        while data := source.recv(1 << 16):
            if kept is not None:
                kept += data
            sink.sendall(data)
    except OSError:
        pass
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


def _frames(stream: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(api key, version, framed request) of each request in a client's stream."""
    pos = 0
    while pos + 8 <= len(stream):
        (size,) = struct.unpack_from(">i", stream, pos)
        key, version = struct.unpack_from(">hh", stream, pos + 4)
        yield key, version, stream[pos : pos + 4 + size]
        pos += 4 + size


# ----------------------------------------------------------------------------- attacks


def mutate(rng: random.Random, data: bytes) -> bytes:
    """A request damaged one way: bits flipped, a field overwritten, cut, extended or
    with a slice repeated; the size prefix kept true or not."""
    out = bytearray(data)
    how = rng.randrange(6)
    if how == 0:
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(4, len(out))] ^= 1 << rng.randrange(8)
    elif how == 1:
        at = rng.randrange(4, len(out) - 1)
        value = rng.choice(INTS)
        width = 2 if -0x8000 <= value <= 0xFFFF and rng.random() < 0.5 else 4
        out[at : at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    elif how == 2:
        del out[rng.randrange(4, len(out)) :]
    elif how == 3:
        out += rng.randbytes(rng.randrange(1, 64))
    elif how == 4:
        at = rng.randrange(4, len(out))
        out[at:at] = out[at : at + rng.randrange(1, 32)] * rng.randint(1, 4)
    else:
        del out[rng.randrange(4, len(out)) :: rng.randint(2, 9)]
    if rng.random() < 0.8:
        out[:4] = struct.pack(">i", len(out) - 4)
    return bytes(out)


def hostile_batch(rng: random.Random) -> bytes:
    """A batch with a correct CRC and hostile content: records or header fields out of
    range, a compressed body damaged, random bytes as records."""
    vals = values(rng.randint(1, 20), rng.randint(0, 50))
    codec = rng.choice(list(CODECS))
    how = rng.randrange(6)
    if how == 5:  # headers: many, empty, null, not UTF-8, names alike; null values and keys
        names = [b"", b"h", b"\xff\xfe", "é".encode(), b"h" * 300, b"\0"]
        body = b"".join(
            record(
                i,
                rng.choice([None, b"", v]),
                key=rng.choice([None, b"", b"k"]),
                headers=[
                    (rng.choice(names), rng.choice([None, b"", b"x" * rng.randrange(0, 300)]))
                    for _ in range(rng.choice([0, 1, 3, 200]))
                ],
            )
            for i, v in enumerate(vals)
        )
        return batch(body, len(vals), codec)
    if how == 0:  # random records
        return batch(rng.randbytes(rng.randrange(0, 200)), rng.choice([1, 2, 5, 100, 1 << 20, -1, 0]), codec)
    if how == 1:  # one record's varints hostile
        fields = [b"\0", core.varint(0), core.varint(0)]
        for _ in range(rng.randint(0, 5)):
            fields.append(core.varint(rng.choice([-2, -1, 0, 1, 5, 1 << 20, 1 << 62, -(1 << 63)])))
        fields.append(rng.randbytes(rng.randrange(0, 8)))
        body = b"".join(fields)
        length = rng.choice([len(body), len(body) + 1, len(body) - 1, 0, -1, 1 << 40])
        return batch(core.varint(length) + body, 1, codec)
    out = bytearray(batch(plain(vals), len(vals), codec))
    if how == 2:  # a header field set to an extreme: length, magic, attributes, count...
        at, width = rng.choice([(8, 4), (16, 1), (21, 2), (23, 4), (27, 8), (43, 8), (51, 2), (53, 4), (57, 4)])
        value = rng.choice(INTS + (1 << 62, 0x38, 0x07, 0x10, 0x20, 5, 6, 7))
        out[at : at + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "big")
    elif how == 3:  # the (compressed) body damaged
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(records.BATCH.size, len(out))] ^= 1 << rng.randrange(8)
    else:  # the body cut short, the length kept true
        del out[rng.randrange(records.BATCH.size, len(out)) :]
        out[8:12] = struct.pack(">i", len(out) - records.LENGTH_END)
    return with_crc(out)


def attacks(rng: random.Random, real: list[tuple[str, bytes]], topic: str, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` hostile requests of every kind, drawn from ``rng`` (``real`` the requests
    to mutate)."""
    for i in range(count):
        kind = i % 9
        if kind == 0:
            yield "random bytes", rng.randbytes(rng.randrange(1, 300))
        elif kind == 1:
            yield "size", struct.pack(">i", rng.choice(SIZES)) + rng.randbytes(rng.randrange(0, 64))
        elif kind == 2:
            key, version = rng.randrange(-1, 82), rng.randrange(-1, 21)
            flexible = rng.random() < 0.5
            head = struct.pack(">hhih", key, version, i, 4) + b"fuzz" + (b"\0" if flexible else b"")
            body = head + rng.randbytes(rng.randrange(0, 120))
            yield f"header {key} v{version}", struct.pack(">i", len(body)) + body
        elif kind in (3, 4, 5):
            label, data = rng.choice(real)
            yield f"mutated {label}", mutate(rng, data)
        elif kind == 6 and i % 4:
            batches = [hostile_batch(rng) for _ in range(rng.choice([1, 1, 1, 2]))]
            yield "hostile batch", produce(topic, batches, rng.randrange(3, 10))
        elif kind == 6:
            yield "hostile message set", produce(topic, [hostile_set(rng)], rng.randrange(3))
        elif kind == 7:
            yield "hostile fields", hostile_fields(rng, topic)
        else:  # several at once, as clients pipeline them, one maybe damaged
            sent = [data for _, data in rng.choices(real, k=rng.randint(2, 6))]
            if rng.random() < 0.5:
                at = rng.randrange(len(sent))
                sent[at] = mutate(rng, sent[at])
            yield "pipelined", b"".join(sent)


def hostile_fields(rng: random.Random, topic: str) -> bytes:
    """A well-formed request whose fields are hostile: offsets, partitions, sizes, names,
    timestamps, acks."""
    name = rng.choice([topic, topic, "", ".", "..", "../" + topic, "x" * 250, topic + "\0", "nope", "été", "a/b"])
    partition = rng.choice([0, 0, 1, -1, (1 << 31) - 1, -(1 << 31)])
    how = rng.randrange(4)
    if how == 0:
        return fetch(
            name,
            rng.choice([-2, -1, 0, 1, 7, 1 << 40, (1 << 63) - 1, -(1 << 63), rng.randrange(0, 5000)]),
            rng.randrange(4, 13),
            partition,
            max_bytes=rng.choice([0, -1, 1, 100, 1 << 20, (1 << 31) - 1, -(1 << 31)]),
            partition_max_bytes=rng.choice([0, -1, 1, 100, 1 << 20, (1 << 31) - 1, -(1 << 31)]),
            min_bytes=rng.choice([0, 1, -1, (1 << 31) - 1]),
            max_wait_ms=rng.choice([0, -1, 1, 20, -(1 << 31)]),
            session_id=rng.choice([0, 0, 0, 1, -1]),
            session_epoch=rng.choice([-1, -1, 0, 1, (1 << 31) - 1]),
        )
    if how == 1:
        return list_offsets(
            name, rng.choice([-3, -4, -1, -2, 0, 1, TIMESTAMP, (1 << 63) - 1, -(1 << 63)]), rng.randrange(1, 7), partition
        )
    if how == 2:
        return metadata([name] * rng.randint(1, 3), rng.randrange(0, 13))
    vals = values(rng.randint(1, 5))
    return produce(
        name,
        [batch(plain(vals), len(vals), rng.choice(list(CODECS)))],
        rng.randrange(3, 10),
        partition,
        acks=rng.choice([1, -1, 0, 2, -2, 0x7FFF]),
        transactional_id=rng.choice([None, None, "", "tx"]),
    )


def values_in(data: bytes) -> list[bytes | None]:
    """The values of the records in a fetch answer's batches, read by kafka-python."""
    out = []
    while data:
        length = struct.unpack_from(">i", data, 8)[0] + records.LENGTH_END
        found = DefaultRecordBatch(data[:length])
        assert found.validate_crc()
        out.extend(r.value for r in found)
        data = data[length:]
    return out


# ----------------------------------------------------------------------------- the daemon


class Daemon:
    """``kl serve --kafka`` as a subprocess, its log lines in a file."""

    def __init__(self, root: str, log: Path, *args: str):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [*KL, "--root", root, "serve", "--kafka", "127.0.0.1:0", "--allow-produce", *args], stderr=err
            )
        deadline = time.monotonic() + 120  # a process start: slow on a busy machine
        while not (found := re.search(r"to Kafka clients on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert self.proc.poll() is None, f"kl serve exited with {self.proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, "kl serve did not start"
            time.sleep(0.02)
        self.address = ("127.0.0.1", int(found[1]))

    def memory_kb(self, field: str = "VmRSS") -> int:
        """The process's resident memory now (VmRSS), or at its peak (VmHWM)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(field + r":\s+(\d+) kB", status)[1])

    def bugs(self) -> list[str]:
        """Log lines that are not the daemon's own, or that report a bug it caught."""
        lines = self.log.read_text().splitlines()
        return [line for line in lines if not LOG_LINE.match(line) or BUG.search(line)]

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(30)


def fill(root: kl.Root) -> list[bytes]:
    """Topic t (2 partitions, a compressed batch among plain ones) and f (the produce
    target, empty, 2 partitions); returns what t/0 holds."""
    root.create_topic("t", kl.TopicConfig(partitions=2))
    root.create_topic("f", kl.TopicConfig(partitions=2))
    vals = values(60, 30, b"t")
    kl.Producer(root).send_batch("t", vals[:20], partition=0)
    kl.Producer(root, compression="gzip").send_batch("t", vals[20:40], partition=0)
    kl.Producer(root).send_batch("t", vals[40:], partition=0)
    kl.Producer(root).send_batch("t", vals, partition=1)
    return vals


def ends(root: kl.Root, topic: str) -> list[int]:
    consumer = kl.Consumer(root)
    return [consumer.latest_offset(topic, p) for p in range(root.config(topic).partitions)]


def read_all(root: kl.Root, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes | None, tuple]]:
    """(offset, key, value, headers) of every message of the partition, read to its end."""
    consumer = kl.Consumer(root)
    offset, end, out = consumer.earliest_offset(topic, partition), consumer.latest_offset(topic, partition), []
    while offset < end:
        found = list(consumer.fetch(topic, partition, offset, 1 << 20))
        out.extend((m.offset, m.key, m.value, tuple(m.headers or ())) for m in found)
        offset = found[-1].next_offset
    return out


def call(address, request: bytes):
    """The decoded answer to one of kafkafuzz's well-formed requests."""
    key, version, correlation = struct.unpack_from(">hhi", request, 4)
    ((got, body),) = answers(attack(address, request))
    assert got == correlation
    response = frontend._responses()[key]
    flexible = response.flexible_version_q(version) and key != ApiVersionsRequest.API_KEY
    return response.decode(body[int(flexible) :], version=version)


def healthy(address, values: list[bytes]) -> None:
    """A fresh client is answered as ever: Metadata lists the topics, and a fetch of t/0
    returns what it holds."""
    topics = {t.name for t in call(address, metadata(None)).topics}
    assert {"t", "f"} <= topics
    answer = call(address, fetch("t", 0)).responses[0].partitions[0]
    assert answer.error_code == 0
    assert values_in(bytes(answer.records)) == values


def refused_whole(request: bytes, answer: bytes) -> bool:
    """Whether ``answer`` says the produce ``request`` (one, whole) was refused for every
    partition."""
    got = list(answers(answer))
    if len(request) < 8 or struct.unpack_from(">i", request)[0] != len(request) - 4 or not got:
        return False
    key, version = struct.unpack_from(">hh", request, 4)
    if key != ProduceRequest.API_KEY or not frontend.APIS[key].low <= version <= frontend.APIS[key].high:
        return False
    body = got[0][1][int(ProduceResponse.flexible_version_q(version)) :]
    response = ProduceResponse.decode(body, version=version)
    return all(p.error_code != 0 for t in response.responses for p in t.partition_responses)


def attack(address: tuple[str, int], data: bytes, timeout: float = 30) -> bytes:
    """Send ``data`` on a connection of its own, say it is all (shut the write side: a
    request cut short is then known cut), and return all the daemon sent back before it
    closed the connection."""
    with socket.create_connection(address, timeout=timeout) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # no TIME_WAIT pile-up
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # refused before it was all sent (a size over the limit)
        out = []
        try:
            while chunk := s.recv(1 << 16):
                out.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(out)


def answers(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(correlation id, body) of each whole answer in ``data``."""
    pos = 0
    while pos + 8 <= len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        if pos + 4 + size > len(data):
            return
        yield struct.unpack_from(">i", data, pos + 4)[0], data[pos + 8 : pos + 4 + size]
        pos += 4 + size
