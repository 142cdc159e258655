"""``kl serve --kafka``: today's Kafka protocol, request by request, through a real server
on 127.0.0.1, with requests and answers built by kafka-python's schema-generated classes
(the real clients' own tests are in test_kafka_clients.py)."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import kafkafuzz
import pytest
from kafka.protocol.admin.acl import CreateAclsRequest, DescribeAclsRequest
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest
from kafka.protocol.admin.cluster import UpdateFeaturesRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

import kl
from kl.net.daemon import Daemon
from kl.net.kafka import errors as kafka_errors
from kl.net.kafka import frontend, records
from kl.net.kafka.broker import Broker, topic_uuid
from kl.net.kafka.errors import INVALID_TIMESTAMP
from kl.net.server import ServeConfig

from conftest import read_all, write, write_each

KL = [sys.executable, "-m", "kl_cli"]


class Running:
    """A ``Server`` serving only the Kafka protocol, in a thread of the test process."""

    def __init__(self, root: kl.Root, **config):
        self.server = Daemon(root, ServeConfig(port=None, kafka_port=0, **config))
        self.address = ("127.0.0.1", self.server.kafka_port)
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


class Client:
    """One connection speaking the protocol with kafka-python's message classes."""

    def __init__(self, address, receive_buffer: int | None = None):
        if receive_buffer is None:
            self.sock = socket.create_connection(address, timeout=10)
        else:  # set before connecting: the window it offers
            self.sock = socket.socket()
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(10)
            self.sock.connect(address)
        self.correlation = 0

    def send(self, request, version: int, **fields) -> None:
        self.correlation += 1
        message = request[version](**fields)
        message.with_header(correlation_id=self.correlation, client_id="test")
        self.sock.sendall(message.encode(header=True, framed=True))

    def receive(self, request, version: int):
        """The answer to the last request sent (an ApiVersions answer's header is never flexible)."""
        response = frontend._responses()[request.API_KEY]
        size = struct.unpack(">i", self._exactly(4))[0]
        data = self._exactly(size)
        assert struct.unpack_from(">i", data)[0] == self.correlation
        flexible = response.flexible_version_q(version) and request is not ApiVersionsRequest
        return response.decode(data[5 if flexible else 4 :], version=version)

    def call(self, request, version: int, **fields):
        self.send(request, version, **fields)
        return self.receive(request, version)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "the server closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def fetch(client: Client, topic: str, offset: int, *, partition: int = 0, version: int = 12, max_wait_ms: int = 0, topic_id=None):
    fields = fetch_fields(topic, offset, partition=partition, max_wait_ms=max_wait_ms, topic_id=topic_id)
    response = client.call(FetchRequest, version, **fields)
    (answer,) = response.responses[0].partitions
    return answer


def batches_of(answer) -> list[DefaultRecordBatch]:
    """The record batches of a fetch answer, each checked, read by kafka-python's reader."""
    out = []
    data = bytes(answer.records or b"")
    while data:
        length = struct.unpack_from(">i", data, 8)[0] + 12
        out.append(DefaultRecordBatch(data[:length]))
        out[-1].validate_crc()
        data = data[length:]
    return out


def decoded(answer) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of each record."""
    return [(r.offset, r.key, r.value, r.timestamp) for batch in batches_of(answer) for r in batch]


def next_offset(answer) -> int:
    """Where a client resumes after the answer's last batch: base + last offset delta + 1."""
    data = bytes(answer.records)
    base, length = struct.unpack_from(">qi", data)
    last = 0
    while data:
        base, length = struct.unpack_from(">qi", data)
        last = base + struct.unpack_from(">i", data, 23)[0] + 1
        data = data[length + 12 :]
    return last


def produce(client: Client, topic: str, batch: bytes, *, partition: int = 0, acks: int = 1, version: int = 9):
    data = ProduceRequest.TopicProduceData(
        name=topic, partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=batch)]
    )
    client.send(ProduceRequest, version, transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[data])
    if acks == 0:
        return None
    response = client.receive(ProduceRequest, version)
    return response.responses[0].partition_responses[0]


