"""Bringing existing segment files in as a topic's partitions (``kl topics import``).

Each source directory holds one partition's segment files, kl's (``.kl``) or Kafka
0.7's (``.kafka``).  Every file is checked first, all of them before anything changes:
names, continuity (each segment ends where the next begins), every message, and sizes
against the topic's limit.  What cannot be adopted is refused with the reason.  The
files are then copied into the partition (the sources are left as they are) and
adopted into its state: the log starts at the first segment's base offset and ends
where the last one ends.  In a kl topic Kafka 0.7 segments are read, never written: the
next append starts a new ``.kl`` segment after them.  In a topic of format 0.7 they
stay the active format and the next append goes on in the last one; ``.kl`` segments
and magic 2 messages are refused there (Kafka 0.7 clients could not read them).

Kafka offsets are kept where the directory tells them: its state record's count at the
active segment's base, else the newest segment's offset index (``NAME.index``) that
matches its segment (base offset, size and messages; the modification time may be a
copy's).  Where neither does, the oldest segment's first message gets Kafka offset 0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from kl.errors import InvalidConfig, KlError, RootNotFound, TopicNotFound
from kl.log import offsetindex
from kl.log.config import FORMAT_07, MiB, TopicConfig
from kl.log.fsutil import fsync_dir, share, storage_error
from kl.log.log import IMPORTING_PREFIX, Log, SegmentInfo
from kl.log.message import CURRENT_MAGIC
from kl.log.segment import SUFFIX, Segment, list_segments
from kl.log.state import BOOT_ID, STATE_FILE, UNKNOWN, PartitionState, read_state

SCAN_LIMIT = 2**31 - 1
"""The largest message believed while checking files that belong to no topic yet."""


class ImportRefused(KlError):
    """Segment files that cannot be adopted as they are (damaged, discontinuous, too big)."""


@dataclass(frozen=True)
class ImportedPartition:
    partition: int
    source: str
    segments: int
    log_start_offset: int
    log_end_offset: int
    largest_message_bytes: int
    kafka_offsets: tuple[int, int]
    """(log start, log end) as Kafka offsets."""


class Checked(NamedTuple):
    """A source directory whose segments can be adopted."""

    segments: list[SegmentInfo]
    largest_message_bytes: int
    kl_data: str | None
    """Where it holds kl's data (a ``.kl`` file, a magic 2 message), which a topic of
    format 0.7 cannot take; None when it holds only Kafka 0.7's."""
    messages: list[int]
    """Each segment's messages, as Kafka offsets count them."""
    base_count: int
    """The Kafka offset of the first segment's first message (see ``kept_count``)."""


def check_directory(directory: str) -> Checked:
    """The segments of ``directory``, its largest message, where it holds kl's data and
    its Kafka offsets; or ``ImportRefused``."""
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise ImportRefused(f"{directory} is not a directory")
    found = list_segments(directory)
    if not found:
        raise ImportRefused(f"{directory} holds no segment files (NNNNNNNNNNNNNNNNNNNN.kl or .kafka)")
    segments: list[SegmentInfo] = []
    messages: list[int] = []
    largest = 0
    kl_data = None
    for base, name in found:
        path = os.path.join(directory, name)
        if os.path.islink(path) or not os.path.isfile(path):
            raise ImportRefused(f"{path} is not a regular file")
        if segments and base == segments[-1].base_offset:
            raise ImportRefused(f"{directory} holds two segment files with base offset {base}")
        if segments and segments[-1].base_offset + segments[-1].size_in_bytes != base:
            before = segments[-1]
            raise ImportRefused(
                f"{before.path} ends at offset {before.base_offset + before.size_in_bytes}, but the next segment begins at {base}"
            )
        if name.endswith(SUFFIX):
            kl_data = kl_data or f"{path} is a kl segment"
        with Segment.open(path, base, SCAN_LIMIT) as segment:
            size = segment.size_in_bytes()
            for damage in segment.damage(0, size):
                raise ImportRefused(f"{path}: {damage.problem.reason} at offset {base + damage.start}; see 'kl dump {path}'")
            for entry in segment.scan(0, size):
                largest = max(largest, entry.size)
                if kl_data is None and entry.magic >= CURRENT_MAGIC:
                    kl_data = f"{path} holds magic {entry.magic} messages (kl's), at offset {base + entry.position}"
            messages.append(offsetindex.segment_count(segment, size))
        segments.append(SegmentInfo(base, path, size))
    return Checked(segments, largest, kl_data, messages, kept_count(directory, segments, messages))


def kept_count(directory: str, segments: list[SegmentInfo], messages: list[int]) -> int:
    """The Kafka offset of the first segment's first message as ``directory`` keeps it:
    from its state record's count at the active segment's base, else from the newest
    offset index that matches its segment, else from the base count kept beside the
    newest segment; 0 where none gives one (or one below 0)."""
    bases = [s.base_offset for s in segments]
    known = []
    try:
        state = read_state(os.path.join(directory, STATE_FILE))
    except (OSError, KlError):
        state = None
    if state is not None and state.active_base_count != UNKNOWN and state.active_base_offset in bases:
        known.append((bases.index(state.active_base_offset), state.active_base_count))
    for i in reversed(range(len(segments))):
        index = offsetindex.read(segments[i].path, bases[i], segments[i].size_in_bytes, None)
        if index is not None and index.base_count != UNKNOWN and index.messages == messages[i]:
            known.append((i, index.base_count))
            break
    if segments:  # the active segment's, as its roll kept it
        last = offsetindex.kept_base_count(segments[-1].path, bases[-1])
        if last is not None:
            known.append((len(segments) - 1, last))
    for i, count in known:
        first = count - sum(messages[:i])
        if first >= 0:
            return first
    return 0


