"""``kl serve --kafka`` answering Kafka's cluster requests: DeleteRecords (under a live
producer and reader), DescribeCluster, DescribeLogDirs, ElectLeaders, the partition
reassignments, DescribeProducers, and transactions refused at once, through raw
requests and through confluent-kafka's and kafka-python's clients."""

from __future__ import annotations

import dataclasses
import threading
import time

import confluent_kafka
import confluent_kafka.admin as confluent_admin
import kafka
import kafka.admin as kafka_admin
import kafka.errors
import pytest
from click.testing import CliRunner
from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeLogDirsRequest
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    DeleteRecordsRequest,
    ElectLeadersRequest,
    ListPartitionReassignmentsRequest,
)
from kafka.protocol.admin.transactions import DescribeProducersRequest, DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.consumer.offsets import ListOffsetsRequest
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from kafka.structs import TopicPartition
from test_kafka import Client, batches_of, built, fetch, produce

import kl
from kl.log.config import TopicConfig
from kl.net import brokers
from kl.net.kafka import errors as kafka_errors
from kl_cli.main import cli

from kafka_clients import Daemon

SMALL = TopicConfig(max_message_bytes=1024, segment_bytes=1024)
"""Segments of about ten records of the tests' size."""


def delete(client, topic: str, offsets: dict[int, int], version: int = 2) -> dict[int, tuple[int, int]]:
    """partition -> (error code, low watermark) of a DeleteRecords."""
    t = DeleteRecordsRequest.DeleteRecordsTopic
    asked = [t(name=topic, partitions=[t.DeleteRecordsPartition(partition_index=p, offset=o) for p, o in offsets.items()])]
    answer = client.call(DeleteRecordsRequest, version, topics=asked, timeout_ms=5000)
    return {p.partition_index: (p.error_code, p.low_watermark) for p in answer.topics[0].partitions}


def earliest(client, topic: str, partition: int = 0) -> int:
    t = ListOffsetsRequest.ListOffsetsTopic
    asked = [t(name=topic, partitions=[t.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-2)])]
    answer = client.call(ListOffsetsRequest, 6, replica_id=-1, isolation_level=0, topics=asked)
    return answer.topics[0].partitions[0].offset


def records_of(answer) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for b in batches_of(answer) for r in b]


def fill(client, topic: str, count: int, partition: int = 0) -> None:
    for i in range(count):
        assert produce(client, topic, built([b"%04d" % i + b"." * 40]), partition=partition).error_code == 0


def recover_clean(root: kl.Root) -> None:
    result = CliRunner().invoke(cli, ["--root", root.path, "recover", "--deep", "--dry-run"], env={"KL_ROOT": None})
    assert result.exit_code == 0, result.output


def segment_starts(root: kl.Root, topic: str, partition: int = 0) -> list[int]:
    """The Kafka offset each segment of the partition starts at."""
    target = root.log(topic, partition)
    return [target.kafka_offset(s.base_offset) for s in target.segments()]


# ----------------------------------------------------------------- DeleteRecords