def built(
    values,
    *,
    keys=None,
    headers=None,
    timestamp: int = 1_700_000_000_000,
    codec: int = 0,
    producer: tuple[int, int, int] | None = None,
):
    """A record batch as kafka-python's producer builds it (headers: a list per record)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 24,
    )
    if producer is not None:
        builder.set_producer_state(*producer, is_transactional=False)
    for i, value in enumerate(values):
        key, header = None if keys is None else keys[i], [] if headers is None else headers[i]
        builder.append(i, timestamp=timestamp + i, key=key, value=value, headers=header)
    return bytes(builder.build())


# ----------------------------------------------------------------- ApiVersions, Metadata


def test_api_versions_lists_what_is_served_and_answers_a_newer_version_with_version_0(served):
    _, client = served()
    answer = client.call(ApiVersionsRequest, 3, client_software_name="test", client_software_version="1")
    assert answer.error_code == 0
    got = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert got == {key: (api.low, api.high) for key, api in frontend.APIS.items()}
    # A version the daemon does not serve: the protocol's answer is version 0 with the list.
    client.correlation += 1
    header = struct.pack(">hhih", 18, 99, client.correlation, 4) + b"test" + b"\0\0"  # v99: a flexible header
    client.sock.sendall(struct.pack(">i", len(header)) + header)
    answer = client.receive(ApiVersionsRequest, 0)
    assert answer.error_code == kafka_errors.UNSUPPORTED_VERSION
    assert {k.api_key for k in answer.api_keys} == set(frontend.APIS)


def test_a_request_kl_does_not_serve_gets_unsupported_version_or_a_closed_connection_never_an_empty_answer(served, root, topic):
    _, client = served()
    refused = client.call(UpdateFeaturesRequest, 1, timeout_ms=1000, feature_updates=[], validate_only=True)
    assert refused.error_code == kafka_errors.UNSUPPORTED_VERSION
    assert client.call(
        MetadataRequest,
        9,
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    ).topics  # the connection serves on
    with pytest.raises(AssertionError, match="closed the connection"):  # no error code for the whole: closed, as by Kafka
        client.call(AlterClientQuotasRequest, 1, entries=[], validate_only=True)


def test_acl_requests_are_answered_as_by_kafka_without_an_authorizer(served, root, topic):
    _, client = served()
    described = client.call(DescribeAclsRequest, 1, resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                            principal_filter=None, host_filter=None, operation=1, permission_type=1)  # fmt: skip
    disabled = (kafka_errors.SECURITY_DISABLED, "No Authorizer is configured on the broker")  # Kafka's words
    assert (described.error_code, described.error_message) == disabled
    creation = CreateAclsRequest.AclCreation(resource_type=2, resource_name="t", resource_pattern_type=3, principal="User:a",
                                             host="*", operation=3, permission_type=3)  # fmt: skip
    created = client.call(CreateAclsRequest, 3, creations=[creation, creation])
    assert [r.error_code for r in created.results] == [kafka_errors.SECURITY_DISABLED] * 2


def closed_without_an_answer(client: Client) -> bool:
    try:
        return client.sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_version_kl_does_not_serve_closes_the_connection_as_kafka_does(served, root, topic):
    """Kafka's brokers close the connection on a version they do not serve (Kafka 4 on
    OffsetCommit v0-1, ...), as kl does (here on ListOffsets v7, past what ApiVersions
    says it serves): an answer would have no error code to refuse it with, and an empty
    one reads as nothing refused (kafka-go's Conn, on Produce v2 before kl served it:
    "reading a response left 4 unread bytes").  Other connections go on."""
    running, client = served()
    partition = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, timestamp=-1, current_leader_epoch=-1)
    client.send(ListOffsetsRequest, 7, replica_id=-1, isolation_level=0,
                topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])])  # fmt: skip
    assert closed_without_an_answer(client)
    other = Client(running.address)
    assert fetch(other, topic, 0).error_code == 0


def test_metadata_names_this_daemon_the_leader_of_every_partition_with_each_topics_id(served, root):
    root.create_topic("a", kl.TopicConfig(partitions=3))
    root.create_topic("b")
    running, client = served()
    answer = client.call(
        MetadataRequest, 12, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    (broker,) = answer.brokers
    assert (broker.host, broker.port) == running.address
    topics = {t.name: t for t in answer.topics}
    assert set(topics) == {"a", "b"}
    assert [p.partition_index for p in topics["a"].partitions] == [0, 1, 2]
    assert all(p.leader_id == broker.node_id for p in topics["a"].partitions)
    assert topic_uuid(root.config("a").topic_id) == topics["a"].topic_id
    assert str(topics["a"].topic_id) != str(topics["b"].topic_id)
    root.create_topic("c")  # created while the daemon runs: found by the next Metadata
    answer = client.call(
        MetadataRequest,
        1,
        topics=[MetadataRequest.MetadataRequestTopic(name="c"), MetadataRequest.MetadataRequestTopic(name="nope")],
    )
    assert [(t.name, t.error_code) for t in answer.topics] == [("c", 0), ("nope", kafka_errors.UNKNOWN_TOPIC_OR_PARTITION)]


def test_metadata_v0_asks_all_topics_with_an_empty_list_and_later_versions_with_null(served, root):
    """As Kafka reads it: version 0 has no null array, so its empty list means every topic;
    from version 1 an empty list means none."""
    for name in ("a", "b"):
        root.create_topic(name)
    _, client = served()

    def names(version: int, topics) -> list[str]:
        answer = client.call(MetadataRequest, version, topics=topics, allow_auto_topic_creation=False)
        return sorted(t.name for t in answer.topics)

    assert names(0, []) == ["a", "b"]
    assert names(1, []) == []
    assert names(1, None) == ["a", "b"]


def test_metadata_of_all_topics_asked_at_once_looks_them_up_once_and_the_next_sees_new_topics(served, root, monkeypatch):
    for name in ("a", "b"):
        root.create_topic(name)
    running, first = served()
    second = Client(running.address)
    asked = []
    both_asked = threading.Event()
    lookups = []
    real_served_topics, real_topics = Broker.served_topics, kl.Root.topics

    def served_topics(self, look):
        asked.append(1)
        if len(asked) == 2:
            both_asked.set()
        return real_served_topics(self, look)

    def slow_topics(self):
        lookups.append(1)
        assert both_asked.wait(10)  # the second request arrived during this lookup
        return real_topics(self)

    monkeypatch.setattr(Broker, "served_topics", served_topics)
    monkeypatch.setattr(kl.Root, "topics", slow_topics)
    everything = dict(topics=None, allow_auto_topic_creation=False)
    first.send(MetadataRequest, 4, **everything)
    second.send(MetadataRequest, 4, **everything)
    answers = [first.receive(MetadataRequest, 4), second.receive(MetadataRequest, 4)]
    assert [sorted(t.name for t in a.topics) for a in answers] == [["a", "b"], ["a", "b"]]
    assert len(lookups) == 1
    monkeypatch.undo()
    root.create_topic("c")
    assert sorted(t.name for t in first.call(MetadataRequest, 4, **everything).topics) == ["a", "b", "c"]
    second.close()


def test_topics_outside_the_pattern_are_not_listed_and_are_refused(served, root):
    root.create_topic("open")
    root.create_topic("secret")
    _, client = served(topics=__import__("re").compile("open"))
    answer = client.call(MetadataRequest, 4, topics=None, allow_auto_topic_creation=False)
    assert [t.name for t in answer.topics] == ["open"]
    assert fetch(client, "secret", 0).error_code == kafka_errors.TOPIC_AUTHORIZATION_FAILED


# ----------------------------------------------------------------- Fetch


def test_fetch_gives_each_record_its_kafka_offset_and_ends_each_batch_at_the_next_record(served, root, topic):
    write_each(root, topic, [b"a", b"bb", b"ccc"], timestamp=1_700_000_000_000)
    _, client = served()
    answer = fetch(client, topic, 0)
    assert answer.error_code == 0 and answer.high_watermark == 3 and answer.log_start_offset == 0
    assert [(o, v) for o, _, v, _ in decoded(answer)] == [(0, b"a"), (1, b"bb"), (2, b"ccc")]
    assert next_offset(answer) == 3
    assert not decoded(fetch(client, topic, 3))  # at the high watermark: nothing, and no error


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_a_fetch_at_any_offset_answers_from_that_record(served, root, topic, version):
    write_each(root, topic, [b"first", b"second", b"third"])
    _, client = served()
    for at in range(3):  # (a fresh daemon finds each by the offset index, the next fetch by what it served)
        assert [o for o, *_ in decoded(fetch(client, topic, at, version=version))] == list(range(at, 3))


@pytest.mark.parametrize("version", [13, 16])
def test_a_fetch_by_topic_id_reads_that_topic_and_not_one_created_again_under_its_name(served, root, topic, version):
    offsets = write_each(root, topic, [b"old"])
    old_id = topic_uuid(root.config(topic).topic_id)
    _, client = served()
    answer = fetch(client, "", 0, version=version, topic_id=old_id)
    assert [(o, v) for o, _, v, _ in decoded(answer)] == [(offsets[0], b"old")]
    root.delete_topic(topic)
    root.create_topic(topic)
    write_each(root, topic, [b"new"])
    assert fetch(client, "", 0, version=version, topic_id=old_id).error_code == kafka_errors.UNKNOWN_TOPIC_ID
    new_id = topic_uuid(root.config(topic).topic_id)
    assert [v for _, _, v, _ in decoded(fetch(client, "", 0, version=version, topic_id=new_id))] == [b"new"]


def test_fetch_offsets_out_of_range_get_offset_out_of_range(served, root, topic):
    write_each(root, topic, [b"x"])
    _, client = served()
    answer = fetch(client, topic, 2)
    # no offsets in an error, as Kafka's
    assert answer.error_code == kafka_errors.OFFSET_OUT_OF_RANGE and answer.high_watermark == -1
    assert answer.records == b""  # empty, not null: librdkafka cannot read a null set
    assert fetch(client, topic, -5).error_code == kafka_errors.OFFSET_OUT_OF_RANGE
    assert fetch(client, "missing", 0).error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    assert fetch(client, topic, 0, partition=3).error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION


def test_a_newer_leader_epoch_and_the_zero_topic_id_are_refused(served, root, topic):
    """As Kafka refuses them (tests/test_kafka_oracle.py): every leader epoch is 0."""
    write_each(root, topic, [b"x"])
    _, client = served()
    fields = fetch_fields(topic, 0)
    fields["topics"][0].partitions[0].current_leader_epoch = 1
    (answer,) = client.call(FetchRequest, 12, **fields).responses[0].partitions
    assert answer.error_code == kafka_errors.UNKNOWN_LEADER_EPOCH and answer.high_watermark == -1
    fields["topics"][0].partitions[0].current_leader_epoch = 0
    assert client.call(FetchRequest, 12, **fields).responses[0].partitions[0].error_code == kafka_errors.NONE
    assert fetch(client, "", 0, version=13, topic_id=None).error_code == kafka_errors.UNKNOWN_TOPIC_ID
    part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=1, timestamp=-1)
    listed = ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])
    (answer,) = client.call(ListOffsetsRequest, 6, replica_id=-1, isolation_level=0, topics=[listed]).topics[0].partitions
    assert (answer.error_code, answer.offset) == (kafka_errors.UNKNOWN_LEADER_EPOCH, -1)


def test_a_compressed_kl_batch_is_served_expanded_and_a_client_can_resume_inside_it(served, root, topic):
    values = [b"ok"] * 200  # more messages than the batch has bytes
    write_each(root, topic, [b"before"])
    (appended,) = write(root, topic, values, compression="zstd")
    assert appended.next_offset - appended.offset < len(values)
    write_each(root, topic, [b"after"])
    _, client = served()
    answer = fetch(client, topic, 0)
    got = decoded(answer)
    assert [v for _, _, v, _ in got] == [b"before", *values, b"after"]
    assert [o for o, *_ in got] == list(range(202)) and answer.high_watermark == 202
    resumed = decoded(fetch(client, topic, 6))  # the client stopped after its 6th message
    assert [(o, v) for o, _, v, _ in resumed] == [(o, v) for o, v in zip(range(6, 202), [*values[5:], b"after"], strict=True)]


def test_a_fetch_with_max_wait_waits_for_data_without_holding_a_worker(served, root, topic):
    running, client = served(workers=1)
    others = [Client(running.address) for _ in range(5)]
    try:
        for other in others:  # five long polls park; the one worker stays free
            other.send(FetchRequest, 12, **fetch_fields(topic, 0, max_wait_ms=5000))
        started = time.monotonic()
        assert client.call(MetadataRequest, 1, topics=None).topics  # answered while they wait
        assert time.monotonic() - started < 2
        offset = write_each(root, topic, [b"news"])[0]
        for other in others:
            response = other.receive(FetchRequest, 12)
            assert [(o, v) for o, _, v, _ in decoded(response.responses[0].partitions[0])] == [(offset, b"news")]
        assert time.monotonic() - started < 4  # woken by the append, not by max_wait_ms
    finally:
        for other in others:
            other.close()


def test_a_long_poll_with_nothing_new_answers_empty_after_max_wait(served, root, topic):
    _, client = served()
    started = time.monotonic()
    answer = fetch(client, topic, 0, max_wait_ms=300)
    assert answer.error_code == 0 and not answer.records
    assert time.monotonic() - started >= 0.29


def test_stopping_answers_parked_fetches_at_once(root, topic):
    running = Running(root)
    client = Client(running.address)
    client.send(FetchRequest, 12, **fetch_fields(topic, 0, max_wait_ms=60_000))
    time.sleep(0.2)
    started = time.monotonic()
    running.stop()
    assert time.monotonic() - started < 5
    response = client.receive(FetchRequest, 12)
    assert response.responses[0].partitions[0].error_code == 0


def fetch_fields(topic: str, offset: int, *, partition: int = 0, max_wait_ms: int = 0, topic_id=None) -> dict:
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=partition,
        fetch_offset=offset,
        partition_max_bytes=1 << 20,
        log_start_offset=-1,
        current_leader_epoch=-1,
        last_fetched_epoch=-1,
    )
    return dict(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=[part])],
        forgotten_topics_data=[],
        rack_id="",
    )


def test_a_fetch_of_thousands_of_partitions_is_answered_without_produce_on(served, root):
    """The request limit without --allow-produce fits the fetch of a consumer assigned
    2,000 partitions (84 KB): answered, not a closed connection the client retries forever."""
    root.create_topic("t", kl.TopicConfig(partitions=3))
    write_each(root, "t", [b"a"], partition=2)
    _, client = served()
    fields = fetch_fields("t", 0)
    fields["topics"][0].partitions = [fetch_fields("t", 0, partition=p)["topics"][0].partitions[0] for p in range(2000)]
    response = client.call(FetchRequest, 12, **fields)
    parts = response.responses[0].partitions
    assert [p.error_code for p in parts[:4]] == [0, 0, 0, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION]
    assert len(parts) == 2000 and [v for _, _, v, _ in decoded(parts[2])] == [b"a"]


def big_fetch(client: Client, topic: str) -> None:
    """Send a Fetch asking for all it can get (16 MiB, the daemon's most) from offset 0."""
    fields = fetch_fields(topic, 0)
    fields["max_bytes"] = fields["topics"][0].partitions[0].partition_max_bytes = 0x7FFFFFFF
    client.send(FetchRequest, 12, **fields)


def test_answers_held_for_clients_that_never_read_stay_within_the_answer_memory(served, root, topic):
    write_each(root, topic, [bytes(100_000)] * 200)  # 20 MB: more than the sockets' buffers take
    running, client = served(answer_memory=4 << 20)
    hoarders = []
    deadline = time.monotonic() + 30
    for _ in range(3):
        hoarder = Client(running.address, receive_buffer=4096)  # a small window
        big_fetch(hoarder, topic)  # and never read
        hoarders.append(hoarder)
        while running.server.answers_held < 3 << 20:  # the first hoarder's answer, as large as the memory, held
            assert time.monotonic() < deadline, "no answer was held"
            time.sleep(0.05)
    big_fetch(client, topic)
    assert len(decoded(client.receive(FetchRequest, 12).responses[0].partitions[0])) == 1  # past the memory: one message
    held = running.server.answers_held
    assert 3 << 20 < held < (4 << 20) + 2 * 200_000  # the memory, and at most a message for each other hoarder
    for hoarder in hoarders:
        hoarder.close()
    while True:  # once they are gone, their answers are let go, and answers are whole again
        big_fetch(client, topic)
        got = decoded(client.receive(FetchRequest, 12).responses[0].partitions[0])
        if len(got) > 1:
            break
        assert time.monotonic() < deadline + 30, "the hoarders' answers were never let go"
        time.sleep(0.1)
    assert [offset for offset, *_ in got] == list(range(len(got))) and len(got) * 100_000 > 3 << 20  # the memory's worth
    assert running.server.answers_held == 0


# ----------------------------------------------------------------- Produce


def test_produce_appends_each_record_as_a_kl_message_and_answers_the_first_offset(served, root, topic):
    write_each(root, topic, [b"before"])
    _, client = served(allow_produce=True)
    answer = produce(client, topic, built([b"one", b"two"], keys=[b"k", None]))
    assert answer.error_code == 0
    got = read_all(root, topic)
    assert answer.base_offset == 1  # the Kafka offset of its first record
    assert root.log(topic, 0).kafka_position(1).offset == got[1].offset
    assert [(m.key, m.value, m.timestamp) for m in got[1:]] == [
        (b"k", b"one", 1_700_000_000_000),
        (None, b"two", 1_700_000_000_001),
    ]


def test_a_message_as_large_as_its_topic_takes_is_appended_past_the_request_limit(served, root):
    root.create_topic("large", kl.TopicConfig(max_message_bytes=10 << 20, segment_bytes=64 << 20))
    root.create_topic("small")
    _, client = served(allow_produce=True, max_request_bytes=1 << 20)
    value = bytes(range(256)) * (9_000_000 // 256)  # 9 MB: past the daemon's 1 MiB, within the topic's 10 MiB
    assert produce(client, "large", built([value])).error_code == 0
    assert [m.value for m in read_all(root, "large", max_bytes=16 << 20)] == [value]
    assert produce(client, "small", built([value])).error_code == kafka_errors.MESSAGE_TOO_LARGE  # small's 1 MiB
    with pytest.raises((AssertionError, ConnectionError)):  # past every topic's: closed, as Kafka past socket.request.max.bytes
        produce(client, "large", built([value + value]))
    assert [m.value for m in read_all(root, "large", max_bytes=16 << 20)] == [value]


@pytest.mark.parametrize("codec", [1, 4], ids=["gzip", "zstd"])
def test_produce_takes_compressed_batches(served, root, topic, codec):
    _, client = served(allow_produce=True)
    values = [b"v%d" % i * 10 for i in range(100)]
    assert produce(client, topic, built(values, codec=codec)).error_code == 0
    assert [m.value for m in read_all(root, topic)] == values


def test_a_retried_idempotent_batch_is_appended_once_and_answered_with_its_offset(served, root, topic):
    _, client = served(allow_produce=True)
    pid = client.call(
        InitProducerIdRequest, 4, transactional_id=None, transaction_timeout_ms=1000, producer_id=-1, producer_epoch=-1
    )
    assert pid.error_code == 0 and pid.producer_id >= 0
    first = built([b"a", b"b"], producer=(pid.producer_id, 0, 0))
    answer = produce(client, topic, first)
    again = produce(client, topic, first)
    assert again.error_code == 0 and again.base_offset == answer.base_offset
    assert [m.value for m in read_all(root, topic)] == [b"a", b"b"]
    assert produce(client, topic, built([b"c"], producer=(pid.producer_id, 0, 2))).error_code == 0
    skipped = produce(client, topic, built([b"e"], producer=(pid.producer_id, 0, 9)))
    assert skipped.error_code == kafka_errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert [m.value for m in read_all(root, topic)] == [b"a", b"b", b"c"]


def test_refused_produces_append_nothing_and_say_why(served, root, topic):
    _, client = served()
    off = produce(client, topic, built([b"x"]))
    assert off.error_code == kafka_errors.TOPIC_AUTHORIZATION_FAILED and "--allow-produce" in off.error_message
    _, client = served(allow_produce=True)
    assert produce(client, "missing", built([b"x"])).error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION
    batch = bytearray(built([b"x", b"y"]))
    batch[-1] ^= 0xFF
    bad = produce(client, topic, bytes(batch))
    assert bad.error_code == kafka_errors.CORRUPT_MESSAGE and "CRC" in bad.error_message
    both = built([b"good"]) + bytes(batch)  # one good batch, one bad: neither is appended
    assert produce(client, topic, both).error_code == kafka_errors.CORRUPT_MESSAGE
    late = produce(client, topic, built([b"x"], timestamp=kl.log.message.MAX_TIMESTAMP + 1))
    assert late.error_code == INVALID_TIMESTAMP
    assert produce(client, topic, built([b"x"]), acks=2).error_code == kafka_errors.INVALID_REQUIRED_ACKS
    assert read_all(root, topic) == []


def test_headers_and_null_values_are_stored_and_served_back(served, root, topic):
    _, client = served(allow_produce=True)
    headers = [[("trace", b"1"), ("trace", None)], []]
    assert produce(client, topic, built([None, b""], keys=[b"k", None], headers=headers, timestamp=5)).error_code == 0
    stored = read_all(root, topic)
    assert [(m.key, m.value, m.headers) for m in stored] == [(b"k", None, (("trace", b"1"), ("trace", None))), (None, b"", ())]
    got = [(r.key, r.value, list(r.headers)) for batch in batches_of(fetch(client, topic, 0)) for r in batch]
    assert got == [(b"k", None, headers[0]), (None, b"", [])]


def test_a_topic_without_headers_refuses_them_and_says_how_to_allow_them(served, root):
    root.create_topic("old", kl.TopicConfig(headers=False))
    _, client = served(allow_produce=True)
    answer = produce(client, "old", built([b"v"], headers=[[("h", b"x")]]))
    assert answer.error_code == kafka_errors.INVALID_RECORD and "kl topics alter old --headers" in answer.error_message
    assert read_all(root, "old") == []


def test_produce_with_acks_0_gets_no_answer_and_appends(served, root, topic):
    _, client = served(allow_produce=True)
    assert produce(client, topic, built([b"quiet"]), acks=0) is None
    assert client.call(MetadataRequest, 1, topics=None).topics  # the next answer is the next request's
    assert [m.value for m in read_all(root, topic)] == [b"quiet"]


# ----------------------------------------------------------------- ListOffsets


@pytest.mark.parametrize("where", ["active", "closed"])
def test_damage_in_acknowledged_data_stops_fetches_at_it_and_not_before_it(served, root, where):
    """Bit rot (a message's length field) in the active segment, or in the oldest closed
    one (counted at its roll, not since): the records before it are served at their Kafka
    offsets, a fetch at it gets CORRUPT_MESSAGE (as a Kafka client finds a batch failing
    its CRC at that offset), the high watermark stands, and the segments after it are read
    as before."""
    root.create_topic("t", kl.TopicConfig(segment_bytes=256 if where == "closed" else 1 << 20, max_message_bytes=256))
    write_each(root, "t", [b"value-%02d" % i for i in range(30)])
    log = root.log("t", 0)
    first = log.segments()[0]
    in_first = [m.offset for m in log.messages(0, log.log_end_offset) if m.offset < first.base_offset + first.size_in_bytes]
    with open(first.path, "r+b") as f:
        f.seek(in_first[2] - first.base_offset)
        f.write(b"\xff")
    _, client = served()
    before = fetch(client, "t", 0)
    assert before.error_code == 0 and before.high_watermark == 30
    assert [(r.offset, r.value) for b in batches_of(before) for r in b] == [(0, b"value-00"), (1, b"value-01")]
    assert [r.offset for b in batches_of(fetch(client, "t", 1)) for r in b] == [1]
    at = fetch(client, "t", 2)
    assert (at.error_code, at.records) == (kafka_errors.CORRUPT_MESSAGE, b"")
    if where == "active":
        assert fetch(client, "t", 29).error_code == kafka_errors.CORRUPT_MESSAGE  # past it: no count reaches it
    else:
        after = len(in_first)
        assert [r.offset for b in batches_of(fetch(client, "t", after)) for r in b][:1] == [after]
        assert [r.value for b in batches_of(fetch(client, "t", 29)) for r in b] == [b"value-29"]


def test_list_offsets_earliest_latest_and_by_time_with_timestamps_out_of_order(served, root, topic):
    for ts in (1000, 5000, 3000, 7000):
        write_each(root, topic, [b"x"], timestamp=ts)
    (inside,) = write(root, topic, [b"y"] * 5, timestamp=9000, compression="zstd")
    _, client = served()

    def at(timestamp: int):
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=0, timestamp=timestamp, current_leader_epoch=-1
        )
        answer = client.call(
            ListOffsetsRequest,
            6,
            replica_id=-1,
            isolation_level=0,
            topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])],
        )
        (p,) = answer.topics[0].partitions
        return p.error_code, p.offset, p.timestamp

    assert at(-2) == (0, 0, -1)
    assert at(-1) == (0, 9, -1)
    assert at(4000) == (0, 1, 5000)  # the first message, in log order, at or after the time
    assert at(6000) == (0, 3, 7000)
    assert at(8000) == (0, 4, 9000)
    assert at(9001) == (0, -1, -1)  # none that new


