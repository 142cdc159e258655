"""Today's Kafka protocol, the front end of ``kl serve --kafka``.

Requests and responses are encoded by kafka-python's protocol classes, generated from
Kafka's own message schemas (``kafka.protocol``); the records inside them by
``kl.net.records`` and the core.  Why kafka-python's: it covers every version of every
request from the schemas (no hand-written structs), compiles an encoder and a decoder per
version, is pure Python with no dependencies and runs on Python 3.10 (``kio``, the other
schema-generated codec, needs 3.11).  Measured here: decoding a 1 MiB Produce request
takes 0.2 ms and encoding a 1 MiB Fetch answer about as long, against 1.5 ms to convert
its records; the records fields are opaque bytes to it, so the per-message work is kl's.

The live daemons over a root are the brokers of one cluster, and each partition's leader
is the one ``brokers.leader`` ranks first, whichever daemon is asked.
Offsets are Kafka offsets, one per message since the partition began (the log's counts
and offset indexes, ``Log.kafka_position``), and idempotent producers' batches are
appended once by the partition's producer journal (``kl.log.producers``).  Specified in
``man/kl-protocol.5`` and ``man/kl-serve.1`` (the versions advertised, and why).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import importlib
import logging
import pkgutil
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from kl.errors import (
    CorruptMessage,
    InvalidProducerEpoch,
    InvalidTopicName,
    KlError,
    OffsetOutOfRange,
    OutOfOrderSequence,
    StorageError,
    TopicNotFound,
)
from kl.log import producers
from kl.log.config import TopicConfig
from kl.log.cursor import Cursor
from kl.log.log import Log, Position
from kl.log.messageset import MessageSet
from kl.log.state import PartitionState
from kl.net import brokers, kafka_groups, records
from kl.net.coordinator import Coordinator
from kl.net.kafka_errors import (
    CORRUPT_MESSAGE,
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    INVALID_REQUEST,
    INVALID_REQUIRED_ACKS,
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    NONE,
    OFFSET_OUT_OF_RANGE,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_VERSION,
    Refused,
)
from kl.net.records import InvalidRecords
from kl.net.server import Connection, Drop, FrontEnd, Wait
from kl.topic import validate_name

log = logging.getLogger("kl.serve")

LATEST, EARLIEST = -1, -2
"""ListOffsets' special timestamps."""
LEADER_EPOCH = 0
"""Every partition's leader epoch, whichever daemon leads it: no daemon holds a copy of the
log that could diverge from another's."""
RESUME_CACHE = 100_000
"""Fetch offsets remembered (where the last record of an answer ends plus one -> where
the next message starts), so that a client resuming there needs no scan."""
MAX_FETCH_BYTES = 16 << 20
"""The most bytes of messages one fetch answer reads, whatever the client asks (Kafka's
brokers cap it too, with fetch.max.bytes): answers are built in memory, several times
that size while they are."""
HEADER = struct.Struct(">hhi")
"""api_key, api_version, correlation_id: the start of every request."""


class _Api:
    """One request kind: its classes, the versions advertised, its handler."""

    def __init__(self, request: Any, response: Any, low: int, high: int, handler: Callable[..., Any]):
        self.request = request
        self.response = response
        self.low = low
        self.high = high
        self.handler = handler


