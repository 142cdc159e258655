"""Fetch: messages from a Kafka offset on, as record batches (v4 on) or message sets
(v0-3), converted by ``kl.net.kafka.records``; a fetch that finds too little waits for
appends (the server's waiter) up to its max wait."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from kl.errors import KlError
from kl.log.cursor import Cursor
from kl.log.log import Log, Position
from kl.log.messageset import MessageSet
from kl.log.state import PartitionState
from kl.net.kafka import records
from kl.net.kafka.api import Api, Spliced
from kl.net.kafka.broker import Broker, check_epoch, topic_uuid
from kl.net.kafka.errors import (
    FETCH_SESSION_ID_NOT_FOUND,
    NONE,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    Refused,
    code_of,
)
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

MAX_FETCH_BYTES = 16 << 20
"""The most bytes of messages one fetch answer reads, whatever the client asks (Kafka's
brokers cap it too, with fetch.max.bytes): answers are built in memory, several times
that size while they are, and held there until the client has taken them, within the
daemon's ``answer_memory`` (past it, an answer carries its first message only), their
records never copied into the encoded answer (``Spliced``)."""
QUIET = (OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, UNKNOWN_LEADER_EPOCH)
"""A fetch's errors that are the client's to handle, not logged."""


def fetch(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if version >= 7 and (request.session_id != 0 or request.session_epoch > 0):
        return FetchResponse(throttle_time_ms=0, error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
    answer = Spliced(None, broker.server.reserve(min(max(0, request.max_bytes), MAX_FETCH_BYTES)))
    try:
        answer.message = _answer(broker, conn, version, request, wait, answer)
    finally:
        if answer.message is None:  # parked (or failed): the room goes back now, not once queued
            broker.server.unreserve(answer.reserved)
    return None if answer.message is None else answer


def _answer(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None, answer: Spliced) -> Any:
    """The fetch's answer within the room reserved for it (past the daemon's answer
    memory, none: the first message alone); None when it is parked to wait for more."""
    room = answer.reserved
    waits: list[tuple[Log, int]] = []
    topics = []
    total = 0
    sizes: dict[str, int] = {}
    for topic in request.topics:
        parts = []
        topic_id = topic.topic_id if version >= 13 else None
        name = topic.topic if version < 13 else broker.name_of(topic_id) if topic_id is not None else None
        for p in topic.partitions:
            # The first message goes whole even past max_bytes, as Kafka's (KIP-74); then the room left.
            limit = min(p.partition_max_bytes, max(1, room) if not total else room)
            epoch = p.current_leader_epoch if version >= 9 else -1
            part, target = _partition(broker, conn, name, topic_id, p.partition, p.fetch_offset, limit, epoch, version)
            size = len(part.records)
            part.records = answer.mark(part.records)
            parts.append(part)
            room = max(0, room - size)
            total += size
            if size and name is not None:
                sizes[name] = sizes.get(name, 0) + size
            if target is not None:
                waits.append(target)
        topics.append(FetchResponse.FetchableTopicResponse(topic=name, topic_id=topic_id, partitions=parts))
    if wait is None and total < max(1, request.min_bytes) and request.max_wait_ms > 0 and waits:
        deadline = time.monotonic() + min(request.max_wait_ms / 1000, broker.server.config.request_timeout)
        broker.server.park(conn, Wait(waits, request.min_bytes - total, deadline, None))
        return None
    for name, size in sizes.items():
        broker.server.metrics.topic(name).bytes_out.inc(size)
    return FetchResponse(throttle_time_ms=0, error_code=NONE, session_id=0, responses=topics)


def _partition(
    broker: Broker,
    conn: Connection,
    topic: str | None,
    topic_id: uuid.UUID | None,
    partition: int,
    offset: int,
    max_bytes: int,
    epoch: int,
    version: int,
) -> tuple[Any, tuple[Log, int] | None]:
    """A partition's answer, and what a wait for more would watch (None after an error).
    A fetch by topic id (version 13 on) must name the topic as it is now: one deleted
    and created again has another id, and its old offsets mean nothing in it.  An
    error answer has no offsets (-1), as Kafka's."""
    data = FetchResponse.FetchableTopicResponse.PartitionData
    try:
        if topic is None:
            raise Refused(UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id or 0}")
        broker.require(conn, "READ", "TOPIC", topic)
        config = broker.checked_config(topic, partition)
        if topic_id is not None and topic_uuid(config.topic_id) != topic_id:
            raise Refused(UNKNOWN_TOPIC_ID, f"topic {topic} no longer has the id {topic_id}: it was created again")
        check_epoch(epoch)
        target = broker.server.root.log(topic, partition)
        state = target.counted()
        start, end = target.kafka_offsets(state)
        if not start <= offset <= end:
            raise Refused(OFFSET_OUT_OF_RANGE, f"offset {offset} is out of range: {topic}/{partition} holds {start} to {end}")
        key = (config.topic_id or topic, partition)
        batch = b"" if offset >= end or max_bytes <= 0 else _records(broker, target, key, offset, max_bytes, state, version)
    except (Refused, KlError) as e:
        code = code_of(e)
        if code not in QUIET:
            log.warning("%s: fetch of %s/%d at %d: %s", conn.peer, topic, partition, offset, e)
        answer = data(
            partition_index=partition,
            error_code=code,
            high_watermark=-1,
            last_stable_offset=-1,
            log_start_offset=-1,
            records=b"",  # empty, never null: librdkafka cannot read a null set, and never sees the error
        )
        return answer, None
    answer = data(
        partition_index=partition,
        error_code=NONE,
        high_watermark=end,
        last_stable_offset=end,
        log_start_offset=start,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=batch,
    )
    return answer, (target, state.log_end_offset)  # a wait is for what comes past the end


def _records(
    broker: Broker, target: Log, key: tuple[str, int], offset: int, max_bytes: int, state: PartitionState, version: int
) -> bytes:
    """The messages from Kafka offset ``offset`` on as record batches (v4 on,
    ``records.record_batches``) or a message set (v0-3, ``records.message_set``), once
    where the client fetches next is remembered."""
    found = _read(broker, target, key, offset, max_bytes, state)
    if found is None:
        return b""
    (start, skip), messages = found
    if version >= 4:
        data, resume = records.record_batches(messages, offset - skip, skip)
    else:
        data, resume = records.message_set(messages, offset - skip, skip, max_bytes, version)
    if resume is not None:
        broker.remember_resume(key, resume.offset, Position(start + resume.position, resume.skip))
    return data


def _read(
    broker: Broker, target: Log, key: tuple[str, int], offset: int, max_bytes: int, state: PartitionState
) -> tuple[Position, MessageSet] | None:
    """Where the message of Kafka offset ``offset`` is and a read of at most
    ``max_bytes`` from there, through a ``Cursor`` (the valid messages before damage;
    the damage itself raised where nothing comes before it); None at the log end."""
    position = broker.message_at(target, key, offset, state)
    if position.offset >= state.log_end_offset:
        return None
    messages, damage = Cursor(target, position).read_with(max_bytes, _whole)
    if messages is None:
        assert damage is not None  # (the cursor's reset "fail" raises what left the log)
        raise damage
    return position, messages


def _whole(messages: MessageSet) -> tuple[MessageSet, int]:
    """A cursor's read taken whole (``Cursor.read_with``)."""
    return messages, messages.next_offset


APIS = [Api(FetchRequest, FetchResponse, 0, 16, fetch)]