# ----------------------------------------------------------------- records


def test_a_batch_kl_writes_is_read_back_by_kafka_pythons_reader(root):
    rows = [(100, 5, b"k", b"v", ()), (130, 9, None, b"", [("trace", b"1"), ("trace", None)]), (170, 7, b"", None, ())]
    batch = DefaultRecordBatch(records.batch(rows, 200))
    batch.validate_crc()
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(*row[:4], list(row[4])) for row in rows]
    assert batch.next_offset == 200


def test_batches_reads_what_kafka_python_builds(root):
    (batch,) = records.batches(built([b"a", b"b"], keys=[b"x", None]), 10, 1 << 20)
    assert [(r.key, r.value, r.timestamp) for r in batch.records()] == [
        (b"x", b"a", 1_700_000_000_000),
        (None, b"b", 1_700_000_000_001),
    ]


def records_in(data: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, value) of each record kafka-python's reader finds in a fetch's records."""
    out, found = [], MemoryRecords(data)
    while (batch := found.next_batch()) is not None:
        out += [(r.offset, r.value) for r in batch]
    return out


@pytest.mark.parametrize("version", [2, 4])
def test_a_read_inside_a_compressed_batch_converts_from_the_record_asked_for_and_resumes_after_it(root, topic, version):
    write(root, topic, [b"a"])
    write(root, topic, [b"b", b"c", b"d"], compression="gzip")
    log = root.log(topic, 0)
    start, skip = log.kafka_position(2)
    assert skip == 1
    messages = log.read(start, 1 << 20)
    if version >= 4:
        data, resume = records.record_batches(messages, 2 - skip, skip)
    else:
        data, resume = records.message_set(messages, 2 - skip, skip, 1 << 20, version)
    assert records_in(data) == [(2, b"c"), (3, b"d")]
    assert resume == records.Resume(4, len(messages.buffer))


@pytest.mark.parametrize("codec", ["gzip", "zstd", "lz4", "snappy", "xerial"])
def test_a_decompression_bomb_is_refused_before_it_is_inflated_naming_the_limit(codec):
    bomb = kafkafuzz.bomb(codec, 64 << 20)
    assert len(bomb) < 4 << 20
    name = "snappy" if codec == "xerial" else codec
    with pytest.raises(records.InvalidRecords, match=f"^a {name} batch decompresses to more than {1 << 20} bytes$"):
        records.batches(bomb, 10, 1 << 20)


# ----------------------------------------------------------------- the command


def test_kl_serve_kafka_alone_logs_its_port_registers_it_and_serves_it(root, topic, tmp_path):
    log = tmp_path / "log"
    with open(log, "wb") as err:
        daemon = subprocess.Popen([*KL, "--root", root.path, "serve", "--kafka", "127.0.0.1:0"], stderr=err)
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(rb"serving \S+ to Kafka clients on 127\.0\.0\.1:(\d+)", log.read_bytes())):
            assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        port = int(found.group(1))
        client = Client(("127.0.0.1", port))
        assert [t.name for t in client.call(MetadataRequest, 1, topics=None).topics] == [topic]
        client.close()
        listed = subprocess.run([*KL, "--root", root.path, "serve", "--list", "--json"], capture_output=True, check=True)
        (entry,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert (entry["kafka"], entry["port"], entry["address"], entry["pid"]) == (f"127.0.0.1:{port}", None, None, daemon.pid)
        plain = subprocess.run([*KL, "--root", root.path, "serve", "--list"], capture_output=True, check=True)
        assert plain.stdout == b""  # no address kl's own clients could use
        assert b"Kafka 0.7" not in log.read_bytes() and b"serving %s on" % root.path.encode() not in log.read_bytes()
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0


def test_kl_serve_refuses_a_kafka_address_that_is_not_one(root):
    done = subprocess.run([*KL, "--root", root.path, "serve", "--kafka", "nowhere:x"], capture_output=True, timeout=30)
    assert done.returncode == 2 and b"is not [HOST:]PORT" in done.stderr
