"""ListOffsets: a partition's first and next offsets, and the first offset at or after a
time (the time indexes); v0's list of segment starts as Kafka 0.10's brokers gave it."""

from __future__ import annotations

from typing import Any

from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

from kl.errors import KlError
from kl.net.kafka.api import Api
from kl.net.kafka.broker import LEADER_EPOCH, Broker, check_epoch
from kl.net.kafka.errors import NONE, TOPIC_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION, Refused, code_of
from kl.net.server import Connection, Wait

LATEST, EARLIEST = -1, -2
"""ListOffsets' special timestamps."""


def list_offsets(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = ListOffsetsResponse.ListOffsetsTopicResponse
    part = answer.ListOffsetsPartitionResponse
    topics = []
    for topic in request.topics:
        parts = []
        if not broker.allows(conn, "DESCRIBE", "TOPIC", topic.name):
            denied: dict[str, Any] = {"old_style_offsets": []} if version == 0 else {"timestamp": -1, "offset": -1}
            parts = [
                part(partition_index=p.partition_index, error_code=TOPIC_AUTHORIZATION_FAILED, **denied) for p in topic.partitions
            ]
            topics.append(answer(name=topic.name, partitions=parts))
            continue
        for p in topic.partitions:
            if version == 0:
                parts.append(_old_style_offsets(broker, topic.name, p))
                continue
            try:
                epoch = p.current_leader_epoch if version >= 4 else -1
                offset, timestamp = _offset(broker, topic.name, p.partition_index, p.timestamp, epoch)
                parts.append(
                    part(
                        partition_index=p.partition_index,
                        error_code=NONE,
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=LEADER_EPOCH,
                    )
                )
            except (Refused, KlError) as e:
                parts.append(part(partition_index=p.partition_index, error_code=code_of(e), timestamp=-1, offset=-1))
        topics.append(answer(name=topic.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def _old_style_offsets(broker: Broker, topic: str, p: Any) -> Any:
    """ListOffsets v0's answer, as Kafka 0.10's brokers gave it (``Log.offsets_before``):
    up to ``max_num_offsets`` Kafka offsets, newest first, of the segments that begin
    at or before ``timestamp`` and of the log end when all of it does (-1: the log end,
    -2: the log start)."""
    part = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse
    try:
        broker.checked_config(topic, p.partition_index)
        target = broker.server.root.log(topic, p.partition_index)
        offsets = [target.kafka_offset(o) for o in target.offsets_before(p.timestamp, max(0, p.max_num_offsets))]
    except (Refused, KlError) as e:
        return part(partition_index=p.partition_index, error_code=code_of(e), old_style_offsets=[])
    return part(partition_index=p.partition_index, error_code=NONE, old_style_offsets=offsets)


def _offset(broker: Broker, topic: str, partition: int, timestamp: int, epoch: int) -> tuple[int, int]:
    """(offset, timestamp) ListOffsets answers for ``timestamp``."""
    broker.checked_config(topic, partition)
    check_epoch(epoch)
    target = broker.server.root.log(topic, partition)
    state = target.counted()
    if timestamp == LATEST:
        return state.log_end_count, -1
    if timestamp == EARLIEST:
        return target.kafka_offsets(state)[0], -1
    if timestamp < 0:
        raise Refused(UNSUPPORTED_VERSION, f"ListOffsets timestamp {timestamp} is not one kl answers")
    found = target.message_for_time(timestamp)
    if found is None:
        return -1, -1  # no message that new: Kafka's answer
    position, msg = found
    return target.kafka_offset(position.offset, position.skip), -1 if msg.timestamp is None else msg.timestamp


APIS = [Api(ListOffsetsRequest, ListOffsetsResponse, 0, 6, list_offsets)]
