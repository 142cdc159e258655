"""Consumer group administration: list, describe (owners, committed offsets, lag), reset,
delete, export and import a group's offsets, delete some of them.  What ``kl groups`` does.

A group is named by its id, any string (Kafka's rule: ``app:v1``, ``my group``); its files
are ``kl.registry``'s, under a name made of the id.  Changes (``reset``, ``delete``,
``import_offsets``, ``delete_offsets``) are refused with ``GroupActive`` while the group
has live members, unless forced: a member keeps its position in memory and would commit
over them.  The check is made once,
before anything is written; a member that joins meanwhile may start from the old offsets.

Lag is counted from the committed offset to the log end by walking the message headers
of those bytes (no checksums, no values): each message counts one, a compressed batch
the messages inside it (it is decompressed), padding none.

A committed offset is a ``Position``: a byte offset, and inside a compressed batch the
count of its messages already consumed, written ``OFFSET+SKIP`` (``reset``'s target,
``export`` and ``import_offsets`` take the same form).
"""

from __future__ import annotations

import enum
import functools
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

from kl.errors import (
    CorruptMessage,
    CorruptState,
    InvalidConfig,
    InvalidOffset,
    KlError,
    OffsetOutOfRange,
    RootNotFound,
    TopicNotFound,
    UnsupportedCodec,
)
from kl.log.config import same_creation
from kl.log.fsutil import file_time_ns
from kl.log.log import Log, Position
from kl.log.state import PartitionState
from kl.registry import (
    Committed,
    CorruptOffset,
    GroupActive,
    GroupNotFound,
    InvalidImport,
    Member,
    Offset,
    Registry,
    groups,
    parse_position,
)
from kl.topic import Root, validate_name

__all__ = [
    "AtTime",
    "ShiftBy",
    "GroupInfo",
    "LagMemo",
    "MemberInfo",
    "OffsetChange",
    "PartitionLag",
    "Status",
    "delete",
    "delete_offsets",
    "describe",
    "export",
    "import_offsets",
    "list_groups",
    "reset",
]


class Status(enum.Enum):
    """Where a group's committed offset of a partition stands."""

    OK = "ok"
    NOT_COMMITTED = "not committed"
    BEFORE_START = "before log start"
    """Retention deleted messages the group had not consumed; lag counts from the log start."""
    PAST_END = "past log end"
    """Beyond the log end (the topic was created again?): no lag is given."""
    GONE = "topic deleted"
    """The topic, or this partition of it, no longer exists."""
    STALE = "stale: topic created again"
    """The offset is of an earlier creation of the topic (another topic id): a member starts afresh."""
    DAMAGED = "damaged"
    """The offset file is unreadable (``PartitionLag.damage`` says how): reset it."""
    UNREADABLE = "unreadable partition"
    """The partition's state record cannot be read (``PartitionLag.damage`` says how):
    ``kl recover`` rebuilds it."""


@dataclass(frozen=True)
class MemberInfo:
    """A live member (its registration's lock is held)."""

    id: str
    host: str
    pid: int
    since_ms: int
    subscription: dict[str, object]
    beat_age_ms: int | None
    """Since its heartbeat last changed its registration file, by this host's clock (the
    file's mtime: a hint; a member far past its session timeout has stopped)."""


@dataclass(frozen=True)
class PartitionLag:
    """One partition as the group sees it; offsets are None where the topic is gone."""

    topic: str
    partition: int
    owner: str | None
    """The live member that owns it (None: released, or its owner is gone)."""
    generation: int
    committed: int | None
    committed_ms: int | None
    """When it was committed."""
    log_start_offset: int | None
    log_end_offset: int | None
    lag_messages: int | None
    """Messages from the committed offset to the log end (None: not committed, gone, past
    the end, or damaged data or a codec kl cannot read on the way)."""
    lag_bytes: int | None
    lag_ms: int | None
    """Age of the oldest unconsumed message (None: caught up, or it has no timestamp)."""
    status: Status
    skip: int = 0
    """Inner messages of the compressed batch at ``committed`` already consumed."""
    damage: str | None = None
    """Why the offset file is damaged (status ``DAMAGED``), or the partition's state
    record unreadable (``UNREADABLE``)."""
    committed_kafka_offset: int | None = None
    """The committed position as a Kafka offset (None where it is not in the log now:
    before its start, past its end, gone, or uncountable)."""
    log_end_kafka_offset: int | None = None
    """The log end as a Kafka offset: the records the partition ever held."""

    @property
    def position(self) -> Position | None:
        """The committed position (None where nothing usable is committed)."""
        return None if self.committed is None else Position(self.committed, self.skip)


