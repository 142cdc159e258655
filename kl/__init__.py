"""kl: the classic Kafka log design over a shared filesystem.

import kl
root = kl.Root("/data/kl")
root.create_topic("events", kl.TopicConfig(partitions=2))
kl.Producer(root).send("events", b"hello")
for message in kl.Consumer(root).fetch("events", 0, 0):
    print(message.offset, message.value)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kl.errors import (
    ConfigNotAlterable,
    CorruptMessage,
    CorruptState,
    FormatMismatch,
    InvalidConfig,
    InvalidHeaders,
    InvalidMessageSet,
    InvalidOffset,
    InvalidTime,
    InvalidTimestamp,
    InvalidTopicName,
    KlError,
    LockTimeout,
    MessageTooLarge,
    OffsetOutOfRange,
    ProducerClosed,
    QueueFull,
    RootNotFound,
    StorageError,
    TopicExists,
    TopicNotFound,
    TopicRecreated,
    UnsupportedCodec,
)

_LAZY = {
    "DEFAULT_MAX_BYTES": "kl.consumer",
    "Batch": "kl.consumer",
    "Consumer": "kl.consumer",
    "Skipped": "kl.consumer",
    "Start": "kl.consumer",
    "Until": "kl.consumer",
    "GroupConsumer": "kl.group",
    "MessageStream": "kl.group",
    "Record": "kl.group",
    "EARLIEST": "kl.log",
    "LATEST": "kl.log",
    "Log": "kl.log",
    "Position": "kl.log",
    "TopicConfig": "kl.log.config",
    "Message": "kl.log.message",
    "MessageSet": "kl.log.messageset",
    "Checked": "kl.log.validate",
    "RemoteConsumer": "kl.net.remote",
    "RemoteProducer": "kl.net.remote",
    "Appended": "kl.producer",
    "Producer": "kl.producer",
    "hash_partitioner": "kl.producer",
    "murmur2_partitioner": "kl.producer",
    "CorruptOffset": "kl.registry",
    "GroupActive": "kl.registry",
    "GroupNotFound": "kl.registry",
    "GroupTaken": "kl.registry",
    "InvalidImport": "kl.registry",
    "NotOwner": "kl.registry",
    "PartitionInfo": "kl.topic",
    "Root": "kl.topic",
    "TopicInfo": "kl.topic",
    "validate_name": "kl.topic",
}
"""The names above the errors, each imported from its module at its first use: a
command that lists topics does not pay for loading groups, producers and the network
client (``import kl`` alone loads only the errors)."""

if TYPE_CHECKING:
    from kl.consumer import DEFAULT_MAX_BYTES, Batch, Consumer, Skipped, Start, Until
    from kl.group import GroupConsumer, MessageStream, Record
    from kl.log import EARLIEST, LATEST, Log, Position
    from kl.log.config import TopicConfig
    from kl.log.message import Message
    from kl.log.messageset import MessageSet
    from kl.log.validate import Checked
    from kl.net.remote import RemoteConsumer, RemoteProducer
    from kl.producer import Appended, Producer, hash_partitioner, murmur2_partitioner
    from kl.registry import CorruptOffset, GroupActive, GroupNotFound, GroupTaken, InvalidImport, NotOwner
    from kl.topic import PartitionInfo, Root, TopicInfo, validate_name


def __getattr__(name: str) -> object:
    """A name of ``_LAZY`` (imported now, then kept), or a submodule (``kl.groups``)."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if not name.startswith("_"):
        try:
            return importlib.import_module(f"kl.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"kl.{name}":
                raise
    raise AttributeError(f"module 'kl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Appended",
    "Batch",
    "Checked",
    "ConfigNotAlterable",
    "Consumer",
    "CorruptMessage",
    "CorruptOffset",
    "CorruptState",
    "DEFAULT_MAX_BYTES",
    "EARLIEST",
    "FormatMismatch",
    "GroupActive",
    "GroupTaken",
    "GroupConsumer",
    "GroupNotFound",
    "InvalidConfig",
    "InvalidImport",
    "InvalidMessageSet",
    "InvalidTime",
    "InvalidHeaders",
    "InvalidTimestamp",
    "InvalidOffset",
    "InvalidTopicName",
    "KlError",
    "LATEST",
    "LockTimeout",
    "Log",
    "Message",
    "MessageSet",
    "MessageStream",
    "MessageTooLarge",
    "NotOwner",
    "OffsetOutOfRange",
    "PartitionInfo",
    "Position",
    "Producer",
    "ProducerClosed",
    "QueueFull",
    "Record",
    "RemoteConsumer",
    "RemoteProducer",
    "Root",
    "RootNotFound",
    "Skipped",
    "Start",
    "StorageError",
    "TopicConfig",
    "TopicExists",
    "TopicInfo",
    "TopicNotFound",
    "TopicRecreated",
    "UnsupportedCodec",
    "Until",
    "hash_partitioner",
    "murmur2_partitioner",
    "validate_name",
]
