"""DeleteRecords: moving a partition's log start up to a Kafka offset, as ``kl retain``
moves it (``Log.start_within``: the new start published first, so readers asking for
older offsets get OFFSET_OUT_OF_RANGE, then the segments below it renamed aside, so a
reader still inside one finishes it; ``kl retain`` unlinks them after its delay).

A log starts at a segment's first message, so a start inside a segment begins a new
one: the rest of the segment is copied (up to ``segment_bytes``, a cost Kafka has not).
The answer's low watermark is the offset asked, as Kafka's, but inside a compressed kl
batch (one stored message: a Kafka client's records are stored one by one), whose
start it is.  Needs ``--allow-admin``.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin.topics import DeleteRecordsRequest, DeleteRecordsResponse

from kl.errors import KlError
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, Refused, code_of
from kl.net.kafka.topics import admin_allowed
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

HIGH_WATERMARK = -1
"""The offset that asks for every record to go."""


def delete_records(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    result = DeleteRecordsResponse.DeleteRecordsTopicResult
    part = result.DeleteRecordsPartitionResult
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            try:
                broker.require(conn, "DELETE", "TOPIC", topic.name)
                low = _delete(broker, topic.name, p.partition_index, p.offset)
            except (Refused, KlError) as e:
                if code_of(e) not in (OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION) and not getattr(e, "logged", False):
                    log.warning("%s: deleting records of %s/%d refused: %s", conn.peer, topic.name, p.partition_index, e)
                parts.append(part(partition_index=p.partition_index, low_watermark=-1, error_code=code_of(e)))
                continue
            log.info("%s: records of %s/%d before %d deleted: it starts at %d", conn.peer, topic.name, p.partition_index,
                     p.offset, low)  # fmt: skip
            parts.append(part(partition_index=p.partition_index, low_watermark=low, error_code=NONE))
        topics.append(result(name=topic.name, partitions=parts))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


def _delete(broker: Broker, topic: str, partition: int, offset: int) -> int:
    """Delete the records of the partition before Kafka offset ``offset`` (-1: the high
    watermark); the Kafka offset it starts at then."""
    admin_allowed(broker, topic)
    broker.checked_config(topic, partition)
    target = broker.server.root.log(topic, partition)
    with target.locked():  # the published state: taken for writing, an unused hold would leave its mark on NFS
        state = target.counted(target.state())
        start, end = target.kafka_offsets(state)
        if offset == HIGH_WATERMARK:
            offset = end
        if not 0 <= offset <= end:
            raise Refused(OFFSET_OUT_OF_RANGE, f"offset {offset} is out of range: {topic}/{partition} ends at {end}")
        if offset > start:
            target.start_within(target.kafka_position(offset, state=state).offset)
    return target.kafka_offsets()[0]


APIS = [Api(DeleteRecordsRequest, DeleteRecordsResponse, 0, 2, delete_records)]