@dataclass(frozen=True)
class GroupInfo:
    group: str
    members: list[MemberInfo]
    partitions: list[PartitionLag]


class AtTime(NamedTuple):
    """``reset``'s target: the first message stamped at or after ``time_ms``."""

    time_ms: int


class ShiftBy(NamedTuple):
    """``reset``'s target: ``messages`` after (before, when negative) the committed
    offset, kept within the log (kafka-consumer-groups' ``--shift-by``)."""

    messages: int


class OffsetChange(NamedTuple):
    """A committed offset that ``reset`` or ``import_offsets`` changed (or would change)."""

    topic: str
    partition: int
    old: Position | None
    """None where nothing (or a damaged file) was committed."""
    new: Position


Target = Literal["earliest", "latest"] | int | Position | AtTime | ShiftBy
RootLike = Root | str | os.PathLike[str]


def list_groups(root: RootLike) -> list[str]:
    """Names of the groups under the root, sorted.  Raises ``RootNotFound``."""
    return groups(existing_root(root).path)


def describe(
    root: RootLike,
    group: str,
    topics: Callable[[str], bool] | None = None,
    states: Mapping[tuple[str, int], PartitionState] | None = None,
    memo: LagMemo | None = None,
) -> GroupInfo:
    """The group's live members, and per partition its owner, committed offset and lag.

    The partitions are those of every topic the group has a committed offset or an owner
    record for, and of every topic a live member subscribes to (of those ``topics`` takes,
    where given).  The lag is counted to the log end of the partition's state in
    ``states`` where it has one (read by the caller: the figures of a snapshot agree),
    else as read now.  A caller describing the group again and again keeps a ``memo``
    for it (an empty dict at first): the reads of a committed offset that did not move
    are not made again.  A damaged offset file
    is a row of status ``DAMAGED`` (the others are described all the same), a partition
    whose state record cannot be read one of ``UNREADABLE``; an offset of an earlier
    creation of its topic one of status ``STALE``.  Raises ``GroupNotFound``.
    """
    r = existing_root(root)
    registry = _registry(r, group)
    members = registry.members()
    live = {member.id for member in members}
    now = file_time_ns(registry.path) // 1_000_000  # the clock of the files' times, whichever host asks
    owners = {(t, p): owner for t, p, owner in registry.owners()}
    committed: dict[tuple[str, int], Committed | CorruptOffset] = {}
    for t, p in registry.partitions("offsets"):
        try:
            found = registry.committed(t, p)
        except CorruptOffset as e:
            committed[t, p] = e
        else:
            if found is not None:
                committed[t, p] = found
    topic_ids = functools.cache(r.topic_id)  # read once a topic
    known = states or {}
    rows = []
    for topic, partition in _partitions(r, members, set(owners) | set(committed), topics):
        owner = owners.get((topic, partition))
        c = committed.get((topic, partition))
        damage, skip, when = None, 0, None
        if isinstance(c, CorruptOffset):
            damage, c = c.reason, None
        elif c is not None:
            skip, when = c.skip, c.time_ms
        if damage is not None or (c is not None and _stale(topic_ids, topic, c)):
            lag = _lag(r, topic, partition, None, now, known.get((topic, partition)))._replace(
                status=Status.STALE if damage is None else Status.DAMAGED
            )
        else:
            position = None if c is None else c.position
            lag = _lag(r, topic, partition, position, now, known.get((topic, partition)), memo)
        rows.append(
            PartitionLag(
                topic,
                partition,
                owner.member if owner is not None and owner.member in live else None,
                0 if owner is None else owner.generation,
                None if c is None else c.offset,
                when,
                lag.log_start_offset,
                lag.log_end_offset,
                lag.messages,
                lag.bytes,
                lag.ms,
                lag.status,
                skip=skip,
                damage=damage or lag.damage,
                committed_kafka_offset=lag.committed_kafka_offset,
                log_end_kafka_offset=lag.log_end_kafka_offset,
            )
        )
    return GroupInfo(registry.group, [_member_info(registry, member, now) for member in members], rows)