def test_delete_records_moves_the_log_start_to_the_offset_asked(served, root):
    root.create_topic("t", dataclasses.replace(SMALL, partitions=2))
    _, client = served(allow_admin=True, allow_produce=True)
    fill(client, "t", 50)
    starts = segment_starts(root, "t")
    assert len(starts) > 3
    inside = starts[2] + 3  # three records into the third segment
    assert delete(client, "t", {0: inside}) == {0: (0, inside)}
    assert earliest(client, "t") == inside == root.log("t", 0).kafka_offsets()[0]
    assert segment_starts(root, "t") == [inside, *starts[3:]]  # the rest of its segment, a segment of its own
    assert fetch(client, "t", inside - 1).error_code == kafka_errors.OFFSET_OUT_OF_RANGE
    assert records_of(fetch(client, "t", inside))[0] == (inside, b"%04d" % inside + b"." * 40)
    assert delete(client, "t", {0: 1}) == {0: (0, inside)}  # below the start: nothing to do, as in Kafka
    assert delete(client, "t", {0: starts[-1] + 1}) == {0: (0, starts[-1] + 1)}  # inside the active segment
    assert records_of(fetch(client, "t", starts[-1] + 1))[0][0] == starts[-1] + 1
    assert produce(client, "t", built([b"appended"])).base_offset == 50  # to the new active segment
    assert records_of(fetch(client, "t", 49))[-2:] == [(49, b"0049" + b"." * 40), (50, b"appended")]
    assert delete(client, "t", {0: 52, 1: -2}) == {
        0: (kafka_errors.OFFSET_OUT_OF_RANGE, -1),
        1: (kafka_errors.OFFSET_OUT_OF_RANGE, -1),
    }
    assert delete(client, "t", {1: 0, 2: 0}, version=0) == {1: (0, 0), 2: (kafka_errors.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    assert delete(client, "nope", {0: 0}) == {0: (kafka_errors.UNKNOWN_TOPIC_OR_PARTITION, -1)}
    recover_clean(root)
    assert delete(client, "t", {0: -1}) == {0: (0, 51)}  # the high watermark: every record
    assert earliest(client, "t") == 51 and fetch(client, "t", 50).error_code == kafka_errors.OFFSET_OUT_OF_RANGE
    assert delete(client, "t", {0: -1}) == {0: (0, 51)}
    assert produce(client, "t", built([b"next"])).base_offset == 51
    assert records_of(fetch(client, "t", 51)) == [(51, b"next")]
    recover_clean(root)

    _, plain = served(allow_produce=True)
    assert delete(plain, "t", {0: -1}) == {0: (kafka_errors.TOPIC_AUTHORIZATION_FAILED, -1)}  # no --allow-admin


def test_a_reader_inside_the_segment_cut_reads_the_same_bytes_as_one_of_the_copy(served, root):
    root.create_topic("t", SMALL)
    _, client = served(allow_admin=True, allow_produce=True)
    fill(client, "t", 30)
    starts = segment_starts(root, "t")
    target = root.log("t", 0)
    at = target.kafka_position(starts[1] + 5).offset
    held, position, size = target.span(at, 1 << 20)  # open in the segment that is cut
    try:
        assert delete(client, "t", {0: starts[1] + 2}) == {0: (0, starts[1] + 2)}
        before = held.read(position, size)
    finally:
        held.close()
    copy, position, size = target.span(at, 1 << 20)
    with copy:
        assert copy.base_offset == target.kafka_position(starts[1] + 2).offset  # a segment of its own
        assert copy.read(position, size) == before and len(before) > 0
    recover_clean(root)


def test_inside_a_compressed_kl_batch_the_log_starts_at_the_batch(served, root):
    """kl's own producer stores a compressed batch as one message: the log start cannot
    fall inside it (a Kafka client's records are stored one by one)."""
    root.create_topic("t")
    _, client = served(allow_admin=True, allow_produce=True)
    fill(client, "t", 2)
    producer = kl.Producer(root, compression="gzip")
    producer.send_batch("t", [b"a", b"b", b"c", b"d"], partition=0)
    producer.close()
    assert delete(client, "t", {0: 4}) == {0: (0, 2)}  # the batch holds offsets 2 to 5
    assert [offset for offset, _ in records_of(fetch(client, "t", 2))] == [2, 3, 4, 5]
    recover_clean(root)


def test_admin_clients_delete_records(served, root):
    root.create_topic("t", SMALL)
    running, client = served(allow_admin=True, allow_produce=True)
    fill(client, "t", 40)
    starts = segment_starts(root, "t")
    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    python = kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        answer = python.delete_records({TopicPartition("t", 0): starts[1] + 1})
        assert answer[TopicPartition("t", 0)]["low_watermark"] == starts[1] + 1
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            python.delete_records({TopicPartition("t", 0): 41})
    finally:
        python.close()
    admin = confluent_admin.AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.delete_records([confluent_kafka.TopicPartition("t", 0, starts[2] + 1)], request_timeout=10).values()
    assert future.result(10).low_watermark == starts[2] + 1
    recover_clean(root)


def test_delete_records_under_a_live_producer_and_reader_loses_nothing_after_the_start(served, root):
    root.create_topic("t", SMALL)
    _, client = served(allow_admin=True, allow_produce=True)
    stop = threading.Event()
    produced: list[int] = []
    seen: list[tuple[float, list[tuple[int, bytes]]]] = []  # (when the fetch was sent, its records)
    errors: list[BaseException] = []

    def producing():
        writer = Client(client.sock.getpeername())
        try:
            for i in range(100_000):
                if stop.is_set():
                    return
                assert produce(writer, "t", built([b"%04d" % i + b"." * 40])).error_code == 0
                produced.append(i)
        except BaseException as e:
            errors.append(e)

    def reading():
        reader = Client(client.sock.getpeername())
        offset = 0
        try:
            while not stop.is_set():
                sent = time.monotonic()
                answer = fetch(reader, "t", offset)
                if answer.error_code == kafka_errors.OFFSET_OUT_OF_RANGE:
                    offset = earliest(reader, "t")  # as a consumer with auto.offset.reset=earliest
                    continue
                assert answer.error_code == 0
                found = records_of(answer)
                seen.append((sent, found))
                if found:
                    offset = found[-1][0] + 1
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=producing), threading.Thread(target=reading)]
    for thread in threads:
        thread.start()
    deleted: list[tuple[float, int]] = []  # (when the answer came, the low watermark)
    deadline = time.monotonic() + 60
    try:
        while len(deleted) < 10 and not errors:
            assert time.monotonic() < deadline, f"{len(produced)} records produced, {len(deleted)} deletions"
            if len(produced) > 30 * (len(deleted) + 1):  # every third deletion up to the high watermark
                [(code, low)] = delete(client, "t", {0: -1 if len(deleted) % 3 == 2 else len(produced) - 5}).values()
                assert code == 0
                deleted.append((time.monotonic(), low))
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors
    assert deleted[-1][1] > 0
    assert any(found and sent > deleted[0][0] for sent, found in seen)  # the reader read on under the deletions
    for sent, found in seen:  # no fetch sent after a deletion answered gets a record below its low watermark
        floor = max((low for answered, low in deleted if answered < sent), default=0)
        assert all(offset >= floor for offset, _ in found)
    for _, found in seen:  # what the reader got is what was produced there
        assert all(value[:4] == b"%04d" % offset for offset, value in found)
    start = deleted[-1][1]
    got = []
    while len(got) < len(produced) - start:
        got += records_of(fetch(client, "t", start + len(got)))
    assert [offset for offset, _ in got] == list(range(start, len(produced)))  # nothing after the start lost
    assert all(value[:4] == b"%04d" % offset for offset, value in got)
    recover_clean(root)


