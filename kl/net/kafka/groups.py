"""Kafka's consumer group requests, answered by ``kl serve --kafka``: FindCoordinator,
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, OffsetDelete,
ListGroups, DescribeGroups and DeleteGroups.  The requests' fields in, the responses' out;
the groups themselves are ``kl.net.kafka.coordinator``'s.  A group id is any string, as in
Kafka; the empty one is refused where Kafka refuses it.

A committed Kafka offset is stored in the group's files as the position of its message
(inside a compressed batch: the batch and how many of its messages come before), which
kl's own members resume from too; past the log end, as the log end and how many messages
after it; OffsetFetch gives it back as the Kafka offset of that position, so Kafka and
kl members resume each other's commits exactly.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from kl.errors import InvalidConfig, KlError
from kl.log.log import Log, Position
from kl.net import brokers
from kl.net.kafka import transactions
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker, refusal
from kl.net.kafka.coordinator import GroupWait, JoinResult, SyncResult
from kl.net.kafka.errors import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_GROUP_ID,
    NONE,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    Refused,
)
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")


def find_coordinator(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    keys = request.coordinator_keys if version >= 4 else [request.key]
    found = [_coordinator(broker, conn, key, request.key_type if version >= 1 else 0) for key in keys]
    if version >= 4:
        coordinator = FindCoordinatorResponse.Coordinator
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            coordinators=[
                coordinator(key=key, node_id=node, host=host, port=port, error_code=code, error_message=text)
                for key, (code, text, node, host, port) in zip(keys, found, strict=True)
            ],
        )
    code, text, node, host, port = found[0]
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=code, error_message=text, node_id=node, host=host, port=port)


def _coordinator(broker: Broker, conn: Connection, key: str, key_type: int) -> tuple[int, str | None, int, str, int]:
    """(error code, error message, node id, host, port) of a group's coordinator."""
    if key_type != 0:  # a transaction's: refused, fatal to the producer (kl.net.kafka.transactions)
        return transactions.refused(conn, "FindCoordinator", key), transactions.NO_TRANSACTIONS, -1, "", -1
    if not broker.allows(conn, "DESCRIBE", "GROUP", key):
        return GROUP_AUTHORIZATION_FAILED, "Group authorization failed.", -1, "", -1
    try:
        address = broker.groups.coordinator(key)
    except InvalidConfig as e:
        return INVALID_GROUP_ID, str(e), -1, "", -1
    except KlError as e:
        log.warning("%s: no coordinator for group %s: %s", conn.peer, key, e)
        return COORDINATOR_NOT_AVAILABLE, str(e), -1, "", -1
    if address is None:
        return COORDINATOR_NOT_AVAILABLE, "the group's coordinator is starting", -1, "", -1
    if address == broker.kafka_address:  # this daemon: at the listener the client came in on
        return NONE, None, broker.node_id, *broker.endpoint(conn)
    peer = broker.peers().get(address)
    reached = None if peer is None else broker.reached(peer, conn)
    if reached is None:
        why = "is not registered" if peer is None else f"has no {conn.security} listener"
        return COORDINATOR_NOT_AVAILABLE, f"the group's coordinator {address} {why}", -1, "", -1
    return NONE, None, brokers.node_id(address), *reached


def join_group(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows(conn, "READ", "GROUP", request.group_id):
        return refusal(JoinGroupResponse, GROUP_AUTHORIZATION_FAILED, generation_id=-1, member_id=request.member_id)
    if wait is None:
        outcome = broker.groups.join(
            request.group_id,
            request.member_id,
            request.group_instance_id if version >= 5 else None,
            conn.client or "",
            "/" + conn.peer.rpartition(":")[0].strip("[]"),
            request.session_timeout_ms,
            request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
            request.protocol_type,
            [(p.name, bytes(p.metadata)) for p in request.protocols],
            ids_first=version >= 4,
            conn=conn,
        )
        if isinstance(outcome, GroupWait):
            broker.server.park(conn, outcome)
            return None
    else:
        outcome = getattr(wait, "result", None) or JoinResult(COORDINATOR_NOT_AVAILABLE, request.member_id)
    assert isinstance(outcome, JoinResult)
    member = JoinGroupResponse.JoinGroupResponseMember
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=outcome.error,
        generation_id=outcome.generation,
        protocol_type=request.protocol_type,
        protocol_name=outcome.protocol if version >= 7 else outcome.protocol or "",
        leader=outcome.leader,
        skip_assignment=False,
        member_id=outcome.member_id,
        members=[member(member_id=i, group_instance_id=instance, metadata=data) for i, instance, data in outcome.members],
    )