def reset(
    root: RootLike,
    group: str,
    to: Target,
    *,
    topic: str | None = None,
    partition: int | None = None,
    force: bool = False,
    dry_run: bool = False,
) -> list[OffsetChange]:
    """Set the group's committed offsets to the log start ("earliest"), the log end
    ("latest"), a byte offset or ``Position`` (one partition only: it must start a
    message, and a position's skip be below the count of the messages there), the first
    message at or after ``AtTime(ms)``, or ``ShiftBy(n)`` messages after (before) the
    committed offset, kept within the log start and end (a committed offset that
    retention deleted shifts from the log start; a compressed batch counts its
    messages, and a position may land inside it).

    All partitions the group knows of (see ``describe``; topics deleted meanwhile are
    left out), or those of ``topic``, or its one ``partition``.  Everything is worked out
    before anything is written; ``dry_run`` writes nothing.  Returns the changes (every
    partition, moved or not).  Raises ``GroupNotFound``, ``GroupActive`` (live members,
    unless ``force``), ``TopicNotFound``, ``InvalidConfig`` (an offset for several
    partitions; a shift of a partition with no committed offset of its topic's current
    creation), ``OffsetOutOfRange`` and ``InvalidOffset``.
    """
    r = existing_root(root)
    registry = _registry(r, group)
    if partition is not None and topic is None:
        raise InvalidConfig(f"a partition ({partition}) needs its topic")
    members = registry.members()
    if topic is not None:
        count = r.config(topic).partitions
        if partition is not None:
            r.log(topic, partition)  # TopicNotFound names the partitions there are
        targets = [(topic, p) for p in range(count)] if partition is None else [(topic, partition)]
    else:
        known = set(registry.partitions("owners")) | set(registry.partitions("offsets"))  # damaged offsets too
        targets = [(t, p) for t, p in _partitions(r, members, known) if _exists(r, t, p)]
    if isinstance(to, (int, Position)) and not isinstance(to, bool) and len(targets) != 1:
        where = f"topic {topic!r}" if topic is not None else f"group {registry.group!r}"
        raise InvalidConfig(f"a byte offset ({to}) is for one partition, and {where} has {len(targets)}: give the partition")
    old = {(t, p): _old(registry, t, p) for t, p in targets}
    if isinstance(to, ShiftBy):
        new = {(t, p): _shifted(r.log(t, p), position, to.messages) for (t, p), position in _shiftable(r, registry, old).items()}
    else:
        new = {(t, p): _target(r.log(t, p), to) for t, p in targets}
    _refuse_if_active(registry, members, force)
    changes = [OffsetChange(t, p, old[t, p], offset) for (t, p), offset in new.items()]
    if not dry_run:
        _write(r, registry, changes, _who("reset"))
    return changes


def delete(root: RootLike, group: str, *, force: bool = False) -> None:
    """Remove the group: members, owners, committed offsets.  Raises ``GroupNotFound`` and
    ``GroupActive`` (live members, unless ``force``; forced, they join it again, new)."""
    registry = _registry(existing_root(root), group)
    _refuse_if_active(registry, registry.members(), force)
    registry.delete()


def delete_offsets(
    root: RootLike, group: str, topic: str, partitions: list[int] | None = None, *, force: bool = False
) -> list[tuple[int, Position | None]]:
    """Forget the group's committed offsets of ``topic`` (of its ``partitions``; None: of
    every partition with one), as kafka-consumer-groups' ``--delete-offsets`` does: a
    member starting there goes by its reset policy.  Returns (partition, the position
    forgotten; None for a damaged offset file) of each one that had an offset.  Raises
    ``GroupNotFound``, and ``GroupActive`` while a live member subscribes to ``topic``
    (Kafka clients' subscriptions are their coordinator's: any of them counts; to delete
    the offsets of another topic while they live, ask it: kafka-consumer-groups
    --delete-offsets), unless ``force``."""
    r = existing_root(root)
    registry = _registry(r, group)
    validate_name(topic)
    members = registry.members()
    _refuse_if_active(registry, [m for m in members if "kafka" in m.subscription or m.subscribes(topic)], force)
    held = {p for t, p in registry.partitions("offsets") if t == topic}
    found = sorted(held if partitions is None else held & set(partitions))
    gone = [(partition, _old(registry, topic, partition)) for partition in found]
    if found:
        registry.forget_offsets(topic, found, _who("delete-offsets"))
    return gone


