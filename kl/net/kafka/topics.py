"""CreateTopics, DeleteTopics and CreatePartitions: managing topics from Kafka's admin
clients and tools, with ``kl topics``' library calls (``Root.create_topic``,
``delete_topic``, ``alter_topic``).  (Topics created on first use, ``kl serve
--auto-create``, are ``Broker.first_use``'s.)

Changes are refused unless the daemon was started with ``--allow-admin`` (as produce is
without ``--allow-produce``).  A topic lives once on the shared file system: any
replication factor is taken and answered as 1, the one copy there is, and a replica
assignment only says how many partitions there are (every partition is led by the
daemon ``Broker.leaders`` names, whichever brokers it lists).  A new topic's configs are
Kafka's names (``kl.log.kafka_config``), and its answer lists them all as DescribeConfigs
does.  ``validate_only`` checks everything and writes nothing.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Any

from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)

from kl.errors import ConfigNotAlterable, InvalidConfig, InvalidTopicName, KlError, TopicNotFound
from kl.log import kafka_config
from kl.log.config import TopicConfig
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker, topic_uuid
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    POLICY_VIOLATION,
    TOPIC_ALREADY_EXISTS,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    Refused,
    code_of,
)
from kl.net.server import Connection, Wait
from kl.topic import validate_name

log = logging.getLogger("kl.serve")

MAX_PARTITIONS = 100_000
"""The most partitions one topic may have through the Kafka protocol (each is a
directory of files: a typo of 10^9 would fill the disk with them)."""
DEFAULT = -1
"""num_partitions or replication_factor left to the broker."""


def admin_allowed(broker: Broker, topic: str | None = None) -> None:
    """Raises ``Refused`` unless this daemon takes changes to topics (``--allow-admin``)
    and serves ``topic``."""
    if not broker.server.config.allow_admin:
        code = CLUSTER_AUTHORIZATION_FAILED if topic is None else TOPIC_AUTHORIZATION_FAILED
        raise Refused(code, "changes to topics are off on this server (kl serve --allow-admin)")
    if topic is not None and not broker.server.served(topic):
        raise Refused(TOPIC_AUTHORIZATION_FAILED, f"topic {topic} is not served here (kl serve --topics)")


def _name(topic: Any) -> str:
    """A requested topic name, checked."""
    try:
        return validate_name(topic)
    except InvalidTopicName as e:
        raise Refused(INVALID_TOPIC_EXCEPTION, str(e)) from None


def _duplicates(names: list[Any]) -> set[Any]:
    """The names a request gives more than once (Kafka refuses each of them)."""
    return {name for name, n in collections.Counter(names).items() if n > 1}


# ----------------------------------------------------------------- CreateTopics


def create_topics(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    twice = _duplicates([t.name for t in request.topics])
    answers = []
    for topic in request.topics:
        if topic.name in twice:
            answers.append(_created(topic.name, None, INVALID_REQUEST, f"topic {topic.name} is named more than once"))
            continue
        try:
            config = _create(broker, conn, topic, request.validate_only)
        except (Refused, KlError) as e:
            told = getattr(e, "logged", False) or request.validate_only or code_of(e) == TOPIC_ALREADY_EXISTS
            if not told:  # (applications create theirs at each start)
                log.warning("%s: creation of topic %r refused: %s", conn.peer, topic.name, e)
            answers.append(_created(topic.name, None, code_of(e), str(e)))
            continue
        if not request.validate_only:
            log.info("%s: created topic %s with %d partitions", conn.peer, topic.name, config.partitions)
        shown = broker.allows(conn, "DESCRIBE_CONFIGS", "TOPIC", topic.name, logged=False)
        answers.append(_created(topic.name, config, NONE, None, shown))
    return CreateTopicsResponse(throttle_time_ms=0, topics=answers)


def _create(broker: Broker, conn: Connection, topic: Any, validate_only: bool) -> TopicConfig:
    """Create the topic a request describes (or only check it); its config."""
    name = _name(topic.name)
    if not broker.may_create(conn, name):
        raise Refused(TOPIC_AUTHORIZATION_FAILED, "Authorization failed.", logged=True)  # Kafka's words
    admin_allowed(broker, name)
    if topic.replication_factor == 0 or topic.replication_factor < DEFAULT:
        raise Refused(INVALID_REPLICATION_FACTOR, f"replication factor must be larger than 0, not {topic.replication_factor}")
    partitions = _partitions(topic)
    config = TopicConfig(partitions=broker.server.config.default_partitions if partitions == DEFAULT else partitions)
    config = _configured(config, topic.configs)
    if os.path.lexists(broker.server.root.topic_path(name)):  # as create_topic finds it
        raise Refused(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")  # Kafka's words
    if validate_only:
        return config
    return broker.server.root.create_topic(name, config)


def _partitions(topic: Any) -> int:
    """How many partitions a CreateTopics topic asks for (DEFAULT: the broker's)."""
    if topic.assignments:
        if topic.num_partitions != DEFAULT or topic.replication_factor != DEFAULT:
            raise Refused(INVALID_REQUEST, "both a replica assignment and numPartitions or replicationFactor are given")
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            expected = f"0 to {len(indexes) - 1}"
            raise Refused(INVALID_REPLICA_ASSIGNMENT, f"the assignment's partitions must be {expected}, not {indexes}")
        _check_replicas(a.broker_ids for a in topic.assignments)
        return _bounded(len(indexes))
    if topic.num_partitions == DEFAULT:
        return DEFAULT
    if topic.num_partitions < 1:
        raise Refused(INVALID_PARTITIONS, f"number of partitions must be larger than 0, not {topic.num_partitions}")
    return _bounded(topic.num_partitions)


def _bounded(partitions: int) -> int:
    if partitions > MAX_PARTITIONS:
        raise Refused(INVALID_PARTITIONS, f"{partitions} partitions is more than a topic may have here ({MAX_PARTITIONS})")
    return partitions


def _check_replicas(replica_lists: Any) -> None:
    """A replica assignment names brokers, none twice in a partition (which ones does not
    matter: the one copy of each partition is on the shared file system)."""
    for replicas in replica_lists:
        if not replicas:
            raise Refused(INVALID_REPLICA_ASSIGNMENT, "a partition's replica list is empty")
        if len(set(replicas)) != len(replicas):
            raise Refused(INVALID_REPLICA_ASSIGNMENT, f"a partition's replica list names a broker twice: {list(replicas)}")


def _configured(config: TopicConfig, configs: list[Any]) -> TopicConfig:
    """``config`` with the Kafka-named settings of a CreateTopics (``kl.log.kafka_config``);
    a config named twice has its last value, as in Kafka."""
    for c in configs:
        if c.value is None:
            raise Refused(INVALID_CONFIG, f"Null value not supported for topic configs: {c.name}")  # Kafka's words
    try:
        return kafka_config.with_kafka_configs(config, {c.name: c.value for c in configs})
    except ConfigNotAlterable as e:
        raise Refused(POLICY_VIOLATION, str(e)) from None


def _created(name: str, config: TopicConfig | None, code: int, text: str | None, shown: bool = True) -> Any:
    """A topic's CreateTopics answer; its configs unless not ``shown`` (the client may
    not describe them: TOPIC_AUTHORIZATION_FAILED in their place, as Kafka answers)."""
    configs = [] if config is None or not shown else [_config_entry(entry) for entry in kafka_config.kafka_configs(config)]
    return CreateTopicsResponse.CreatableTopicResult(
        name=name,
        topic_id=topic_uuid(None if config is None else config.topic_id),
        error_code=code,
        error_message=text,
        topic_config_error_code=NONE if shown else TOPIC_AUTHORIZATION_FAILED,
        num_partitions=-1 if config is None or not shown else config.partitions,
        replication_factor=-1 if config is None or not shown else 1,
        configs=configs,
    )


def _config_entry(entry: kafka_config.KafkaConfig) -> Any:
    """A created topic's config as CreateTopics v5+ answers it (as DescribeConfigs does)."""
    return CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs(
        name=entry.name, value=entry.value, read_only=entry.read_only, config_source=entry.source, is_sensitive=False
    )


# ----------------------------------------------------------------- DeleteTopics


def delete_topics(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    if version >= 6:
        asked = [(t.name, t.topic_id) for t in request.topics]
    else:
        asked = [(name, None) for name in request.topic_names]
    twice = _duplicates([name for name, _ in asked if name is not None])
    answers = []
    for name, topic_id in asked:
        if name is not None and name in twice:
            answers.append(_deleted(name, topic_id, INVALID_REQUEST, f"topic {name} is named more than once"))
            continue
        try:
            name, topic_id = _delete(broker, conn, name, topic_id)
        except (Refused, KlError) as e:
            if code_of(e) != UNKNOWN_TOPIC_OR_PARTITION and not getattr(e, "logged", False):
                log.warning("%s: deletion of topic %r refused: %s", conn.peer, name, e)
            answers.append(_deleted(name, topic_id, code_of(e), str(e)))
            continue
        log.info("%s: deleted topic %s", conn.peer, name)
        answers.append(_deleted(name, topic_id, NONE, None))
    return DeleteTopicsResponse(throttle_time_ms=0, responses=answers)


def _delete(broker: Broker, conn: Connection, name: str | None, topic_id: Any) -> tuple[str, Any]:
    """Delete a topic by name, or by id (a zero id: by name); its name and id.  Named by
    an id, the name of a topic the client may not describe is not told."""
    by_id = topic_id is not None and topic_id.int != 0
    if name is not None and by_id:
        raise Refused(INVALID_REQUEST, "a topic to delete is named by both its name and its id")
    if by_id:
        found = broker.name_of(topic_id)
        if found is None:
            raise Refused(UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id}")
        broker.require(conn, "DESCRIBE", "TOPIC", found)
        name = found
    if name is None:
        raise Refused(INVALID_REQUEST, "a topic to delete is named by neither a name nor an id")
    broker.require(conn, "DELETE", "TOPIC", name)
    admin_allowed(broker, _name(name))
    try:
        config = broker.server.topic_config(name)
        if by_id and topic_uuid(config.topic_id) != topic_id:
            raise Refused(UNKNOWN_TOPIC_ID, f"topic {name} no longer has the id {topic_id}: it was created again")
        broker.server.root.delete_topic(name)
    except TopicNotFound:
        raise Refused(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist") from None
    return name, topic_uuid(config.topic_id)


def _deleted(name: str | None, topic_id: Any, code: int, text: str | None) -> Any:
    return DeleteTopicsResponse.DeletableTopicResult(
        name=name, topic_id=topic_id if topic_id is not None else topic_uuid(None), error_code=code, error_message=text
    )


# ----------------------------------------------------------------- CreatePartitions


def create_partitions(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    twice = _duplicates([t.name for t in request.topics])
    answers = []
    result = CreatePartitionsResponse.CreatePartitionsTopicResult
    for topic in request.topics:
        if topic.name in twice:
            text = f"topic {topic.name} is named more than once"
            answers.append(result(name=topic.name, error_code=INVALID_REQUEST, error_message=text))
            continue
        try:
            broker.require(conn, "ALTER", "TOPIC", topic.name)
            grown = _grow(broker, topic, request.validate_only)
        except (Refused, KlError) as e:
            code = INVALID_PARTITIONS if isinstance(e, InvalidConfig) else code_of(e)
            if not getattr(e, "logged", False):
                log.warning("%s: new partitions of topic %r refused: %s", conn.peer, topic.name, e)
            answers.append(result(name=topic.name, error_code=code, error_message=str(e)))
            continue
        if grown and not request.validate_only:
            log.info("%s: topic %s grown to %d partitions", conn.peer, topic.name, topic.count)
        answers.append(result(name=topic.name, error_code=NONE, error_message=None))
    return CreatePartitionsResponse(throttle_time_ms=0, results=answers)


def _grow(broker: Broker, topic: Any, validate_only: bool) -> bool:
    name = _name(topic.name)
    admin_allowed(broker, name)
    try:
        now = broker.server.topic_config(name).partitions
    except TopicNotFound:
        raise Refused(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist") from None
    if topic.count < now:
        increase = f"{topic.count} would not be an increase"
        raise Refused(INVALID_PARTITIONS, f"The topic {name} currently has {now} partition(s); {increase}.")  # Kafka's words
    if topic.count == now:
        raise Refused(INVALID_PARTITIONS, f"Topic already has {now} partition(s).")
    _bounded(topic.count)
    if topic.assignments is not None:
        if len(topic.assignments) != topic.count - now:
            raise Refused(
                INVALID_REPLICA_ASSIGNMENT,
                f"the assignment names {len(topic.assignments)} new partitions, not {topic.count - now}",
            )
        _check_replicas(a.broker_ids for a in topic.assignments)
    if not validate_only:
        broker.server.root.alter_topic(name, partitions=topic.count)
    return True


APIS = [
    Api(CreateTopicsRequest, CreateTopicsResponse, 0, 7, create_topics),
    Api(DeleteTopicsRequest, DeleteTopicsResponse, 0, 6, delete_topics),
    Api(CreatePartitionsRequest, CreatePartitionsResponse, 0, 3, create_partitions),
]
