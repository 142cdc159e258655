"""Produce and InitProducerId: appending a client's records (converted by
``kl.net.kafka.records``), an idempotent producer's batches once each (the partition's
producer journal, ``kl.log.producers``); a transactional producer's refused
(``transactions``)."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from kl.errors import KlError
from kl.log import producers
from kl.net.kafka import records, transactions
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_REQUIRED_ACKS,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    Refused,
    code_of,
)
from kl.net.kafka.records import InvalidRecords
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

Answer = tuple[int, int, int, "str | None"]
"""A partition's answer: (partition, error code, base offset, error message)."""


def produce(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answers: list[tuple[str, list[Answer]]]
    refusal = None
    if request.acks not in (0, 1, -1):
        refusal = INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1, not {request.acks}"
    elif request.transactional_id is not None:
        refusal = transactions.refused(conn, "Produce", request.transactional_id), transactions.NO_TRANSACTIONS
    if refusal is not None:
        code, text = refusal
        answers = [(t.name, [(p.index, code, -1, text) for p in t.partition_data]) for t in request.topic_data]
    else:
        parse = records.batches if version >= 3 else records.message_set_batches  # v0-2: no idempotence
        answers = [
            (t.name, [_partition(broker, conn, t.name, p.index, p.records, request.acks, parse) for p in t.partition_data])
            for t in request.topic_data
        ]
    if request.acks == 0:
        return None
    return ProduceResponse(
        responses=[
            ProduceResponse.TopicProduceResponse(
                name=name,
                partition_responses=[
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=index,
                        error_code=code,
                        base_offset=offset,
                        log_append_time_ms=-1,
                        log_start_offset=-1,
                        record_errors=[],
                        error_message=text,
                    )
                    for index, code, offset, text in parts
                ],
            )
            for name, parts in answers
        ],
        throttle_time_ms=0,
    )


def _partition(
    broker: Broker, conn: Connection, topic: str, partition: int, data: Any, acks: int, parse: Callable[..., list[records.Batch]]
) -> Answer:
    """The partition's answer once its batches are appended (all of them, or none)."""
    try:
        if not broker.server.config.allow_produce:
            raise Refused(TOPIC_AUTHORIZATION_FAILED, "produce is off on this server (kl serve --allow-produce)")
        broker.require(conn, "WRITE", "TOPIC", topic)
        config = broker.checked_config(topic, partition, named_by=conn)
        if data is None:
            raise Refused(INVALID_RECORD, "the partition's records are null")
        limit = broker.server.config.max_request_bytes
        found = parse(data, max_records=limit // 7, max_bytes=4 * limit)
        messages = records.kl_messages(found, topic, config)
        target = broker.server.root.log(topic, partition)
        first, last = found[0], found[-1]
        producer = None
        if first.producer_id >= 0:  # idempotent: appended once (kl.log.producers)
            last_sequence = (last.base_sequence + last.size - 1) & producers.MAX_SEQUENCE
            producer = producers.Batch(first.producer_id, first.producer_epoch, first.base_sequence, last_sequence)
        offset = target.append_counted(messages, fsync=acks == -1, producer=producer)[1]
        broker.server.metrics.topic(topic).appended(len(data), messages.count)
        return partition, NONE, offset, None
    except InvalidRecords as e:
        return _refused(conn, topic, partition, CORRUPT_MESSAGE, e)
    except (Refused, KlError) as e:
        return _refused(conn, topic, partition, code_of(e), e)


def _refused(conn: Connection, topic: str, partition: int, code: int, error: Exception) -> Answer:
    if not getattr(error, "logged", False):
        log.warning("%s: produce to %s/%d refused: %s", conn.peer, topic, partition, error)
    return partition, code, -1, str(error)


def init_producer_id(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if request.transactional_id is not None:
        code = transactions.refused(conn, "InitProducerId", request.transactional_id)
        return InitProducerIdResponse(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)
    if not broker.allows_idempotent_write(conn):
        return InitProducerIdResponse(
            throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1
        )
    # A random id: two daemons over one root, or one restarted, never hand out the same.
    return InitProducerIdResponse(throttle_time_ms=0, error_code=NONE, producer_id=random.getrandbits(62), producer_epoch=0)


APIS = [
    Api(ProduceRequest, ProduceResponse, 0, 9, produce),
    Api(InitProducerIdRequest, InitProducerIdResponse, 0, 4, init_producer_id),
]