def export(root: RootLike, group: str) -> str:
    """The group's committed offsets, one ``TOPIC PARTITION OFFSET`` line each
    (``OFFSET+SKIP`` inside a compressed batch), sorted by topic and partition: what
    ``import_offsets`` reads.  Offsets of partitions that no longer exist, and of an
    earlier creation of their topic, come as comment lines.  Raises ``GroupNotFound`` and
    ``CorruptOffset``."""
    r = existing_root(root)
    lines = []
    for topic, partition, committed in _registry(r, group).offsets():
        line = f"{topic} {partition} {committed.position}\n"
        if not _exists(r, topic, partition):
            line = f"# {line.rstrip()} (no such partition now)\n"
        elif _stale(r.topic_id, topic, committed):
            line = f"# {line.rstrip()} (of topic {topic} before it was deleted and created again)\n"
        lines.append(line)
    return "".join(lines)


def import_offsets(root: RootLike, group: str, text: str, *, force: bool = False) -> list[OffsetChange]:
    """Set the committed offsets that ``text`` gives (``export``'s format: one ``TOPIC
    PARTITION OFFSET`` or ``TOPIC PARTITION OFFSET+SKIP`` a line; blank lines and lines
    starting with ``#`` are skipped).

    Every line is checked before any offset is written: the partition exists, the offset
    starts a message within the log, a skip is below the count of the messages there.
    Creates the group when missing.  Returns the changes.  Raises ``InvalidImport``
    (naming the line) and ``GroupActive`` (live members, unless ``force``).
    """
    r = existing_root(root)
    registry = Registry(r.path, group, lock_timeout=r.lock_timeout)
    wanted: dict[tuple[str, int], Position] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, offset = _parse_line(r, line, number)
        if key in wanted:
            raise InvalidImport(f"line {number}: {key[0]}/{key[1]} is given twice")
        wanted[key] = offset
    _refuse_if_active(registry, registry.members(), force)
    changes = [OffsetChange(t, p, _old(registry, t, p), offset) for (t, p), offset in wanted.items()]
    registry.create()
    _write(r, registry, changes, _who("import"))
    return changes


# ----------------------------------------------------------------- helpers


def existing_root(root: RootLike) -> Root:
    """``root`` as a ``Root``; raises ``RootNotFound`` when its directory is missing (not mounted)."""
    r = root if isinstance(root, Root) else Root(root)
    if not os.path.isdir(r.path):
        raise RootNotFound(f"root {r.path} does not exist (is it mounted?)")
    return r


def _registry(root: Root, group: str) -> Registry:
    registry = Registry(root.path, group, lock_timeout=root.lock_timeout)
    if not registry.exists():
        raise GroupNotFound(f"no group {group!r} in {root.path}")
    return registry


def _refuse_if_active(registry: Registry, members: list[Member], force: bool) -> None:
    if members and not force:
        who = ", ".join(
            f"{member.host} pid {member.pid}"
            if "kafka" not in member.subscription
            else f"Kafka clients through kl serve at {member.subscription['kafka']}"
            for member in members
        )
        n = len(members)
        raise GroupActive(
            f"group {registry.group!r} has {n} live member{'s' if n != 1 else ''} ({who}): stop {'them' if n != 1 else 'it'}"
            " first, or force it"
        )


def _who(action: str) -> str:
    """The ``member`` an admin change writes into the offset file."""
    return f"{action}@{socket.gethostname()}"


def _write(root: Root, registry: Registry, changes: list[OffsetChange], who: str) -> None:
    """Write the changes' new offsets, as of their topics' current ids."""
    ids = {topic: root.topic_id(topic) for topic in {c.topic for c in changes}}
    registry.write_offsets([Offset(c.topic, c.partition, c.new, ids[c.topic]) for c in changes], who)


def _stale(topic_id: Callable[[str], str], topic: str, committed: Committed) -> bool:
    """Whether ``committed`` is of an earlier creation of ``topic``, whose current id
    ``topic_id`` reads (one written before topic ids counts as of the current one)."""
    try:
        return not same_creation(committed.topic_id, topic_id(topic))
    except TopicNotFound:
        return False


