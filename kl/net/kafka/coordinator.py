"""The group coordinator of ``kl serve --kafka``: Kafka's classic consumer group protocol
over kl's group files.

One daemon coordinates a group at a time: the one holding an open file description lock
on ``ROOT/.groups/.coordinators/GROUP``, a file that names that daemon's Kafka address.
FindCoordinator on any daemon takes the lock when it is free (its holder died: the
kernel, or the NFS server once the host's lease ran out, let it go) and else answers with
the address in the file, so every daemon over the root names the same coordinator.

Membership (who is in the group, its generation, the assignment the leader made) lives in
the coordinator's memory, as in Kafka's brokers: a coordinator that dies takes it along,
and the members, told UNKNOWN_MEMBER_ID by the next one, join it afresh.  Committed
offsets are kl's group offset files (``kl.registry``), so ``kl groups describe`` shows them
and ``kl groups reset`` changes them.  A commit is stored only while its member is in the
group's current generation; the coordinator checks it still holds the group's lock
(a write through the locked file, refused on NFS once its lease is gone) just before the
offset file is renamed into place.

kl's own members and Kafka clients never share a group at once.  While a group has Kafka
members, its coordinator holds a registration among the group's members (``ids/``) marked
``kafka``: a Kafka member joining a group with a live kl member is refused
(INCONSISTENT_GROUP_PROTOCOL, and a log line naming the group), as is a kl member joining
a group that has the mark (``GroupTaken``).  Each side registers before it looks for the
other, so of two that come at once at least one sees the other.

The state machine is Kafka's (GroupCoordinator.scala): Empty, PreparingRebalance (waiting
for every member to join again, at most the longest rebalance timeout), CompletingRebalance
(waiting for the leader's assignment) and Stable.  A JoinGroup or SyncGroup that has to
wait for the others is parked with the server's waiter (``GroupWait``) until its answer is
ready.  A member is removed when its session timeout passes without a word from it, or
at once when the connection it last spoke on closes without a LeaveGroup (its process
died: the kernel closed the socket), so the others take over its partitions after one of
their heartbeats.  Static membership (``group.instance.id``) is taken as dynamic
membership.  A group left empty and unasked for ``IDLE_RELEASE`` is let go.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from kl.errors import KlError, LockTimeout
from kl.log import locks
from kl.log.fsutil import ensure_dir, mount_of, open_file, storage_error
from kl.log.log import Position
from kl.net import brokers
from kl.net.kafka.errors import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    GROUP_SUBSCRIBED_TO_TOPIC,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    KAFKA_STORAGE_ERROR,
    MEMBER_ID_REQUIRED,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
    OFFSET_METADATA_TOO_LARGE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from kl.net.server import Wait
from kl.registry import (
    COORDINATORS_DIR,
    Committed,
    CorruptOffset,
    GroupNotFound,
    Offset,
    Registration,
    Registry,
    coordinator_path,
    decode_coordinator,
    encode_coordinator,
    groups,
)
from kl.registry import (
    Member as RegisteredMember,
)
from kl.topic import GROUPS_DIR, Root

log = logging.getLogger("kl.serve")

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
STATES = (EMPTY, PREPARING, COMPLETING, STABLE, DEAD)

MAX_METADATA = 4096
"""The longest commit metadata stored (Kafka's offset.metadata.max.bytes, which counts characters)."""
MIN_SESSION, MAX_SESSION = 6.0, 1800.0
"""The session timeouts a member may ask for (Kafka's group.min/max.session.timeout.ms)."""
INITIAL_DELAY = 0.5
"""How long the first rebalance of an empty group waits for more members (Kafka's
group.initial.rebalance.delay.ms, shorter): members starting together get one rebalance."""
TICK = 0.1
"""How often members' sessions and rebalances' deadlines are checked."""
HOLD = 0.5
"""A Heartbeat that comes this long or less before another member's session runs out is
answered once that is decided: members beat in step (each starts its heartbeat timer from
the same SyncGroup answer), so the others' heartbeats come just before a stopped member's
session ends, and they would learn of the rebalance a whole heartbeat interval later."""
IDLE_RELEASE = 300.0
"""An empty group nobody asked about for this long is let go (its lock and memory)."""
BEAT_EVERY = 1.0
"""How often the coordinator moves its group registrations' heartbeats and checks it still
holds its coordinator locks."""


class GroupWait(Wait):
    """A JoinGroup or SyncGroup waiting for the rest of its group: over once ``result`` is set."""

    __slots__ = ("result",)

    def __init__(self, deadline: float):
        super().__init__([], 1, deadline, None)
        self.result: JoinResult | SyncResult | None = None

    def ready(self, now: float) -> bool:
        return self.result is not None or now >= self.deadline


class JoinResult(NamedTuple):
    error: int
    member_id: str = ""
    generation: int = -1
    protocol: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = []
    """For the leader: every member's (id, instance id, metadata of the chosen protocol)."""


class SyncResult(NamedTuple):
    error: int
    protocol: str | None = None
    assignment: bytes = b""


@dataclass(eq=False)
class Member:
    id: str
    instance_id: str | None
    client_id: str
    host: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    expires: float
    """When the member is removed unless it is heard from (monotonic)."""
    conn: object
    """The connection of its last JoinGroup, SyncGroup or Heartbeat."""
    assignment: bytes = b""
    join: GroupWait | None = None
    """Its JoinGroup, while it waits for the rebalance to complete."""
    sync: GroupWait | None = None
    """Its SyncGroup, while it waits for the leader's assignment."""


@dataclass(eq=False)
class Group:
    name: str
    registry: Registry
    lock: threading.Lock = field(default_factory=threading.Lock)
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, float] = field(default_factory=dict)
    """Member ids given out with MEMBER_ID_REQUIRED, not joined yet -> when they lapse."""
    not_before: float = 0.0
    """The rebalance under way completes no sooner (the initial delay)."""
    deadline: float = 0.0
    """The rebalance under way completes by then, without the members not back."""
    registration: Registration | None = None
    """Its mark among the group's members while it has Kafka members."""
    used: float = field(default_factory=time.monotonic)
    """When a request last named it."""