# ----------------------------------------------------------------- the cluster


def test_describe_cluster_names_this_daemon_the_controller_and_what_it_allows(served, root):
    running, client = served(allow_produce=True)
    answer = client.call(DescribeClusterRequest, 1, include_cluster_authorized_operations=False, endpoint_type=1)
    [node] = [front.broker.node_id for _, front in running.server.listeners]
    assert answer.error_code == 0
    [(broker_id, port)] = [(b.broker_id, b.port) for b in answer.brokers]
    assert port == running.server.kafka_port and answer.controller_id == broker_id
    assert node == broker_id
    assert answer.authorized_operations is None  # not asked: Kafka's -2^31
    answer = client.call(DescribeClusterRequest, 2, include_cluster_authorized_operations=True, endpoint_type=1,
                         include_fenced_brokers=True)  # fmt: skip
    assert answer.authorized_operations == {8, 10, 12}  # describe, describe configs, idempotent write
    answer = client.call(DescribeClusterRequest, 1, include_cluster_authorized_operations=False, endpoint_type=2)
    assert answer.error_code == kafka_errors.UNSUPPORTED_ENDPOINT_TYPE and "controllers" in answer.error_message

    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    python = kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        described = python.describe_cluster()
        assert described["controller_id"] == broker_id and described["cluster_id"]
        assert [(b["broker_id"], b["port"], b["is_fenced"]) for b in described["brokers"]] == [(broker_id, port, False)]
    finally:
        python.close()
    admin = confluent_admin.AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_cluster(request_timeout=10).result(10)
    assert described.controller.id == broker_id and [n.port for n in described.nodes] == [port]
    assert described.cluster_id == answer.cluster_id


