"""DescribeCluster, DescribeLogDirs, ElectLeaders and the partition reassignments: the
cluster as Kafka's admin tools see it, a cluster where each partition has one replica.

The brokers are this daemon and the other live ones over the root (``Broker.nodes``);
the controller is the one with the lowest node id, as Metadata names it (kl has no
controller: every daemon reads the root, and this choice makes every daemon name the
same one).  The one log directory is the root, its partitions' sizes their segments'
bytes.  A partition has one copy, on the shared file system, led by the daemon
``Broker.leaders`` names: no election is ever needed, no reassignment is ever under way,
and one naming another broker than that leader is refused (one naming it is nothing to
do, as in Kafka).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from kafka.protocol.admin.cluster import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)

from kl.errors import KlError
from kl.net.acls import CLUSTER_NAME
from kl.net.kafka.api import Api
from kl.net.kafka.broker import DENIED, Broker
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    ELECTION_NOT_NEEDED,
    INVALID_REPLICA_ASSIGNMENT,
    NO_REASSIGNMENT_IN_PROGRESS,
    NONE,
    UNSUPPORTED_ENDPOINT_TYPE,
    Refused,
    code_of,
)
from kl.net.kafka.topics import admin_allowed
from kl.net.server import Connection, Wait

BROKERS = 1
"""DescribeCluster's endpoint type of brokers (2: controllers, which kl has none of)."""
DESCRIBE, CREATE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 8, 5, 7, 10, 11, 12
"""Kafka's ACL operations (``AclOperation``) on a cluster that kl's daemons grant."""


# ----------------------------------------------------------------- DescribeCluster


