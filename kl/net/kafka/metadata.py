"""Metadata: the brokers (the live daemons over the root) and the served topics, each
partition led by the daemon ``Broker.leaders`` names, its only replica."""

from __future__ import annotations

import copy
from typing import Any

from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from kl.net import brokers
from kl.net.acls import CLUSTER_NAME
from kl.net.kafka.api import Api
from kl.net.kafka.broker import LEADER_EPOCH, Broker, topic_uuid
from kl.net.kafka.errors import NONE, Refused
from kl.net.server import Connection, Wait

Topic = MetadataResponse.MetadataResponseTopic
Partition = Topic.MetadataResponsePartition


def metadata(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    """All topics: those the client may describe.  Topics named: those it may not
    describe answered TOPIC_AUTHORIZATION_FAILED (whether they exist or not, as Kafka)."""
    peers = broker.peers()
    if request.topics is None or (version == 0 and not request.topics):  # v0 has no null: its empty list is all
        listed = broker.served_topics(lambda names: _topics(broker, names, peers, None, False))
        topics = [t for t in listed if broker.allows(conn, "DESCRIBE", "TOPIC", t.name, logged=False)]
    else:
        create = version < 4 or request.allow_auto_topic_creation
        names = [t.name for t in request.topics if t.name is not None]
        topics = _topics(broker, names, peers, conn, create)
    if version >= 8 and request.include_topic_authorized_operations:
        topics = [copy.copy(t) for t in topics]  # (those listed are shared with other requests)
        for t in topics:
            t.authorized_operations = broker.operations(conn, "TOPIC", t.name) if t.error_code == NONE else None
    nodes = broker.nodes(peers, conn)
    cluster = None
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        cluster = broker.operations(conn, "CLUSTER", CLUSTER_NAME) if broker.allows_cluster(conn, "DESCRIBE") else set()
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=n, host=h, port=p, rack=None) for n, h, p in nodes],
        cluster_id=broker.cluster_id,
        controller_id=min(n for n, _, _ in nodes),
        topics=topics,
        authorized_operations=cluster,
    )


def _topics(
    broker: Broker, names: list[str], peers: dict[str, brokers.BrokerInfo], named_by: Connection | None, create: bool
) -> list[Any]:
    """The topics' metadata (``named_by``, ``create``: see ``Broker.checked_config``)."""
    topics = []
    for name in names:
        try:
            if named_by is not None:
                broker.require(named_by, "DESCRIBE", "TOPIC", name)
            config = broker.checked_config(name, named_by=named_by, create=create)
        except Refused as e:
            topics.append(Topic(error_code=e.code, name=name, partitions=[]))
            continue
        partitions = [
            Partition(
                error_code=NONE,
                partition_index=p,
                leader_id=leader,
                leader_epoch=LEADER_EPOCH,
                replica_nodes=[leader],
                isr_nodes=[leader],
                offline_replicas=[],
            )
            for p, leader in enumerate(broker.leaders(name, config.partitions, peers))
        ]
        topics.append(
            Topic(error_code=NONE, name=name, topic_id=topic_uuid(config.topic_id), is_internal=False, partitions=partitions)
        )
    return topics


APIS = [Api(MetadataRequest, MetadataResponse, 0, 12, metadata)]