def test_describe_log_dirs_gives_the_root_and_each_partitions_bytes(served, root):
    root.create_topic("t", dataclasses.replace(SMALL, partitions=2))
    root.create_topic("u")
    running, client = served(allow_produce=True)
    fill(client, "t", 30)
    sizes = {p: root.log("t", p).size_in_bytes() for p in range(2)}
    assert sizes[0] > 1024 and sizes[1] == 0
    t = DescribeLogDirsRequest.DescribableLogDirTopic
    answer = client.call(DescribeLogDirsRequest, 4, topics=[t(topic="t", partitions=[0, 1, 7]), t(topic="nope", partitions=[0])])
    [result] = answer.results
    assert result.error_code == 0 and result.log_dir == root.path and result.total_bytes >= result.usable_bytes > 0
    assert [(x.name, [(p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in x.partitions])
            for x in result.topics] == [("t", [(0, sizes[0], 0, False), (1, 0, 0, False)])]  # fmt: skip
    answer = client.call(DescribeLogDirsRequest, 1, topics=None)
    assert sorted(x.name for x in answer.results[0].topics) == ["t", "u"]

    python = kafka_admin.KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{running.server.kafka_port}", request_timeout_ms=10_000)
    try:
        [described] = python.describe_log_dirs({"t": [0]})
        [log_dir] = described["log_dirs"]
        assert log_dir["log_dir"] == root.path
        assert [(p["partition_index"], p["partition_size"]) for p in log_dir["topics"][0]["partitions"]] == [(0, sizes[0])]
    finally:
        python.close()


def test_elections_are_never_needed_and_partitions_never_move(served, root):
    root.create_topic("t", TopicConfig(partitions=2))
    running, client = served(allow_admin=True)
    tp = ElectLeadersRequest.TopicPartitions
    answer = client.call(ElectLeadersRequest, 2, election_type=0, timeout_ms=1000,
                         topic_partitions=[tp(topic="t", partitions=[0, 1, 5]), tp(topic="nope", partitions=[0])])  # fmt: skip
    assert answer.error_code == 0
    assert [(r.topic, [(p.partition_id, p.error_code) for p in r.partition_result]) for r in answer.replica_election_results] == [
        ("t", [(0, kafka_errors.ELECTION_NOT_NEEDED), (1, kafka_errors.ELECTION_NOT_NEEDED),
               (5, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION)]),
        ("nope", [(0, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION)]),
    ]  # fmt: skip
    every = client.call(ElectLeadersRequest, 1, election_type=0, timeout_ms=1000, topic_partitions=None)
    assert (every.error_code, every.replica_election_results) == (0, [])

    answer = client.call(ListPartitionReassignmentsRequest, 0, timeout_ms=1000, topics=None)
    assert (answer.error_code, answer.topics) == (0, [])
    rt = AlterPartitionReassignmentsRequest.ReassignableTopic
    [leader] = [front.broker.node_id for _, front in running.server.listeners]
    answer = client.call(AlterPartitionReassignmentsRequest, 0, timeout_ms=1000, topics=[rt(name="t", partitions=[
        rt.ReassignablePartition(partition_index=0, replicas=[leader]),
        rt.ReassignablePartition(partition_index=1, replicas=[leader + 1]),
        rt.ReassignablePartition(partition_index=0, replicas=None),
    ])])  # fmt: skip
    codes = [(p.partition_index, p.error_code) for p in answer.responses[0].partitions]
    assert codes == [(0, 0), (1, kafka_errors.INVALID_REPLICA_ASSIGNMENT), (0, kafka_errors.NO_REASSIGNMENT_IN_PROGRESS)]
    assert "one replica" in answer.responses[0].partitions[1].error_message

    python = kafka_admin.KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{running.server.kafka_port}", request_timeout_ms=10_000)
    try:
        python.elect_leaders(0, {"t": [0, 1]})  # ELECTION_NOT_NEEDED is no error to it
        assert python.list_partition_reassignments() == {}
        assert python.alter_partition_reassignments({TopicPartition("t", 0): [leader]}) == {TopicPartition("t", 0): None}
    finally:
        python.close()
    admin = confluent_admin.AdminClient({"bootstrap.servers": f"127.0.0.1:{running.server.kafka_port}"})
    asked = [confluent_kafka.TopicPartition("t", 0)]
    [(_, error)] = admin.elect_leaders(confluent_kafka.ElectionType.PREFERRED, asked).result(10).items()
    assert error.code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED

    _, plain = served()
    answer = plain.call(ElectLeadersRequest, 2, election_type=0, timeout_ms=1000,
                        topic_partitions=[tp(topic="t", partitions=[0])])  # fmt: skip
    assert answer.error_code == kafka_errors.CLUSTER_AUTHORIZATION_FAILED
    answer = plain.call(AlterPartitionReassignmentsRequest, 0, timeout_ms=1000, topics=[])
    assert answer.error_code == kafka_errors.CLUSTER_AUTHORIZATION_FAILED and "--allow-admin" in answer.error_message


def test_two_daemons_describe_the_same_cluster_and_leaders(root, tmp_path):
    """Each daemon lists both as brokers and names the same controller (the lowest node
    id), and takes a reassignment only to the leader both name."""
    partitions = 24  # all led by one daemon once in 2**23
    root.create_topic("t", TopicConfig(partitions=partitions))
    first = Daemon(root.path, tmp_path / "first.log", "--allow-admin")
    second = Daemon(root.path, tmp_path / "second.log", "--allow-admin")
    try:
        nodes = {brokers.node_id(d.bootstrap): int(d.bootstrap.rsplit(":", 1)[1]) for d in (first, second)}
        pool = sorted([first.bootstrap, second.bootstrap])
        leaders = [brokers.node_id(brokers.leader("t", p, pool)) for p in range(partitions)]
        assert len(set(leaders)) == 2  # some partitions led by each
        rt = AlterPartitionReassignmentsRequest.ReassignableTopic
        moves = [rt.ReassignablePartition(partition_index=p, replicas=[n]) for p in range(partitions) for n in sorted(nodes)]
        for daemon in (first, second):
            client = Client(tuple_of(daemon.bootstrap))
            deadline = time.monotonic() + 20
            while len((answer := client.call(DescribeClusterRequest, 1, include_cluster_authorized_operations=False,
                                             endpoint_type=1)).brokers) < 2:  # fmt: skip
                assert time.monotonic() < deadline, "the other daemon is not listed"
                time.sleep(0.1)
            assert {b.broker_id: b.port for b in answer.brokers} == nodes and answer.controller_id == min(nodes)
            answer = client.call(AlterPartitionReassignmentsRequest, 0, timeout_ms=1000, topics=[rt(name="t", partitions=moves)])
            taken = [(p.partition_index, m.replicas[0]) for p, m in zip(answer.responses[0].partitions, moves, strict=True)
                     if p.error_code == 0]  # fmt: skip
            assert taken == list(enumerate(leaders))
            client.close()
        python = kafka_admin.KafkaAdminClient(bootstrap_servers=first.bootstrap, request_timeout_ms=10_000)
        try:
            described = python.describe_log_dirs({"t": [0]})  # asks every broker
            assert sorted(d["broker"] for d in described) == sorted(nodes)
            assert {d["log_dirs"][0]["log_dir"] for d in described} == {root.path}
        finally:
            python.close()
    finally:
        first.stop()
        second.stop()


def tuple_of(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


# ----------------------------------------------------------------- producers and transactions


def test_describe_producers_lists_the_idempotent_producers_of_the_journal(served, root):
    root.create_topic("t", TopicConfig(partitions=2))
    running, client = served(allow_produce=True)
    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    try:
        for i in range(3):
            producer.send("t", b"v%d" % i, partition=0).get(10)
        producer.flush(10)
    finally:
        producer.close(10)
    t = DescribeProducersRequest.TopicRequest
    answer = client.call(DescribeProducersRequest, 0, topics=[t(name="t", partition_indexes=[0, 1, 9])])
    [p0, p1, p9] = answer.topics[0].partitions
    [state] = p0.active_producers
    assert (p0.error_code, state.producer_epoch, state.last_sequence, state.current_txn_start_offset) == (0, 0, 2, -1)
    assert abs(state.last_timestamp - time.time() * 1000) < 60_000
    assert (p1.error_code, p1.active_producers) == (0, [])
    assert p9.error_code == kafka_errors.UNKNOWN_TOPIC_OR_PARTITION and p9.error_message

    python = kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        [(tp, found)] = python.describe_producers([TopicPartition("t", 0)]).items()
        assert [(p.producer_id, p.last_sequence) for p in found.active_producers] == [(state.producer_id, 2)]
        assert list(python.list_transactions().values()) == [[]]  # (by broker)
        with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
            python.describe_transactions(["tx"])  # its coordinator is refused, as init_transactions' is
    finally:
        python.close()


def test_every_transaction_request_is_refused_at_once(served, root):
    root.create_topic("t")
    _, client = served(allow_produce=True)
    answer = client.call(FindCoordinatorRequest, 3, key="tx", key_type=1)
    refused = kafka_errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert (answer.error_code, answer.error_message) == (refused, "kl has no transactions")
    answer = client.call(InitProducerIdRequest, 4, transactional_id="tx", transaction_timeout_ms=60_000, producer_id=-1,
                         producer_epoch=-1)  # fmt: skip
    assert answer.error_code == kafka_errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    answer = client.call(AddPartitionsToTxnRequest, 3, v3_and_below_transactional_id="tx", v3_and_below_producer_id=1,
                         v3_and_below_producer_epoch=0, v3_and_below_topics=[topic(name="t", partitions=[0])])  # fmt: skip
    assert answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == refused
    answer = client.call(AddOffsetsToTxnRequest, 3, transactional_id="tx", producer_id=1, producer_epoch=0, group_id="g")
    assert answer.error_code == refused
    answer = client.call(EndTxnRequest, 3, transactional_id="tx", producer_id=1, producer_epoch=0, committed=True)
    assert answer.error_code == refused
    ot = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    offset = ot.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                                                committed_metadata=None)  # fmt: skip
    answer = client.call(TxnOffsetCommitRequest, 3, transactional_id="tx", group_id="g", producer_id=1, producer_epoch=0,
                         generation_id=-1, member_id="", group_instance_id=None,
                         topics=[ot(name="t", partitions=[offset])])  # fmt: skip
    assert answer.topics[0].partitions[0].error_code == refused
    answer = client.call(ListTransactionsRequest, 1, state_filters=[], producer_id_filters=[], duration_filter=-1)
    assert (answer.error_code, answer.transaction_states) == (0, [])
    answer = client.call(DescribeTransactionsRequest, 0, transactional_ids=["tx"])
    assert answer.transaction_states[0].error_code == kafka_errors.TRANSACTIONAL_ID_NOT_FOUND


def test_transactional_producers_fail_init_transactions_at_once(served, root, caplog):
    root.create_topic("t")
    running, _ = served(allow_produce=True)
    bootstrap = f"127.0.0.1:{running.server.kafka_port}"
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx-c"})
    began = time.monotonic()
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        producer.init_transactions(60)
    assert time.monotonic() - began < 10
    error = raised.value.args[0]
    assert error.fatal() and error.code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error

    python = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id="tx-p", max_block_ms=60_000)
    try:
        began = time.monotonic()
        with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
            python.init_transactions()
        assert time.monotonic() - began < 10
    finally:
        python.close(0)
    assert any("kl has no transactions" in r.getMessage() and "'tx-p'" in r.getMessage() for r in caplog.records)


