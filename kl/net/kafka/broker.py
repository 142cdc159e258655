"""This daemon as a Kafka broker: what every request's handler shares.

Its place in the cluster (its node id and address, the other live daemons over the root,
each partition's leader: the one ``brokers.leader`` ranks first, whichever daemon is
asked), the checks every request naming a topic gets, the group coordinator, and where
the messages of Kafka offsets are (the log's counts and offset indexes,
``Log.kafka_position``, ahead of them what the last fetches served).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import functools
import logging
import threading
import time
import uuid
from typing import Any

from kl.errors import InvalidTopicName, KlError, TopicExists, TopicNotFound
from kl.log.config import TopicConfig
from kl.log.log import Log, Position
from kl.log.state import PartitionState
from kl.net import brokers
from kl.net.acls import CLUSTER_NAME, OPERATIONS, SUPPORTED, Authorizer
from kl.net.kafka.coordinator import STATES, Coordinator
from kl.net.kafka.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_TOPIC_EXCEPTION,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
    Refused,
)
from kl.net.kafka.sasl import Authenticator
from kl.net.server import Connection, FrontEnd, Server, host_of
from kl.topic import validate_name

log = logging.getLogger("kl.serve")

LEADER_EPOCH = 0
"""Every partition's leader epoch, whichever daemon leads it: no daemon holds a copy of the
log that could diverge from another's."""
RESUME_CACHE = 100_000
"""Fetch offsets remembered (where the last record of an answer ends plus one -> where
the next message starts), so that a client resuming there needs no scan."""
DENIED = {
    "TOPIC": (TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
    "GROUP": (GROUP_AUTHORIZATION_FAILED, "Group authorization failed."),
    "CLUSTER": (CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."),
    "TRANSACTIONAL_ID": (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed."),
}
"""Each resource type's error code and Kafka's words for it."""
MAX_UNKNOWN = 10_000
"""Names of missing topics remembered as logged (past them, a client asking for ever new
ones is not logged again)."""


class Broker:
    """The daemon ``server`` as one broker of the cluster its root's daemons make."""

    def __init__(self, server: Server):
        self.server = server
        self.groups = Coordinator(server.root, server.recheck, server.metrics.rebalances.inc)
        for state in STATES:  # read when scraped, as Kafka's classic-group-count (its states in lower case)
            server.metrics.groups.labels(state.lower()).set_function(functools.partial(self.groups.count, state))
        self.sasl = Authenticator(server)
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid5(uuid.NAMESPACE_URL, server.root.path).bytes).decode()[:22]
        self.address = ("", 0)
        self.kafka_address = ""
        """``HOST:PORT`` as this daemon registers it (``BrokerInfo.kafka``)."""
        self.node_id = -1
        self.endpoints: dict[FrontEnd, tuple[str, int]] = {}
        """Each listener's (host, port) as advertised, by its front end: Metadata names this
        daemon by the listener a connection came in on; the first one is its node."""
        self._resume: collections.OrderedDict[tuple[str, int, int], Position] = collections.OrderedDict()
        self._resume_lock = threading.Lock()
        self._names: dict[uuid.UUID, str] = {}
        """Topic id -> name, as last found."""
        self._listing = threading.Lock()
        """Held while the served topics are looked up."""
        self._listed: tuple[float, list[Any]] = (-1.0, [])
        """When the last such lookup finished, and what it made of them."""
        self._unknown: set[str] = set()
        """The names of topics that do not exist that clients asked for, as logged."""
        self._unknown_lock = threading.Lock()

    @property
    def authorizer(self) -> Authorizer | None:
        """The server's ACLs (None: none are enforced), as the last reload left them."""
        return self.server.authorizer

    def listening(self, address: str, port: int, front: FrontEnd) -> None:
        host = self.server.config.advertised or brokers.host_of(address)
        self.endpoints[front] = (host, port)
        if self.node_id >= 0:
            return
        self.address = (host, port)
        self.kafka_address = brokers.address_of(host, port)
        self.node_id = brokers.node_id(self.kafka_address)
        self.groups.start(self.kafka_address)

    # ----------------------------------------------------------------- the cluster

    def peers(self) -> dict[str, brokers.BrokerInfo]:
        """The other live daemons serving the Kafka protocol over the root, by Kafka address."""
        try:
            return {b.kafka: b for b in brokers.live(self.server.root.path) if b.kafka and b.kafka != self.kafka_address}
        except KlError as e:
            log.warning("cannot list the other daemons: %s", e)
            return {}

    def leaders(self, topic: str, count: int, peers: dict[str, brokers.BrokerInfo]) -> list[int]:
        """The node id of each partition's leader: of the live daemons that serve the topic
        (those that take produce requests, when there are any), the one ``brokers.leader``
        names, so that every daemon names the same (kl-serve(1))."""
        serving = {a: b.produce for a, b in peers.items() if brokers.serves(b, topic)}
        serving[self.kafka_address] = self.server.config.allow_produce
        pool = sorted(a for a, produce in serving.items() if produce) or sorted(serving)
        if len(pool) == 1:
            return [brokers.node_id(pool[0])] * count
        return [brokers.node_id(brokers.leader(topic, p, pool)) for p in range(count)]

    def endpoint(self, conn: Connection) -> tuple[str, int]:
        """(host, port) of this daemon at the listener ``conn`` came in on, as advertised."""
        return self.endpoints.get(conn.front, self.address)

    def nodes(self, peers: dict[str, brokers.BrokerInfo], conn: Connection) -> list[tuple[int, str, int]]:
        """(node id, host, port) of this daemon (at the listener ``conn`` came in on) and
        the other live ones serving the Kafka protocol over the root (a partition's leader
        or a group's coordinator may be one of them), this one first."""
        host, port = self.endpoint(conn)
        found = [(self.node_id, host, port)]
        for address in sorted(peers):
            reached = self.reached(peers[address], conn)
            if reached is not None:  # (one without a listener of the connection's protocol is not named, as in Kafka)
                found.append((brokers.node_id(address), *reached))
        return found

    def reached(self, peer: brokers.BrokerInfo, conn: Connection) -> tuple[str, int] | None:
        """(host, port) of another daemon's listener of the security protocol ``conn`` came
        in by (None: it has none)."""
        address = peer.kafka if peer.listeners is None else peer.listeners.get(conn.security)
        if address is None:
            return None
        host, _, port = address.rpartition(":")
        return host.strip("[]"), int(port)

    # ----------------------------------------------------------------- authorization

    def allows(self, conn: Connection, operation: str, resource_type: str, name: str, *, logged: bool = True) -> bool:
        """``Server.allows``."""
        return self.server.allows(conn, operation, resource_type, name, logged=logged)

    def allows_cluster(self, conn: Connection, operation: str, *, logged: bool = True) -> bool:
        return self.allows(conn, operation, "CLUSTER", CLUSTER_NAME, logged=logged)

    def allows_idempotent_write(self, conn: Connection) -> bool:
        """Kafka's rule for an idempotent producer's id: IDEMPOTENT_WRITE on the cluster,
        or WRITE on some topic."""
        if self.authorizer is None or self.allows_cluster(conn, "IDEMPOTENT_WRITE", logged=False):
            return True
        if self.authorizer.authorize_any(conn.principal, host_of(conn), "WRITE", "TOPIC"):
            return True
        return self.allows_cluster(conn, "IDEMPOTENT_WRITE")  # (logs the denial)

    def may_create(self, conn: Connection, topic: str) -> bool:
        """CREATE on the cluster or on the topic."""
        return self.allows_cluster(conn, "CREATE", logged=False) or self.allows(conn, "CREATE", "TOPIC", topic)

    def operations(self, conn: Connection, resource_type: str, name: str) -> set[int]:
        """The codes of the operations on the resource the principal may do (Kafka's
        "authorized operations"; every one that applies when there are no ACLs)."""
        if self.authorizer is None:
            return {OPERATIONS[op] for op in SUPPORTED[resource_type]}
        return self.authorizer.operations(conn.principal, host_of(conn), resource_type, name)

    def require(self, conn: Connection, operation: str, resource_type: str, name: str) -> None:
        """Raises ``Refused`` with the resource type's authorization error unless ``allows``."""
        if not self.allows(conn, operation, resource_type, name):
            code, text = DENIED[resource_type]
            raise Refused(code, text, logged=True)

    def require_cluster(self, conn: Connection, operation: str) -> None:
        self.require(conn, operation, "CLUSTER", CLUSTER_NAME)

    # ----------------------------------------------------------------- topics

    def served_topics(self, look: Any) -> list[Any]:
        """``look(names)`` of every served topic.  A call that comes while another one's
        lookup runs waits for it and shares what it found (clients send several Metadata
        of all topics at once on connecting: each lookup of 10,000 topics reads their
        10,000 ``topic.json``)."""
        arrived = time.monotonic()
        with self._listing:
            finished, found = self._listed
            if finished < arrived:
                found = look([n for n in self.server.root.topics() if self.server.served(n)])
                self._listed = (time.monotonic(), found)
        return found

    def checked_config(
        self, topic: str, partition: int | None = None, *, named_by: Connection | None = None, create: bool = True
    ) -> TopicConfig:
        """The topic's config after the checks every request gets.  A topic a client
        names (``named_by``) that does not exist is ``first_use``'s: created if
        ``create`` (and this daemon creates topics on first use), else logged once."""
        try:
            validate_name(topic)
        except InvalidTopicName as e:
            raise Refused(INVALID_TOPIC_EXCEPTION, str(e)) from None
        if not self.server.served(topic):
            raise Refused(TOPIC_AUTHORIZATION_FAILED, f"topic {topic} is not served here (kl serve --topics)")
        try:
            config = self.server.topic_config(topic)
        except TopicNotFound as e:
            if named_by is None or not self.first_use(named_by, topic, create):
                raise Refused(UNKNOWN_TOPIC_OR_PARTITION, str(e), logged=named_by is not None) from None
            config = self.server.topic_config(topic)
        if partition is not None and not 0 <= partition < config.partitions:
            raise Refused(
                UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic} has partitions 0 to {config.partitions - 1}, not {partition}"
            )
        return config

    def first_use(self, conn: Connection, topic: str, create: bool) -> bool:
        """A client named ``topic``, a valid name this daemon serves, which does not
        exist: create it with the root's defaults (and ``--partitions``) if ``create``
        and this daemon creates topics on first use (``kl serve --auto-create``); whether
        it exists now.  Else log the name, once."""
        config = self.server.config
        if create and config.auto_create:
            if not self.may_create(conn, topic):
                raise Refused(TOPIC_AUTHORIZATION_FAILED, DENIED["TOPIC"][1], logged=True)
            try:
                self.server.root.create_topic(topic, TopicConfig(partitions=config.default_partitions))
            except TopicExists:
                return True
            except KlError as e:
                log.warning("%s: topic %r could not be created on first use: %s", conn.peer, topic, e)
                return False
            log.info("%s: created topic %s on first use (%d partitions)", conn.peer, topic, config.default_partitions)
            return True
        with self._unknown_lock:
            told = topic in self._unknown
            if not told and len(self._unknown) < MAX_UNKNOWN:
                self._unknown.add(topic)
        if not told:
            log.warning("%s: asked for topic %r, which does not exist (kl serve --auto-create makes it)", conn.peer, topic)
        return False

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        """The name of the served topic with this id (None: none has it)."""
        name = self._names.get(topic_id)
        if name is not None:
            with contextlib.suppress(KlError):
                if topic_uuid(self.server.topic_config(name).topic_id) == topic_id:
                    return name
        self._names = {}
        for name in self.server.root.topics():
            with contextlib.suppress(KlError):
                if self.server.served(name):
                    self._names[topic_uuid(self.server.topic_config(name).topic_id)] = name
        return self._names.get(topic_id)

    # ----------------------------------------------------------------- offsets

    def message_at(self, target: Log, key: tuple[str, int], offset: int, state: PartitionState | None = None) -> Position:
        """Where the message of Kafka offset ``offset`` is (see ``Log.kafka_position``),
        from what the last fetches served where they can tell."""
        with self._resume_lock:
            known = self._resume.get((key[0], key[1], offset))
        if known is not None and (state is None or known.offset < state.log_end_offset):
            return known
        return target.kafka_position(offset, state=state)

    def remember_resume(self, key: tuple[str, int], offset: int, position: Position) -> None:
        """Remember that the message of Kafka offset ``offset`` of the partition ``key``
        (its topic's id, or name, and number) is at ``position``."""
        with self._resume_lock:
            self._resume[key[0], key[1], offset] = position
            if len(self._resume) > RESUME_CACHE:
                self._resume.popitem(last=False)


def refusal(response: Any, code: int, **fields: Any) -> Any:
    """A ``response`` (class) whose whole-request ``error_code`` is ``code``: its other
    fields the schema's defaults, or ``fields``."""
    answer = response(**fields)
    answer.error_code = code
    answer.throttle_time_ms = 0
    return answer


def check_epoch(epoch: int) -> None:
    """Raises ``Refused`` (UNKNOWN_LEADER_EPOCH) for a client's current leader epoch newer
    than ``LEADER_EPOCH``, as Kafka's leader does (KIP-320); -1 names none."""
    if epoch > LEADER_EPOCH:
        raise Refused(UNKNOWN_LEADER_EPOCH, f"leader epoch {epoch} is newer than the partition's, {LEADER_EPOCH}")


def topic_uuid(topic_id: str | None) -> uuid.UUID:
    """kl's topic id (22 characters of base64url, as Kafka writes its ids) as a UUID."""
    if not topic_id:
        return uuid.UUID(int=0)
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=="))