def _old(registry: Registry, topic: str, partition: int) -> Position | None:
    try:
        committed = registry.committed(topic, partition)
    except KlError:  # damaged: overwritten
        return None
    return None if committed is None else committed.position


def _partitions(
    root: Root, members: list[Member], known: set[tuple[str, int]], taken: Callable[[str], bool] | None = None
) -> list[tuple[str, int]]:
    """``known`` partitions plus every partition of their topics and of the topics live
    members subscribe to (of those ``taken`` takes, where given), sorted."""
    if taken is not None:
        known = {(t, p) for t, p in known if taken(t)}
    topics = {t for t, _ in known}
    existing = root.topics()
    topics.update(t for t in existing if any(member.subscribes(t) for member in members) and (taken is None or taken(t)))
    found = set(known)
    for topic in topics:
        if topic in existing:
            try:
                found.update((topic, p) for p in range(root.config(topic).partitions))
            except TopicNotFound:
                pass  # deleted meanwhile
    return sorted(found)


def _exists(root: Root, topic: str, partition: int) -> bool:
    try:
        root.log(topic, partition).state()
    except TopicNotFound:
        return False
    return True


def _shiftable(root: Root, registry: Registry, old: dict[tuple[str, int], Position | None]) -> dict[tuple[str, int], Position]:
    """The committed offsets to shift; ``InvalidConfig`` naming the partitions without
    one of their topic as it is now (none, damaged, or of an earlier creation)."""
    found, missing = {}, []
    for (topic, partition), position in old.items():
        committed = None if position is None else registry.committed(topic, partition)
        if committed is None or _stale(root.topic_id, topic, committed):
            missing.append(f"{topic}/{partition}")
        else:
            found[topic, partition] = committed.position
    if missing:
        raise InvalidConfig(
            f"group {registry.group!r} has no committed offset to shift for {', '.join(missing)}: reset it to a place first"
        )
    return found


def _shifted(log: Log, position: Position, by: int) -> Position:
    """The place ``by`` messages after (before, when negative) ``position``, kept
    within the log; a position below the log start counts from the log start."""
    state = log.state()
    if position.offset < state.log_start_offset:
        position = Position(state.log_start_offset)
    if position.offset >= state.log_end_offset:
        position = Position(state.log_end_offset)
    if by < 0:
        if position.skip >= -by:
            return Position(position.offset, position.skip + by)
        return log.position_back(-by - position.skip, before=position.offset)
    last, index, moved = None, 0, 0
    for msg in log.messages(position.offset, state.log_end_offset):
        index = index + 1 if msg.offset == last else 0
        last = msg.offset
        if msg.offset == position.offset and index < position.skip:
            continue  # before the position, inside its compressed batch
        if moved == by:
            return Position(msg.offset, index)
        moved += 1
    return Position(state.log_end_offset)


def _target(log: Log, to: Target) -> Position:
    if to == "earliest":
        return Position(log.log_start_offset)
    if to == "latest":
        return Position(log.log_end_offset)
    if isinstance(to, AtTime):
        return Position(log.offset_for_time(to.time_ms))
    if isinstance(to, Position):
        return _check_position(log, to)
    if isinstance(to, int) and not isinstance(to, bool):
        return _check_position(log, Position(to))
    raise InvalidConfig(f"reset to earliest, latest, a byte offset, a Position, AtTime(ms) or ShiftBy(n), not {to!r}")


def _check_position(log: Log, position: Position) -> Position:
    """``position`` if its offset starts a message within the log and its skip is below
    the count of the messages there; else ``InvalidOffset``."""
    log.check_offset(position.offset)
    if position.skip:
        held = sum(1 for msg in log.read(position.offset, 1) if msg.offset == position.offset)
        if position.skip >= held:
            where = f"{os.path.basename(os.path.dirname(log.directory))}/{os.path.basename(log.directory)}"
            raise InvalidOffset(
                f"position {position} of {where}: offset {position.offset} holds {held} message{'s' if held != 1 else ''},"
                f" so none is left after skipping {position.skip}"
            )
    return position


def _member_info(registry: Registry, member: Member, now: int) -> MemberInfo:
    try:
        changed = os.stat(os.path.join(registry.path, "ids", member.id)).st_mtime_ns // 1_000_000
        age: int | None = max(0, now - changed)
    except OSError:
        age = None
    return MemberInfo(member.id, member.host, member.pid, member.since_ms, member.subscription, age)


