"""Kafka's names for a topic's settings: one table from Kafka's topic configs
(``retention.ms``, ``segment.bytes``, ...) to kl's (``TopicConfig``), with the values
converted both ways, and the configs kl has fixed values for (read-only).

Kafka's conventions are not kl's: Kafka's ``retention.ms`` and ``retention.bytes`` of -1
are kl's 0 (no limit), and Kafka's "never" for ``flush.messages`` and ``flush.ms``,
Long.MAX, is kl's 0 (the rule off).  What kl cannot hold is refused, never rounded:
Kafka's ``retention.ms=0`` and ``retention.bytes=0`` (delete every closed segment),
``flush.ms=0`` (kl's fsync of every message is ``flush.messages=1``),
``cleanup.policy=compact`` (kl does not compact).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kl.errors import ConfigNotAlterable, InvalidConfig
from kl.log.config import TopicConfig

LONG_MAX = (1 << 63) - 1
"""Java's Long.MAX_VALUE: Kafka's "never" for flush.messages and flush.ms."""
INT_MAX = (1 << 31) - 1
SOURCE_TOPIC = 1
"""Kafka's config source DYNAMIC_TOPIC_CONFIG: a value set on the topic."""
SOURCE_BROKER = 4
"""STATIC_BROKER_CONFIG: a value the broker was started with (``kl serve``'s options)."""
SOURCE_DEFAULT = 5
"""DEFAULT_CONFIG: the default value."""


@dataclass(frozen=True)
class Setting:
    """One Kafka topic config: its name, its type as Kafka declares it (``LONG``,
    ``INT``, ``STRING``, ``LIST``, ``BOOLEAN``), the broker config that is its default
    (its synonym), and either kl's setting it stands for (``kl_name`` with the
    conversions ``to_kafka`` and ``from_kafka``) or the value kl has fixed (``fixed``)."""

    name: str
    type: str
    broker_name: str
    doc: str
    kl_name: str | None = None
    to_kafka: Callable[[int], str] = str
    from_kafka: Callable[[str], int] | None = None
    fixed: str | None = None


@dataclass(frozen=True)
class KafkaConfig:
    """A topic's config as Kafka's tools show it: ``value`` and ``default`` in Kafka's
    terms, ``read_only`` when kl has a fixed value for it, ``kl_name`` the setting it is
    (None for the fixed ones)."""

    name: str
    value: str
    default: str
    read_only: bool
    kl_name: str | None
    doc: str
    type: str
    broker_name: str

    @property
    def is_default(self) -> bool:
        return self.value == self.default

    @property
    def source(self) -> int:
        """Where the value comes from, as Kafka says it: the topic's own (a value other than
        the default: kl keeps every setting in ``topic.json``, one equal to the default
        reads as the default) or the default."""
        return SOURCE_DEFAULT if self.is_default else SOURCE_TOPIC


def _long(name: str, text: str, low: int, kind: str = "LONG") -> int:
    """Kafka's value ``text`` of ``name``, a whole number of ``kind`` (``INT``, ``LONG``)
    from ``low``; refused in Kafka's words."""
    try:
        value = int(text.strip(), 10)
    except (ValueError, AttributeError):
        value = None
    if value is None or not -(1 << 63) <= value <= (INT_MAX if kind == "INT" else LONG_MAX):
        raise InvalidConfig(f"{_invalid(name, text)}Not a number of type {kind}")
    if value < low:
        raise InvalidConfig(f"{_invalid(name, value)}Value must be at least {low}")
    return value


def _invalid(name: str, value: object) -> str:
    return f"Invalid value {value} for configuration {name}: "


def _unlimited(name: str) -> Callable[[str], int]:
    """A size or an age where Kafka's -1 is no limit, kl's 0; Kafka's 0 (delete every
    closed segment) kl cannot hold."""

    def from_kafka(text: str) -> int:
        value = _long(name, text, -1)
        if value == 0:
            raise InvalidConfig(f"{_invalid(name, 0)}kl takes -1 (no limit) or more than 0")
        return max(value, 0)

    return from_kafka


