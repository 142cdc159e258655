"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: a topic's settings under
Kafka's names (``kl.log.kafka_config``), and the daemon's own as a broker's.

A topic's value other than kl's default is reported as set on the topic
(DYNAMIC_TOPIC_CONFIG), one equal to it as the default (kl keeps every setting in
``topic.json``); the configs kl has fixed values for are read-only.  A broker's configs
are ``kl serve``'s options and kl's defaults, read-only: altering them is refused.
Changes to topics take ``--allow-admin``, go through ``Root.alter_topic`` (its rules:
partitions and max.message.bytes only grow) and are refused per resource, with
INVALID_CONFIG (a value kl cannot hold) or POLICY_VIOLATION (one it does not change) and
a message; ``validate_only`` checks everything and writes nothing.  AlterConfigs, as in
Kafka, sets a topic's whole config: the configs it does not name go back to their defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from kl.errors import ConfigNotAlterable, KlError
from kl.log import config as kl_config
from kl.log import kafka_config
from kl.log.config import TopicConfig
from kl.log.kafka_config import SOURCE_BROKER, SOURCE_DEFAULT, KafkaConfig
from kl.net.acls import CLUSTER_NAME
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import INVALID_CONFIG, INVALID_REQUEST, NONE, POLICY_VIOLATION, Refused, code_of
from kl.net.kafka.topics import admin_allowed
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

TOPIC = 2
BROKER = 4
"""The resource types kl answers for (Kafka's ConfigResource.Type)."""
SET, DELETE, APPEND, SUBTRACT = range(4)
"""IncrementalAlterConfigs' operations."""
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "LONG": 5, "LIST": 7}
"""Kafka's ConfigType codes (DescribeConfigs v3+)."""


def refusal(error: KlError | Refused) -> Refused:
    """A refused change as its answer: POLICY_VIOLATION for what kl does not change,
    INVALID_CONFIG for what it cannot hold, in Kafka's names."""
    if isinstance(error, Refused):
        return error
    if isinstance(error, ConfigNotAlterable):
        return Refused(POLICY_VIOLATION, kafka_config.kafka_names(str(error)))
    return Refused(code_of(error), kafka_config.kafka_names(str(error)))


# ----------------------------------------------------------------- DescribeConfigs


