"""A consumer group's registry: the seed's ZooKeeper nodes, as files under the root.

    ROOT/.groups/GROUP/ids/HOST:UUID       a live member: its registration, locked while it lives
    ROOT/.groups/GROUP/claims/TOPIC        who owns each partition of the topic, and the claim's generation:
                                           partition P's record is the 128 bytes from P x 128, locked
                                           while a claim, release or commit of P runs
    ROOT/.groups/GROUP/commits/TOPIC       the committed positions: one checksummed JSON line per commit
                                           of a partition, its last line the one that counts
    ROOT/.groups/GROUP/offsets/TOPIC/P     a committed position of a kl before commits files (text,
                                           checksummed), read where commits/TOPIC has no line of P
    ROOT/.groups/GROUP/id                  the group's id, where GROUP is a digest (below)
    ROOT/.groups/.coordinators/GROUP       the group's Kafka coordinator (kl serve --kafka), locked
                                           while it coordinates: its address and its members'
                                           longest session timeout, rewritten every second

A group id is any string (Kafka's rule); GROUP is its name on the file system
(``group_name``): the id itself when it is 1-249 characters from A-Z a-z 0-9 . _ - not
starting with a dot (every name an older kl accepted), else its UTF-8 bytes with each one
outside A-Z a-z 0-9 . _ - (and a leading dot) written ``%XX`` (``app:v1`` is ``app%3Av1``;
the empty id is ``%``); where that is longer than 249 bytes, its first bytes, ``%~`` and
the SHA-256 of the id, with the id in ``GROUP/id``.  No name made so starts with a dot
or holds a ``/``, a control character or a NUL, and no two ids share one.

Two files per topic, whatever its number of partitions: a member joining 1,000 partitions
claims them through one open file and commits where each starts with one append and one
fsync (a file per partition cost it about 3,000 file creations).

A committed position is a byte offset and, inside a compressed batch, how many of the
batch's inner messages were consumed (``Position``), with the topic id of the creation of
the topic it was read from: an offset of another creation counts as never committed.

A member is live while it holds an open file description lock on its registration file
(the kernel drops it when the process dies; an NFS server when the host's lease runs out)
and while its heartbeat, a counter it rewrites in that file every poll interval, keeps
moving.  A member that stops beating (SIGSTOP, a host that hangs) is expired by the others
after ``session_timeout`` seconds of their own clocks, even though its lock is still held:
no clocks are compared between hosts.  Whoever finds a registration whose lock is free
deletes it.

Ownership is the owner record, changed under the partition's lock: a claim succeeds
when the record names no member, this member, or one that is not live; it writes the
next generation.  A commit (under the same lock, and the commits file's) is accepted only
while the record still names the committing member and its generation, so a member that
was expired and replaced cannot commit over its successor (``NotOwner``).  Commits are
appended (``O_APPEND``) and fsynced; once the file is ``COMPACT_RATIO`` times larger than
its last lines it is replaced by them (written aside, fsynced, renamed over it).

A member waits for a lock only ``lock_timeout`` (a small share of its session timeout),
then gets ``LockTimeout`` and tries again later, so its heartbeat never waits behind a
lock held by another process.  A process stopped while holding a lock (SIGSTOP, a hung
host) would block the partition for good: its caller may ``force`` a claim, release or
commit, which then goes on without the lock once ``lock_timeout`` passed (the group's
members do so once the lock's holder can be taken for a member they expired, see
kl/group.py).  A holder woken up later finishes the one write it was making: an owner
record another member's claim replaces, or an append (at the end of the file, whoever
wrote since) that at worst sets a partition back to where that holder had read, so
messages come again and none is lost.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kl.errors import CorruptState, InvalidConfig, KlError, LockTimeout, StorageError
from kl.log import locks
from kl.log.fsutil import (
    ensure_dir,
    file_time_ns,
    fsync_dir,
    list_dir,
    mount_of,
    nfs_locking_problem,
    open_file,
    storage_error,
    write_all,
    write_atomic,
)
from kl.log.log import Position
from kl.topic import GROUPS_DIR, validate_name

log = logging.getLogger(__name__)

RELEASED = "-"
CLAIMS, COMMITS, LEGACY_OFFSETS = "claims", "commits", "offsets"
SLOT = 128
"""Bytes of an owner record in a claims file (a member id is at most 101)."""
COMMITS_LOCK = 1 << 40
"""The byte of a claims file locked while a commit appends to the topic's commits file."""
COMPACT_AT, COMPACT_RATIO = 1 << 16, 4
"""A commits file is compacted once past ``COMPACT_AT`` bytes and ``COMPACT_RATIO`` times its last lines."""
OWNERS_DURABLE = False
"""Owner records are written in place but not fsynced (a member joining 1,000 partitions
would spend most of its join on fsyncs).  A record only matters while the member it names lives: the crash that could lose
it or leave it empty ends every process of the machine whose disk holds it (over NFS, the
close already put it on the server), and a record lost or empty reads as released, in
generation 0, which no member still running holds.  Offsets stay durable."""
BEAT = re.compile(rb"beat ([0-9]{16})\n")
BEAT_AT, BEAT_WIDTH = 5, 16