class Described(NamedTuple):
    error: int
    state: str
    protocol_type: str
    protocol: str
    members: list[tuple[str, str | None, str, str, bytes, bytes]]
    """(member id, instance id, client id, client host, metadata, assignment)."""


class Coordinator:
    """The groups this daemon coordinates, and the lookup of the others' coordinators."""

    def __init__(self, root: Root, wake: Callable[[], None], rebalanced: Callable[[], None] = lambda: None):
        self.root = root
        self._wake = wake
        """Tells the server's waiter to look at its parked requests now."""
        self._rebalanced = rebalanced
        """Called as each rebalance starts (the daemon counts them)."""
        self.address = ""
        """This daemon's Kafka address, ``HOST:PORT`` (set once it listens)."""
        self._dir = os.path.join(root.path, GROUPS_DIR, COORDINATORS_DIR)
        self._groups: dict[str, Group] = {}
        self._held: dict[str, int] = {}
        """Group -> the descriptor holding its coordinator lock."""
        self._lock = threading.Lock()
        """Guards ``_groups`` and ``_held``."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hung_up: queue.SimpleQueue[object] = queue.SimpleQueue()
        """Connections closed since the last tick."""
        self._nfs: bool | None = None
        self._resigned = False
        """The daemon is stopping: it coordinates no group any more (``resign``)."""

    def start(self, address: str) -> None:
        self.address = address
        self._thread = threading.Thread(target=self._run, name="kl-serve-groups", daemon=True)
        self._thread.start()

    def resign(self) -> None:
        """The daemon is stopping: give up every group at once, as Kafka's coordinator
        unloads a group it no longer owns (its waiting JoinGroup and SyncGroup answered
        NOT_COORDINATOR, and every later request about it too), so that its members find
        the next coordinator, which takes the group's lock, and join it there."""
        with self._lock:
            self._resigned = True
            names = list(self._held)
            for name in names:
                self._drop(name, NOT_COORDINATOR)
        if names:
            log.info("stopping: no longer the coordinator of %s (members are told NOT_COORDINATOR)", ", ".join(names))

    def close(self) -> None:
        """Stop coordinating: leave every group's registration and lock."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for name in list(self._held):
                self._drop(name)

    # ----------------------------------------------------------------- coordinators

    def coordinator(self, name: str) -> str | None:
        """``HOST:PORT`` of the group's coordinator: this daemon if nobody holds the group's
        lock (it takes it); None while the holder has not written its address yet."""
        with self._lock:
            if name in self._held:
                return self.address
            if self._resigned:
                return None
            path = coordinator_path(self.root.path, name)
            ensure_dir(self._dir)
            try:
                fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            except OSError as e:
                raise storage_error(e, "open", path) from None
            try:
                locks.lock_file(fd, path, 0)
            except LockTimeout:
                try:
                    record = decode_coordinator(os.pread(fd, 512, 0))
                finally:
                    os.close(fd)
                return None if record is None else record[0]
            except BaseException:
                os.close(fd)
                raise
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, encode_coordinator(self.address, 0), 0)
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                raise storage_error(e, "write", path) from None
            self._held[name] = fd
            self._groups[name] = Group(name, Registry(self.root.path, name))
            log.info("coordinating group %s", name)
            return self.address

    def coordinated_elsewhere(self, name: str) -> bool:
        """Whether another daemon holds the group's coordinator lock."""
        with self._lock:
            if name in self._held:
                return False
        path = coordinator_path(self.root.path, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return locks.locked_elsewhere(fd, path)
        except KlError:
            return False
        finally:
            os.close(fd)

    def count(self, state: str) -> int:
        """How many of the groups coordinated here are in ``state`` (``STATES``)."""
        with self._lock:
            return sum(1 for group in self._groups.values() if group.state == state)

    def _group(self, name: str) -> Group | None:
        with self._lock:
            group = self._groups.get(name)
        if group is not None:
            group.used = time.monotonic()
        return group

    def _holds(self, name: str) -> None:
        """Raise ``_Lost`` unless this daemon still holds the group's lock: a write through
        the locked file (its record, the members' longest session timeout in it), which NFS
        refuses once the host's lease ran out."""
        fd, group = self._held.get(name), self._groups.get(name)
        if fd is None or group is None:
            raise _Lost(name)
        session = max((m.session_timeout for m in list(group.members.values())), default=0.0)
        try:
            os.pwrite(fd, encode_coordinator(self.address, round(session * 1000)), 0)
            if self._nfs is None:
                self._nfs = mount_of(self._dir)[1].startswith("nfs")
            if self._nfs:
                os.fsync(fd)
        except OSError as e:
            raise _Lost(f"{name}: {os.strerror(e.errno) if e.errno else e}") from None

    def _drop(self, name: str, sync_error: int = REBALANCE_IN_PROGRESS) -> None:
        """Forget a group (called with ``_lock``): answer its waiting members (a JoinGroup
        NOT_COORDINATOR, a SyncGroup ``sync_error``), leave its registration, let its lock go."""
        group = self._groups.pop(name, None)
        if group is not None:
            with group.lock:
                for member in group.members.values():
                    _answer(member, JoinResult(NOT_COORDINATOR, member.id), SyncResult(sync_error))
                group.members.clear()
                self._unregister(group)
        fd = self._held.pop(name, None)
        if fd is not None:
            os.close(fd)
        self._wake()

    # ----------------------------------------------------------------- membership

    def join(
        self,
        name: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        host: str,
        session_ms: int,
        rebalance_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        ids_first: bool,
        conn: object,
    ) -> JoinResult | GroupWait:
        """A JoinGroup: its answer, or the wait for it.  ``ids_first``: a new member is
        given its id and asked to join again with it (JoinGroup v4 on)."""
        if not name:
            return JoinResult(INVALID_GROUP_ID, member_id)
        group = self._group(name)
        if group is None:
            return JoinResult(NOT_COORDINATOR, member_id)
        session, rebalance = session_ms / 1000, max(session_ms, rebalance_ms) / 1000
        if not MIN_SESSION <= session <= MAX_SESSION:
            return JoinResult(INVALID_SESSION_TIMEOUT, member_id)
        if not protocol_type or not protocols:
            return JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)
        now = time.monotonic()
        with group.lock:
            if group.members and (protocol_type != group.protocol_type or not _common(list(group.members.values()), protocols)):
                return JoinResult(INCONSISTENT_GROUP_PROTOCOL, member_id)
            if member_id and member_id not in group.members and member_id not in group.pending:
                return JoinResult(UNKNOWN_MEMBER_ID, member_id)
            if group.registration is None:
                error = self._register(group)
                if error:
                    return JoinResult(error, member_id)
            if not member_id:
                member_id = f"{client_id}-{uuid.uuid4()}"
                if ids_first:
                    group.pending[member_id] = now + session
                    return JoinResult(MEMBER_ID_REQUIRED, member_id)
            group.pending.pop(member_id, None)
            member = group.members.get(member_id)
            if member is None:
                member = Member(member_id, instance_id, client_id, host, session, rebalance, protocol_type, protocols, now, conn)
                group.members[member_id] = member
                log.info("group %s: %s joins (%s)", name, member_id, host)
                self._note(name)
            else:
                member.protocols, member.session_timeout, member.rebalance_timeout = protocols, session, rebalance
                member.conn = conn
            if group.protocol_type is None:
                group.protocol_type = protocol_type
            if member.join is not None:
                member.join.result = JoinResult(REBALANCE_IN_PROGRESS, member_id)  # its earlier JoinGroup
            member.join = wait = GroupWait(now + rebalance + 1)
            if group.state != PREPARING:
                self._prepare(group, now, f"{member_id} joins")
            wait.deadline = max(wait.deadline, group.deadline + 1)  # others may take longer to come back
            self._complete(group, now)
            if isinstance(wait.result, JoinResult):
                return wait.result
            return wait

    def sync(
        self,
        name: str,
        generation: int,
        member_id: str,
        protocol_type: str | None,
        protocol: str | None,
        assignments: dict[str, bytes],
        conn: object,
    ) -> SyncResult | GroupWait:
        """A SyncGroup: its answer, or the wait for the leader's."""
        if not name:
            return SyncResult(INVALID_GROUP_ID)
        group = self._group(name)
        if group is None:
            return SyncResult(NOT_COORDINATOR)
        now = time.monotonic()
        with group.lock:
            member = group.members.get(member_id)
            if member is None:
                return SyncResult(UNKNOWN_MEMBER_ID)
            if generation != group.generation:
                return SyncResult(ILLEGAL_GENERATION)
            if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol is not None and protocol != group.protocol
            ):
                return SyncResult(INCONSISTENT_GROUP_PROTOCOL)
            if group.state == PREPARING:
                return SyncResult(REBALANCE_IN_PROGRESS)
            member.expires, member.conn = now + member.session_timeout, conn
            if group.state == STABLE:
                return SyncResult(NONE, group.protocol, member.assignment)
            if member_id == group.leader:
                for other in group.members.values():
                    other.assignment = assignments.get(other.id, b"")
                    if other.sync is not None:
                        other.sync.result = SyncResult(NONE, group.protocol, other.assignment)
                        other.sync = None
                group.state = STABLE
                log.info("group %s: generation %d is stable, %d members", name, group.generation, len(group.members))
                self._wake()
                return SyncResult(NONE, group.protocol, member.assignment)
            if member.sync is not None:
                member.sync.result = SyncResult(REBALANCE_IN_PROGRESS)
            member.sync = wait = GroupWait(now + member.session_timeout + 1)
            return wait

    def heartbeat(self, name: str, generation: int, member_id: str, conn: object, hold: bool = True) -> int | GroupWait:
        """A Heartbeat: its error code, or (``hold``) the wait for another member's session
        about to run out."""
        if not name:
            return INVALID_GROUP_ID
        group = self._group(name)
        if group is None:
            return NOT_COORDINATOR
        with group.lock:
            member = group.members.get(member_id)
            if member is None:
                return UNKNOWN_MEMBER_ID
            if generation != group.generation:
                return ILLEGAL_GENERATION
            now = time.monotonic()
            member.expires, member.conn = now + member.session_timeout, conn
            self._expire(group, now)  # now, not at the next tick
            if group.state == PREPARING:
                return REBALANCE_IN_PROGRESS
            if hold and group.state == STABLE:
                ending = min((m.expires for m in group.members.values() if m is not member), default=now + HOLD + 1)
                if ending <= now + HOLD:
                    return GroupWait(ending + 2 * TICK)
            return NONE

    def hung_up(self, conn: object) -> None:
        """A connection closed: the members it spoke for are removed at the next tick (their
        process died, and the kernel closed its socket: no need to wait out the session)."""
        self._hung_up.put(conn)

    def leave(self, name: str, member_ids: list[str]) -> tuple[int, list[int]]:
        """A LeaveGroup: the request's error, and each member's."""
        if not name:
            return INVALID_GROUP_ID, [INVALID_GROUP_ID] * len(member_ids)
        group = self._group(name)
        if group is None:
            return NOT_COORDINATOR, [NOT_COORDINATOR] * len(member_ids)
        now = time.monotonic()
        codes = []
        with group.lock:
            for member_id in member_ids:
                if group.pending.pop(member_id, None) is not None:
                    codes.append(NONE)
                elif member_id in group.members:
                    self._remove(group, group.members[member_id], now, "left")
                    codes.append(NONE)
                else:
                    codes.append(UNKNOWN_MEMBER_ID)
            self._settle(group, now)
        return NONE, codes

    # ----------------------------------------------------------------- offsets

    def commit(
        self, name: str, generation: int, member_id: str, offsets: list[tuple[str, int, Position | int, str, str]]
    ) -> list[int]:
        """An OffsetCommit of ``offsets`` ((topic, partition, position, topic id, metadata),
        or an error code in place of the position): each one's error code."""
        group = self._group(name)
        if group is None:
            return [NOT_COORDINATOR] * len(offsets)
        with group.lock:
            error = self._may_commit(group, generation, member_id)
            if error:
                return [error] * len(offsets)
            if member_id:
                member = group.members[member_id]
                member.expires = time.monotonic() + member.session_timeout
            codes = []
            stored: list[Offset] = []
            for topic, partition, position, topic_id, metadata in offsets:
                if isinstance(position, int):
                    codes.append(position)
                elif len(metadata) > MAX_METADATA:
                    codes.append(OFFSET_METADATA_TOO_LARGE)
                else:
                    codes.append(NONE)
                    stored.append(Offset(topic, partition, position, topic_id, metadata))
            try:  # one append a topic
                group.registry.write_offsets(stored, member_id or "kafka", before_write=lambda: self._holds(name))
            except _Lost as e:
                log.warning("group %s: lost its coordinator lock (%s): its commits are refused", name, e)
                return [NOT_COORDINATOR if code == NONE else code for code in codes]
            except KlError as e:
                log.warning("group %s: a commit of %d offsets refused: %s", name, len(stored), e)
                return [KAFKA_STORAGE_ERROR if code == NONE else code for code in codes]
            return codes

    def _may_commit(self, group: Group, generation: int, member_id: str) -> int:
        """Why a commit by ``member_id`` in ``generation`` is refused (NONE: it is not).
        One from outside the group (an ``assign()`` consumer: no member id, generation -1)
        is taken only while the group has no members, of either kind."""
        if not member_id and generation < 0:
            if group.members:
                return UNKNOWN_MEMBER_ID
            native = _kl_members(group.registry)
            if native:
                log.warning("group %s: a commit from outside the group refused: kl members live (%s)", group.name, native[0].id)
                return UNKNOWN_MEMBER_ID
            return NONE
        if member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ILLEGAL_GENERATION
        if group.state == COMPLETING:
            return REBALANCE_IN_PROGRESS
        return NONE

    def committed(self, name: str, topic: str, partition: int, topic_id: str) -> tuple[Committed | None, int]:
        """What is committed for the partition (None: nothing, or an offset of an earlier
        creation of the topic), and an error code for a damaged offset file."""
        try:
            found = Registry(self.root.path, name).committed(topic, partition)
        except CorruptOffset as e:
            log.warning("group %s: %s", name, e)
            return None, KAFKA_STORAGE_ERROR
        if found is None:
            return None, NONE
        if found.topic_id and topic_id and found.topic_id != topic_id:
            log.warning(
                "group %s: the committed offset of %s/%d is of the topic before it was deleted and created again:"
                " it counts as never committed",
                name,
                topic,
                partition,
            )
            return None, NONE
        return found, NONE

    def committed_partitions(self, name: str) -> list[tuple[str, int]]:
        """Every (topic, partition) with an offset file in the group, sorted."""
        return Registry(self.root.path, name).partitions("offsets")

    # ----------------------------------------------------------------- admin

    def delete(self, name: str) -> int:
        """DeleteGroups of one group: its offsets and files go, unless it has members of
        either kind (NON_EMPTY_GROUP)."""
        group = self._group(name)
        if group is None and self.coordinated_elsewhere(name):
            return NOT_COORDINATOR
        with group.lock if group is not None else contextlib.nullcontext():
            if group is not None and (group.members or group.pending):
                return NON_EMPTY_GROUP
            registry = Registry(self.root.path, name)
            if not registry.exists():
                return GROUP_ID_NOT_FOUND
            if registry.members():
                return NON_EMPTY_GROUP
            try:
                registry.delete()
            except GroupNotFound:
                return GROUP_ID_NOT_FOUND
            except KlError as e:
                log.warning("group %s: cannot delete it: %s", name, e)
                return KAFKA_STORAGE_ERROR
            log.info("group %s deleted", name)
            return NONE

    def delete_offsets(self, name: str, topics: dict[str, list[int]]) -> tuple[int, dict[str, int]]:
        """OffsetDelete of the partitions of ``topics``: the request's error, and each
        topic's (its partitions share it).  Kafka's rules: refused for a group unknown
        (GROUP_ID_NOT_FOUND), or with members of another protocol than "consumer"
        (NON_EMPTY_GROUP); a topic its members subscribe to keeps its offsets
        (GROUP_SUBSCRIBED_TO_TOPIC), the others' are forgotten."""
        if not name:
            return INVALID_GROUP_ID, {}
        group = self._group(name)
        if group is None and self.coordinated_elsewhere(name):
            return NOT_COORDINATOR, {}
        with group.lock if group is not None else contextlib.nullcontext():
            registry = Registry(self.root.path, name)
            if not registry.exists():
                return GROUP_ID_NOT_FOUND, {}
            if group is not None and group.members:
                if group.protocol_type != "consumer":
                    return NON_EMPTY_GROUP, {}
                subscribed = _subscribed(group, topics)
            else:
                native = _kl_members(registry)
                subscribed = {t for t in topics if any(m.subscribes(t) for m in native)}
            codes = {t: GROUP_SUBSCRIBED_TO_TOPIC if t in subscribed else NONE for t in topics}
            before = (lambda: self._holds(name)) if group is not None else None
            for topic, partitions in topics.items():
                if codes[topic]:
                    continue
                try:
                    registry.forget_offsets(topic, partitions, "kafka", before_write=before)
                except _Lost as e:
                    log.warning("group %s: lost its coordinator lock (%s): its offsets stay", name, e)
                    codes[topic] = NOT_COORDINATOR
                except KlError as e:
                    log.warning("group %s: the offsets of %s stay: %s", name, topic, e)
                    codes[topic] = KAFKA_STORAGE_ERROR
                else:
                    log.info("group %s: committed offsets of %s deleted (partitions %s)", name, topic, partitions)
            return NONE, codes

    def describe(self, name: str) -> Described:
        """The group as DescribeGroups tells it: its Kafka members', or else from its files
        (kl members, if it has any, as the members of a "kl" protocol)."""
        group = self._group(name)
        if group is None and self.coordinated_elsewhere(name):
            return Described(NOT_COORDINATOR, DEAD, "", "", [])
        if group is None or not (group.members or group.pending):
            registry = Registry(self.root.path, name)
            if not registry.exists():
                return Described(NONE, DEAD, "", "", [])
            native = _kl_members(registry)
            members: list[tuple[str, str | None, str, str, bytes, bytes]] = [(m.id, None, "kl", m.host, b"", b"") for m in native]
            return Described(NONE, STABLE if native else EMPTY, "consumer", "kl" if native else "", members)
        with group.lock:
            members = [
                (m.id, m.instance_id, m.client_id, m.host, dict(m.protocols).get(group.protocol or "", b""), m.assignment)
                for m in group.members.values()
            ]
            return Described(NONE, group.state, group.protocol_type or "", group.protocol or "", members)

    def listed(self) -> list[tuple[str, str, str]]:
        """(group, protocol type, state) of the groups coordinated here and, on the live
        daemon of the lowest node id, of those no daemon coordinates: a client asking every
        daemon (as admin tools do) hears of each group once."""
        found = []
        unclaimed: bool | None = None
        for name in groups(self.root.path):
            group = self._group(name)
            if group is not None and group.members:
                found.append((name, group.protocol_type or "consumer", group.state))
                continue
            if unclaimed is None:
                unclaimed = self._lists_unclaimed()
            if group is not None or (unclaimed and not self.coordinated_elsewhere(name)):
                found.append((name, "consumer", self.describe(name).state))
        return found

    def _lists_unclaimed(self) -> bool:
        mine = brokers.node_id(self.address)
        try:
            return all(mine <= brokers.node_id(b.kafka) for b in brokers.live(self.root.path) if b.kafka)
        except KlError:
            return True

    # ----------------------------------------------------------------- rebalances

    def _register(self, group: Group) -> int:
        """Mark the group as having Kafka members; an error code when it cannot (kl
        members live, or the root refuses)."""
        try:
            registration = group.registry.register({"kafka": self.address})
        except KlError as e:
            log.warning("group %s: cannot register its Kafka members: %s", group.name, e)
            return COORDINATOR_NOT_AVAILABLE
        try:
            native = _kl_members(group.registry)
        except KlError as e:
            registration.close()
            log.warning("group %s: cannot list its members: %s", group.name, e)
            return COORDINATOR_NOT_AVAILABLE
        if native:
            registration.close()
            log.warning(
                "group %s: a Kafka client cannot join: kl members live (%s, kl consume --group); a group is either kl's"
                " or Kafka clients'",
                group.name,
                native[0].id,
            )
            return INCONSISTENT_GROUP_PROTOCOL
        group.registration = registration
        return NONE

    def _unregister(self, group: Group) -> None:
        if group.registration is not None:
            group.registration.close()
            group.registration = None
            self._note(group.name)

    def _note(self, name: str) -> None:
        """Write the group's coordinator record now (its members changed), not at the next beat."""
        with contextlib.suppress(_Lost):
            self._holds(name)

    def _prepare(self, group: Group, now: float, why: str) -> None:
        """Start a rebalance: members waiting for an assignment are told to join again."""
        if group.state == EMPTY:
            group.not_before = now + INITIAL_DELAY
        group.state = PREPARING
        group.deadline = now + max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        for member in group.members.values():
            _answer(member, None, SyncResult(REBALANCE_IN_PROGRESS))
        log.info("group %s: rebalancing (generation %d): %s", group.name, group.generation, why)
        self._rebalanced()
        self._wake()

    def _complete(self, group: Group, now: float) -> None:
        """End the rebalance under way once every member joined again (or its time is up,
        without those not back): the next generation; the leader is given the members."""
        if group.state != PREPARING or now < group.not_before:
            return
        late = [m for m in group.members.values() if m.join is None]
        if (late or group.pending) and now < group.deadline:
            return
        for member in late:
            self._remove(group, member, now, "did not join the rebalance in time")
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.protocol_type, group.leader = EMPTY, None, None, None
            if not group.pending:
                self._unregister(group)
            return
        members = list(group.members.values())
        group.protocol = _choose(members)
        if group.leader not in group.members:
            group.leader = members[0].id
        group.state = COMPLETING
        listed = [(m.id, m.instance_id, dict(m.protocols)[group.protocol]) for m in members]
        for member in members:
            member.expires = now + member.session_timeout
            member.assignment = b""
            result = JoinResult(
                NONE, member.id, group.generation, group.protocol, group.leader, listed if member.id == group.leader else []
            )
            _answer(member, result, None)
        log.info("group %s: generation %d, %d members, leader %s", group.name, group.generation, len(members), group.leader)
        self._wake()

    def _remove(self, group: Group, member: Member, now: float, why: str) -> None:
        del group.members[member.id]
        _answer(member, JoinResult(UNKNOWN_MEMBER_ID, member.id), SyncResult(UNKNOWN_MEMBER_ID))
        log.info("group %s: %s %s", group.name, member.id, why)
        if group.state in (STABLE, COMPLETING):
            self._prepare(group, now, f"{member.id} {why}")

    def _settle(self, group: Group, now: float) -> None:
        """After members left: complete the rebalance if it waited only for them; an
        empty group leaves its registration."""
        if group.state == PREPARING:
            self._complete(group, now)
        if not group.members and not group.pending and group.state != PREPARING:
            group.state = EMPTY
            self._unregister(group)

    def _run(self) -> None:
        """Expire members and pending ids past their time, end rebalances past their
        deadline; every ``BEAT_EVERY``, beat the registrations and check the locks."""
        next_beat = 0.0
        while not self._stop.wait(TICK):
            now = time.monotonic()
            beat = now >= next_beat
            if beat:
                next_beat = now + BEAT_EVERY
            with self._lock:
                held = list(self._groups.values())
            gone: list[object] = []
            with contextlib.suppress(queue.Empty):
                while True:
                    gone.append(self._hung_up.get_nowait())
            for group in held:
                if beat:
                    with self._lock:
                        if group.state == EMPTY and not group.pending and now - group.used > IDLE_RELEASE:
                            self._drop(group.name)  # nobody asked for it in a while: its lock goes
                            continue
                        try:
                            self._holds(group.name)
                        except _Lost as e:
                            log.warning("group %s: lost its coordinator lock (%s): no longer its coordinator", group.name, e)
                            self._drop(group.name)
                            continue
                self._check(group, now, beat, gone)

    def _check(self, group: Group, now: float, beat: bool, gone: list[object]) -> None:
        with group.lock:
            for member in [m for m in group.members.values() if any(m.conn is conn for conn in gone)]:
                self._remove(group, member, now, "hung up without leaving the group")
            for member_id, lapse in list(group.pending.items()):
                if now >= lapse:
                    del group.pending[member_id]
            self._expire(group, now)
            self._settle(group, now)
            if beat and group.registration is not None:
                with contextlib.suppress(KlError):
                    group.registration.beat()

    def _expire(self, group: Group, now: float) -> None:
        """Remove the members past their session timeout (called with the group's lock)."""
        for member in list(group.members.values()):
            if member.join is None and member.sync is None and now >= member.expires:
                self._remove(group, member, now, f"missed its session timeout ({member.session_timeout:g} s)")