def describe_cluster(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = DescribeClusterResponse
    if version >= 1 and request.endpoint_type != BROKERS:
        text = f"endpoint type {request.endpoint_type} is not served: kl has brokers only, no controllers"
        return answer(
            throttle_time_ms=0,
            error_code=UNSUPPORTED_ENDPOINT_TYPE,
            error_message=text,
            endpoint_type=request.endpoint_type,
            cluster_id=broker.cluster_id,
            controller_id=-1,
            brokers=[],
            authorized_operations=None,  # (encoded as Kafka's -2^31: not asked)
        )
    nodes = broker.nodes(broker.peers(), conn)
    return answer(
        throttle_time_ms=0,
        error_code=NONE,
        error_message=None,
        endpoint_type=BROKERS,
        cluster_id=broker.cluster_id,
        controller_id=min(n for n, _, _ in nodes),
        brokers=[answer.DescribeClusterBroker(broker_id=n, host=h, port=p, rack=None, is_fenced=False) for n, h, p in nodes],
        authorized_operations=_operations(broker, conn) if request.include_cluster_authorized_operations else None,
    )


def _operations(broker: Broker, conn: Connection) -> set[int]:
    """The operations on the cluster this daemon lets the client do (their bits,
    encoded): none unless it may describe the cluster, as Kafka answers."""
    if not broker.allows_cluster(conn, "DESCRIBE"):
        return set()
    config = broker.server.config
    granted = [DESCRIBE, DESCRIBE_CONFIGS]
    granted += [IDEMPOTENT_WRITE] if config.allow_produce else []
    granted += [CREATE, ALTER, ALTER_CONFIGS] if config.allow_admin else []
    return set(granted) & broker.operations(conn, "CLUSTER", CLUSTER_NAME)


# ----------------------------------------------------------------- DescribeLogDirs


def describe_log_dirs(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = DescribeLogDirsResponse.DescribeLogDirsResult
    topic = result.DescribeLogDirsTopic
    if not broker.allows_cluster(conn, "DESCRIBE"):
        return DescribeLogDirsResponse(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, results=[])
    asked: list[tuple[str, list[int] | None]]
    if request.topics is None:
        asked = [(name, None) for name in broker.server.root.topics() if broker.server.served(name)]
    else:
        asked = [(t.topic, list(t.partitions)) for t in request.topics]
    topics = []
    for name, partitions in asked:
        sizes = _sizes(broker, name, partitions)
        if sizes:
            parts = [
                topic.DescribeLogDirsPartition(partition_index=p, partition_size=size, offset_lag=0, is_future_key=False)
                for p, size in sizes
            ]
            topics.append(topic(name=name, partitions=parts))
    root = broker.server.root.path
    total = usable = -1
    with contextlib.suppress(OSError):
        fs = os.statvfs(root)
        total, usable = fs.f_blocks * fs.f_frsize, fs.f_bavail * fs.f_frsize
    return DescribeLogDirsResponse(
        throttle_time_ms=0,
        error_code=NONE,
        results=[
            result(
                error_code=NONE,
                log_dir=os.path.abspath(root),
                topics=topics,
                total_bytes=total,
                usable_bytes=usable,
                is_cordoned=False,
            )
        ],
    )


def _sizes(broker: Broker, topic: str, partitions: list[int] | None) -> list[tuple[int, int]]:
    """(partition, bytes of its segments) of the partitions asked (None: all) that exist;
    none for a topic that does not exist or is not served (as Kafka leaves out what the
    directory does not hold)."""
    try:
        count = broker.checked_config(topic).partitions
    except (Refused, KlError):
        return []
    found = []
    for p in range(count) if partitions is None else sorted(set(partitions)):
        if 0 <= p < count:
            with contextlib.suppress(KlError):
                found.append((p, broker.server.root.log(topic, p).size_in_bytes()))
    return found


# ----------------------------------------------------------------- ElectLeaders


def elect_leaders(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = ElectLeadersResponse.ReplicaElectionResult
    part = result.PartitionResult
    refused: Refused | None = None
    try:
        broker.require_cluster(conn, "ALTER")
        admin_allowed(broker)
    except Refused as e:
        refused = e
    results = []
    for topic in request.topic_partitions or []:  # null: every partition, none of which needs one (Kafka lists none)
        parts = []
        for p in topic.partitions:
            code, text = _election(broker, topic.topic, p) if refused is None else (refused.code, str(refused))
            parts.append(part(partition_id=p, error_code=code, error_message=text))
        results.append(result(topic=topic.topic, partition_result=parts))
    top = NONE if refused is None or version < 1 else refused.code
    return ElectLeadersResponse(throttle_time_ms=0, error_code=top, replica_election_results=results)


def _election(broker: Broker, topic: str, partition: int) -> tuple[int, str]:
    try:
        broker.checked_config(topic, partition)
    except (Refused, KlError) as e:
        return code_of(e), str(e)
    return ELECTION_NOT_NEEDED, "the partition's one replica leads it: no election is needed"


# ----------------------------------------------------------------- reassignments


def alter_partition_reassignments(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = AlterPartitionReassignmentsResponse
    topic_answer = answer.ReassignableTopicResponse
    part = topic_answer.ReassignablePartitionResponse
    try:
        broker.require_cluster(conn, "ALTER")
        admin_allowed(broker)
    except Refused as e:
        return answer(
            throttle_time_ms=0, allow_replication_factor_change=True, error_code=e.code, error_message=str(e), responses=[]
        )
    peers = broker.peers()
    responses = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            code, text = _reassignment(broker, peers, topic.name, p.partition_index, p.replicas)
            parts.append(part(partition_index=p.partition_index, error_code=code, error_message=text))
        responses.append(topic_answer(name=topic.name, partitions=parts))
    return answer(
        throttle_time_ms=0, allow_replication_factor_change=True, error_code=NONE, error_message=None, responses=responses
    )


def _reassignment(broker: Broker, peers: Any, topic: str, partition: int, replicas: list[int] | None) -> tuple[int, str | None]:
    """A partition's answer to a reassignment to ``replicas`` (None: cancel one)."""
    try:
        config = broker.checked_config(topic, partition)
    except (Refused, KlError) as e:
        return code_of(e), str(e)
    if replicas is None:
        return NO_REASSIGNMENT_IN_PROGRESS, f"no reassignment of {topic}/{partition} is in progress"
    leader = broker.leaders(topic, config.partitions, peers)[partition]
    if list(replicas) == [leader]:
        return NONE, None
    return INVALID_REPLICA_ASSIGNMENT, (
        f"{topic}/{partition} has one replica, on the shared file system, led by broker {leader}: it cannot be "
        f"moved to {list(replicas)}"
    )


def list_partition_reassignments(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows_cluster(conn, "DESCRIBE"):
        text = DENIED["CLUSTER"][1]
        return ListPartitionReassignmentsResponse(
            throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, error_message=text, topics=[]
        )
    return ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=NONE, error_message=None, topics=[])


APIS = [
    Api(DescribeClusterRequest, DescribeClusterResponse, 0, 2, describe_cluster),
    Api(DescribeLogDirsRequest, DescribeLogDirsResponse, 1, 5, describe_log_dirs),
    Api(ElectLeadersRequest, ElectLeadersResponse, 0, 2, elect_leaders),
    Api(AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, 0, 1, alter_partition_reassignments),
    Api(ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, 0, 0, list_partition_reassignments),
]