class Kafka(FrontEnd):
    """Answers today's Kafka clients (``kl serve --kafka``)."""

    def __init__(self, server: Any):
        super().__init__(server)
        self._resume: collections.OrderedDict[tuple[str, int, int], Position] = collections.OrderedDict()
        self._names: dict[uuid.UUID, str] = {}
        """Topic id -> name, as last found."""
        self._resume_lock = threading.Lock()
        self._listing = threading.Lock()
        """Held while the topics of a Metadata of all topics are looked up."""
        self._listed: tuple[float, list[Any]] = (-1.0, [])
        """When the last such lookup finished, and what it found."""
        self.groups = Coordinator(server.root, server.recheck)
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid5(uuid.NAMESPACE_URL, server.root.path).bytes).decode()[:22]

    def listening(self, address: str, port: int) -> None:
        host = self.server.config.advertised or brokers.host_of(address)
        self.address = (host, port)
        self.kafka_address = brokers.address_of(host, port)
        """``HOST:PORT`` as this daemon registers it (``BrokerInfo.kafka``)."""
        self.node_id = brokers.node_id(self.kafka_address)
        self.groups.start(self.kafka_address)
        log.info("serving %s to Kafka clients on %s:%d", self.server.root.path, address, port)

    def close(self) -> None:
        self.groups.close()

    def closed(self, conn: Connection) -> None:
        self.groups.hung_up(conn)

    # ----------------------------------------------------------------- requests

    def handle(self, conn: Connection, request: memoryview) -> None:
        if len(request) < HEADER.size + 2:
            raise Drop(f"a request of {len(request)} bytes is shorter than its header")
        key, version, correlation = HEADER.unpack_from(request)
        api = APIS.get(key)
        if key == API_VERSIONS and not api.low <= version <= api.high:  # type: ignore[union-attr]
            self._send(conn, correlation, ApiVersionsResponse(error_code=UNSUPPORTED_VERSION, api_keys=_api_keys()), 0, False)
            return
        if api is None:
            self._unsupported(conn, key, version, correlation)
            return
        if not api.low <= version <= api.high:
            # Kafka's brokers close the connection on a version they do not serve (Kafka 4
            # on OffsetCommit v0-1, ...): an answer without an error code to carry
            # UNSUPPORTED_VERSION would be empty, which a client reads as nothing refused
            # (kafka-go's Conn, on Produce v2: "reading a response left 4 unread bytes").
            raise Drop(f"{api.request.name} v{version} is not served here (versions {api.low}-{api.high})")
        flexible = api.request.flexible_version_q(version)
        pos, conn.client = _header(request, flexible)
        try:
            body = api.request.decode(request[pos:], version=version)
        except Exception as e:  # kafka-python's decoders raise what the bytes make them raise
            raise Drop(f"malformed {api.request.name} v{version}: {type(e).__name__}: {e}") from None
        if (null := _null_array(api.request._struct, body, version)) is not None:
            raise Drop(f"malformed {api.request.name} v{version}: its {null} array is null")
        self._answer(conn, api, version, correlation, body, None)

    def resume(self, conn: Connection, wait: Wait) -> None:
        api, version, correlation, body = wait.request  # type: ignore[misc]
        self._answer(conn, api, version, correlation, body, wait)  # type: ignore[has-type]

    def _answer(self, conn: Connection, api: _Api, version: int, correlation: int, body: Any, wait: Wait | None) -> None:
        response = api.handler(self, conn, version, body, wait)
        if conn.wait is not None:  # parked: answered by resume
            conn.wait.request = (api, version, correlation, body)
            return
        if response is None:
            return  # produce with acks 0: no answer
        flexible = api.response.flexible_version_q(version) and api.request is not ApiVersionsRequest
        self._send(conn, correlation, response, version, flexible)

    def _unsupported(self, conn: Connection, key: int, version: int, correlation: int) -> None:
        """Answer a request of a type kl does not serve with UNSUPPORTED_VERSION where the
        response has an error code (its other fields empty); close the connection when
        kafka-python knows no such response to encode."""
        response = _responses().get(key)
        if response is None or not 0 <= version <= response.max_version:
            raise Drop(f"request type {key} version {version} is not one kl or kafka-python knows")
        log.warning("%s: %s v%d is not served here: answered UNSUPPORTED_VERSION", conn.peer, response.name, version)
        answer = response()
        if hasattr(answer, "error_code"):
            answer.error_code = UNSUPPORTED_VERSION
        self._send(conn, correlation, answer, version, response.flexible_version_q(version))

    def _send(self, conn: Connection, correlation: int, response: ApiMessage, version: int, flexible: bool) -> None:
        data = response.encode(version=version)
        head = struct.pack(">ii", 4 + int(flexible) + len(data), correlation) + (b"\0" if flexible else b"")
        self.server.answer(conn).pieces.extend((memoryview(head), memoryview(data)))  # TCP_CORK makes one stream

    # ----------------------------------------------------------------- ApiVersions, Metadata

    def _api_versions(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        return ApiVersionsResponse(error_code=NONE, api_keys=_api_keys(), throttle_time_ms=0)

    def _metadata(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        peers = self._peers()
        if request.topics is None or (version == 0 and not request.topics):  # v0 has no null: its empty list is all
            topics = self._all_topics(peers)
        else:
            topics = self._topics([t.name for t in request.topics if t.name is not None], peers)
        nodes = [self.node_id, *(brokers.node_id(a) for a in peers)]
        return MetadataResponse(
            throttle_time_ms=0, brokers=self._brokers(peers), cluster_id=self.cluster_id, controller_id=min(nodes), topics=topics
        )

    def _all_topics(self, peers: dict[str, brokers.BrokerInfo]) -> list[Any]:
        """Every served topic's metadata.  A request that arrives while another one's are
        looked up waits for that lookup and shares it (clients send several at once on
        connecting: each lookup of 10,000 topics reads their 10,000 ``topic.json``)."""
        arrived = time.monotonic()
        with self._listing:
            finished, topics = self._listed
            if finished < arrived:
                topics = self._topics([n for n in self.server.root.topics() if self.server.served(n)], peers)
                self._listed = (time.monotonic(), topics)
        return topics

    def _topics(self, names: list[str], peers: dict[str, brokers.BrokerInfo]) -> list[Any]:
        topics = []
        for name in names:
            try:
                config = self.checked_config(name)
            except Refused as e:
                topics.append(MetadataResponse.MetadataResponseTopic(error_code=e.code, name=name, partitions=[]))
                continue
            partitions = [
                MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                    error_code=NONE,
                    partition_index=p,
                    leader_id=leader,
                    leader_epoch=LEADER_EPOCH,
                    replica_nodes=[leader],
                    isr_nodes=[leader],
                    offline_replicas=[],
                )
                for p, leader in enumerate(self._leaders(name, config.partitions, peers))
            ]
            topics.append(
                MetadataResponse.MetadataResponseTopic(
                    error_code=NONE, name=name, topic_id=_uuid(config.topic_id), is_internal=False, partitions=partitions
                )
            )
        return topics

    def _peers(self) -> dict[str, brokers.BrokerInfo]:
        """The other live daemons serving the Kafka protocol over the root, by Kafka address."""
        try:
            return {b.kafka: b for b in brokers.live(self.server.root.path) if b.kafka and b.kafka != self.kafka_address}
        except KlError as e:
            log.warning("cannot list the other daemons: %s", e)
            return {}

    def _leaders(self, topic: str, count: int, peers: dict[str, brokers.BrokerInfo]) -> list[int]:
        """The node id of each partition's leader: of the live daemons that serve the topic
        (those that take produce requests, when there are any), the one ``brokers.leader``
        names, so that every daemon names the same (kl-serve(1))."""
        serving = {a: b.produce for a, b in peers.items() if brokers.serves(b, topic)}
        serving[self.kafka_address] = self.server.config.allow_produce
        pool = sorted(a for a, produce in serving.items() if produce) or sorted(serving)
        if len(pool) == 1:
            return [brokers.node_id(pool[0])] * count
        return [brokers.node_id(brokers.leader(topic, p, pool)) for p in range(count)]

    def _brokers(self, peers: dict[str, brokers.BrokerInfo]) -> list[Any]:
        """This daemon and the other live ones serving the Kafka protocol over the root (a
        partition's leader or a group's coordinator may be one of them)."""
        broker = MetadataResponse.MetadataResponseBroker
        host, port = self.address
        found = [broker(node_id=self.node_id, host=host, port=port, rack=None)]
        for address in sorted(peers):
            other_host, _, other_port = address.rpartition(":")
            found.append(broker(node_id=brokers.node_id(address), host=other_host.strip("[]"), port=int(other_port), rack=None))
        return found

    # ----------------------------------------------------------------- Produce

    def _produce(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        answers: list[tuple[str, list[tuple[int, int, int, str | None]]]]
        refusal = None
        if request.acks not in (0, 1, -1):
            refusal = INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1, not {request.acks}"
        elif request.transactional_id is not None:
            refusal = INVALID_REQUEST, "kl has no transactions"
        if refusal is not None:
            code, text = refusal
            answers = [(t.name, [(p.index, code, -1, text) for p in t.partition_data]) for t in request.topic_data]
        else:
            parse = records.batches if version >= 3 else records.message_set_batches  # v0-2: no idempotence
            answers = [
                (
                    t.name,
                    [self._produce_partition(conn, t.name, p.index, p.records, request.acks, parse) for p in t.partition_data],
                )
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

    def _produce_partition(
        self, conn: Connection, topic: str, partition: int, data: Any, acks: int, parse: Callable[..., list[records.Batch]]
    ) -> tuple[int, int, int, str | None]:
        """(partition, error code, base offset, error message) once the partition's batches
        are appended (all of them, or none)."""
        try:
            if not self.server.config.allow_produce:
                raise Refused(TOPIC_AUTHORIZATION_FAILED, "produce is off on this server (kl serve --allow-produce)")
            config = self.checked_config(topic, partition)
            if data is None:
                raise Refused(INVALID_RECORD, "the partition's records are null")
            limit = self.server.config.max_request_bytes
            found = parse(data, max_records=limit // 7, max_bytes=4 * limit)
            messages = records.kl_messages(found, topic, config)
            target = self.server.root.log(topic, partition)
            first, last = found[0], found[-1]
            producer = None
            if first.producer_id >= 0:  # idempotent: appended once (kl.log.producers)
                last_sequence = (last.base_sequence + last.size - 1) & producers.MAX_SEQUENCE
                producer = producers.Batch(first.producer_id, first.producer_epoch, first.base_sequence, last_sequence)
            return partition, NONE, target.append_counted(messages, fsync=acks == -1, producer=producer)[1], None
        except Refused as e:
            return self._refused(conn, topic, partition, e.code, str(e))
        except InvalidRecords as e:
            return self._refused(conn, topic, partition, CORRUPT_MESSAGE, str(e))
        except KlError as e:
            return self._refused(conn, topic, partition, _code(e), str(e))

    def _refused(self, conn: Connection, topic: str, partition: int, code: int, text: str) -> tuple[int, int, int, str | None]:
        log.warning("%s: produce to %s/%d refused: %s", conn.peer, topic, partition, text)
        return partition, code, -1, text

    def _init_producer_id(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        if request.transactional_id is not None:
            log.warning(
                "%s: InitProducerId for transactional id %r refused: kl has no transactions", conn.peer, request.transactional_id
            )
            return InitProducerIdResponse(throttle_time_ms=0, error_code=INVALID_REQUEST, producer_id=-1, producer_epoch=-1)
        # A random id: two daemons over one root, or one restarted, never hand out the same.
        return InitProducerIdResponse(throttle_time_ms=0, error_code=NONE, producer_id=random.getrandbits(62), producer_epoch=0)

    # ----------------------------------------------------------------- Fetch

    def _fetch(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        if version >= 7 and (request.session_id != 0 or request.session_epoch > 0):
            return FetchResponse(throttle_time_ms=0, error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0, responses=[])
        room = min(max(0, request.max_bytes), MAX_FETCH_BYTES)
        waits: list[tuple[Log, int]] = []
        topics = []
        total = 0
        for topic in request.topics:
            parts = []
            topic_id = topic.topic_id if version >= 13 else None
            name = topic.topic if version < 13 else self._name_of(topic_id) if topic_id is not None else None
            for p in topic.partitions:
                # The first records go whole even past max_bytes, as Kafka's (KIP-74); then the room left.
                limit = min(p.partition_max_bytes, MAX_FETCH_BYTES if not total else room)
                epoch = p.current_leader_epoch if version >= 9 else -1
                answer, target = self._fetch_partition(conn, name, topic_id, p.partition, p.fetch_offset, limit, epoch, version)
                parts.append(answer)
                size = len(answer.records or b"")
                room = max(0, room - size)
                total += size
                if target is not None:
                    waits.append(target)
            topics.append(FetchResponse.FetchableTopicResponse(topic=name, topic_id=topic_id, partitions=parts))
        if wait is None and total < max(1, request.min_bytes) and request.max_wait_ms > 0 and waits:
            deadline = time.monotonic() + min(request.max_wait_ms / 1000, self.server.config.request_timeout)
            self.server.park(conn, Wait(waits, request.min_bytes - total, deadline, None))
            return None
        return FetchResponse(throttle_time_ms=0, error_code=NONE, session_id=0, responses=topics)

    def _fetch_partition(
        self,
        conn: Connection,
        topic: str | None,
        topic_id: uuid.UUID | None,
        partition: int,
        offset: int,
        max_bytes: int,
        epoch: int,
        version: int,
    ) -> tuple[Any, tuple[Log, int] | None]:
        """A partition's answer, and what a wait for more would watch (None after an error).
        A fetch by topic id (version 13 on) must name the topic as it is now: one deleted
        and created again has another id, and its old offsets mean nothing in it.  An
        error answer has no offsets (-1), as Kafka's."""
        data = FetchResponse.FetchableTopicResponse.PartitionData
        try:
            if topic is None:
                raise Refused(UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id or 0}")
            config = self.checked_config(topic, partition)
            if topic_id is not None and _uuid(config.topic_id) != topic_id:
                raise Refused(UNKNOWN_TOPIC_ID, f"topic {topic} no longer has the id {topic_id}: it was created again")
            _check_epoch(epoch)
            target = self.server.root.log(topic, partition)
            state = target.counted()
            start, end = target.kafka_offsets(state)
            if not start <= offset <= end:
                raise Refused(OFFSET_OUT_OF_RANGE, f"offset {offset} is out of range: {topic}/{partition} holds {start} to {end}")
            key = (config.topic_id or topic, partition)
            batch = b"" if offset >= end or max_bytes <= 0 else self._records(target, key, offset, max_bytes, state, version)
        except (Refused, KlError) as e:
            code = _code(e)
            if code not in (OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, UNKNOWN_LEADER_EPOCH):
                log.warning("%s: fetch of %s/%d at %d: %s", conn.peer, topic, partition, offset, e)
            answer = data(
                partition_index=partition,
                error_code=code,
                high_watermark=-1,
                last_stable_offset=-1,
                log_start_offset=-1,
                records=b"",  # empty, never null: librdkafka cannot read a null set, and never sees the error
            )
            return answer, None
        answer = data(
            partition_index=partition,
            error_code=NONE,
            high_watermark=end,
            last_stable_offset=end,
            log_start_offset=start,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=batch,
        )
        return answer, (target, state.log_end_offset)  # a wait is for what comes past the end

    def _records(
        self, target: Log, key: tuple[str, int], offset: int, max_bytes: int, state: PartitionState, version: int
    ) -> bytes:
        """The messages from Kafka offset ``offset`` on as record batches (v4 on,
        ``records.record_batches``) or a message set (v0-3, ``records.message_set``), once
        where the client fetches next is remembered."""
        found = self._read(target, key, offset, max_bytes, state)
        if found is None:
            return b""
        (start, skip), messages = found
        if version >= 4:
            data, resume = records.record_batches(messages, offset - skip, skip)
        else:
            data, resume = records.message_set(messages, offset - skip, skip, max_bytes, version)
        if resume is not None:
            self._remember_resume(key, resume.offset, Position(start + resume.position, resume.skip))
        return data

    def _read(
        self, target: Log, key: tuple[str, int], offset: int, max_bytes: int, state: PartitionState
    ) -> tuple[Position, MessageSet] | None:
        """Where the message of Kafka offset ``offset`` is and a read of at most
        ``max_bytes`` from there, through a ``Cursor`` (the valid messages before damage;
        the damage itself raised where nothing comes before it); None at the log end."""
        position = self.message_at(target, key, offset, state)
        if position.offset >= state.log_end_offset:
            return None
        messages, damage = Cursor(target, position).read_with(max_bytes, _whole)
        if messages is None:
            assert damage is not None  # (the cursor's reset "fail" raises what left the log)
            raise damage
        return position, messages

    def message_at(self, target: Log, key: tuple[str, int], offset: int, state: PartitionState | None = None) -> Position:
        """Where the message of Kafka offset ``offset`` is (see ``Log.kafka_position``),
        from what the last fetches served where they can tell."""
        with self._resume_lock:
            known = self._resume.get((key[0], key[1], offset))
        if known is not None and (state is None or known.offset < state.log_end_offset):
            return known
        return target.kafka_position(offset, state=state)

    def _remember_resume(self, key: tuple[str, int], offset: int, position: Position) -> None:
        """Remember that the message of Kafka offset ``offset`` of the partition ``key``
        (its topic's id, or name, and number) is at ``position``."""
        with self._resume_lock:
            self._resume[key[0], key[1], offset] = position
            if len(self._resume) > RESUME_CACHE:
                self._resume.popitem(last=False)

    def _name_of(self, topic_id: uuid.UUID) -> str | None:
        """The name of the served topic with this id (None: none has it)."""
        name = self._names.get(topic_id)
        if name is not None:
            with contextlib.suppress(KlError):
                if _uuid(self.server.topic_config(name).topic_id) == topic_id:
                    return name
        self._names = {}
        for name in self.server.root.topics():
            with contextlib.suppress(KlError):
                if self.server.served(name):
                    self._names[_uuid(self.server.topic_config(name).topic_id)] = name
        return self._names.get(topic_id)

    # ----------------------------------------------------------------- ListOffsets

    def _list_offsets(self, conn: Connection, version: int, request: Any, wait: Wait | None) -> Any:
        answer = ListOffsetsResponse.ListOffsetsTopicResponse
        part = answer.ListOffsetsPartitionResponse
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                if version == 0:
                    parts.append(self._old_style_offsets(topic.name, p))
                    continue
                try:
                    epoch = p.current_leader_epoch if version >= 4 else -1
                    offset, timestamp = self._offset(topic.name, p.partition_index, p.timestamp, epoch)
                    parts.append(
                        part(
                            partition_index=p.partition_index,
                            error_code=NONE,
                            timestamp=timestamp,
                            offset=offset,
                            leader_epoch=LEADER_EPOCH,
                        )
                    )
                except (Refused, KlError) as e:
                    code = _code(e)
                    parts.append(part(partition_index=p.partition_index, error_code=code, timestamp=-1, offset=-1))
            topics.append(answer(name=topic.name, partitions=parts))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    def _old_style_offsets(self, topic: str, p: Any) -> Any:
        """ListOffsets v0's answer, as Kafka 0.10's brokers gave it (``Log.offsets_before``):
        up to ``max_num_offsets`` Kafka offsets, newest first, of the segments that begin
        at or before ``timestamp`` and of the log end when all of it does (-1: the log end,
        -2: the log start)."""
        part = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse
        try:
            self.checked_config(topic, p.partition_index)
            target = self.server.root.log(topic, p.partition_index)
            offsets = [target.kafka_offset(o) for o in target.offsets_before(p.timestamp, max(0, p.max_num_offsets))]
        except (Refused, KlError) as e:
            code = _code(e)
            return part(partition_index=p.partition_index, error_code=code, old_style_offsets=[])
        return part(partition_index=p.partition_index, error_code=NONE, old_style_offsets=offsets)

    def _offset(self, topic: str, partition: int, timestamp: int, epoch: int) -> tuple[int, int]:
        """(offset, timestamp) ListOffsets answers for ``timestamp``."""
        self.checked_config(topic, partition)
        _check_epoch(epoch)
        target = self.server.root.log(topic, partition)
        state = target.counted()
        if timestamp == LATEST:
            return state.log_end_count, -1
        if timestamp == EARLIEST:
            return target.kafka_offsets(state)[0], -1
        if timestamp < 0:
            raise Refused(UNSUPPORTED_VERSION, f"ListOffsets timestamp {timestamp} is not one kl answers")
        found = target.message_for_time(timestamp)
        if found is None:
            return -1, -1  # no message that new: Kafka's answer
        position, msg = found
        return target.kafka_offset(position.offset, position.skip), -1 if msg.timestamp is None else msg.timestamp

    # ----------------------------------------------------------------- helpers

    def checked_config(self, topic: str, partition: int | None = None) -> TopicConfig:
        """The topic's config after the checks every request gets."""
        try:
            validate_name(topic)
        except InvalidTopicName as e:
            raise Refused(INVALID_TOPIC_EXCEPTION, str(e)) from None
        if not self.server.served(topic):
            raise Refused(TOPIC_AUTHORIZATION_FAILED, f"topic {topic} is not served here (kl serve --topics)")
        try:
            config = self.server.topic_config(topic)
        except TopicNotFound as e:
            raise Refused(UNKNOWN_TOPIC_OR_PARTITION, str(e)) from None
        if partition is not None and not 0 <= partition < config.partitions:
            raise Refused(
                UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic} has partitions 0 to {config.partitions - 1}, not {partition}"
            )
        return config


def _whole(messages: MessageSet) -> tuple[MessageSet, int]:
    """A cursor's read taken whole (``Cursor.read_with``)."""
    return messages, messages.next_offset


def _check_epoch(epoch: int) -> None:
    """Raises ``Refused`` (UNKNOWN_LEADER_EPOCH) for a client's current leader epoch newer
    than ``LEADER_EPOCH``, as Kafka's leader does (KIP-320); -1 names none."""
    if epoch > LEADER_EPOCH:
        raise Refused(UNKNOWN_LEADER_EPOCH, f"leader epoch {epoch} is newer than the partition's, {LEADER_EPOCH}")


def _code(error: KlError | Refused) -> int:
    """The Kafka error code of a refusal, or of what kl raised."""
    if isinstance(error, Refused):
        return error.code
    if isinstance(error, OffsetOutOfRange):
        return OFFSET_OUT_OF_RANGE
    if isinstance(error, TopicNotFound):
        return UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(error, CorruptMessage):
        return CORRUPT_MESSAGE
    if isinstance(error, StorageError):
        return KAFKA_STORAGE_ERROR
    if isinstance(error, OutOfOrderSequence):
        return OUT_OF_ORDER_SEQUENCE_NUMBER
    if isinstance(error, InvalidProducerEpoch):
        return INVALID_PRODUCER_EPOCH
    return UNKNOWN_SERVER_ERROR


def _uuid(topic_id: str | None) -> uuid.UUID:
    """kl's topic id (22 characters of base64url, as Kafka writes its ids) as a UUID."""
    if not topic_id:
        return uuid.UUID(int=0)
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=="))


def _header(request: memoryview, flexible: bool) -> tuple[int, str | None]:
    """Where the body starts (after the client id and, in flexible versions, the tagged
    fields), and the client id."""
    pos = HEADER.size
    (length,) = struct.unpack_from(">h", request, pos)
    client = None if length < 0 else bytes(request[pos + 2 : pos + 2 + length]).decode("utf-8", "replace")
    pos += 2 + max(0, length)
    if flexible:
        count, pos = _uvarint(request, pos)
        for _ in range(count):
            _, pos = _uvarint(request, pos)
            size, pos = _uvarint(request, pos)
            pos += size
    if pos > len(request):
        raise Drop("a request's header runs past its end")
    return pos, client


def _null_array(struct: Any, data: Any, version: int) -> str | None:
    """The name of an array in ``data`` that is null where its schema says it never is
    (kafka-python decodes a length of -1 as null whatever the schema says), else None."""
    for field in struct.fields.values():
        if not field.is_array() or not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        items = getattr(data, field.name)
        if items is None:
            if not field.nullable_for_version_q(version):
                return str(field.name)
        elif field.is_struct_array():
            for item in items:
                if (found := _null_array(field.array_of, item, version)) is not None:
                    return found
    return None


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise Drop("a request's header holds a bad varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


@functools.cache
def _responses() -> dict[int, Any]:
    """Every response class kafka-python has, by API key."""
    for group in ("admin", "consumer", "metadata", "producer"):
        package = importlib.import_module(f"kafka.protocol.{group}")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{module.name}")
    found = {}
    pending = [ApiMessage]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not ApiMessage and getattr(cls, "_class_version", None) is None and cls.type == "response":
            found[cls.API_KEY] = cls
    return found


def _api_keys() -> list[Any]:
    key = ApiVersionsResponse.ApiVersion
    return [key(api_key=k, min_version=a.low, max_version=a.high) for k, a in sorted(APIS.items())]


PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 22
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42
APIS = {
    PRODUCE: _Api(ProduceRequest, ProduceResponse, 0, 9, Kafka._produce),
    FETCH: _Api(FetchRequest, FetchResponse, 0, 16, Kafka._fetch),
    LIST_OFFSETS: _Api(ListOffsetsRequest, ListOffsetsResponse, 0, 6, Kafka._list_offsets),
    METADATA: _Api(MetadataRequest, MetadataResponse, 0, 12, Kafka._metadata),
    API_VERSIONS: _Api(ApiVersionsRequest, ApiVersionsResponse, 0, 3, Kafka._api_versions),
    INIT_PRODUCER_ID: _Api(InitProducerIdRequest, InitProducerIdResponse, 0, 4, Kafka._init_producer_id),
    OFFSET_COMMIT: _Api(OffsetCommitRequest, OffsetCommitResponse, 2, 9, kafka_groups.offset_commit),
    OFFSET_FETCH: _Api(OffsetFetchRequest, OffsetFetchResponse, 1, 8, kafka_groups.offset_fetch),
    FIND_COORDINATOR: _Api(FindCoordinatorRequest, FindCoordinatorResponse, 0, 4, kafka_groups.find_coordinator),
    JOIN_GROUP: _Api(JoinGroupRequest, JoinGroupResponse, 0, 9, kafka_groups.join_group),
    HEARTBEAT: _Api(HeartbeatRequest, HeartbeatResponse, 0, 4, kafka_groups.heartbeat),
    LEAVE_GROUP: _Api(LeaveGroupRequest, LeaveGroupResponse, 0, 5, kafka_groups.leave_group),
    SYNC_GROUP: _Api(SyncGroupRequest, SyncGroupResponse, 0, 5, kafka_groups.sync_group),
    DESCRIBE_GROUPS: _Api(DescribeGroupsRequest, DescribeGroupsResponse, 0, 5, kafka_groups.describe_groups),
    LIST_GROUPS: _Api(ListGroupsRequest, ListGroupsResponse, 0, 5, kafka_groups.list_groups),
    DELETE_GROUPS: _Api(DeleteGroupsRequest, DeleteGroupsResponse, 0, 2, kafka_groups.delete_groups),
}
"""What kl answers, and the versions it advertises (see kl-serve(1))."""
