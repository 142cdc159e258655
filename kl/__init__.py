"""kl: the classic Kafka log design over a shared filesystem.

import kl
root = kl.Root("/data/kl")
root.create_topic("events", kl.TopicConfig(partitions=2))
kl.Producer(root).send("events", b"hello")
for message in kl.Consumer(root).fetch("events", 0, 0):
    print(message.offset, message.value)
"""

from kl.consumer import DEFAULT_MAX_BYTES, Batch, Consumer, Skipped, Start, Until
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
from kl.group import GroupConsumer, MessageStream, Record
from kl.log import EARLIEST, LATEST, Log, Position
from kl.log.config import TopicConfig
from kl.log.message import Message
from kl.log.messageset import MessageSet
from kl.net.remote import RemoteConsumer, RemoteProducer
from kl.producer import Appended, Producer, hash_partitioner, murmur2_partitioner
from kl.registry import CorruptOffset, GroupActive, GroupNotFound, GroupTaken, InvalidImport, NotOwner
from kl.topic import PartitionInfo, Root, TopicInfo, validate_name

__all__ = [
    "Appended",
    "Batch",
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