class Topics(Protocol):
    """What an import needs of a root of topics (``kl.Root``, which sits above this layer)."""

    def config(self, name: str) -> TopicConfig: ...

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig: ...

    def log(self, name: str, partition: int) -> Log: ...


def _exists(root: Topics, name: str) -> bool:
    try:
        root.config(name)
    except (TopicNotFound, RootNotFound):  # a missing root is created with the topic
        return False
    return True


def import_topic(root: Topics, name: str, directories: list[str], config: TopicConfig | None = None) -> list[ImportedPartition]:
    """Adopt each directory's segments as partition 0, 1, ... of topic ``name``.

    The topic is created when missing (with ``config``, its partition count raised to the
    number of directories and its size limit to the largest message found);
    an existing topic must have that many partitions or more, each still empty.
    Raises ``ImportRefused`` (nothing changed) and the usual ``KlError``s.
    """
    if not directories:
        raise ImportRefused("give at least one directory of segment files")
    checked = [check_directory(directory) for directory in directories]
    largest = max(c.largest_message_bytes for c in checked)
    exists = _exists(root, name)
    legacy = root.config(name).legacy if exists else (config or TopicConfig()).legacy
    for c in checked:
        if legacy and c.kl_data is not None:
            raise ImportRefused(f"topic {name!r} stores Kafka 0.7 messages (format {FORMAT_07}): {c.kl_data}")
    if not exists:
        base = config or TopicConfig()
        limit = max(base.max_message_bytes, largest)
        try:
            partitions = max(base.partitions, len(directories))
            wanted = dataclasses.replace(
                base, partitions=partitions, max_message_bytes=limit, segment_bytes=max(base.segment_bytes, limit)
            )
        except InvalidConfig as e:
            raise ImportRefused(f"cannot create topic {name!r} for these files: {e}") from None
        root.create_topic(name, wanted)
    existing = root.config(name)
    if existing.partitions < len(directories):
        raise ImportRefused(f"topic {name!r} has {existing.partitions} partitions, fewer than {len(directories)} directories")
    if largest > existing.max_message_bytes:
        raise ImportRefused(
            f"a message of {largest} bytes exceeds max_message_bytes {existing.max_message_bytes} of topic {name!r}"
            f" (at most {max(largest, MiB)} would do)"
        )
    logs = [root.log(name, p) for p in range(len(directories))]
    for p, (log, (segments, *_)) in enumerate(zip(logs, checked, strict=True)):
        state = log.state()
        if state.log_end_offset != 0:
            raise ImportRefused(f"partition {p} of topic {name!r} is not empty (it ends at {state.log_end_offset})")
        incoming = {os.path.basename(s.path) for s in segments}
        for _, present in list_segments(log.directory):
            path = os.path.join(log.directory, present)
            if present not in incoming and os.path.getsize(path) > 0:
                raise ImportRefused(
                    f"partition {p} of topic {name!r} holds {present}, which is not being imported; move it away first"
                )
    out = []
    for p, (log, found, directory) in enumerate(zip(logs, checked, directories, strict=True)):
        with log.locked():
            _adopt(log, found)
        segments = found.segments
        out.append(
            ImportedPartition(
                p,
                directory,
                len(segments),
                segments[0].base_offset,
                segments[-1].base_offset + segments[-1].size_in_bytes,
                found.largest_message_bytes,
                (found.base_count, found.base_count + sum(found.messages)),
            )
        )
    return out


def _adopt(log: Log, checked: Checked) -> None:
    """Under the lock: copy checked segment files into an empty partition (each to a
    temporary name, fsynced, renamed in), remove its other, empty, segment files, and
    publish the copies as the whole log, with their Kafka offsets."""
    segments = checked.segments
    incoming = {os.path.basename(s.path) for s in segments}
    for info in segments:
        target = os.path.join(log.directory, os.path.basename(info.path))
        tmp = os.path.join(log.directory, f"{IMPORTING_PREFIX}{os.urandom(6).hex()}")
        try:
            shutil.copyfile(info.path, tmp, follow_symlinks=False)
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            share(tmp, log.directory)
            os.rename(tmp, target)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise storage_error(e, "import", target) from None
    for _, name in list_segments(log.directory):
        if name not in incoming:
            os.unlink(os.path.join(log.directory, name))
    fsync_dir(log.directory)
    first, last = segments[0], segments[-1]
    end = last.base_offset + last.size_in_bytes
    now = time.time_ns() // 1_000_000
    active = checked.base_count + sum(checked.messages[:-1])
    log.write_state(
        PartitionState(
            first.base_offset,
            last.base_offset,
            end,
            end,
            end,
            0,
            now,
            BOOT_ID,
            active_base_count=active,
            log_end_count=active + checked.messages[-1],
        )
    )