def test_hostile_names_partitions_and_offsets_get_a_code_each_and_the_root_stays_whole(served, root):
    root.create_topic("t", SMALL)
    _, client = served(allow_admin=True, allow_produce=True)
    fill(client, "t", 20)
    names = ["../t", "a/b", "x" * 300, "", "."]
    t = DeleteRecordsRequest.DeleteRecordsTopic
    asked = [t(name=n, partitions=[t.DeleteRecordsPartition(partition_index=0, offset=0)]) for n in names]
    asked.append(t(name="t", partitions=[t.DeleteRecordsPartition(partition_index=p, offset=o)
                                         for p, o in ((-1, 0), (2**31 - 1, 0), (0, 2**63 - 1), (0, -(2**63)))]))  # fmt: skip
    answer = client.call(DeleteRecordsRequest, 2, topics=asked, timeout_ms=5000)
    codes = [[p.error_code for p in topic.partitions] for topic in answer.topics]
    assert codes == [[kafka_errors.INVALID_TOPIC_EXCEPTION]] * len(names) + [[
        kafka_errors.UNKNOWN_TOPIC_OR_PARTITION, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION,
        kafka_errors.OFFSET_OUT_OF_RANGE, kafka_errors.OFFSET_OUT_OF_RANGE,
    ]]  # fmt: skip
    d = DescribeLogDirsRequest.DescribableLogDirTopic
    answer = client.call(DescribeLogDirsRequest, 4, topics=[d(topic=n, partitions=[0]) for n in names] +
                         [d(topic="t", partitions=[-1, 2**31 - 1, *range(10_000)])])  # fmt: skip
    assert [(x.name, [p.partition_index for p in x.partitions]) for x in answer.results[0].topics] == [("t", [0])]
    p = DescribeProducersRequest.TopicRequest
    answer = client.call(DescribeProducersRequest, 0, topics=[p(name=n, partition_indexes=[0, -1]) for n in [*names, "t"]])
    invalid = [[kafka_errors.INVALID_TOPIC_EXCEPTION] * 2] * len(names)
    assert [[q.error_code for q in x.partitions] for x in answer.topics] == [
        *invalid,
        [0, kafka_errors.UNKNOWN_TOPIC_OR_PARTITION],
    ]
    assert root.topics() == ["t"] and fetch(client, "t", 19).error_code == 0  # still serving, nothing lost
    recover_clean(root)