class NotOwner(KlError):
    """A commit or claim by a member that no longer owns the partition (a stale generation)."""


class CorruptOffset(CorruptState):
    """A committed offset file is damaged: ``path`` and ``reason`` say which and how."""

    def __init__(self, message: str, *, path: str, reason: str):
        super().__init__(message)
        self.path, self.reason = path, reason


class GroupNotFound(KlError):
    """No group of that name under the root."""


class GroupTaken(KlError):
    """A kl member cannot join a group whose members are Kafka clients (through ``kl serve
    --kafka``), nor they one with kl members: a group is either kind's at a time."""


class GroupActive(KlError):
    """An admin change (reset, delete, import) refused while the group has live members."""


class InvalidImport(KlError):
    """A line of offsets to import is malformed, or names a partition or offset that does not exist."""


MAX_NAME = 249
"""The longest group name stored as it is (the longest topic name); longer ones are digests."""
DIGEST_PREFIX = 150
"""Bytes of a long group name kept before its digest."""
ID_FILE = "id"
_KEPT = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_PLAIN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,248}")
"""The group names of an older kl (the rules of topic names): stored as they are."""


def group_name(group: str) -> str:
    """The name of the group ``group``'s files on the file system (see the module's
    docstring).  Raises ``InvalidConfig`` for an id that is not a string of Unicode
    characters (a lone surrogate has no UTF-8)."""
    if not isinstance(group, str):
        raise InvalidConfig(f"a group id is a string, not {group!r}")
    try:
        data = group.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidConfig(f"group id {group!r} is not valid Unicode text") from None
    if _PLAIN.fullmatch(group):
        return group
    if not data:
        return "%"
    name = "".join(chr(b) if b in _KEPT and not (i == 0 and b == ord(".")) else f"%{b:02X}" for i, b in enumerate(data))
    if len(name) <= MAX_NAME:
        return name
    prefix = name[:DIGEST_PREFIX]
    cut = prefix.rfind("%", len(prefix) - 2)
    return f"{prefix[:cut] if cut >= 0 else prefix}%~{hashlib.sha256(data).hexdigest()}"


def group_of(root_path: str, name: str) -> str | None:
    """The id of the group stored under ``name``, or None where ``name`` is no group's
    (kl's own files, names no id is stored under, a digest whose id file is missing)."""
    if name.startswith("."):
        return None
    if "%~" in name:
        try:
            with open(os.path.join(root_path, GROUPS_DIR, name, ID_FILE), "rb") as f:
                group = f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    elif name == "%":
        group = ""
    else:
        parts = re.split(r"%([0-9A-F]{2})", name)  # text, escaped byte, text, ...
        try:
            group = b"".join(bytes.fromhex(p) if i % 2 else p.encode("ascii") for i, p in enumerate(parts)).decode("utf-8")
        except ValueError:  # (UnicodeError is one)
            return None
    return group if group_name(group) == name else None


@dataclass(frozen=True)
class Member:
    """A registration as read from its file."""

    id: str
    host: str
    pid: int
    since_ms: int
    subscription: dict[str, object]
    """``{"topics": [...]}`` or ``{"pattern": REGEX, "exclude": REGEX|None}``; or, for a
    group's Kafka clients (registered by their coordinator), ``{"kafka": "HOST:PORT"}``."""
    beat: int

    def subscribes(self, topic: str) -> bool:
        return subscribes(self.subscription, topic)


def subscribes(subscription: Mapping[str, object], topic: str) -> bool:
    """Whether a subscription (``{"topics": [...]}`` or ``{"pattern": ..., "exclude": ...}``) takes ``topic``."""
    topics = subscription.get("topics")
    if isinstance(topics, list):
        return topic in topics
    pattern, exclude = subscription.get("pattern"), subscription.get("exclude")
    if not isinstance(pattern, str) or not re.fullmatch(pattern, topic):
        return False
    return not (isinstance(exclude, str) and re.fullmatch(exclude, topic))


@dataclass(frozen=True)
class Owner:
    member: str | None
    """None once released."""
    generation: int


def parse_position(text: str) -> Position | None:
    """``OFFSET`` or ``OFFSET+SKIP`` as a ``Position``; None if it is neither."""
    found = re.fullmatch(r"([0-9]+)(?:\+([0-9]+))?", text)
    return None if found is None else Position(int(found[1]), int(found[2] or 0))


class Commit(NamedTuple):
    """A position to store for a partition by its owner: :meth:`Registry.commit`'s arguments."""

    topic: str
    partition: int
    position: Position
    member: str
    generation: int
    topic_id: str = ""
    force: bool = False


class Offset(NamedTuple):
    """A position to store for a partition whoever owns it: :meth:`Registry.write_offsets`'."""

    topic: str
    partition: int
    position: Position
    topic_id: str = ""
    metadata: str = ""


@dataclass(frozen=True)
class Committed:
    offset: int
    member: str
    time_ms: int
    skip: int = 0
    """Inner messages of the compressed batch at ``offset`` already consumed."""
    topic_id: str = ""
    """The id of the topic's creation the offset is of ("": written before topic ids)."""
    metadata: str = ""
    """What the committer stored with the offset (a Kafka client's commit metadata)."""

    @property
    def position(self) -> Position:
        return Position(self.offset, self.skip)