def describe_configs(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    results = []
    result = DescribeConfigsResponse.DescribeConfigsResult
    for resource in request.resources:
        kind, name = resource.resource_type, resource.resource_name
        try:
            _authorize(broker, conn, "DESCRIBE_CONFIGS", kind, name)
            entries = _described(broker, kind, name)
        except (Refused, KlError) as e:
            refused = refusal(e)
            code, text = refused.code, str(refused)
            results.append(result(error_code=code, error_message=text, resource_type=kind, resource_name=name, configs=[]))
            continue
        keys = resource.configuration_keys
        configs = [
            _entry(entry, source, request.include_synonyms, request.include_documentation)
            for entry, source in entries
            if not keys or entry.name in keys  # none: all, as Kafka answers
        ]
        results.append(result(error_code=NONE, error_message=None, resource_type=kind, resource_name=name, configs=configs))
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


def _authorize(broker: Broker, conn: Connection, operation: str, kind: int, name: str) -> None:
    """A topic's configs are the topic's to grant, a broker's the cluster's."""
    if kind == TOPIC:
        broker.require(conn, operation, "TOPIC", name)
    elif kind == BROKER:
        broker.require(conn, operation, "CLUSTER", CLUSTER_NAME)


def _described(broker: Broker, kind: int, name: str) -> list[tuple[KafkaConfig, int]]:
    """The configs of a resource and the source of each."""
    if kind == TOPIC:
        return [(entry, entry.source) for entry in kafka_config.kafka_configs(broker.checked_config(name))]
    if kind == BROKER:
        if name == "":
            return []  # the cluster's dynamic defaults: kl has none
        if name != str(broker.node_id):
            text = f"Unexpected broker id, expected {broker.node_id} or empty string, but received {name}"  # Kafka's words
            raise Refused(INVALID_REQUEST, text)
        return _broker_configs(broker)
    raise Refused(INVALID_REQUEST, f"resources of type {kind} have no configs here (topics: 2, brokers: 4)")


def _broker_configs(broker: Broker) -> list[tuple[KafkaConfig, int]]:
    """The daemon's settings under Kafka's broker config names, read-only: its options
    (as a broker's static config) and, as the defaults of topics' configs, kl's defaults."""
    config = broker.server.config
    own = [
        ("auto.create.topics.enable", "BOOLEAN", str(config.auto_create).lower(), "create topics on first use (--auto-create)"),
        ("broker.id", "INT", str(broker.node_id), "this daemon's node id (from its address)"),
        ("default.replication.factor", "INT", "1", "1: a topic lives once, on the shared file system"),
        ("num.partitions", "INT", str(config.default_partitions), "a new topic's partitions (--partitions)"),
        ("socket.request.max.bytes", "INT", str(config.request_limit), "the largest request taken (more with --allow-produce)"),
    ]  # fmt: skip
    found = [(KafkaConfig(n, value, value, True, None, doc, kind, n), SOURCE_BROKER) for n, kind, value, doc in own]
    for entry in kafka_config.kafka_configs(TopicConfig()):
        default = KafkaConfig(entry.broker_name, entry.default, entry.default, True, entry.kl_name, entry.doc, entry.type,
                              entry.broker_name)  # fmt: skip
        found.append((default, SOURCE_DEFAULT))
    return sorted(found, key=lambda found: found[0].name)


def _entry(entry: KafkaConfig, source: int, synonyms: bool, documentation: bool) -> Any:
    result = DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult
    synonym = result.DescribeConfigsSynonym
    found = []
    if synonyms:
        if source != SOURCE_DEFAULT:
            found.append(synonym(name=entry.name, value=entry.value, source=source))
        if entry.broker_name != entry.name or source == SOURCE_DEFAULT:
            found.append(synonym(name=entry.broker_name, value=entry.default, source=SOURCE_DEFAULT))
    return result(
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=source,
        is_default=source == SOURCE_DEFAULT,
        is_sensitive=False,
        synonyms=found,
        config_type=CONFIG_TYPES[entry.type],
        documentation=entry.doc if documentation else None,
    )


# ----------------------------------------------------------------- AlterConfigs, IncrementalAlterConfigs


def alter_configs(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    def changes(resource: Any, config: TopicConfig) -> dict[str, str | None]:
        """The whole config: what is not named goes back to its default."""
        _unique(c.name for c in resource.configs)
        return dict.fromkeys(kafka_config.ALTERABLE) | {c.name: _not_null(c.name, c.value) for c in resource.configs}

    answers = _altered(broker, conn, request, changes, AlterConfigsResponse.AlterConfigsResourceResponse)
    return AlterConfigsResponse(throttle_time_ms=0, responses=answers)


def incremental_alter_configs(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    def changes(resource: Any, config: TopicConfig) -> dict[str, str | None]:
        _unique(c.name for c in resource.configs)
        current = {entry.name: entry.value for entry in kafka_config.kafka_configs(config)}
        return {c.name: _operated(c, current) for c in resource.configs}

    answers = _altered(broker, conn, request, changes, IncrementalAlterConfigsResponse.AlterConfigsResourceResponse)
    return IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=answers)


def _unique(names: Iterable[str]) -> None:
    """Refuses a resource's alteration that names a config twice (as Kafka does)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise Refused(INVALID_REQUEST, f"Error due to duplicate config keys: {name}")  # Kafka's words
        seen.add(name)


def _not_null(name: str, value: str | None) -> str:
    if value is None:
        raise Refused(INVALID_REQUEST, f"Null value not supported for : {name}")  # Kafka's words
    return value


def _operated(change: Any, current: dict[str, str]) -> str | None:
    """The value one IncrementalAlterConfigs operation leaves (None: the default)."""
    op, name = change.config_operation, change.name
    if op == SET:
        return _not_null(name, change.value)
    if op == DELETE:
        return None
    if op not in (APPEND, SUBTRACT):
        raise Refused(INVALID_REQUEST, f"unknown config operation {op} for {name}")
    setting = kafka_config.BY_NAME.get(name)
    if setting is None or setting.type != "LIST":
        verb = "APPEND" if op == APPEND else "SUBTRACT"
        raise Refused(INVALID_CONFIG, f"Can't {verb} to key {name} because its type is not LIST.")  # Kafka's words
    values = [v for v in current[name].split(",") if v]
    given = [v.strip() for v in (change.value or "").split(",") if v.strip()]
    if op == APPEND:
        return ",".join(values + [v for v in given if v not in values])
    return ",".join(v for v in values if v not in given)


def _altered(broker: Broker, conn: Connection, request: Any, changes: Any, answer: Any) -> list[Any]:
    """Each resource's answer to an alteration, ``changes(resource, config)`` giving
    the Kafka-named values it asks for."""
    answers = []
    for resource in request.resources:
        kind, name = resource.resource_type, resource.resource_name
        try:
            _authorize(broker, conn, "ALTER_CONFIGS", kind, name)
            done = _alter(broker, resource, changes, request.validate_only)
        except (Refused, KlError) as e:
            refused = refusal(e)
            if not refused.logged:
                log.warning("%s: change of the configs of %r refused: %s", conn.peer, name, refused)
            answers.append(answer(error_code=refused.code, error_message=str(refused), resource_type=kind, resource_name=name))
            continue
        if done and not request.validate_only:
            log.info("%s: altered topic %s: %s", conn.peer, name, ", ".join(f"{k}={v}" for k, v in done.items()))
        answers.append(answer(error_code=NONE, error_message=None, resource_type=kind, resource_name=name))
    return answers


def _alter(broker: Broker, resource: Any, changes: Any, validate_only: bool) -> dict[str, int]:
    """Alter (or only check) one resource's configs; kl's settings changed."""
    if resource.resource_type == BROKER:
        if all(getattr(c, "config_operation", None) == DELETE for c in resource.configs):
            return {}  # a dynamic broker config the daemon has none of, deleted (kafka-reassign-partitions' throttles)
        raise Refused(INVALID_CONFIG, "a broker's configs are kl serve's options: they cannot change while it runs")
    if resource.resource_type != TOPIC:
        raise Refused(INVALID_REQUEST, f"resources of type {resource.resource_type} have no configs here (topics: 2)")
    name = resource.resource_name
    admin_allowed(broker, name)
    config = broker.checked_config(name)
    wanted = kafka_config.with_kafka_configs(config, changes(resource, config))
    diff = {k: getattr(wanted, k) for k in kl_config.ALTERABLE if getattr(wanted, k) != getattr(config, k)}
    config.altered(**diff)
    if diff and not validate_only:
        broker.server.root.alter_topic(name, **diff)
    return diff


APIS = [
    Api(DescribeConfigsRequest, DescribeConfigsResponse, 1, 4, describe_configs),
    Api(AlterConfigsRequest, AlterConfigsResponse, 0, 2, alter_configs),
    Api(IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1, incremental_alter_configs),
]