class _Lost(Exception):
    """This daemon no longer holds a group's coordinator lock."""


def _answer(member: Member, join: JoinResult | None, sync: SyncResult | None) -> None:
    """Answer the member's waiting JoinGroup with ``join`` and its SyncGroup with ``sync``
    (None: leave it waiting)."""
    if join is not None and member.join is not None:
        member.join.result, member.join = join, None
    if sync is not None and member.sync is not None:
        member.sync.result, member.sync = sync, None


def _kl_members(registry: Registry) -> list[RegisteredMember]:
    """The group's live kl members (``kl consume --group``), not its Kafka clients' mark."""
    return [m for m in registry.members() if "kafka" not in m.subscription]


def _subscribed(group: Group, topics: dict[str, list[int]]) -> set[str]:
    """Those of ``topics`` the group's members subscribe to (in their subscriptions of the
    group's protocol); all of them where one cannot be read, as Kafka takes it."""
    found: set[str] = set()
    for member in group.members.values():
        try:
            found.update(ConsumerProtocolSubscription.decode(dict(member.protocols)[group.protocol or ""]).topics)
        except (KeyError, ValueError, struct.error):  # (no protocol chosen yet, or not a subscription)
            return set(topics)
    return found & set(topics)


def _common(members: list[Member], protocols: list[tuple[str, bytes]]) -> set[str]:
    """The protocols every member (and a newcomer offering ``protocols``) supports."""
    common = {name for name, _ in protocols}
    for member in members:
        common &= {name for name, _ in member.protocols}
    return common


def _choose(members: list[Member]) -> str:
    """The protocol (assignor) for the generation: each member votes for the first of its
    own it shares with all; the most votes win (ties: the one named first)."""
    common = _common(members, members[0].protocols)
    votes = collections.Counter(next(name for name, _ in m.protocols if name in common) for m in members)
    return max(votes, key=lambda name: (votes[name], -[n for n, _ in members[0].protocols].index(name)))