def _never(name: str, low: int, zero: str = "") -> Callable[[str], int]:
    """A flush rule where Kafka's Long.MAX is never, kl's 0."""

    def from_kafka(text: str) -> int:
        value = _long(name, text, low)
        if value == 0:
            raise InvalidConfig(f"{_invalid(name, 0)}{zero}")
        return 0 if value == LONG_MAX else value

    return from_kafka


def _plain(name: str, kind: str) -> Callable[[str], int]:
    return lambda text: _long(name, text, 0, kind)


def _policy(text: str) -> int:
    policies = [p.strip() for p in text.split(",")]
    if policies != ["delete"]:
        raise InvalidConfig(f"{_invalid('cleanup.policy', text)}kl does not compact; only delete is taken")
    return 0


def _limit_text(value: int) -> str:
    return str(value or -1)


def _never_text(value: int) -> str:
    return str(value or LONG_MAX)


SETTINGS = (
    Setting(
        "cleanup.policy",
        "LIST",
        "log.cleanup.policy",
        "delete: old segments are deleted by retention (kl does not compact)",
        kl_name=None,
        from_kafka=_policy,
        fixed="delete",
    ),
    Setting(
        "compression.type",
        "STRING",
        "compression.type",
        "uncompressed: kl stores a producer's compressed batches as plain messages",
        fixed="uncompressed",
    ),
    Setting(
        "flush.messages",
        "LONG",
        "log.flush.interval.messages",
        "fsync a partition after this many messages (Long.MAX: never)",
        kl_name="flush_messages",
        to_kafka=_never_text,
        from_kafka=_never("flush.messages", 1),
    ),
    Setting(
        "flush.ms",
        "LONG",
        "log.flush.interval.ms",
        "fsync a partition this many milliseconds after its last fsync (Long.MAX: never)",
        kl_name="flush_ms",
        to_kafka=_never_text,
        from_kafka=_never("flush.ms", 0, "kl has no fsync at every append by time; flush.messages=1 fsyncs every message"),
    ),
    Setting(
        "follower.replication.throttled.replicas",
        "LIST",
        "follower.replication.throttled.replicas",
        "empty: no replica follows, none is throttled",
        fixed="",
    ),
    Setting(
        "leader.replication.throttled.replicas",
        "LIST",
        "leader.replication.throttled.replicas",
        "empty: no replica follows, none is throttled",
        fixed="",
    ),
    Setting(
        "max.message.bytes",
        "INT",
        "message.max.bytes",
        "the largest message, kl's header included",
        kl_name="max_message_bytes",
        from_kafka=_plain("max.message.bytes", "INT"),
    ),
    Setting(
        "message.timestamp.type",
        "STRING",
        "log.message.timestamp.type",
        "CreateTime: every message keeps the timestamp its producer gave it",
        fixed="CreateTime",
    ),
    Setting(
        "min.insync.replicas",
        "INT",
        "min.insync.replicas",
        "1: the one copy on the shared file system is every replica",
        fixed="1",
    ),
    Setting("preallocate", "BOOLEAN", "log.preallocate", "false: segment files grow as they are written", fixed="false"),
    Setting("remote.storage.enable", "BOOLEAN", "remote.log.storage.system.enable", "false: no tiered storage", fixed="false"),
    Setting(
        "retention.bytes",
        "LONG",
        "log.retention.bytes",
        "delete the oldest closed segments past this many bytes per partition (-1: no limit)",
        kl_name="retention_bytes",
        to_kafka=_limit_text,
        from_kafka=_unlimited("retention.bytes"),
    ),
    Setting(
        "retention.ms",
        "LONG",
        "log.retention.ms",
        "delete closed segments older than this many milliseconds (-1: no limit)",
        kl_name="retention_ms",
        to_kafka=_limit_text,
        from_kafka=_unlimited("retention.ms"),
    ),
    Setting(
        "segment.bytes",
        "INT",
        "log.segment.bytes",
        "roll to a new segment file past this size",
        kl_name="segment_bytes",
        from_kafka=_plain("segment.bytes", "INT"),
    ),
    Setting("segment.ms", "LONG", "log.roll.ms", "Long.MAX: kl rolls segments by size only, never by age", fixed=str(LONG_MAX)),
    Setting(
        "unclean.leader.election.enable",
        "BOOLEAN",
        "unclean.leader.election.enable",
        "false: no replica can be behind the one copy",
        fixed="false",
    ),
)
"""Every topic config kl reports, by Kafka's name in Kafka's order (alphabetical)."""
BY_NAME = {s.name: s for s in SETTINGS}
ALTERABLE = tuple(s.name for s in SETTINGS if s.from_kafka is not None)
"""The Kafka configs a topic's config can be set or altered by (``cleanup.policy`` to delete only)."""
KAFKA_NAME = {s.kl_name: s.name for s in SETTINGS if s.kl_name}
"""kl's setting -> Kafka's name."""
_DEFAULTS = TopicConfig()
_KL_NAMES = re.compile(r"\b(" + "|".join(KAFKA_NAME) + r")\b")


