"""Transactions, refused, and DescribeProducers, from the producer journal.

kl has no transactions.  Every request of one is refused at once with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the error Kafka's Java client, librdkafka and
kafka-python take as fatal when ``init_transactions()`` finds the coordinator
(FindCoordinator of a transactional id, ``groups``) or asks for its producer id
(InitProducerId, ``produce``): the producer fails there, where retriable errors
(COORDINATOR_NOT_AVAILABLE) would have it retry until its time-out.  The message
"kl has no transactions" goes with it where the answer has room for one, and to the
daemon's log.  ListTransactions lists none, DescribeTransactions knows none.

DescribeProducers lists each partition's idempotent producers, as its producer journal
holds them (``kl.log.producers``): the epoch and last sequence of each one's last batch
and when it was appended (Kafka's last timestamp is the batch's largest record time).
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin.transactions import (
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from kl.errors import KlError
from kl.log import producers
from kl.net.kafka.api import Api
from kl.net.kafka.broker import Broker
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    NONE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_NOT_FOUND,
    Refused,
    code_of,
)
from kl.net.server import Connection, Wait

log = logging.getLogger("kl.serve")

NO_TRANSACTIONS = "kl has no transactions"
REFUSED = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
"""The error code of every transaction's request."""


def refused(conn: Connection, what: str, transactional_id: str | None) -> int:
    """Log a transaction's request refused; its error code."""
    log.warning("%s: %s for transactional id %r refused: %s", conn.peer, what, transactional_id, NO_TRANSACTIONS)
    return REFUSED


# ----------------------------------------------------------------- the transaction's requests


def add_partitions_to_txn(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    answer = AddPartitionsToTxnResponse
    topic = answer.AddPartitionsToTxnTopicResult
    part = topic.AddPartitionsToTxnPartitionResult

    def results(topics: Any, code: int) -> list[Any]:
        return [
            topic(name=t.name, results_by_partition=[part(partition_index=p, partition_error_code=code) for p in t.partitions])
            for t in topics
        ]

    if version >= 4 and not broker.allows_cluster(conn, "CLUSTER_ACTION"):  # (from v4, a broker's request: Kafka's rule)
        return answer(throttle_time_ms=0, error_code=CLUSTER_AUTHORIZATION_FAILED, results_by_transaction=[])
    if version <= 3:
        code = refused(conn, "AddPartitionsToTxn", request.v3_and_below_transactional_id)
        return answer(throttle_time_ms=0, results_by_topic_v3_and_below=results(request.v3_and_below_topics, code))
    by_transaction = [
        answer.AddPartitionsToTxnResult(
            transactional_id=t.transactional_id,
            topic_results=results(t.topics, refused(conn, "AddPartitionsToTxn", t.transactional_id)),
        )
        for t in request.transactions
    ]
    return answer(throttle_time_ms=0, error_code=NONE, results_by_transaction=by_transaction)


def add_offsets_to_txn(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=refused(conn, "AddOffsetsToTxn", request.transactional_id))


def end_txn(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    code = refused(conn, "EndTxn", request.transactional_id)
    return EndTxnResponse(throttle_time_ms=0, error_code=code, producer_id=-1, producer_epoch=-1)


def txn_offset_commit(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    code = refused(conn, "TxnOffsetCommit", request.transactional_id)
    topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    part = topic.TxnOffsetCommitResponsePartition
    topics = [
        topic(name=t.name, partitions=[part(partition_index=p.partition_index, error_code=code) for p in t.partitions])
        for t in request.topics
    ]
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)


# ----------------------------------------------------------------- admin


def list_transactions(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    return ListTransactionsResponse(throttle_time_ms=0, error_code=NONE, unknown_state_filters=[], transaction_states=[])


def describe_transactions(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    state = DescribeTransactionsResponse.TransactionState
    states = [
        state(
            error_code=TRANSACTIONAL_ID_NOT_FOUND
            if broker.allows(conn, "DESCRIBE", "TRANSACTIONAL_ID", t)
            else TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            transactional_id=t,
            transaction_state="",
            transaction_timeout_ms=0,
            transaction_start_time_ms=-1,
            producer_id=-1,
            producer_epoch=-1,
            topics=[],
        )  # fmt: skip
        for t in request.transactional_ids
    ]
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)


def describe_producers(broker: Broker, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
    topic = DescribeProducersResponse.TopicResponse
    part = topic.PartitionResponse
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partition_indexes:
            try:
                broker.require(conn, "READ", "TOPIC", t.name)
                active = _producers(broker, t.name, p)
            except (Refused, KlError) as e:
                parts.append(part(partition_index=p, error_code=code_of(e), error_message=str(e), active_producers=[]))
                continue
            parts.append(part(partition_index=p, error_code=NONE, error_message=None, active_producers=active))
        topics.append(topic(name=t.name, partitions=parts))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


def _producers(broker: Broker, topic: str, partition: int) -> list[Any]:
    broker.checked_config(topic, partition)
    target = broker.server.root.log(topic, partition)
    state = target.counted()
    found = producers.last_batches(target.directory, state.producer_serial, state.log_end_count)
    producer = DescribeProducersResponse.TopicResponse.PartitionResponse.ProducerState
    return [
        producer(
            producer_id=pid,
            producer_epoch=e.epoch,
            last_sequence=e.last_sequence,
            last_timestamp=e.time_ms,
            coordinator_epoch=-1,
            current_txn_start_offset=-1,
        )  # fmt: skip
        for pid, e in sorted(found.items())
    ]


APIS = [
    Api(AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 5, add_partitions_to_txn),
    Api(AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 4, add_offsets_to_txn),
    Api(EndTxnRequest, EndTxnResponse, 0, 5, end_txn),
    Api(TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 5, txn_offset_commit),
    Api(DescribeTransactionsRequest, DescribeTransactionsResponse, 0, 0, describe_transactions),
    Api(ListTransactionsRequest, ListTransactionsResponse, 0, 2, list_transactions),
    Api(DescribeProducersRequest, DescribeProducersResponse, 0, 0, describe_producers),
]