def sync_group(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows(conn, "READ", "GROUP", request.group_id):
        return refusal(SyncGroupResponse, GROUP_AUTHORIZATION_FAILED, assignment=b"")
    if wait is None:
        outcome = broker.groups.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.protocol_type if version >= 5 else None,
            request.protocol_name if version >= 5 else None,
            {a.member_id: bytes(a.assignment) for a in request.assignments},
            conn,
        )
        if isinstance(outcome, GroupWait):
            broker.server.park(conn, outcome)
            return None
    else:
        outcome = getattr(wait, "result", None) or SyncResult(COORDINATOR_NOT_AVAILABLE)
    assert isinstance(outcome, SyncResult)
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=outcome.error,
        protocol_type=request.protocol_type if version >= 5 else None,
        protocol_name=outcome.protocol,
        assignment=outcome.assignment,
    )


def heartbeat(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows(conn, "READ", "GROUP", request.group_id):
        return refusal(HeartbeatResponse, GROUP_AUTHORIZATION_FAILED)
    code = broker.groups.heartbeat(request.group_id, request.generation_id, request.member_id, conn, hold=wait is None)
    if isinstance(code, GroupWait):
        broker.server.park(conn, code)
        return None
    return HeartbeatResponse(throttle_time_ms=0, error_code=code)


def leave_group(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if not broker.allows(conn, "READ", "GROUP", request.group_id):
        return refusal(LeaveGroupResponse, GROUP_AUTHORIZATION_FAILED, members=[])
    leaving = [(m.member_id, m.group_instance_id) for m in request.members] if version >= 3 else [(request.member_id, None)]
    code, codes = broker.groups.leave(request.group_id, [member for member, _ in leaving])
    if version < 3:
        return LeaveGroupResponse(throttle_time_ms=0, error_code=codes[0])
    answer = LeaveGroupResponse.MemberResponse
    return LeaveGroupResponse(
        throttle_time_ms=0,
        error_code=code,
        members=[
            answer(member_id=member, group_instance_id=instance, error_code=c)
            for (member, instance), c in zip(leaving, codes, strict=True)
        ],
    )


def offset_commit(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    """Kafka's order: the group's READ, then each topic's; the partitions of a topic
    that may not be read are refused, the others committed."""
    group_denied = not broker.allows(conn, "READ", "GROUP", request.group_id)
    offsets: list[tuple[str, int, Position | int, str, str]] = []
    denied: set[str] = set()
    for topic in request.topics:
        if group_denied or not broker.allows(conn, "READ", "TOPIC", topic.name):
            denied.add(topic.name)
            continue
        for p in topic.partitions:
            at = _position(broker, topic.name, p.partition_index, p.committed_offset)
            offsets.append((topic.name, p.partition_index, *at, p.committed_metadata or ""))
    group = (request.group_id, request.generation_id_or_member_epoch, request.member_id)
    codes = iter(broker.groups.commit(*group, offsets) if offsets else [])
    denial = GROUP_AUTHORIZATION_FAILED if group_denied else TOPIC_AUTHORIZATION_FAILED
    answer = OffsetCommitResponse.OffsetCommitResponseTopic
    return OffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            answer(
                name=topic.name,
                partitions=[
                    answer.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=denial if topic.name in denied else next(codes)
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ],
    )


def _position(broker: Broker, topic: str, partition: int, offset: int) -> tuple[Position | int, str]:
    """Where a committed Kafka offset is in kl's partition, and the topic's id; or an
    error code in place of the position."""
    try:
        config = broker.checked_config(topic, partition)
        target = broker.server.root.log(topic, partition)
        state = target.counted()
        if offset < 0:
            return OFFSET_OUT_OF_RANGE, ""
        start, end = target.kafka_offsets(state)
        if offset < start:
            return Position(state.log_start_offset), config.topic_id or ""  # (a place retention removed)
        if offset >= end:  # past the log end: the message that will be there
            return Position(state.log_end_offset, offset - end), config.topic_id or ""
        return broker.message_at(target, (config.topic_id or topic, partition), offset, state), config.topic_id or ""
    except Refused as e:
        return e.code, ""
    except KlError as e:
        log.warning("commit of %s/%d at %d refused: %s", topic, partition, offset, e)
        return UNKNOWN_TOPIC_OR_PARTITION, ""


def offset_fetch(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    def may_describe(group: str) -> bool:
        return broker.allows(conn, "DESCRIBE", "GROUP", group)

    if version >= 8:
        group = OffsetFetchResponse.OffsetFetchResponseGroup
        topic_class = group.OffsetFetchResponseTopics
        return OffsetFetchResponse(
            throttle_time_ms=0,
            groups=[
                group(
                    group_id=g.group_id,
                    topics=_fetched(broker, conn, g.group_id, g.topics, topic_class, topic_class.OffsetFetchResponsePartitions)
                    if may_describe(g.group_id)
                    else [],
                    error_code=NONE if may_describe(g.group_id) else GROUP_AUTHORIZATION_FAILED,
                )
                for g in request.groups
            ],
        )
    topic_class = OffsetFetchResponse.OffsetFetchResponseTopic
    if not may_describe(request.group_id):
        return OffsetFetchResponse(throttle_time_ms=0, topics=[], error_code=GROUP_AUTHORIZATION_FAILED)
    return OffsetFetchResponse(
        throttle_time_ms=0,
        topics=_fetched(broker, conn, request.group_id, request.topics, topic_class, topic_class.OffsetFetchResponsePartition),
        error_code=NONE,
    )


def _kafka_offset(target: Log, found: Position) -> int:
    """The Kafka offset of a committed position; one below the log start where retention
    removed it (a fetch there is out of range, as it is in Kafka)."""
    state = target.counted()
    if found.offset < state.log_start_offset:
        return max(target.kafka_offsets(state)[0] - 1, 0)
    if found.offset >= state.log_end_offset:
        return state.log_end_count + found.skip
    return target.kafka_offset(found.offset, found.skip, state=state)


def _fetched(broker: Broker, conn: Connection, name: str, topics: Any, topic_class: Any, partition_class: Any) -> list[Any]:
    """The committed offsets of ``topics`` (None: of every partition with one that the
    client may describe, as Kafka leaves the others out)."""
    if topics is None:
        wanted: dict[str, list[int]] = {}
        for topic, partition in broker.groups.committed_partitions(name):
            if broker.allows(conn, "DESCRIBE", "TOPIC", topic, logged=False):
                wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: list(t.partition_indexes) for t in topics}
    answers = []
    for topic, partitions in wanted.items():
        parts = []
        may = broker.allows(conn, "DESCRIBE", "TOPIC", topic)
        for partition in partitions:
            offset, metadata, code = -1, "", NONE if may else TOPIC_AUTHORIZATION_FAILED
            with contextlib.suppress(Refused, KlError):  # no such partition, or not served: nothing committed
                if may:
                    config = broker.checked_config(topic, partition)
                    found, code = broker.groups.committed(name, topic, partition, config.topic_id or "")
                    if found is not None:
                        offset, metadata = (
                            _kafka_offset(broker.server.root.log(topic, partition), Position(found.offset, found.skip)),
                            found.metadata,
                        )
            parts.append(
                partition_class(
                    partition_index=partition,
                    committed_offset=offset,
                    committed_leader_epoch=-1,
                    metadata=metadata,
                    error_code=code,
                )
            )
        answers.append(topic_class(name=topic, partitions=parts))
    return answers


def list_groups(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    states = {s.lower() for s in request.states_filter} if version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if version >= 5 else set()
    listed = ListGroupsResponse.ListedGroup
    everyone = broker.allows_cluster(conn, "DESCRIBE", logged=False)
    return ListGroupsResponse(
        throttle_time_ms=0,
        error_code=NONE,
        groups=[
            listed(group_id=name, protocol_type=kind, group_state=state, group_type="classic")
            for name, kind, state in broker.groups.listed()
            if (not states or state.lower() in states)
            and (not types or "classic" in types)
            and (everyone or broker.allows(conn, "DESCRIBE", "GROUP", name, logged=False))
        ],
    )


def describe_groups(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    described = DescribeGroupsResponse.DescribedGroup
    member = described.DescribedGroupMember
    answers = []
    for name in request.groups:
        if not broker.allows(conn, "DESCRIBE", "GROUP", name):
            answers.append(
                described(
                    error_code=GROUP_AUTHORIZATION_FAILED,
                    error_message=None,
                    group_id=name,
                    group_state="",
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=None,
                )
            )
            continue
        found = broker.groups.describe(name)
        answers.append(
            described(
                error_code=found.error,
                error_message=None,
                group_id=name,
                group_state=found.state,
                protocol_type=found.protocol_type,
                protocol_data=found.protocol,
                members=[
                    member(
                        member_id=i,
                        group_instance_id=instance,
                        client_id=client,
                        client_host=host,
                        member_metadata=metadata,
                        member_assignment=assignment,
                    )
                    for i, instance, client, host, metadata, assignment in found.members
                ],
                authorized_operations=None,  # not asked for (kafka-python's bitfield: -2**31)
            )
        )
    return DescribeGroupsResponse(throttle_time_ms=0, groups=answers)


def delete_groups(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = DeleteGroupsResponse.DeletableGroupResult
    return DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[
            result(
                group_id=name,
                error_code=broker.groups.delete(name)
                if broker.allows(conn, "DELETE", "GROUP", name)
                else GROUP_AUTHORIZATION_FAILED,
            )
            for name in request.groups_names
        ],
    )


def offset_delete(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    """Partitions of topics not served or not there are refused as Kafka refuses them
    (UNKNOWN_TOPIC_OR_PARTITION), and those of topics the client may not read; the
    others' offsets are the coordinator's to delete."""
    if not broker.allows(conn, "DELETE", "GROUP", request.group_id):
        return OffsetDeleteResponse(throttle_time_ms=0, error_code=GROUP_AUTHORIZATION_FAILED, topics=[])
    refused: dict[tuple[str, int], int] = {}
    wanted: dict[str, list[int]] = {}
    for topic in request.topics:
        for p in topic.partitions:
            try:
                broker.require(conn, "READ", "TOPIC", topic.name)
                broker.checked_config(topic.name, p.partition_index)
            except Refused as e:
                refused[topic.name, p.partition_index] = e.code
            else:
                wanted.setdefault(topic.name, []).append(p.partition_index)
    code, codes = broker.groups.delete_offsets(request.group_id, wanted)
    if code:
        return OffsetDeleteResponse(throttle_time_ms=0, error_code=code, topics=[])
    answer = OffsetDeleteResponse.OffsetDeleteResponseTopic
    return OffsetDeleteResponse(
        throttle_time_ms=0,
        error_code=NONE,
        topics=[
            answer(
                name=topic.name,
                partitions=[
                    answer.OffsetDeleteResponsePartition(
                        partition_index=p.partition_index,
                        error_code=refused.get((topic.name, p.partition_index), codes.get(topic.name, NONE)),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in request.topics
        ],
    )


APIS = [
    Api(OffsetCommitRequest, OffsetCommitResponse, 2, 9, offset_commit),
    Api(OffsetFetchRequest, OffsetFetchResponse, 1, 8, offset_fetch),
    Api(FindCoordinatorRequest, FindCoordinatorResponse, 0, 4, find_coordinator),
    Api(JoinGroupRequest, JoinGroupResponse, 0, 9, join_group),
    Api(HeartbeatRequest, HeartbeatResponse, 0, 4, heartbeat),
    Api(LeaveGroupRequest, LeaveGroupResponse, 0, 5, leave_group),
    Api(SyncGroupRequest, SyncGroupResponse, 0, 5, sync_group),
    Api(DescribeGroupsRequest, DescribeGroupsResponse, 0, 5, describe_groups),
    Api(ListGroupsRequest, ListGroupsResponse, 0, 5, list_groups),
    Api(DeleteGroupsRequest, DeleteGroupsResponse, 0, 2, delete_groups),
    Api(OffsetDeleteRequest, OffsetDeleteResponse, 0, 0, offset_delete),
]