class Registration:
    """This process's membership: the locked registration file and its heartbeat."""

    def __init__(self, fd: int, path: str, member: Member, nfs: bool):
        self.fd, self.path, self.member, self._nfs = fd, path, member, nfs
        self.beats = 0

    def beat(self) -> None:
        """Move the heartbeat on (in place, so the lock stays on the same file)."""
        self.beats += 1
        try:
            os.pwrite(self.fd, b"%016d" % (self.beats % 10**16), BEAT_AT)
            if self._nfs:
                os.fsync(self.fd)  # other hosts see it only once it reached the server
        except OSError as e:
            raise storage_error(e, "write", self.path) from None

    def close(self) -> None:
        """Leave: delete the registration, then let the lock go."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)


class Registry:
    """The files of one group.  Safe across threads and processes."""

    def __init__(self, root_path: str, group: str, *, lock_timeout: float = 10.0):
        self.name = group_name(group)
        self.group = group
        self.path = os.path.join(root_path, GROUPS_DIR, self.name)
        self.lock_timeout = lock_timeout

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def create(self, kind: str = "") -> str:
        """Make the group's directory where missing (with its id file, where its name is a
        digest), and its directory ``kind`` in it; the path of that."""
        if "%~" in self.name and not os.path.isfile(os.path.join(self.path, ID_FILE)):
            ensure_dir(self.path)
            write_atomic(os.path.join(self.path, ID_FILE), self.group.encode())
        path = os.path.join(self.path, kind) if kind else self.path
        ensure_dir(path)
        return path

    # ----------------------------------------------------------------- members

    def register(self, subscription: dict[str, object]) -> Registration:
        """Join: write ``ids/HOST:UUID``, locked before it appears under its name."""
        ids = self.create("ids")
        problem = nfs_locking_problem(ids)
        if problem is not None:
            raise StorageError(problem)
        host = socket.gethostname()
        member = Member(f"{host}:{uuid.uuid4()}", host, os.getpid(), time.time_ns() // 1_000_000, subscription, 0)
        path = os.path.join(ids, member.id)
        tmp = os.path.join(ids, f".{member.id}.tmp")
        body = {"id": member.id, "host": host, "pid": member.pid, "since_ms": member.since_ms, **subscription}
        data = b"beat %016d\n" % 0 + json.dumps(body).encode() + b"\n"
        try:
            fd = open_file(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        except OSError as e:
            raise storage_error(e, "create", tmp) from None
        try:
            locks.lock_file(fd, tmp, 0)
            os.write(fd, data)
            os.fsync(fd)
            os.rename(tmp, path)
            fsync_dir(ids)
        except (OSError, KlError) as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise e if isinstance(e, KlError) else storage_error(e, "register in", ids) from None
        return Registration(fd, path, member, mount_of(ids)[1].startswith("nfs"))

    def members(self) -> list[Member]:
        """The members whose lock is held, sorted by id; registrations of dead members are
        deleted on the way.  (Whether a live one still beats is for the caller to judge.)"""
        ids = os.path.join(self.path, "ids")
        found = []
        for name in sorted(n for n in list_dir(ids) if not n.startswith(".")):
            member = _read_if_live(os.path.join(ids, name))
            if member is not None:
                found.append(member)
        return found

    # ----------------------------------------------------------------- owners

    def _topic_file(self, kind: str, topic: str) -> str:
        return os.path.join(self.path, kind, validate_name(topic))

    def _claims(self, topic: str) -> _Claims:
        """The topic's claims file, open for one operation (made where missing)."""
        self.create(CLAIMS)
        path = self._topic_file(CLAIMS, topic)
        return _Claims(path, self.lock_timeout, self.group)

    def owner(self, topic: str, partition: int) -> Owner:
        path = self._topic_file(CLAIMS, topic)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return Owner(None, 0)
        except OSError as e:
            raise storage_error(e, "open", path) from None
        try:
            return _parse_owner(os.pread(fd, SLOT, partition * SLOT))
        except OSError as e:
            raise storage_error(e, "read", path) from None
        finally:
            os.close(fd)

    def claim(self, topic: str, partition: int, member: str, expired: Mapping[str, int], *, force: bool = False) -> int | None:
        """Take the partition for ``member``; the new generation, or None while another
        member owns it.  The owner's ownership lapses when it is dead, or when the caller
        expired it (``expired``: member id -> the heartbeat it stopped at) and its heartbeat
        has not moved since: a member that woke up and beat again keeps what it has.
        Raises ``LockTimeout`` after ``lock_timeout``, unless ``force``: then goes on
        without the partition's lock."""
        [outcome] = self.claim_many(topic, [partition], member, expired, force=lambda _: force)
        if isinstance(outcome, LockTimeout):
            raise outcome
        return outcome

    def claim_many(
        self,
        topic: str,
        partitions: Sequence[int],
        member: str,
        expired: Mapping[str, int],
        *,
        force: Callable[[int], bool] = lambda _: False,
    ) -> list[int | None | LockTimeout]:
        """:meth:`claim` of each of ``partitions`` of ``topic`` (``force(partition)`` for
        its ``force``), through one open of the claims file: per partition the new
        generation, None while another member owns it, or the ``LockTimeout`` that left it."""
        beats: dict[str, int | None] = {}
        outcomes: list[int | None | LockTimeout] = []
        with self._claims(topic) as claims:
            for partition in partitions:
                try:
                    held = claims.lock(partition, force(partition))
                except LockTimeout as e:
                    outcomes.append(e)
                    continue
                try:
                    owner = claims.owner(partition)
                    if owner.member not in (None, member):
                        if owner.member not in beats:
                            beats[owner.member] = self.beat_of(owner.member)
                        beat = beats[owner.member]
                        if beat is not None and expired.get(owner.member) != beat:
                            outcomes.append(None)
                            continue
                    claims.set_owner(partition, member, owner.generation + 1)
                    outcomes.append(owner.generation + 1)
                finally:
                    if held:
                        claims.unlock(partition)
        return outcomes

    def beat_of(self, member: str) -> int | None:
        """The heartbeat of ``member`` if it is registered and its lock held, else None."""
        if "/" in member or member.startswith("."):
            return None  # not a name kl gives a member
        found = _read_if_live(os.path.join(self.path, "ids", member))
        return None if found is None else found.beat

    @contextlib.contextmanager
    def _owned(
        self, claims: _Claims, partition: int, member: str, generation: int, action: str, force: bool = False
    ) -> Iterator[None]:
        """Hold the partition's lock while ``member`` owns it in ``generation``; else raise
        ``NotOwner``: ``action`` by it is rejected.  ``LockTimeout`` and ``force`` as for
        :meth:`claim`."""
        held = claims.lock(partition, force)
        try:
            owner = claims.owner(partition)
            if owner != Owner(member, generation):
                raise _not_owner(action, member, generation, owner)
            yield
        finally:
            if held:
                claims.unlock(partition)

    def release(self, topic: str, partition: int, member: str, generation: int, *, force: bool = False) -> None:
        """Give the partition up, if ``member`` still owns it in ``generation``; else raise
        ``NotOwner`` (naming who does)."""
        with (
            self._claims(topic) as claims,
            self._owned(claims, partition, member, generation, f"release of {topic}/{partition}", force),
        ):
            claims.set_owner(partition, None, generation)

    def owns(self, topic: str, partition: int, member: str, generation: int) -> bool:
        with self._claims(topic) as claims:
            try:
                with self._owned(claims, partition, member, generation, f"ownership of {topic}/{partition}"):
                    return True
            except NotOwner:
                return False

    # ----------------------------------------------------------------- offsets

    def commit(
        self,
        topic: str,
        partition: int,
        position: Position | int,
        member: str,
        generation: int,
        topic_id: str = "",
        *,
        force: bool = False,
    ) -> None:
        """Store ``position`` (of the topic's creation ``topic_id``; "": read as of the current
        one) for the partition if ``member`` owns it in ``generation``; raises ``NotOwner`` if
        it does not (``LockTimeout`` and ``force`` as for :meth:`claim`)."""
        at = position if isinstance(position, Position) else Position(position)
        [outcome] = self.commit_many([Commit(topic, partition, at, member, generation, topic_id, force)])
        if outcome is not None:
            raise outcome

    def commit_many(self, commits: Sequence[Commit]) -> list[NotOwner | LockTimeout | None]:
        """:meth:`commit` of each of ``commits``, one append to each topic's commits file
        (fsynced once) while each partition's lock is held and its member owns it in its
        generation.  Per commit: None once stored, or the ``NotOwner`` or ``LockTimeout``
        (``force`` as for :meth:`claim`; the commits lock is gone on without when any of a
        topic's commits is forced) that left its offset as it was.  Raises ``StorageError``:
        the topics' appends before it are stored, its own is not."""
        now_ms = time.time_ns() // 1_000_000
        outcomes: list[NotOwner | LockTimeout | None] = [None] * len(commits)
        by_topic: dict[str, list[int]] = {}
        for i, c in enumerate(commits):
            by_topic.setdefault(c.topic, []).append(i)
        for topic, indices in by_topic.items():
            with self._claims(topic) as claims:
                try:
                    exclusive = claims.lock_commits(any(commits[i].force for i in indices))
                except LockTimeout as e:
                    for i in indices:
                        outcomes[i] = e
                    continue
                lines = []
                for i in sorted(indices, key=lambda i: commits[i].partition):
                    c = commits[i]
                    try:
                        held = claims.lock(c.partition, c.force)
                    except LockTimeout as e:
                        outcomes[i] = e
                        continue
                    owner = claims.owner(c.partition)
                    if owner != Owner(c.member, c.generation):
                        action = f"commit of {topic}/{c.partition} offset {c.position}"
                        outcomes[i] = _not_owner(action, c.member, c.generation, owner)
                        if held:
                            claims.unlock(c.partition)
                        continue  # the others' locks stay held until the append is stored
                    at = Committed(c.position.offset, c.member, now_ms, c.position.skip, c.topic_id)
                    lines.append(encode_commit(c.partition, at, c.generation))
                self._append(topic, lines, exclusive)
        return outcomes

    def write_offset(
        self,
        topic: str,
        partition: int,
        position: Position | int,
        member: str,
        topic_id: str = "",
        *,
        metadata: str = "",
    ) -> None:
        """Store ``position`` (and ``metadata`` with it) without asking who owns the
        partition: :meth:`write_offsets` of one."""
        at = position if isinstance(position, Position) else Position(position)
        self.write_offsets([Offset(topic, partition, at, topic_id, metadata)], member)

    def write_offsets(self, offsets: Sequence[Offset], member: str, *, before_write: Callable[[], None] | None = None) -> None:
        """Store each of ``offsets`` as committed by ``member`` without asking who owns the
        partitions (admin tools, and the Kafka clients' coordinator, which asked itself):
        one append to each topic's commits file; ``before_write`` runs once its commits
        lock is held, before it.  Raises ``LockTimeout`` after ``lock_timeout`` and
        ``StorageError``: the topics' appends before it are stored."""
        now_ms = time.time_ns() // 1_000_000
        by_topic: dict[str, list[bytes]] = {}
        for o in offsets:
            committed = Committed(o.position.offset, member, now_ms, o.position.skip, o.topic_id, o.metadata)
            by_topic.setdefault(o.topic, []).append(encode_commit(o.partition, committed, None))
        for topic, lines in by_topic.items():
            self._append_locked(topic, lines, before_write)

    def delete_offset(self, topic: str, partition: int, member: str, generation: int) -> None:
        """Forget the committed offset (of a topic deleted and created again), if ``member``
        owns the partition in ``generation``; raises ``NotOwner`` if it does not, and
        ``LockTimeout``."""
        with self._claims(topic) as claims:
            claims.lock_commits(False)
            with self._owned(claims, partition, member, generation, f"forgetting the committed offset of {topic}/{partition}"):
                self._append(topic, [encode_forgotten(partition, member)], True)

    def forget_offsets(
        self, topic: str, partitions: Sequence[int], member: str, *, before_write: Callable[[], None] | None = None
    ) -> None:
        """Forget the committed offsets of ``partitions`` of ``topic`` without asking who
        owns them (admin tools, OffsetDelete): one append to its commits file, as
        :meth:`write_offsets` makes (``before_write`` and what it raises too)."""
        self._append_locked(topic, [encode_forgotten(p, member) for p in partitions], before_write)

    def _append_locked(self, topic: str, lines: list[bytes], before_write: Callable[[], None] | None) -> None:
        """:meth:`_append` under the topic's commits lock; ``before_write`` runs once it is held."""
        with self._claims(topic) as claims:
            claims.lock_commits(False)
            if before_write is not None:
                before_write()
            self._append(topic, lines, True)

    def _append(self, topic: str, lines: list[bytes], exclusive: bool) -> None:
        """Append ``lines`` to the topic's commits file and fsync it; its caller holds the
        commits lock (``exclusive``) or went on without it.  A line a crashed writer left
        unfinished stays a line of its own (skipped by readers); a write that fails is cut
        back off, when ``exclusive``.  Then, when ``exclusive``, compact the file once it
        grew ``COMPACT_RATIO`` times larger than its last lines (and past ``COMPACT_AT``)."""
        if not lines:
            return
        path = self._topic_file(COMMITS, topic)
        directory = self.create(COMMITS)
        try:
            fd = open_file(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC)
        except OSError as e:
            raise storage_error(e, "open", path) from None
        try:
            size = os.fstat(fd).st_size
            data = b"".join(lines)
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            write_all(fd, data)
            os.fsync(fd)
            if size == 0:
                fsync_dir(directory)
        except OSError as e:
            if exclusive:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
            raise storage_error(e, "write", path) from None
        finally:
            os.close(fd)
        if exclusive and size + len(data) > COMPACT_AT:
            try:
                _compact(path, size + len(data))
            except StorageError as e:  # the commit is stored: the next one tries again
                log.warning("group %s: %s", self.group, e)

    def committed(self, topic: str, partition: int) -> Committed | None:
        """The committed offset, or None.  Raises ``CorruptOffset`` for a damaged offset
        file of an older kl (read where the commits file has no line of the partition)."""
        found = read_commits(self._topic_file(COMMITS, topic))
        if partition in found.records:
            return found.records[partition]
        return _read_legacy(self._legacy_path(topic, partition))

    def _legacy_path(self, topic: str, partition: int) -> str:
        return os.path.join(self.path, LEGACY_OFFSETS, validate_name(topic), str(partition))

    def set_aside(self, topic: str, partition: int) -> str:
        """Rename a damaged offset file of an older kl to ``P.damaged`` (replacing an older
        one); its new path."""
        path = self._legacy_path(topic, partition)
        try:
            os.replace(path, path + ".damaged")
        except OSError as e:
            raise storage_error(e, "set aside", path) from None
        return path + ".damaged"

    def offsets(self) -> Iterator[tuple[str, int, Committed]]:
        """Every committed offset: (topic, partition, committed), sorted.  Raises
        ``CorruptOffset`` at a damaged file."""
        for topic, partition in self.partitions("offsets"):
            committed = self.committed(topic, partition)
            if committed is not None:
                yield topic, partition, committed

    def owners(self) -> Iterator[tuple[str, int, Owner]]:
        """Every owner record (released ones included): (topic, partition, owner), sorted."""
        for topic in sorted(list_dir(os.path.join(self.path, CLAIMS))):
            path = os.path.join(self.path, CLAIMS, topic)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise storage_error(e, "read", path) from None
            for partition in range(len(data) // SLOT):
                owner = _parse_owner(data[partition * SLOT : (partition + 1) * SLOT])
                if owner.generation:
                    yield topic, partition, owner

    def partitions(self, kind: str) -> list[tuple[str, int]]:
        """(topic, partition) of every owner record ("owners"), or of every committed
        offset ("offsets": damaged offset files of an older kl included), sorted."""
        if kind == "owners":
            return [(t, p) for t, p, _ in self.owners()]
        found: set[tuple[str, int]] = set()
        for topic in list_dir(os.path.join(self.path, COMMITS)):
            if not topic.startswith("."):
                found.update((topic, p) for p, c in read_commits(os.path.join(self.path, COMMITS, topic)).records.items() if c)
        legacy = os.path.join(self.path, LEGACY_OFFSETS)
        for topic in list_dir(legacy):
            shadowed = read_commits(os.path.join(self.path, COMMITS, topic)).records
            found.update((topic, int(n)) for n in list_dir(os.path.join(legacy, topic)) if n.isdigit() and int(n) not in shadowed)
        return sorted(found)

    def delete(self) -> None:
        """Remove the group's directory (its caller made sure no member lives)."""
        try:
            shutil.rmtree(self.path)
        except FileNotFoundError:
            raise GroupNotFound(f"no group {self.group!r}") from None
        except OSError as e:
            raise storage_error(e, "remove", self.path) from None


COORDINATORS_DIR = ".coordinators"


def coordinator_path(root_path: str, group: str) -> str:
    """The Kafka coordinator's file of ``group``."""
    return os.path.join(root_path, GROUPS_DIR, COORDINATORS_DIR, group_name(group))


def encode_coordinator(address: str, session_ms: int) -> bytes:
    """The coordinator file: ``HOST:PORT SESSION_MS`` (0 while the group has no Kafka
    members), always as long for an address: rewritten in place, it is never torn."""
    return f"{address} {session_ms:010d}\n".encode()


def decode_coordinator(data: bytes) -> tuple[str, int] | None:
    """(address, session timeout in ms) of a coordinator file; None while it is being written."""
    found = re.fullmatch(rb"(\S+)(?: ([0-9]{1,10}))?\n", data)
    if found is None:
        return None
    return found[1].decode("utf-8", "replace"), int(found[2] or 0)


def kafka_lease(root_path: str, group: str) -> tuple[str, float | None] | None:
    """While Kafka clients may still read the group's partitions: their coordinator's
    address and for how many more seconds at most (None: as long as it lives), or None
    when they may not.  As long as the
    coordinator lives, for as long as they are members; once it died (its lock is free), for
    their longest session timeout after its last word in the file (measured by the file
    system's clock): a client keeps its partitions until its session times out without a
    coordinator."""
    path = coordinator_path(root_path, group)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise storage_error(e, "open", path) from None
    try:
        data, changed = os.pread(fd, 512, 0), os.fstat(fd).st_mtime_ns
        held = locks.locked_elsewhere(fd, path)
    except OSError as e:
        raise storage_error(e, "read", path) from None
    finally:
        os.close(fd)
    record = decode_coordinator(data)
    if record is None or record[1] <= 0:
        return None
    address, session_ms = record
    if held:
        return address, None
    left = session_ms / 1000 - (file_time_ns(os.path.dirname(path)) - changed) / 1e9
    return (address, left) if left > 0 else None


def groups(root_path: str) -> list[str]:
    """Ids of the groups under the root, sorted."""
    found = (group_of(root_path, name) for name in list_dir(os.path.join(root_path, GROUPS_DIR)))
    return sorted(group for group in found if group is not None)


def decode_offset(data: bytes, path: str) -> Committed:
    """An offset file's record (one without ``skip`` and ``topic_id``, of an older kl, has
    skip 0 and topic id "").  Raises ``CorruptOffset`` naming what is wrong."""
    body, crc_line, tail = data.rpartition(b"crc32 ")
    fields = dict(line.split(" ", 1) for line in body.decode("utf-8", "replace").splitlines() if " " in line)
    if not crc_line or not data.endswith(b"\n") or not re.fullmatch(rb"[0-9a-f]{8}\n", tail):
        raise _damaged(path, "no checksum line at its end")
    if int(tail, 16) != zlib.crc32(body):
        raise _damaged(path, "its checksum does not match")
    try:
        offset, skip = int(fields["offset"]), int(fields.get("skip", "0"))
        when = datetime.datetime.fromisoformat(fields["time"].replace("Z", "+00:00"))
        member = fields["member"]
        metadata = json.loads(fields.get("metadata", '""'))
        if not isinstance(metadata, str):
            raise ValueError(f"metadata {fields['metadata']} is not a string")
    except KeyError as e:
        raise _damaged(path, f"no {e.args[0]} line") from None
    except ValueError as e:
        raise _damaged(path, f"an unreadable field: {e}") from None
    if offset < 0 or skip < 0:
        raise _damaged(path, f"a negative offset ({offset}+{skip})")
    return Committed(offset, member, int(when.timestamp() * 1000), skip, fields.get("topic_id", "").strip(), metadata)


def _damaged(path: str, reason: str) -> CorruptOffset:
    return CorruptOffset(
        f"damaged committed offset file {path} ({reason}): reset it with 'kl groups reset'", path=path, reason=reason
    )


class _Claims:
    """A topic's claims file, open for one operation.  Partition P's owner record is its
    ``SLOT`` bytes from P × ``SLOT`` (``MEMBER GENERATION``, padded), locked (an open file
    description lock on those bytes) while a claim, release or commit of P runs; the byte
    at ``COMMITS_LOCK`` is locked while a commit appends to the topic's commits file.
    Taking a lock is also where an NFS client revalidates what it cached of the file, and
    letting one go where it writes back what it changed.  Closing lets every lock go."""

    def __init__(self, path: str, timeout: float, group: str):
        try:
            self.fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as e:
            raise storage_error(e, "open", path) from None
        self.path, self.timeout, self.group = path, timeout, group

    def __enter__(self) -> _Claims:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def lock(self, partition: int, force: bool) -> bool:
        """Lock the partition's record; whether it is held.  Raises ``LockTimeout`` after
        the registry's ``lock_timeout``, unless ``force``: then goes on without it."""
        return self._lock(partition * SLOT, SLOT, force, f"partition {partition}")

    def lock_commits(self, force: bool) -> bool:
        """Lock the topic's commits file (for appends), as ``lock`` does a record."""
        return self._lock(COMMITS_LOCK, 1, force, "the commits file")

    def _lock(self, start: int, length: int, force: bool, what: str) -> bool:
        try:
            locks.lock_file(self.fd, self.path, self.timeout, start=start, length=length)
        except LockTimeout as e:
            if not force:
                raise
            log.warning("group %s: going on without the lock of %s of %s: %s", self.group, what, self.path, e)
            return False
        return True

    def unlock(self, partition: int) -> None:
        locks.unlock_file(self.fd, self.path, start=partition * SLOT, length=SLOT)

    def owner(self, partition: int) -> Owner:
        try:
            return _parse_owner(os.pread(self.fd, SLOT, partition * SLOT))
        except OSError as e:
            raise storage_error(e, "read", self.path) from None

    def set_owner(self, partition: int, member: str | None, generation: int) -> None:
        """Write the record in place (not fsynced: see ``OWNERS_DURABLE``)."""
        record = f"{RELEASED if member is None else member} {generation}".encode()
        if len(record) >= SLOT:
            raise StorageError(f"member id {member!r} is too long for an owner record of {SLOT} bytes")
        try:
            os.pwrite(self.fd, record.ljust(SLOT - 1) + b"\n", partition * SLOT)
        except OSError as e:
            raise storage_error(e, "write", self.path) from None


def _compact(path: str, size: int) -> None:
    """Replace the commits file at ``path`` (``size`` bytes) by its partitions' last lines
    once it is ``COMPACT_RATIO`` times larger, under its commits lock; temporary files of
    a compaction that died on the way go first (only a holder of that lock makes them)."""
    found = read_commits(path)
    if size <= COMPACT_RATIO * sum(len(line) for line in found.lines.values()):
        return
    directory, name = os.path.split(path)
    for leftover in list_dir(directory):
        if re.fullmatch(rf"\.{re.escape(name)}\.[0-9]+\.[0-9a-f]{{8}}\.tmp", leftover):  # fsutil.temp_path's
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, leftover))
    write_atomic(path, b"".join(line for _, line in sorted(found.lines.items())))


