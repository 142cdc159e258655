"""The Kafka protocol's error codes kl answers with (Kafka's Errors.java), and the
exception a handler raises to answer one."""

from __future__ import annotations

from kl.errors import (
    CorruptMessage,
    InvalidConfig,
    InvalidProducerEpoch,
    InvalidTopicName,
    KlError,
    OffsetOutOfRange,
    OutOfOrderSequence,
    StorageError,
    TopicExists,
    TopicNotFound,
)

UNKNOWN_SERVER_ERROR = -1
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
OFFSET_METADATA_TOO_LARGE = 12
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUIRED_ACKS = 21
ILLEGAL_GENERATION = 22
INCONSISTENT_GROUP_PROTOCOL = 23
INVALID_GROUP_ID = 24
UNKNOWN_MEMBER_ID = 25
INVALID_SESSION_TIMEOUT = 26
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_TIMESTAMP = 32
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SECURITY_DISABLED = 54
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
FETCH_SESSION_ID_NOT_FOUND = 70
UNKNOWN_LEADER_EPOCH = 75
MEMBER_ID_REQUIRED = 79
ELECTION_NOT_NEEDED = 84
NO_REASSIGNMENT_IN_PROGRESS = 85
GROUP_SUBSCRIBED_TO_TOPIC = 86
INVALID_RECORD = 87
RESOURCE_NOT_FOUND = 91
DUPLICATE_RESOURCE = 92
UNACCEPTABLE_CREDENTIAL = 93
UNKNOWN_TOPIC_ID = 100
TRANSACTIONAL_ID_NOT_FOUND = 105
UNSUPPORTED_ENDPOINT_TYPE = 115


class Refused(Exception):
    """A partition's (or a request's) answer is this error code (the message goes to the
    log and, where the response has a field for it, to the client)."""

    def __init__(self, code: int, message: str, *, logged: bool = False):
        super().__init__(message)
        self.code = code
        self.logged = logged
        """Whether the daemon logged it already (not to be logged again per request)."""


_CODES: list[tuple[type[KlError], int]] = [
    (OffsetOutOfRange, OFFSET_OUT_OF_RANGE),
    (TopicNotFound, UNKNOWN_TOPIC_OR_PARTITION),
    (CorruptMessage, CORRUPT_MESSAGE),
    (StorageError, KAFKA_STORAGE_ERROR),
    (OutOfOrderSequence, OUT_OF_ORDER_SEQUENCE_NUMBER),
    (InvalidProducerEpoch, INVALID_PRODUCER_EPOCH),
    (TopicExists, TOPIC_ALREADY_EXISTS),
    (InvalidTopicName, INVALID_TOPIC_EXCEPTION),
    (InvalidConfig, INVALID_CONFIG),
]
"""kl's errors a Kafka error code stands for (the first class that matches)."""


def code_of(error: KlError | Refused) -> int:
    """The Kafka error code of a refusal, or of what kl raised."""
    if isinstance(error, Refused):
        return error.code
    return next((code for kind, code in _CODES if isinstance(error, kind)), UNKNOWN_SERVER_ERROR)