def kafka_configs(config: TopicConfig) -> list[KafkaConfig]:
    """``config`` as Kafka's topic configs, in Kafka's order."""
    return [
        KafkaConfig(
            s.name,
            _value(s, config),
            _value(s, _DEFAULTS),
            s.fixed is not None and s.from_kafka is None,
            s.kl_name,
            s.doc,
            s.type,
            s.broker_name,
        )
        for s in SETTINGS
    ]


def _value(setting: Setting, config: TopicConfig) -> str:
    if setting.kl_name is None:
        return str(setting.fixed)
    return setting.to_kafka(getattr(config, setting.kl_name))


def kl_settings(configs: Mapping[str, str | None]) -> dict[str, int | None]:
    """Kafka-named ``configs`` as kl's settings (None stays None: back to the default).
    A read-only config may be given its fixed value (or its default: the same).  Raises
    ``InvalidConfig`` naming the Kafka config that is unknown or out of range,
    ``ConfigNotAlterable`` one that is read-only."""
    settings: dict[str, int | None] = {}
    for name, text in configs.items():
        setting = BY_NAME.get(name)
        if setting is None:
            raise InvalidConfig(f"Unknown topic config name: {name} (kl takes {', '.join(ALTERABLE)})")
        if setting.from_kafka is None:
            if text is None or text.strip() == setting.fixed:
                continue  # what it is already
            raise ConfigNotAlterable(f"{name} cannot be set: kl's topics always have {name}={setting.fixed}")
        if text is None:
            value = None if setting.kl_name is None else getattr(_DEFAULTS, setting.kl_name)
        else:
            value = setting.from_kafka(text)
        if setting.kl_name is not None:
            settings[setting.kl_name] = value
    return settings


def with_kafka_configs(config: TopicConfig, configs: Mapping[str, str | None]) -> TopicConfig:
    """``config`` with Kafka-named ``configs`` set (a value of None: back to kl's
    default).  Raises ``InvalidConfig`` and ``ConfigNotAlterable`` with a one-line
    message in Kafka's names; the rules of an alteration (what only grows) are
    ``TopicConfig.altered``'s."""
    changes = kl_settings(configs)
    try:
        return dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    except InvalidConfig as e:
        raise InvalidConfig(kafka_names(str(e))) from None


def kafka_names(text: str) -> str:
    """``text`` (one of kl's messages) with kl's setting names replaced by Kafka's."""
    return _KL_NAMES.sub(lambda m: KAFKA_NAME[m.group(1)], text)