def _parse_owner(data: bytes) -> Owner:
    """An owner record; one never written (zeros, past the end) or torn reads as released in generation 0."""
    member, _, generation = data.decode("utf-8", "replace").strip().partition(" ")
    if not member or not generation.isdigit() or "\x00" in member:
        return Owner(None, 0)
    return Owner(None if member == RELEASED else member, int(generation))


def _not_owner(action: str, member: str, generation: int, owner: Owner) -> NotOwner:
    """``action`` by ``member`` in ``generation`` rejected: the partition's record says ``owner``."""
    now = "released" if owner.member is None else f"owned by {owner.member}"
    return NotOwner(
        f"{action} by {member} (generation {generation}) rejected: the partition is {now} (generation {owner.generation})"
    )


def _stamp(time_ms: int) -> str:
    when = datetime.datetime.fromtimestamp(time_ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")
    return when.replace("+00:00", "Z")


def _line(record: dict[str, object]) -> bytes:
    body = json.dumps(record, separators=(", ", ": ")).encode()
    return body + b" %08x\n" % zlib.crc32(body)


def encode_commit(partition: int, c: Committed, generation: int | None) -> bytes:
    """A commits file's line: the partition's position, who committed it (in which of its
    generations; none for admin tools and Kafka clients), when, and ``metadata`` when
    there is some, as JSON, then a CRC32 of the JSON."""
    record: dict[str, object] = {"partition": partition, "offset": c.offset, "skip": c.skip, "topic_id": c.topic_id}
    record.update(member=c.member, generation=generation, time=_stamp(c.time_ms))
    if c.metadata:
        record["metadata"] = c.metadata
    return _line(record)


def encode_forgotten(partition: int, member: str) -> bytes:
    """A commits file's line that forgets the partition's committed position."""
    return _line({"partition": partition, "forgotten": True, "member": member, "time": _stamp(time.time_ns() // 1_000_000)})


def decode_commit(line: bytes) -> tuple[int, Committed | None]:
    """(partition, its position or None where forgotten) of a commits file's line (no
    newline).  Raises ``ValueError`` naming what is wrong with it."""
    body, _, crc = line.rpartition(b" ")
    if not re.fullmatch(rb"[0-9a-f]{8}", crc):
        raise ValueError("no checksum at its end")
    if int(crc, 16) != zlib.crc32(body):
        raise ValueError("its checksum does not match")
    try:
        record = json.loads(body)
        partition = record["partition"]
        if record.get("forgotten"):
            return partition, None
        when = datetime.datetime.fromisoformat(record["time"].replace("Z", "+00:00"))
        time_ms = int(when.timestamp() * 1000)
        c = Committed(record["offset"], record["member"], time_ms, record["skip"], record["topic_id"], record.get("metadata", ""))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"an unreadable field: {e}") from None
    fields = (partition, c.offset, c.skip, c.member, c.topic_id, c.metadata)
    if not all(isinstance(v, int) for v in fields[:3]) or not all(isinstance(v, str) for v in fields[3:]) or min(fields[:3]) < 0:
        raise ValueError("a field of the wrong kind")
    return partition, c


@dataclass
class Commits:
    """What was read of a topic's commits file: per partition its last line and what it says."""

    key: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(device, inode, size, modification time) of the file when read."""
    parsed: int = 0
    """Bytes of whole lines read."""
    lines: dict[int, bytes] = field(default_factory=dict)
    records: dict[int, Committed | None] = field(default_factory=dict)


_read: dict[str, Commits] = {}
_read_guard = threading.Lock()
KEPT_READS = 256
"""Commits files whose reading this process keeps, to read on from where it stopped."""


def read_commits(path: str) -> Commits:
    """The commits file at ``path`` as it is now (empty where there is none), reading on
    from what this process read of it before when it only grew since.  An unreadable
    line is skipped (a warning names it): its partition goes on from its line before,
    so at worst messages come again.  Raises ``StorageError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Commits()
    except OSError as e:
        raise storage_error(e, "open", path) from None
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with _read_guard:
            known = _read.get(path)
        if known is not None and known.key == key:
            return known
        start = known.parsed if known is not None and known.key[:2] == key[:2] and st.st_size >= known.parsed else 0
        chunks = []
        at = start
        while at < st.st_size:
            chunk = os.pread(fd, st.st_size - at, at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
    except OSError as e:
        raise storage_error(e, "read", path) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    whole = data.rfind(b"\n") + 1  # an unfinished last line is read once it is whole, or skipped once another follows it
    found = Commits(key, start + whole)
    if known is not None and start:
        found.lines, found.records = dict(known.lines), dict(known.records)
    for line in data[:whole].split(b"\n")[:-1]:
        try:
            partition, committed = decode_commit(line)
        except ValueError as e:
            log.warning("%s: a line at byte %d is unreadable (%s): skipped", path, start, e)
        else:
            found.lines[partition], found.records[partition] = line + b"\n", committed
        start += len(line) + 1
    with _read_guard:
        _read.pop(path, None)
        _read[path] = found
        while len(_read) > KEPT_READS:
            del _read[next(iter(_read))]
    return found


def _read_legacy(path: str) -> Committed | None:
    """The offset file of an older kl at ``path``, or None.  Raises ``CorruptOffset``."""
    try:
        with open(path, "rb") as f:
            data = f.read(8192)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise storage_error(e, "read", path) from None
    return decode_offset(data, path)


def _read_if_live(path: str) -> Member | None:
    """The member registered in ``path`` if its lock is held; else delete the file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            locks.lock_file(fd, path, 0)
        except LockTimeout:
            return _parse_member(os.pread(fd, 4096, 0))
        with contextlib.suppress(OSError):
            os.unlink(path)  # nobody holds it: its member is gone
        return None
    except (OSError, StorageError):
        return None
    finally:
        os.close(fd)


def _parse_member(data: bytes) -> Member | None:
    beat = BEAT.match(data)
    try:
        body = json.loads(data[BEAT_AT + BEAT_WIDTH + 1 :])
        subscription = {k: body[k] for k in ("topics", "pattern", "exclude", "kafka") if k in body}
        return Member(
            body["id"], body["host"], int(body["pid"]), int(body["since_ms"]), subscription, int(beat[1]) if beat else -1
        )
    except (ValueError, KeyError, TypeError):
        return None  # still being written: seen next time
