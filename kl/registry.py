"""A consumer group's registry: the seed's ZooKeeper nodes, as files under the root.

    ROOT/.groups/GROUP/ids/HOST:UUID            a live member: its registration, locked while it lives
    ROOT/.groups/GROUP/owners/TOPIC/P           which member owns partition P, and the claim's generation
    ROOT/.groups/GROUP/owners/TOPIC/P.lock      held while a claim, release or commit of P runs
    ROOT/.groups/GROUP/offsets/TOPIC/P          the committed position (text, checksummed)
    ROOT/.groups/GROUP/offsets/TOPIC/P.damaged  a damaged offset file a member set aside
    ROOT/.groups/.coordinators/GROUP            the group's Kafka coordinator (kl serve --kafka), locked
                                                while it coordinates: its address and its members'
                                                longest session timeout, rewritten every second

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
next generation.  A commit (under the same lock) is accepted only while the record still
names the committing member and its generation, so a member that was expired and
replaced cannot commit over its successor (``NotOwner``).

A member waits for a partition's lock only ``lock_timeout`` (a small share of its session
timeout), then gets ``LockTimeout`` and tries again later, so its heartbeat never waits
behind a lock held by another process.  A process stopped while holding a lock (SIGSTOP,
a hung host) would block the partition for good: its caller may ``force`` a claim,
release or commit, which then goes on without the lock once ``lock_timeout`` passed (the
group's members do so once the lock's holder can be taken for a member they expired, see
kl/group.py).  A holder woken up later finishes the one write it was making, which
another member's commit or claim replaces: at worst messages come again, none is lost.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kl.errors import CorruptState, InvalidTopicName, KlError, LockTimeout, StorageError
from kl.log import locks
from kl.log.fsutil import (
    ensure_dir,
    file_time_ns,
    fsync_dir,
    list_dir,
    mount_of,
    nfs_locking_problem,
    open_file,
    stage_durably,
    storage_error,
    write_atomic,
)
from kl.log.log import Position
from kl.topic import GROUPS_DIR, validate_name

log = logging.getLogger(__name__)

RELEASED = "-"
OWNERS_DURABLE = False
"""Owner records are replaced atomically but not fsynced (a member joining 1,000 partitions
spent 2,000 fsyncs, most of its join, claiming them and as many releasing them at the
end).  A record only matters while the member it names lives: the crash that could lose
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


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid group name (the rules of topic names)."""
    try:
        return validate_name(name)
    except InvalidTopicName:
        raise InvalidTopicName(
            f"invalid group name {name!r}: use 1-249 characters from A-Z a-z 0-9 . _ - not starting with a dot"
        ) from None


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
        self.group = validate_group(group)
        self.path = os.path.join(root_path, GROUPS_DIR, group)
        self.lock_timeout = lock_timeout

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    # ----------------------------------------------------------------- members

    def register(self, subscription: dict[str, object]) -> Registration:
        """Join: write ``ids/HOST:UUID``, locked before it appears under its name."""
        ids = os.path.join(self.path, "ids")
        ensure_dir(ids)
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

    def _partition_path(self, kind: str, topic: str, partition: int) -> str:
        return os.path.join(self.path, kind, validate_name(topic), str(partition))

    @contextlib.contextmanager
    def _locked(self, topic: str, partition: int, force: bool = False) -> Iterator[str]:
        """Hold partition ``partition``'s lock; yields the owner record's path.  Raises
        ``LockTimeout`` after ``lock_timeout``, unless ``force``: then goes on without it."""
        path = self._partition_path("owners", topic, partition)
        ensure_dir(os.path.dirname(path))
        lock = locks.lock_for(path + ".lock")
        held = True
        try:
            lock.acquire(self.lock_timeout)
        except LockTimeout as e:
            if not force:
                raise
            log.warning("group %s: going on without the lock of %s/%d: %s", self.group, topic, partition, e)
            held = False
        try:
            yield path
        finally:
            if held:
                lock.release()

    def owner(self, topic: str, partition: int) -> Owner:
        return _read_owner(self._partition_path("owners", topic, partition))

    def claim(self, topic: str, partition: int, member: str, expired: Mapping[str, int], *, force: bool = False) -> int | None:
        """Take the partition for ``member``; the new generation, or None while another
        member owns it.  The owner's ownership lapses when it is dead, or when the caller
        expired it (``expired``: member id -> the heartbeat it stopped at) and its heartbeat
        has not moved since: a member that woke up and beat again keeps what it has.
        ``LockTimeout`` and ``force`` as for :meth:`_locked`."""
        with self._locked(topic, partition, force) as path:
            owner = _read_owner(path)
            if owner.member not in (None, member):
                beat = self.beat_of(owner.member)
                if beat is not None and expired.get(owner.member) != beat:
                    return None
            generation = owner.generation + 1
            write_atomic(path, f"{member} {generation}\n".encode(), durable=OWNERS_DURABLE)
            return generation

    def beat_of(self, member: str) -> int | None:
        """The heartbeat of ``member`` if it is registered and its lock held, else None."""
        if "/" in member or member.startswith("."):
            return None  # not a name kl gives a member
        found = _read_if_live(os.path.join(self.path, "ids", member))
        return None if found is None else found.beat

    @contextlib.contextmanager
    def _owned(self, topic: str, partition: int, member: str, generation: int, action: str, force: bool = False) -> Iterator[str]:
        """Hold the partition's lock while ``member`` owns it in ``generation`` (yields the
        owner record's path); else raise ``NotOwner``: ``action`` by it is rejected.
        ``LockTimeout`` and ``force`` as for :meth:`_locked`."""
        with self._locked(topic, partition, force) as path:
            owner = _read_owner(path)
            if owner != Owner(member, generation):
                now = "released" if owner.member is None else f"owned by {owner.member}"
                raise NotOwner(
                    f"{action} by {member} (generation {generation}) rejected:"
                    f" the partition is {now} (generation {owner.generation})"
                )
            yield path

    def release(self, topic: str, partition: int, member: str, generation: int, *, force: bool = False) -> bool:
        """Give the partition up, if ``member`` still owns it in ``generation``; whether it did."""
        try:
            with self._owned(topic, partition, member, generation, f"release of {topic}/{partition}", force) as path:
                write_atomic(path, f"{RELEASED} {generation}\n".encode(), durable=OWNERS_DURABLE)
        except NotOwner:
            return False
        return True

    def owns(self, topic: str, partition: int, member: str, generation: int) -> bool:
        try:
            with self._owned(topic, partition, member, generation, f"ownership of {topic}/{partition}"):
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
        it does not (``LockTimeout`` and ``force`` as for :meth:`_locked`)."""
        action = f"commit of {topic}/{partition} offset {position}"
        with self._owned(topic, partition, member, generation, action, force):
            self.write_offset(topic, partition, position, member, topic_id)

    def commit_many(self, commits: Sequence[Commit]) -> list[NotOwner | LockTimeout | None]:
        """:meth:`commit` of each of ``commits``, made durable together: every offset file
        is written to a temporary file and fsynced first (``fsutil.stage_durably``), then
        each is renamed into place under its partition's lock while its member owns it in
        its generation, then each directory is fsynced once, before this returns.  Per
        commit: None once stored, or the ``NotOwner`` or ``LockTimeout`` (``force`` as for
        :meth:`_locked`) that left its offset as it was.  Raises ``StorageError``: the
        offsets renamed before it are in place, maybe not durable."""
        now_ms = time.time_ns() // 1_000_000
        paths = [self._partition_path("offsets", c.topic, c.partition) for c in commits]
        for directory in dict.fromkeys(map(os.path.dirname, paths)):
            ensure_dir(directory)
        data = [encode_offset(Committed(c.position.offset, c.member, now_ms, c.position.skip, c.topic_id)) for c in commits]
        tmps = stage_durably(list(zip(paths, data, strict=True)))
        outcomes: list[NotOwner | LockTimeout | None] = []
        try:
            for c, path, tmp in zip(commits, paths, tmps, strict=True):
                action = f"commit of {c.topic}/{c.partition} offset {c.position}"
                try:
                    with self._owned(c.topic, c.partition, c.member, c.generation, action, c.force):
                        os.rename(tmp, path)
                except (NotOwner, LockTimeout) as e:
                    outcomes.append(e)
                    continue
                except OSError as e:
                    raise storage_error(e, "write", path) from None
                outcomes.append(None)
            for directory in dict.fromkeys(os.path.dirname(p) for p, done in zip(paths, outcomes, strict=True) if done is None):
                try:
                    fsync_dir(directory)
                except OSError as e:
                    raise storage_error(e, "fsync", directory) from None
        finally:
            for tmp in tmps[len(outcomes) :] + [t for t, done in zip(tmps, outcomes, strict=False) if done is not None]:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
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
        before_rename: Callable[[], None] | None = None,
    ) -> None:
        """Store ``position`` (and ``metadata`` with it) without asking who owns the
        partition (admin tools, and the Kafka clients' coordinator, which asked itself;
        ``before_rename`` as for ``write_atomic``)."""
        path = self._partition_path("offsets", topic, partition)
        ensure_dir(os.path.dirname(path))
        at = position if isinstance(position, Position) else Position(position)
        committed = Committed(at.offset, member, time.time_ns() // 1_000_000, at.skip, topic_id, metadata)
        write_atomic(path, encode_offset(committed), before_rename=before_rename)

    def set_aside(self, topic: str, partition: int) -> str:
        """Rename a damaged offset file to ``P.damaged`` (replacing an older one); its new path."""
        path = self._partition_path("offsets", topic, partition)
        try:
            os.replace(path, path + ".damaged")
        except OSError as e:
            raise storage_error(e, "set aside", path) from None
        return path + ".damaged"

    def committed(self, topic: str, partition: int) -> Committed | None:
        """The committed offset, or None.  Raises ``CorruptOffset`` for a damaged file."""
        path = self._partition_path("offsets", topic, partition)
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise storage_error(e, "read", path) from None
        return decode_offset(data, path)

    def offsets(self) -> Iterator[tuple[str, int, Committed]]:
        """Every committed offset: (topic, partition, committed), sorted.  Raises
        ``CorruptOffset`` at a damaged file."""
        for topic, partition in self.partitions("offsets"):
            committed = self.committed(topic, partition)
            if committed is not None:
                yield topic, partition, committed

    def owners(self) -> Iterator[tuple[str, int, Owner]]:
        """Every owner record (released ones included): (topic, partition, owner), sorted."""
        for topic, partition in self.partitions("owners"):
            yield topic, partition, self.owner(topic, partition)

    def partitions(self, kind: str) -> list[tuple[str, int]]:
        """(topic, partition) of every file of ``kind`` ("offsets" or "owners"), sorted."""
        base = os.path.join(self.path, kind)
        return sorted((t, int(n)) for t in list_dir(base) for n in list_dir(os.path.join(base, t)) if n.isdigit())

    def delete_offset(self, topic: str, partition: int, member: str, generation: int) -> None:
        """Forget the committed offset (of a topic deleted and created again), if ``member``
        owns the partition in ``generation``; raises ``NotOwner`` if it does not."""
        with self._owned(topic, partition, member, generation, f"forgetting the committed offset of {topic}/{partition}"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._partition_path("offsets", topic, partition))

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
    return os.path.join(root_path, GROUPS_DIR, COORDINATORS_DIR, validate_group(group))


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
    """Names of the groups under the root, sorted."""
    return sorted(n for n in list_dir(os.path.join(root_path, GROUPS_DIR)) if not n.startswith("."))


def encode_offset(c: Committed) -> bytes:
    """The offset file: readable with ``cat``, its last line a CRC32 of the lines before;
    ``metadata`` (a JSON string) only when there is some.  (A kl before ``skip``,
    ``topic_id`` and ``metadata`` reads ``offset``, ``member`` and ``time`` of it.)"""
    when = datetime.datetime.fromtimestamp(c.time_ms / 1000, datetime.timezone.utc).isoformat(timespec="milliseconds")
    body = (
        f"offset {c.offset}\nskip {c.skip}\ntopic_id {c.topic_id}\nmember {c.member}\ntime {when.replace('+00:00', 'Z')}\n"
        + (f"metadata {json.dumps(c.metadata)}\n" if c.metadata else "")
    ).encode()
    return body + b"crc32 %08x\n" % zlib.crc32(body)


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


def _read_owner(path: str) -> Owner:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            member, _, generation = f.read(1024).strip().partition(" ")
        return Owner(None if member == RELEASED else member, int(generation))
    except (FileNotFoundError, ValueError):
        return Owner(None, 0)
    except OSError as e:
        raise storage_error(e, "read", path) from None


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