class Lag(NamedTuple):
    """A partition's log start and end and a committed position's lag (None: unknown)."""

    log_start_offset: int | None
    log_end_offset: int | None
    messages: int | None
    bytes: int | None
    ms: int | None
    status: Status
    committed_kafka_offset: int | None = None
    log_end_kafka_offset: int | None = None
    damage: str | None = None
    """Why the partition's state record cannot be read (status ``UNREADABLE``)."""


LagMemo = dict[tuple[str, int], tuple[tuple[object, ...], tuple[int | None, int | None]]]
"""(topic, partition) -> what ``_lag`` read of the place it counts from (its Kafka
offset and the timestamp of the message there), and where and when: offset, skip, topic
id, the directory's modification time (changed by a roll, retention or a repair), and
whether a message was there."""


def _lag(
    root: Root,
    topic: str,
    partition: int,
    committed: Position | None,
    now: int,
    state: PartitionState | None = None,
    memo: LagMemo | None = None,
) -> Lag:
    """The partition's log start and end (of ``state``, by default as read now), and the
    lag of ``committed`` (None: not committed) at ``now`` (ms, the files' clock): messages
    from it to the log end (a compressed batch counts its inner messages), bytes, and the
    age of the first of them by its timestamp.  Reads the state, the counts, and one
    message (not again where ``memo`` has them); damaged data or a codec kl cannot read
    on the way leave the counts and the age None.  Raises no ``TopicNotFound`` (status
    ``GONE``) and no ``CorruptState`` (``UNREADABLE``)."""
    try:
        log = root.log(topic, partition)
        state = state or log.state()
    except TopicNotFound:
        return Lag(None, None, None, None, None, Status.GONE)
    except CorruptState as e:
        return Lag(None, None, None, None, None, Status.UNREADABLE, damage=str(e))
    start, end = state.log_start_offset, state.log_end_offset
    try:
        state = log.counted(state)
        end_count: int | None = state.log_end_count
    except TopicNotFound:
        return Lag(None, None, None, None, None, Status.GONE)
    except CorruptMessage:
        end_count = None
    if committed is None:
        return Lag(start, end, None, None, None, Status.NOT_COMMITTED, None, end_count)
    if committed.offset > end:
        return Lag(start, end, None, None, None, Status.PAST_END, None, end_count)
    status = Status.BEFORE_START if committed.offset < start else Status.OK
    first = max(committed.offset, start)
    skip = committed.skip if first == committed.offset else 0
    try:
        where = (first, skip, log.config.topic_id, os.stat(log.directory).st_mtime_ns, first < end)
    except FileNotFoundError:
        return Lag(None, None, None, None, None, Status.GONE)
    kept = None if memo is None else memo.get((topic, partition))
    if kept is not None and kept[0] == where:
        at, stamp = kept[1]
    else:
        try:
            at = log.kafka_offset(first, skip, state=state)
            stamp = next((msg.timestamp for msg in log.messages(first, end)), None)
        except TopicNotFound:
            return Lag(None, None, None, None, None, Status.GONE)
        except (CorruptMessage, UnsupportedCodec, OffsetOutOfRange, InvalidOffset):  # (damage, retention meanwhile)
            at, stamp = None, None
        else:
            if memo is not None:
                memo[topic, partition] = where, (at, stamp)
    count = None if end_count is None or at is None else end_count - at
    age = None if stamp is None else max(0, now - stamp)
    return Lag(start, end, count, end - first, age, status, at if status is Status.OK else None, end_count)


def _parse_line(root: Root, line: str, number: int) -> tuple[tuple[str, int], Position]:
    fields = line.split()
    position = parse_position(fields[2]) if len(fields) == 3 else None
    if position is None or not fields[1].isdigit():
        raise InvalidImport(f"line {number}: expected 'TOPIC PARTITION OFFSET' or 'TOPIC PARTITION OFFSET+SKIP', got {line!r}")
    topic, partition = fields[0], int(fields[1])
    try:
        validate_name(topic)
        _check_position(root.log(topic, partition), position)
    except KlError as e:
        raise InvalidImport(f"line {number}: {e}") from None
    return (topic, partition), position
