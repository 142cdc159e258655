"""A partition's log: the list of its segment files, its published state and its lock.

Writers append under the partition's inter-process lock: they read the state, repair a
torn tail a crash left, write the message set at the end they found (never with
O_APPEND, which NFS does not honour), then publish the new end in the state record.
Readers take no lock: they read the state, then only bytes below its log end.  ``Log``
is the only code that writes the state record; recovery and retention call its verbs.

Flushing follows the topic's policy.  An append that finds a flush due publishes and
hands the fsync to a background thread (``kl.log.flusher``), which fsyncs outside the lock
(one fsync covers every append before it: a group commit) and then publishes the new
flushed offset; so neither the appender nor other writers wait for the disk.  The same
thread keeps the time rule for producers that go idle.  An fsync error fails this
handle's next append, flush and close.  ``fsync=True`` (and NFS) fsync under the lock
and publish only durable data.

On NFS a writer can lose its lock without knowing (paused or cut off past its lease), so
appends there are fenced: each puts up an "append under way" mark with a fresh token
before it writes (``_announce``), publishes only while the mark is still its own
(``_check_fence``), and a writer that finds an append that never finished starts a new
segment rather than write where that one's writer may still write late (``_fence``).

A ``Log`` object is safe to share between threads and across ``fork()``; several
processes on several hosts may append to one partition at once.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

from kl.errors import (
    CorruptMessage,
    CorruptState,
    InvalidConfig,
    InvalidOffset,
    OffsetOutOfRange,
    StorageError,
    TopicNotFound,
)
from kl.log import flusher, locks, offsetindex, openfiles, producers, timeindex
from kl.log.config import CONFIG_FILE, TopicConfig, config_generation
from kl.log.fsutil import create_file, file_time_ns, fsync_dir, mount_of, nfs_locking_problem, storage_error, write_all
from kl.log.message import LENGTH_SIZE, MIN_LENGTH, PREFIX, Message
from kl.log.messageset import INCOMPLETE, MessageSet
from kl.log.offsetindex import Counted
from kl.log.segment import LEGACY_SUFFIX, SUFFIX, Segment, list_segments, segment_name, segment_path
from kl.log.state import BOOT_ID, NO_TOKEN, STATE_FILE, UNKNOWN, PartitionState, StateFile, read_state, write_state
from kl.log.validate import Checked

log = logging.getLogger(__name__)
T = TypeVar("T")

RECHECK_SECONDS = 1.0
"""How long a writer that was the last to append trusts its view of the files without
an fstat (a partition or state file removed by hand is noticed after it)."""
DEFAULT_LOCK_TIMEOUT = 120.0
"""Longer than the default NFSv4 lease (90 s) a crashed client's lock can outlive it by."""
LOST_LOCK = (
    "this host lost its lock on the partition (cut off from the NFS server past its lease?) "
    "and the server refused its writes; another host may have appended since"
)
DELETED_SUFFIX = ".deleted"
"""Segments below the log start are renamed with it, then unlinked after a delay."""
READ_CHUNK = 1 << 20
"""Bytes read at a time by scans of whole segments."""
TIME_LOOKUP_TRIES = 10
"""Times ``offset_for_time`` looks again when retention deleted a segment under it."""
FENCED = (
    "this host lost its lock on the partition (paused, or cut off from the NFS server, past its lease) "
    "and another host took it over; nothing of this append was published"
)
FENCE_SUFFIX = ".fence"
"""A new empty active segment's name while it is made to replace the old one (``_fence``)."""
IMPORTING_PREFIX = ".import-"
"""A segment being copied in by ``adopt`` (under the lock): found outside it, a leftover."""


class _Staged(NamedTuple):
    """An append written and not yet published (``Log._stage``): the state it was written
    after, its length, whether it was fsynced, and the new segment holding it, if it rolled."""

    state: PartitionState
    length: int
    fsync: bool
    new: Segment | None


class Position(NamedTuple):
    """A place in a partition between two messages: the message at ``offset``, after
    the first ``skip`` messages stored there (inner messages of a compressed batch,
    which has a single offset).  Written ``OFFSET`` or ``OFFSET+SKIP``."""

    offset: int
    skip: int = 0

    def __str__(self) -> str:
        return f"{self.offset}+{self.skip}" if self.skip else str(self.offset)


class SegmentInfo(NamedTuple):
    base_offset: int
    path: str
    size_in_bytes: int
    mtime_ns: int | None = None
    """A closed segment's modification time when listed (None for the active one)."""


class Log:
    """One partition of a topic."""

    def __init__(
        self,
        directory: str,
        lock_path: str,
        config: TopicConfig,
        *,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        config_generation: int = 0,
    ):
        """``config_generation``: that of the ``topic.json`` ``config`` was read from, when
        known (``refresh_config`` then reads it again only once it changed)."""
        self.directory = directory
        self.lock_path = lock_path
        self.config = config
        """The topic's settings: taken up again from disk after ``kl topics alter``
        (``refresh_config``) by each append and each read that finds data."""
        self.lock_timeout = lock_timeout
        self._config_path = os.path.join(os.path.dirname(directory), CONFIG_FILE)
        self._config_generation = config_generation
        self.state_path = os.path.join(directory, STATE_FILE)
        self.suffix = LEGACY_SUFFIX if config.legacy else SUFFIX
        """The suffix of the segments this log writes: ``.kafka`` for a topic of format 0.7."""
        self._bases: list[int] = []
        self._names: list[str] = []
        # Writer handles, used only under the lock.
        self._state_file: StateFile | None = None
        self._active: Segment | None = None
        self._kept: tuple[StateFile, Segment | None] | None = None
        """On NFS, between two holds of the lock: the state file and active segment, open
        and unlocked (``_let_go``); the next hold locks them again, which revalidates them."""
        self._tail_checked = False
        self._orphans_listed = False
        """This handle listed the directory for unpublished segments (its first roll did)."""
        self._recheck_at = 0.0
        self._published: PartitionState | None = None
        self._published_raw: bytes | None = None
        self._nfs: bool | None = None
        self._locking_checked = False
        self._counted: dict[int, Counted] = {}
        """Segment base -> its messages as counted (``kl.log.offsetindex``), the active one's too."""
        self._count_lock = threading.Lock()
        self._start_count: tuple[tuple[int, int, int, int | None], int] | None = None
        """(log start, active base, its count, the directory's modification time) -> the log start's Kafka offset."""
        self._validated: dict[int, int] = {}
        """On NFS: segment base -> the end up to which this reader revalidated it."""
        self._journal: producers.Journal | None = None
        """The producer journal as this writer read it (``append_counted`` of an idempotent batch)."""
        self._lock: locks.ProcessLock | None = None
        self._failed: str | None = None
        self._token: bytes | None = None
        """On NFS, under the lock: the token of this hold's "append under way" mark."""
        self._record: bytes | None = None
        """On NFS, under the lock: the record this hold read or published last."""
        self.flush_scheduled = False
        """Set while ``kl.log.flusher`` holds this log for a timed flush."""
        self.used = False
        """Set by each hold (``openfiles.Keeper``: the writer's files count in the process's budget)."""

    def __repr__(self) -> str:
        return f"Log({self.directory!r})"

    def foreign(self, segment: Segment | SegmentInfo) -> bool:
        """A segment of the other format (Kafka 0.7's in a kl topic): read, never written."""
        return not segment.path.endswith(self.suffix)

    # ----------------------------------------------------------------- reading

    def state(self) -> PartitionState:
        """The published state.  Raises ``TopicNotFound`` when the partition is gone and
        ``CorruptState`` when its record is missing or damaged (``kl recover`` rebuilds it).

        On NFS the record is read under a shared lock: without one, a client that has no
        change attribute to go by (NFSv3) can keep serving an old record.
        """
        try:
            if not self.on_nfs():
                return read_state(self.state_path)
            state_file = self._state_file
            if state_file is not None:  # this writer holds it locked: its view is fresh
                return PartitionState.decode(state_file.read(), self.state_path)
            return read_state(self.state_path, self._revalidate_state)
        except FileNotFoundError:
            if os.path.isdir(self.directory):
                raise CorruptState(f"partition state {self.state_path} is missing; run 'kl recover'") from None
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StorageError(f"{self.state_path} is a symbolic link: kl follows no links inside a root") from None
            raise storage_error(e, "read", self.state_path) from None

    @property
    def log_start_offset(self) -> int:
        """The byte offset of the first message kept (retention moves it), as the state record says now."""
        return self.state().log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The byte offset after the last message published, as the state record says now."""
        return self.state().log_end_offset

    def open_segment(self, base_offset: int) -> Segment:
        """The segment starting at ``base_offset``, opened for reading: on NFS past this
        host's page cache, as writers write.  A lock revalidates what the client cached,
        but not always: in the lab's kill -9 hand-over, a reader on the host whose own
        writer appended with ``O_DIRECT`` read a page of zeros where the other host had
        appended and published a batch, in about one run of six (in none of 70 past the cache)."""
        segment = Segment.open(segment_path(self.directory, base_offset), base_offset, self.config.max_message_bytes)
        if self.on_nfs():
            try:
                segment.past_page_cache()
            except BaseException:
                segment.close()
                raise
        return segment

    def read(self, offset: int, max_bytes: int) -> MessageSet:
        """The complete messages in ``[offset, offset + max_bytes)``, as a lazily parsed set.

        A first message larger than ``max_bytes`` is still returned whole: the read grows
        up to the topic's maximum message size.  Raises ``OffsetOutOfRange`` outside
        ``[log start, log end]`` and ``InvalidOffset`` where no message starts at ``offset``.
        """
        found = self._open_at(offset)
        if found is None:
            return MessageSet(b"", offset, max_message_bytes=self.config.max_message_bytes)
        segment, state, segment_end, stable = found
        with segment:
            try:
                return self._read_segment(segment, state, offset, max_bytes, segment_end, stable)
            except OSError as e:
                raise storage_error(e, "read", segment.path) from None

    def span(self, offset: int, max_bytes: int) -> tuple[Segment, int, int] | None:
        """Where a fetch of ``max_bytes`` at ``offset`` lies on disk: (open segment, position, size).

        As in Kafka 0.7 the bytes end at ``max_bytes`` or the segment's end, even inside a
        message (the reader resumes there), so a fetch never spans two files; they never
        pass the published end nor include a torn tail.  None at the log end.  The caller
        closes the segment.  Raises ``OffsetOutOfRange``.
        """
        found = self._open_at(offset)
        if found is None:
            return None
        segment, state, segment_end, stable = found
        try:
            segment_end = self._untorn_end(segment, state, offset, max_bytes, segment_end, stable)
        except BaseException:
            segment.close()
            raise
        return segment, offset - segment.base_offset, max(0, min(max_bytes, segment_end - offset))

    def _open_at(self, offset: int) -> tuple[Segment, PartitionState, int, int] | None:
        """The segment holding ``offset``, opened (None at the log end), with the state it was
        found by and the segment's end and stable offsets."""
        state = self.state()
        self._check_range(offset, state)
        for _ in range(3):
            if offset == state.log_end_offset:
                return None
            self.refresh_config(keep=False)  # after the state: a message it covers obeys the settings read now
            base, segment_end, stable = self._locate(offset, state)
            try:
                segment = self.open_segment(base)
            except FileNotFoundError:  # deleted by retention, or a stale listing: look again
                self._relist()
                state = self.state()
                self._check_range(offset, state)
                self._bases = []
                continue
            except OSError as e:
                raise storage_error(e, "read", segment_path(self.directory, base)) from None
            try:
                if self.on_nfs() and self._validated.get(base) != segment_end:  # new data since we looked
                    locks.revalidate(segment.fd, segment.path, self.lock_timeout)
                    self._validated[base] = segment_end
            except OSError as e:
                segment.close()
                raise storage_error(e, "read", segment.path) from None
            return segment, state, segment_end, stable
        raise TopicNotFound(f"segment for offset {offset} in {self.directory} keeps disappearing")

    def _relist(self) -> None:
        """Before looking for segments again: on NFS, a listing, so that names the client
        cached (as there or as missing) are looked up afresh."""
        if self.on_nfs():
            os.listdir(self.directory)

    def _check_range(self, offset: int, state: PartitionState) -> None:
        if not state.log_start_offset <= offset <= state.log_end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is out of range: {self.directory} holds offsets "
                f"{state.log_start_offset} to {state.log_end_offset}",
                offset=offset,
                log_start_offset=state.log_start_offset,
                log_end_offset=state.log_end_offset,
            )

    def _locate(self, offset: int, state: PartitionState) -> tuple[int, int, int]:
        """(base offset, end offset, stable offset) of the segment holding ``offset``."""
        if offset >= state.active_base_offset:
            return state.active_base_offset, state.log_end_offset, state.stable_offset
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0 or i + 1 >= len(self._bases) or self._bases[i + 1] > state.active_base_offset:
            self.refresh()
            i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:  # retention moved the log start after ``state`` was read, or a segment is missing
            state = self.state()
            self._check_range(offset, state)
            raise OffsetOutOfRange(
                f"offset {offset} is out of range: no segment of {self.directory} holds it",
                offset=offset,
                log_start_offset=state.log_start_offset,
                log_end_offset=state.log_end_offset,
            )
        end = self._bases[i + 1] if i + 1 < len(self._bases) else state.active_base_offset
        return self._bases[i], end, end  # closed segments were fsynced when they rolled

    def refresh(self) -> None:
        """List the segment files again (another process rolled or deleted some).  Raises ``TopicNotFound``."""
        try:
            found = list_segments(self.directory)
        except FileNotFoundError:
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        self._bases = [base for base, _ in found]
        self._names = [name for _, name in found]

    def _read_segment(
        self, segment: Segment, state: PartitionState, offset: int, max_bytes: int, segment_end: int, stable: int
    ) -> MessageSet:
        limit = self.config.max_message_bytes
        base = segment.base_offset
        position = offset - base
        segment_end = self._untorn_end(segment, state, offset, max_bytes, segment_end, stable)
        if offset >= segment_end:  # stopped at a torn tail
            return MessageSet(b"", offset, max_message_bytes=limit)
        size = min(max_bytes, segment_end - offset)
        messages = segment.message_set(position, size, stable=stable - base, end=segment_end - base)
        data = messages.buffer
        head = data if len(data) >= PREFIX.size else segment.read(position, PREFIX.size)
        if len(data) == size < segment_end - offset and len(head) >= PREFIX.size:
            length, magic = PREFIX.unpack_from(head)
            if magic < len(MIN_LENGTH) and size < LENGTH_SIZE + length <= limit:  # one message larger than max_bytes
                size = min(LENGTH_SIZE + length, segment_end - offset)
                messages = segment.message_set(position, size, stable=stable - base, end=segment_end - base)
        if not messages.buffer and offset < stable:
            raise CorruptMessage(segment.path, position, f"file ends before offset {segment_end}", offset=offset)
        first = next(messages.entries(), None)
        if first is not None and first.problem is not None:
            cut_short = (
                first.problem.kind is INCOMPLETE and offset + len(messages.buffer) < segment_end and not messages.ends_at_eof
            )
            if not cut_short:
                self._check_boundary(segment, offset)
        return messages

    def _untorn_end(self, segment: Segment, state: PartitionState, offset: int, max_bytes: int, end: int, stable: int) -> int:
        """``end``, or where a torn tail of the active segment begins when a read of
        ``max_bytes`` at ``offset`` would reach into the last append not yet flushed."""
        base = segment.base_offset
        if base == state.active_base_offset and stable < end and offset + max_bytes > state.last_append_offset:
            last = state.last_append_offset - base  # check the last append whole before any of it is read
            return base + segment.good_end(stable - base, last, end - base, start=max(last, stable - base))[0]
        return end

    def check_offset(self, offset: int) -> None:
        """Make sure a message starts at ``offset`` by scanning its segment from the start.

        A read checks only the bytes at the offset, so an offset inside a value that
        itself holds a well-formed message would read that as one; call this for
        offsets a person typed.  Raises ``OffsetOutOfRange`` and ``InvalidOffset``.
        """
        found = self._open_at(offset)
        if found is None:
            return
        with found[0] as segment:
            self._check_boundary(segment, offset)

    def boundary(self, offset: int) -> tuple[int, int]:
        """Where the messages nearest ``offset`` start, by a scan of its segment from the
        start: (at or before it, after it), equal when a message starts there; the log end
        twice at the end.  Raises ``OffsetOutOfRange``."""
        found = self._open_at(offset)
        if found is None:
            return offset, offset
        with found[0] as segment:
            before, after = segment.boundary(offset - segment.base_offset)
            return segment.base_offset + before, segment.base_offset + after

    def _check_boundary(self, segment: Segment, offset: int) -> None:
        """Raise ``InvalidOffset`` when a scan from the segment's start steps over ``offset``."""
        before, after = segment.boundary(offset - segment.base_offset)
        if before < offset - segment.base_offset < after:
            raise InvalidOffset(
                f"offset {offset} is not the start of a message in {self.directory}; "
                f"the nearest messages start at {segment.base_offset + before} and {segment.base_offset + after}"
            )

    def segments(self, state: PartitionState | None = None) -> list[SegmentInfo]:
        """The segments from the log start to the active one, oldest first, with sizes
        (as ``state`` has them; by default the published state).  A closed segment's
        size stops at the next segment's base: bytes past it are a fenced writer's late
        ones (see ``_fence``), never data."""
        state = state or self.state()
        self.refresh()
        out = []
        following = state.active_base_offset  # the first base above the one at hand (walking down)
        above = None
        for base, name in zip(reversed(self._bases), reversed(self._names), strict=True):
            if above is not None and base < above:
                following = above
            above = base
            if state.log_start_offset <= base <= state.active_base_offset:
                path = os.path.join(self.directory, name)
                if base == state.active_base_offset:
                    if path != segment_path(self.directory, base):
                        continue  # a second file with the active base (recover reports it)
                    size, mtime = state.log_end_offset - base, None
                else:
                    try:
                        stat = os.lstat(path)
                    except FileNotFoundError:
                        continue
                    size, mtime = min(stat.st_size, following - base), stat.st_mtime_ns
                out.append(SegmentInfo(base, path, size, mtime))
        out.reverse()
        return out

    def size_in_bytes(self) -> int:
        """Bytes of the partition's segment files."""
        return sum(s.size_in_bytes for s in self.segments())

    def first_timestamp(self, segment: SegmentInfo) -> int | None:
        """Timestamp of a segment's first message (None if empty, gone, or magic 0/1)."""
        try:
            first = next(iter(self.read(segment.base_offset, 4096)), None)
        except OffsetOutOfRange:
            return None
        return None if first is None else first.timestamp

    def skip_corrupt(self, offset: int) -> int:
        """The offset after the damaged message at ``offset``: where valid messages start
        again that provably run on to the segment's end (or that end)."""
        found = self._open_at(offset)
        if found is None:
            return offset
        segment, _, end, _ = found
        base = segment.base_offset
        with segment:
            bad = segment.first_problem(offset - base, end - base)
            if bad is None:
                return offset
            resumed = segment.resync(bad, end - base)
        return end if resumed is None else base + resumed

    def offsets_before(self, time_ms: int, max_offsets: int) -> list[int]:
        """Up to ``max_offsets`` segment start offsets at or before ``time_ms``, newest first.

        A segment counts as "before" when its first message's timestamp is at or before
        ``time_ms``; the log end is included when the whole log is.  ``LATEST`` (-1) and
        ``EARLIEST`` (-2) give the log end and the log start.  A topic of format 0.7 has
        no timestamps and answers as Kafka 0.7's ``getOffsetsBefore`` did, by the
        segment files' modification times (see ``_offsets_before_by_mtime``).
        """
        state = self.state()
        if self.config.legacy:
            return self._offsets_before_by_mtime(state, time_ms, max_offsets)
        if time_ms == LATEST:
            return [state.log_end_offset][:max_offsets]
        if time_ms == EARLIEST:
            return [state.log_start_offset][:max_offsets]
        found = []
        for segment in self.segments(state):
            ts = self.first_timestamp(segment)
            if ts is not None and ts <= time_ms:
                found.append(segment.base_offset)
        if state.log_end_offset > state.active_base_offset and time_ms >= time.time_ns() // 1_000_000:
            found.append(state.log_end_offset)
        return found[::-1][:max_offsets]

    def _offsets_before_by_mtime(self, state: PartitionState, time_ms: int, max_offsets: int) -> list[int]:
        """Kafka 0.7's ``getOffsetsBefore``: each segment's (base offset, file mtime), then
        (log end, now) when the active segment is not empty; from the newest entry whose
        time is at or before ``time_ms`` (``LATEST``: the last entry, ``EARLIEST``: the
        first) back to the oldest, at most ``max_offsets`` of them."""
        entries = [(s.base_offset, mtime) for s in self.segments(state) if (mtime := self.mtime_ms(s)) is not None]
        if state.log_end_offset > state.active_base_offset:
            entries.append((state.log_end_offset, file_time_ns(self.directory) // 1_000_000))  # the mtimes' clock
        if time_ms == LATEST:
            start = len(entries) - 1
        elif time_ms == EARLIEST:
            start = min(0, len(entries) - 1)
        else:
            start = len(entries) - 1
            while start >= 0 and entries[start][1] > time_ms:
                start -= 1
        return [entries[i][0] for i in range(start, max(start - max_offsets, -1), -1)]

    @staticmethod
    def mtime_ms(segment: SegmentInfo) -> int | None:
        """A segment file's modification time in milliseconds (None when it is gone)."""
        try:
            return os.stat(segment.path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def offset_for_time(self, time_ms: int) -> int:
        """The offset of the first message, in log order, with a timestamp at or after
        ``time_ms`` (the log end if there is none), whatever order the timestamps are in:
        Kafka's ``offsetsForTimes``.  Closed segments whose largest timestamp (their time
        summary, see ``time_summary``) is below ``time_ms`` are skipped unread.  A topic
        of format 0.7 has none: there it is the start of the first segment whose file was
        last modified at or after ``time_ms`` (the log end if there is none).  Segments
        deleted by retention meanwhile are looked for again; raises ``OffsetOutOfRange``
        only when the start moves on during each of ``TIME_LOOKUP_TRIES``."""
        found = self._for_time(time_ms)
        return found if isinstance(found, int) else found[0].offset

    def message_for_time(self, time_ms: int) -> tuple[Position, Message] | None:
        """The first message stamped at or after ``time_ms`` (see ``offset_for_time``),
        inside a compressed batch too, and where it is; None when there is none (or in a
        topic of format 0.7, which has no timestamps)."""
        if self.config.legacy:
            return None
        found = self._for_time(time_ms)
        return None if isinstance(found, int) else found

    def _for_time(self, time_ms: int) -> int | tuple[Position, Message]:
        for _ in range(TIME_LOOKUP_TRIES - 1):
            with contextlib.suppress(OffsetOutOfRange):
                return self._offset_for_time(time_ms)
        return self._offset_for_time(time_ms)

    def _offset_for_time(self, time_ms: int) -> int | tuple[Position, Message]:
        """The message found, or the offset (a segment's start, or the log end) that stands for one."""
        state = self.state()
        segments = self.segments(state)
        if self.config.legacy:
            for segment in segments:
                mtime = self.mtime_ms(segment)
                if mtime is not None and mtime >= time_ms:
                    return segment.base_offset
            return state.log_end_offset
        for info in segments:
            end = state.log_end_offset
            if info.base_offset < state.active_base_offset:
                try:
                    newest = self.time_summary(info).newest
                except FileNotFoundError:  # deleted by retention: OffsetOutOfRange, and look again
                    self._check_range(info.base_offset, self.state())
                    raise TopicNotFound(f"segment {info.path} disappeared") from None
                if newest is None or newest < time_ms:
                    continue
                end = info.base_offset + info.size_in_bytes
            last, skip = -1, 0
            for msg in self.messages(info.base_offset, end):
                skip = skip + 1 if msg.offset == last else 0
                last = msg.offset
                if msg.timestamp is not None and msg.timestamp >= time_ms:
                    return Position(msg.offset, skip), msg
        return state.log_end_offset

    def messages(self, start: int, end: int) -> Iterator[Message]:
        """Every message from ``start`` (a message boundary) up to ``end``, read a
        megabyte at a time; the inner messages of a compressed batch one by one (padding,
        which may fill a read, stepped over)."""
        offset = start
        while offset < end:
            found = self.read(offset, min(READ_CHUNK, end - offset))
            for msg in found:
                if msg.offset >= end:
                    return
                yield msg
            if found.next_offset <= offset:
                return
            offset = found.next_offset

    def time_summary(self, info: SegmentInfo, *, keep: bool = True) -> timeindex.TimeSummary:
        """A closed segment's time summary: the one kept beside it when it still names
        the segment as it is, or else worked out by a scan (and kept, unless ``keep`` is
        False; see ``kl.log.timeindex``).
        Raises ``FileNotFoundError`` when the segment is gone, ``OffsetOutOfRange`` when
        it is below the log start and ``CorruptMessage`` when it is damaged."""
        stat = os.stat(info.path, follow_symlinks=False)
        found = timeindex.read(info.path, info.base_offset, stat.st_size, stat.st_mtime_ns)
        if found is not None:
            return found
        messages = self.messages(info.base_offset, info.base_offset + min(stat.st_size, info.size_in_bytes))
        summary = timeindex.TimeSummary.of(info.base_offset, stat.st_size, stat.st_mtime_ns, messages)
        if keep:
            timeindex.write(info.path, summary)
        return summary

    def offset_back(self, count: int) -> int:
        """The offset from which the last ``count`` messages can be read (see ``position_back``)."""
        return self.position_back(count).offset

    def position_back(self, count: int, before: int | None = None) -> Position:
        """Where the last ``count`` messages before offset ``before`` (a message
        boundary; default the log end) start, the log start when there are fewer:
        inside a compressed batch, the batch's offset and how many of its messages
        come first.  One scan of the segments it needs, newest first.  A segment that
        retention deletes meanwhile ends the scan at the new log start.  Raises
        ``TopicNotFound``."""
        for _ in range(3):
            state = self.state()
            end = state.log_end_offset if before is None else min(before, state.log_end_offset)
            if count <= 0:
                return Position(end)
            needed = count
            for info in reversed(self.segments(state)):
                if info.base_offset >= end:
                    continue
                try:
                    segment = self.open_segment(info.base_offset)
                except FileNotFoundError:  # deleted by retention, or a stale listing: look again
                    break
                except OSError as e:
                    raise storage_error(e, "read", info.path) from None
                with segment:
                    position, left = segment.back(needed, min(info.size_in_bytes, end - info.base_offset))
                if position is not None:
                    return Position(info.base_offset + position, skip=left)
                needed = left
            else:
                return Position(self.state().log_start_offset)  # fresh: retention may have moved it meanwhile
            start = self.state().log_start_offset
            if info.base_offset < start:  # every message from the new start is wanted, and fewer remain
                return Position(start)
            self._relist()
        raise TopicNotFound(f"segments of {self.directory} keep disappearing")

    # ----------------------------------------------------------------- Kafka offsets

    def counted(self, state: PartitionState | None = None) -> PartitionState:
        """The state (by default the published one) with its message counts: worked out
        from the segments where the record carries none (one an older kl wrote, or
        recovery rebuilt; the next writer publishes them).  Raises ``CorruptMessage``
        where a segment cannot be counted."""
        return self._recounted(lambda counted: counted, state)

    def _recounted(self, lookup: Callable[[PartitionState], T], state: PartitionState | None) -> T:
        """``lookup`` of the counted state; of the published state again where retention
        set a segment aside meanwhile (``lookup`` and the counting raise
        ``FileNotFoundError``), as a reader's new log start is then."""
        for _ in range(3):
            try:
                return lookup(self._count(state or self.state()))
            except FileNotFoundError:
                self._relist()
                state = None
        raise TopicNotFound(f"segments of {self.directory} keep disappearing")

    def _count(self, state: PartitionState) -> PartitionState:
        if state.log_end_count != UNKNOWN:
            return state
        with self._count_lock:
            base_count = state.active_base_count
            if base_count == UNKNOWN:
                base_count = self._derived_base_count(state)
            active = self._active_counts(state, base_count)
            return state._replace(active_base_count=base_count, log_end_count=base_count + active.count)

    def _derived_base_count(self, state: PartitionState) -> int:
        """The active segment's base count: as the index a roll wrote for it keeps it, else
        from the oldest segment on: its offset index's base count where it keeps one,
        else 0, plus every closed segment's messages."""
        base = state.active_base_offset
        kept = offsetindex.kept_base_count(segment_path(self.directory, base), base)
        if kept is not None:
            return kept
        count = UNKNOWN
        for info in self.segments(state):
            if info.base_offset < state.active_base_offset:
                counted = self._closed_counts(info, UNKNOWN)
                if count != UNKNOWN:
                    counted.base_count = count
                count = counted.base_count + counted.count
        return max(count, 0)

    def kafka_offsets(self, state: PartitionState | None = None) -> tuple[int, int]:
        """(log start, log end) as Kafka offsets."""
        return self._recounted(self._kafka_offsets, state)

    def _kafka_offsets(self, state: PartitionState) -> tuple[int, int]:
        """The log start's Kafka offset is worked out again once the directory changed
        too: a repair of a closed segment (which copies it aside there) takes messages
        out of its count, and so moves the older segments' numbers up."""
        try:
            changed = os.stat(self.directory).st_mtime_ns
        except OSError:
            changed = None  # the partition went after its state was read: the lookup below says so
        key = (state.log_start_offset, state.active_base_offset, state.active_base_count, changed)
        known = self._start_count
        if known is None or known[0] != key:
            known = self._start_count = (key, self._kafka_offset(state, state.log_start_offset, 0))
        return known[1], state.log_end_count

    def kafka_offset(self, offset: int, skip: int = 0, *, state: PartitionState | None = None) -> int:
        """The Kafka offset of the message at ``offset`` (a message start, or the log
        end), after ``skip`` messages of the compressed batch there.  Raises
        ``OffsetOutOfRange`` and ``CorruptMessage``."""
        return self._recounted(lambda counted: self._kafka_offset(counted, offset, skip), state)

    def _kafka_offset(self, state: PartitionState, offset: int, skip: int) -> int:
        self._check_range(offset, state)
        if offset == state.log_end_offset:
            return state.log_end_count + skip
        with self._count_lock:
            for info, counted in self._chain(state):
                if info.base_offset <= offset:
                    if offset - info.base_offset > counted.size_in_bytes:
                        self._count_on(info, counted)
                    with self.open_segment(info.base_offset) as segment:
                        return counted.base_count + counted.find(segment, position=offset - info.base_offset)[1] + skip
        raise self._missing(state, f"no segment of {self.directory} holds offset {offset}")

    def kafka_position(self, kafka_offset: int, *, state: PartitionState | None = None) -> Position:
        """Where the message of Kafka offset ``kafka_offset`` is: its message set's offset
        and how many of the compressed batch there come first (the log end at the end).
        Raises ``OffsetOutOfRange`` outside the log, in Kafka offsets."""
        return self._recounted(lambda counted: self._kafka_position(counted, kafka_offset), state)

    def _kafka_position(self, state: PartitionState, kafka_offset: int) -> Position:
        start, end = self._kafka_offsets(state)
        if not start <= kafka_offset <= end:
            raise OffsetOutOfRange(
                f"Kafka offset {kafka_offset} is out of range: {self.directory} holds {start} to {end}",
                offset=kafka_offset,
                log_start_offset=start,
                log_end_offset=end,
            )
        if kafka_offset == end:
            return Position(state.log_end_offset)
        with self._count_lock:
            for info, counted in self._chain(state):
                if counted.base_count <= kafka_offset:
                    if kafka_offset - counted.base_count > counted.count and counted.size_in_bytes < info.size_in_bytes:
                        self._count_on(info, counted)
                    with self.open_segment(info.base_offset) as segment:
                        position, skip = counted.find(segment, count=kafka_offset - counted.base_count)
                    return Position(info.base_offset + position, skip)
        raise self._missing(state, f"no segment of {self.directory} holds Kafka offset {kafka_offset}")

    def _missing(self, state: PartitionState, what: str) -> Exception:
        """``FileNotFoundError`` (look again) where retention moved the log start since
        ``state``, else ``CorruptState``."""
        if self.state().log_start_offset != state.log_start_offset:
            return FileNotFoundError(what)
        return CorruptState(f"{what}; run 'kl recover'")

    def _chain(self, state: PartitionState) -> Iterator[tuple[SegmentInfo, Counted]]:
        """Newest first, each segment with its counts: base counts from the active
        segment's back, each the next one's less its own messages (the closed segments
        listed only when the active one is not enough).  Under ``_count_lock``."""
        base = state.active_base_offset
        yield (
            SegmentInfo(base, segment_path(self.directory, base), state.log_end_offset - base),
            self._active_counts(state, state.active_base_count, to_damage=True),
        )
        base_count = state.active_base_count
        for info in reversed(self.segments(state)):
            if info.base_offset >= base:
                continue
            counted = self._closed_counts(info, base_count)
            base_count = counted.base_count
            yield info, counted

    def _active_counts(self, state: PartitionState, base_count: int, *, to_damage: bool = False) -> Counted:
        """The active segment's messages, counted up to the log end; with ``to_damage``, up
        to damage that stops the count (the messages before it keep their numbers: see
        ``_count_on``).  Under ``_count_lock``."""
        base = state.active_base_offset
        counted = self._counted.get(base)
        if counted is None or counted.base_count != base_count or counted.size_in_bytes > state.log_end_offset - base:
            counted = self._counted[base] = Counted(base, base_count)
            for other in [b for b in self._counted if b > base]:
                del self._counted[other]  # segments of a partition created again, or cut back by recovery
        if counted.size_in_bytes < state.log_end_offset - base:
            with self.open_segment(base) as segment:
                try:
                    counted.extend(segment, state.log_end_offset - base)
                except CorruptMessage:
                    if not to_damage:
                        raise
        return counted

    def _count_on(self, info: SegmentInfo, counted: Counted) -> None:
        """Count ``info`` on to its end, for a lookup past where damage stopped its count:
        raises the damage (``CorruptMessage``) while it is there."""
        with self.open_segment(info.base_offset) as segment:
            counted.extend(segment, info.size_in_bytes)

    def _closed_counts(self, info: SegmentInfo, following: int) -> Counted:
        """A closed segment's messages: as counted before, as its offset index keeps them,
        or counted now by a scan (and kept in its index); counted again once it was
        modified (a repair pads over damage, which takes messages out of the count).  Its
        base count is the next segment's (``following``) less its messages; where that is
        ``UNKNOWN``, what its index says (0 without one).  Raises ``FileNotFoundError``
        when retention set the segment aside.  Under ``_count_lock``."""
        counted = self._counted.get(info.base_offset)
        if counted is None or counted.size_in_bytes != info.size_in_bytes or counted.mtime_ns != info.mtime_ns:
            stat = os.stat(info.path, follow_symlinks=False)
            kept = offsetindex.read(info.path, info.base_offset, stat.st_size, stat.st_mtime_ns)
            if kept is not None and kept.size_in_bytes == info.size_in_bytes and offsetindex.complete(kept):
                counted = Counted.of(kept)
            else:
                counted = Counted(info.base_offset, UNKNOWN if kept is None else kept.base_count)
                with self.open_segment(info.base_offset) as segment:
                    try:
                        counted.extend(segment, info.size_in_bytes)
                    except CorruptMessage:
                        if not self._counted_before(info, counted):
                            raise
            counted.mtime_ns = stat.st_mtime_ns
            self._counted[info.base_offset] = counted
            kept_base = counted.base_count
            self._base_from(counted, following)
            whole = counted.size_in_bytes == stat.st_size == info.size_in_bytes  # (not where damage stopped the count)
            if whole and (kept is None or kept_base != counted.base_count or not offsetindex.complete(kept)):
                offsetindex.write(info.path, counted.index(stat.st_mtime_ns))
        else:
            self._base_from(counted, following)
        return counted

    @staticmethod
    def _counted_before(info: SegmentInfo, counted: Counted) -> bool:
        """After damage stopped the count of closed segment ``info``: take its count from
        its index (the roll's, of the segment as it was then, whatever its modification
        time now), so the chain numbers the older segments past it, and lookups in it
        stop at the damage; False without one."""
        kept = offsetindex.read(info.path, info.base_offset, info.size_in_bytes, None)
        if kept is None:
            return False
        counted.count = kept.messages
        if counted.base_count == UNKNOWN:
            counted.base_count = kept.base_count
        return True

    @staticmethod
    def _base_from(counted: Counted, following: int) -> None:
        if following != UNKNOWN:
            counted.base_count = following - counted.count
        elif counted.base_count == UNKNOWN:
            counted.base_count = 0

    def _keep_counts(self, state: PartitionState) -> None:
        """After a roll from ``state``: keep the closed segment's base count and message
        count in its offset index (with the entries of a count made while it was active,
        else none: the first reader that needs them adds them)."""
        base, size = state.active_base_offset, state.log_end_offset - state.active_base_offset
        counted = self._counted.get(base)
        if counted is None or counted.size_in_bytes != size or counted.base_count != state.active_base_count:
            counted = Counted(base, state.active_base_count)
            counted.size_in_bytes, counted.count = size, state.log_end_count - state.active_base_count
        path = segment_path(self.directory, base)
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return
        offsetindex.write(path, counted.index(mtime))

    def _keep_base_count(self, state: PartitionState) -> None:
        """Keep the active segment's base count beside it (``offsetindex.keep_base_count``),
        where ``state`` knows it: at a roll, and where recovery, a copy's start or its
        renumbering set it."""
        if state.active_base_count != UNKNOWN:
            base = state.active_base_offset
            offsetindex.keep_base_count(segment_path(self.directory, base), base, state.active_base_count)

    # ----------------------------------------------------------------- writing

    def append(self, batch: Checked, *, fsync: bool = False) -> int:
        """Append a checked message set (``kl.log.validate``: validated, or framed by kl,
        and counted); returns the offset it starts at.

        The set is written whole at the end of the active segment and then published.
        With ``fsync`` the data and state are flushed before this returns; otherwise the
        topic's flush policy decides.  Raises ``LockTimeout``, ``StorageError`` (the log is
        left as it was) and ``CorruptMessage`` when the tail is damaged below its
        committed end (run ``kl recover``).  ``append_all`` appends to several at once.
        """
        return self.append_counted(batch, fsync=fsync)[0]

    @property
    def producer_ids(self) -> int:
        """The idempotent producers this writer's producer journal remembers (0 before it appended a batch of one)."""
        journal = self._journal
        return 0 if journal is None else len(journal.producers)

    def append_counted(self, batch: Checked, *, fsync: bool = False, producer: producers.Batch | None = None) -> tuple[int, int]:
        """``append``, returning the offset the set starts at and the Kafka offset of its
        first message.  ``producer``: the set is an idempotent producer's batch, appended
        once (a retry answers where it was appended; see ``kl.log.producers``).  Raises
        ``OutOfOrderSequence`` and ``InvalidProducerEpoch`` too."""
        if self._failed:
            raise StorageError(self._failed)
        lock = self._lock
        if lock is None or lock.generation != locks.forks:
            lock = self._process_lock()
        lock.acquire(self.lock_timeout)  # as _hold and _unhold, inline: the hot path
        try:
            if producer is not None:
                return self._append_once(batch, fsync, producer)
            return self._publish_append(self._stage(batch.data, fsync), batch.count)
        except BaseException:
            if self._nfs:
                self.close()  # a failed hold keeps nothing
            raise
        finally:
            if self._nfs:
                self._let_go()  # the data files' locks go before the partition's
            lock.release()

    def _append_once(self, batch: Checked, fsync: bool, producer: producers.Batch) -> tuple[int, int]:
        """Under the lock: an idempotent producer's batch checked against the journal,
        appended unless it is a retry, and its record written before it is published."""
        journal = self._journal
        if journal is None:
            journal = self._journal = producers.Journal(self.directory)
        self.refresh_config()
        state = self.writable_state()
        try:
            found = journal.check(producer, state.producer_serial, state.log_end_count)
        except BaseException:
            self._appended_nothing(state)
            raise
        if found is not None:
            self._appended_nothing(state)
            return found.offset, found.kafka_offset
        staged = self._stage(batch.data, fsync, state)
        start = state.log_end_offset if staged.new is None else staged.new.base_offset
        try:
            journal.write(producer, state.producer_serial + 1, start, state.log_end_count, durable=staged.fsync)
        except BaseException:
            self._unstage(staged)
            raise
        try:
            return self._publish_append(staged, batch.count, journaled=True)
        except BaseException:
            journal.forget()
            raise

    def _appended_nothing(self, state: PartitionState) -> None:
        """On NFS, after ``writable_state`` put up its "append under way" mark and nothing
        was appended: ``state`` published again, unchanged, so the next writer finds no
        append under way (and starts no new segment for it)."""
        if self._nfs:
            self.publish(state, durable=True)

    def _hold(self) -> locks.ProcessLock:
        """Take the partition's lock for an append."""
        if self._failed:
            raise StorageError(self._failed)
        lock = self._lock
        if lock is None or lock.generation != locks.forks:
            lock = self._process_lock()
        lock.acquire(self.lock_timeout)
        return lock

    def _unhold(self, lock: locks.ProcessLock) -> None:
        if self._nfs:
            self._let_go()  # the data files' locks go before the partition's
        lock.release()

    def _stage(self, data: bytes, fsync: bool, state: PartitionState | None = None) -> _Staged:
        """Under the lock: write ``data`` at the log end (into a new segment when the
        active one is full), fsynced with ``fsync`` (and on NFS), and publish nothing.
        ``state``: what ``writable_state`` gave this hold (on NFS it is taken once)."""
        if state is None:
            self.refresh_config()
            state = self.writable_state()
        active = self._active
        assert active is not None
        size = state.log_end_offset - state.active_base_offset
        fsync = fsync or bool(self._nfs)
        if size and (size + len(data) > self.config.segment_bytes or not active.path.endswith(self.suffix)):  # foreign()
            return tuple.__new__(_Staged, (state, len(data), fsync, self._write_rolled(state, data, fsync)))
        try:
            active.append(data, size)
        except StorageError as e:
            raise self._explained(e) from None
        if fsync:
            self.fsync(active)
        return tuple.__new__(_Staged, (state, len(data), fsync, None))  # _Staged(...) without its Python frame

    def _publish_append(self, staged: _Staged, count: int, journaled: bool = False) -> tuple[int, int]:
        """Publish what ``_stage`` wrote (``count`` messages): the offset it starts at and
        the Kafka offset of its first message.  ``journaled``: the producer journal has
        a record of it, the serial it gets."""
        state, length, fsync, new = staged
        log_start, base, start, flushed, _, unflushed, flushed_at, _, _, base_count, first, serial = state
        after = first + count
        serial += journaled
        now = time.time_ns() // 1_000_000
        if new is not None:
            new_base = new.base_offset
            end = new_base + length
            flushed, unflushed = (end, 0) if fsync else (new_base, count)
            rolled = PartitionState(
                log_start, new_base, end, flushed, new_base, unflushed, now, BOOT_ID, NO_TOKEN, first, after, serial
            )
            self._make_active(new, rolled)
            self._keep_counts(state)
            self._keep_base_count(rolled)
            return new_base, first
        end = start + length
        if fsync:
            self.publish(
                PartitionState(log_start, base, end, end, start, 0, now, BOOT_ID, NO_TOKEN, base_count, after, serial),
                durable=True,
            )
            return start, first
        unflushed += count
        cfg = self.config
        # the new states are built as tuples (as PartitionState(...) would, without its Python frame)
        if (cfg.flush_messages and unflushed >= cfg.flush_messages) or (
            cfg.flush_ms and now - flushed_at >= cfg.flush_ms
        ):  # due: the flusher thread fsyncs (one fsync for every append before it)
            self.publish(
                tuple.__new__(
                    PartitionState, (log_start, base, end, flushed, start, 0, now, BOOT_ID, NO_TOKEN, base_count, after, serial)
                ),
                durable=False,
            )
            flusher.flush_soon(self)
        else:
            self.publish(
                tuple.__new__(
                    PartitionState,
                    (log_start, base, end, flushed, start, unflushed, flushed_at, BOOT_ID, NO_TOKEN, base_count, after, serial),
                ),
                durable=False,
            )
            if cfg.flush_ms and not self.flush_scheduled:
                flusher.schedule(self, (flushed_at + cfg.flush_ms - now) / 1000)
        return start, first

    def _unstage(self, staged: _Staged) -> None:
        """Undo what ``_stage`` wrote and was not published: the new segment is removed,
        the active one cut back to the log end (on NFS the record is published again,
        unchanged, so that the next writer finds no append under way)."""
        state, _, _, new = staged
        if new is not None:
            new.close()
            with contextlib.suppress(OSError):
                os.unlink(new.path)
            return
        self._tail_checked = False
        with contextlib.suppress(OSError, StorageError):
            if self._active is not None:
                self._active.truncate_to(state.log_end_offset - state.active_base_offset)
            if self._nfs:
                self.publish(state, durable=True)

    def flush(self) -> None:
        """fsync what is published (outside the lock), then publish the flushed offset."""
        if self._failed:
            raise StorageError(self._failed)
        state = self.state()
        if state.flushed_offset >= state.log_end_offset:
            return
        try:
            segment = Segment.open(
                segment_path(self.directory, state.active_base_offset), state.active_base_offset, self.config.max_message_bytes
            )
        except FileNotFoundError:
            return  # rolled and deleted meanwhile: a roll fsyncs the segment it closes
        with segment:
            self.fsync(segment)
        with self.locked():
            current = self.writable_state()
            if current.active_base_offset == state.active_base_offset and current.flushed_offset < state.log_end_offset:
                flushed = min(state.log_end_offset, current.log_end_offset)
                done = flushed == current.log_end_offset
                self.publish(
                    current._replace(
                        flushed_offset=flushed,
                        unflushed_messages=0 if done else current.unflushed_messages,
                        flushed_at_ms=time.time_ns() // 1_000_000 if done else current.flushed_at_ms,
                        boot_id=BOOT_ID,
                    ),
                    durable=False,
                )
        self._fsync_state()

    def _fsync_state(self) -> None:
        try:
            fd = os.open(self.state_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            self._fail(storage_error(e, "fsync", self.state_path))

    def close(self) -> None:
        """Close the writer's file descriptors (reading needs none)."""
        for handle in (self._state_file, self._active, *(self._kept or ())):
            if handle is not None:
                try:
                    handle.close()
                except OSError as e:  # NFS reports a lost lock (again) at close
                    log.warning("%s: closing %s failed: %s", self.directory, handle, e)
        self._state_file = self._active = self._kept = None
        self._forget_hold()
        openfiles.kept(self, 0)

    def close_idle(self) -> bool:
        """Close the writer's files unless a thread of this process holds or waits for the
        partition's lock (``openfiles.Keeper``); the next append opens them again."""
        lock = self._lock
        if lock is None or lock.generation != locks.forks:  # no hold under way in this process
            self.close()
            return True
        return lock.if_idle(self.close)

    def close_lock_file(self) -> None:
        """Close the partition lock's file too, unless the lock is in use (``Root.close``)."""
        if self._lock is not None:
            self._lock.close_idle()

    def _let_go(self) -> None:
        """On NFS, at the end of a hold: unlock the state file and the active segment and
        keep them open for the next hold (whose locks revalidate them: no open, close or
        lookup per append); if that fails, close them."""
        state_file, active = self._state_file, self._active
        if state_file is None:
            return
        try:
            if active is not None:
                locks.unlock_file(active.fd, active.path)
            locks.unlock_file(state_file.fd, self.state_path)
        except StorageError as e:
            log.warning("%s: %s", self.directory, e)
            self.close()
            return
        self._state_file = self._active = None
        self._kept = (state_file, active)
        self._forget_hold()

    def _forget_hold(self) -> None:
        """Drop what a hold learnt of the tail and the state record: the next hold finds them again."""
        self._tail_checked = False
        self._published_raw = None
        self._token = self._record = None

    def _process_lock(self) -> locks.ProcessLock:
        lock = self._lock
        if lock is None or lock.generation != locks.forks:
            lock = self._lock = locks.lock_for(self.lock_path)
        return lock

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the partition's lock (``LockTimeout`` after ``lock_timeout``)."""
        lock = self._process_lock()
        lock.acquire(self.lock_timeout)
        try:
            yield
        except BaseException:
            if self._nfs:
                self.close()  # a failed hold keeps nothing
            raise
        finally:
            if self._nfs:
                self._let_go()  # the data files' locks go before the partition's
            lock.release()

    def writable_state(self, reopened: bool = False) -> PartitionState:
        """Under the lock: the state, with the active segment open and its tail sound.

        On NFS the state file and the active segment (kept open from the last hold, see
        ``_let_go``) are locked for the hold: the partition lock revalidates only the lock
        file's cache, a lock on each file revalidates that file.  Both are read and
        written past the page cache (``StateFile``, ``Segment.past_page_cache``).  Raises
        ``TopicNotFound`` when the partition was deleted (or its topic created again
        with other settings: the caller must look the topic up afresh).
        """
        self.used = True
        state_file = self._state_file
        raw = None
        if state_file is not None and self._nfs is False:  # open on a local disk: checked before
            try:
                raw = state_file.read()
            except OSError:
                pass  # read again below, which closes the files and says what failed
            else:
                if raw == self._published_raw and time.monotonic() < self._recheck_at:
                    assert self._published is not None
                    return self._published  # nobody appended since we did: the tail is ours
        if not self._locking_checked:
            problem = nfs_locking_problem(self.directory)
            if problem:
                raise StorageError(f"cannot append to {self.directory}: {problem}")
            self._locking_checked = True
        nfs = self.on_nfs()
        if nfs and self._state_file is not None:
            self.close()
        unfinished = False
        kept, self._kept = self._kept, None
        try:
            if kept is not None:
                self._state_file, self._active = kept
            state_file = self._open_state()
            if nfs:
                raw, mark = state_file.read_marked()
            else:
                mark = None
                if raw is None:
                    raw = state_file.read()
            state = PartitionState.decode(raw, self.state_path)  # TopicNotFound for kl topics delete's mark
            if self._active is None or state.active_base_offset != self._active.base_offset:
                if self._active is not None:
                    self._active.close()
                    self._active = None
                base = state.active_base_offset
                self._active = Segment.open(
                    segment_path(self.directory, base), base, self.config.max_message_bytes, writable=True
                )
                if nfs:
                    self._active.past_page_cache()
            if nfs:  # held until the lock is released: revalidates the file, and fences this host
                locks.lock_file(self._active.fd, self._active.path, self.lock_timeout)
            if nfs:
                unfinished = mark is not None and mark != state.token
                self._announce(state_file, raw)
            stat = os.fstat(self._active.fd)
            file_size = stat.st_size
            gone = stat.st_nlink == 0 or state_file.unlinked()
        except FileNotFoundError:
            self.close()
            if nfs and not reopened and os.path.isdir(self.directory):
                os.listdir(self.directory)  # NFS caches names: look again once they are fresh
                return self.writable_state(reopened=True)
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        except (OSError, StorageError) as e:
            self.close()
            if kept is not None and e.errno == errno.ESTALE:  # a kept file was replaced (NFSv3 says so): open the paths
                return self.writable_state(reopened=reopened)
            if isinstance(e, StorageError):
                raise
            raise storage_error(e, "open", self.directory) from None
        except BaseException:
            self.close()
            raise
        openfiles.kept(self, 2 if nfs else 3)  # the state file (mapped on a local disk: 2) and the active segment
        if gone:  # removed or replaced by hand: start afresh from the paths
            self.close()
            if reopened or self._config_changed():
                raise TopicNotFound(f"partition {self.directory} was deleted")
            return self.writable_state(reopened=True)
        self._recheck_at = time.monotonic() + RECHECK_SECONDS
        if nfs and (unfinished or file_size > state.log_end_offset - state.active_base_offset):
            state = self._fence(state, file_size)
            self._tail_checked = True
        elif not self._tail_checked or file_size != state.log_end_offset - state.active_base_offset:
            state = self._repair_tail(state, file_size)
            self._tail_checked = True
        if state.log_end_count == UNKNOWN:  # a record of an older kl, or one recovery rebuilt
            state = self.counted(state)
            self.publish(state, durable=True)
        return state

    def _announce(self, state_file: StateFile, raw: bytes) -> None:
        """On NFS, before anything is written: put up this lock hold's "append under
        way" mark with a fresh token, through to the server, and check that the record
        is still the one read before it (``raw``).  A holder paused past its lease
        that wakes here finds another host's record and stops before it writes data;
        one that wakes later finds another host's mark at ``publish``."""
        token = os.urandom(len(NO_TOKEN))
        try:
            state_file.write_mark(token)
            now, mark = state_file.read_marked()
        except OSError as e:
            self._fail(storage_error(e, "write the append mark of", self.state_path))
        if now != raw or mark != token:
            self._fail(StorageError(f"cannot append to {self.directory}: {FENCED}"))
        self._token, self._record = token, raw

    def _check_fence(self, state_file: StateFile) -> None:
        """On NFS, just before publishing: the mark must still be this hold's and the
        record the one it read or wrote last, read from the server; else another host
        took the partition over and nothing may be published (see ``_announce``)."""
        try:
            now, mark = state_file.read_marked()
        except OSError as e:
            self._fail(storage_error(e, "read", self.state_path))
        if now != self._record or mark != self._token:
            self._fail(StorageError(f"cannot publish to {self.directory}: {FENCED}"))

    def _fence(self, state: PartitionState, file_size: int) -> PartitionState:
        """On NFS, an append that never finished: its writer's mark has no matching
        record, or bytes lie past the log end.  That writer may only be paused, or cut
        off past its lease, and write late where it was; so nobody writes there again.
        The active segment is closed at its good end (bytes past it cut) and a new,
        empty one begins there (when the active segment is empty, a new file replaces
        it: the late writer holds the old one open).  Readers read a closed segment up
        to the next one's base, so late bytes past that land where nobody reads."""
        active = self._active
        assert active is not None
        base = state.active_base_offset
        end, why = self._good_tail(state, file_size)
        if end < file_size:
            active.truncate_to(end)
        self.fsync(active)
        log_end = base + end
        log.warning(
            "%s: the append under way at offset %d never finished (its writer died, or was paused or cut off "
            "past its lease)%s; a new segment begins there",
            self.directory,
            log_end,
            f": cut {file_size - end} bytes ({why or 'never published'})" if end < file_size else "",
        )
        self._remove_orphans(state)
        if end:
            self._roll_mark(log_end)
            new = Segment.create(self.directory, log_end, self.config.max_message_bytes, self.suffix)
        else:
            new = Segment.create(self.directory, base, self.config.max_message_bytes, FENCE_SUFFIX)
            try:
                os.rename(new.path, active.path)
            except OSError as e:
                new.close()
                raise storage_error(e, "replace", active.path) from None
            new.path = active.path
        try:
            new.past_page_cache()
            fsync_dir(self.directory)
            locks.lock_file(new.fd, new.path, self.lock_timeout)
        except BaseException:
            new.close()
            raise
        now = time.time_ns() // 1_000_000
        count = self.counted(state._replace(log_end_offset=log_end, log_end_count=UNKNOWN)).log_end_count
        start, serial = state.log_start_offset, state.producer_serial
        fenced = PartitionState(start, log_end, log_end, log_end, log_end, 0, now, BOOT_ID, NO_TOKEN, count, count, serial)
        self._make_active(new, fenced)
        return fenced

    def refresh_config(self, *, keep: bool = True) -> bool:
        """Take up the topic's settings as ``kl topics alter`` left them on disk: with
        ``keep`` (appends) one ``fstat`` of the file kept open while ``topic.json`` is
        unchanged, else (reads, and on NFS, where that revalidates it) an open; see
        ``config_generation``.  A config of another creation of the topic is left to the
        checks that detect one.  True when this log's config changed.  Safe across
        threads (the config is replaced whole)."""
        path = self._config_path
        nfs = self._nfs  # on_nfs(), without a call once it is known
        generation = config_generation(path, fresh=not keep or (self.on_nfs() if nfs is None else nfs))
        if not generation or generation == self._config_generation:
            return False
        try:
            with open(path, "rb") as f:
                config = TopicConfig.from_json(f.read(), path)
        except (OSError, InvalidConfig):
            return False
        self._config_generation = generation  # read after it: a change since gives another generation
        if config == self.config or not config.same_topic(self.config):
            return False
        self.config = config
        return True

    def _config_changed(self) -> bool:
        """The topic's config on disk is of another creation of the topic (it was created
        again); without a topic id, any difference counts."""
        path = self._config_path
        try:
            with open(path, "rb") as f:
                config = TopicConfig.from_json(f.read(), path)
        except (OSError, InvalidConfig):
            return True
        return not config.same_topic(self.config) if self.config.topic_id else config != self.config

    def _open_state(self) -> StateFile:
        """The state record, opened (and on local disks mapped) for this writer unless it
        is open (kept from the last hold); on NFS locked until the partition lock is released."""
        if self._state_file is None:
            try:
                self._state_file = StateFile(self.state_path, mapped=not self._nfs)
            except FileNotFoundError:
                if os.path.isdir(self.directory):
                    raise CorruptState(f"partition state {self.state_path} is missing; run 'kl recover'") from None
                raise
        if self._nfs:
            locks.lock_file(self._state_file.fd, self.state_path, self.lock_timeout)
        return self._state_file

    def on_nfs(self) -> bool:
        """The partition is on NFS (looked up once)."""
        if self._nfs is None:
            self._nfs = mount_of(self.directory)[1].startswith("nfs")
        return self._nfs

    def _revalidate_state(self, fd: int) -> None:
        locks.lock_file(fd, self.state_path, self.lock_timeout, shared=True)  # dropped when fd closes

    def revalidate(self, fd: int, path: str) -> None:
        """On NFS, make this host drop what it cached of a file (see ``locks.lock_file``)."""
        if self.on_nfs():
            locks.revalidate(fd, path, self.lock_timeout)

    def _repair_tail(self, state: PartitionState, file_size: int) -> PartitionState:
        """Make the active segment end exactly where its good published data does.

        Bytes past the log end were never published (a writer died first) and are cut,
        never adopted (but never in a foreign segment, one of the other format: kl did
        not write them).  A
        damaged tail past the stable offset moves the log end back (see
        ``Segment.good_end``).  Below the stable offset nothing is touched: damage there
        raises ``CorruptMessage`` for ``kl recover``.
        """
        active = self._active
        assert active is not None
        base = state.active_base_offset
        published = state.log_end_offset - base
        end, why = self._good_tail(state, file_size)
        if end < file_size:
            active.truncate_to(end)
            log.warning("%s: cut %d bytes at position %d: %s", active.path, file_size - end, end, why or "never published")
        if end == published:
            return state
        log_end = base + end
        repaired = state._replace(
            log_end_offset=log_end,
            log_end_count=UNKNOWN,
            flushed_offset=min(state.flushed_offset, log_end),
            last_append_offset=min(state.last_append_offset, log_end),
            boot_id=BOOT_ID,
        )
        self.publish(repaired, durable=True)
        return repaired

    def _good_tail(self, state: PartitionState, file_size: int) -> tuple[int, str | None]:
        """Where the active segment's good published data ends, and why earlier than the
        log end (see ``Segment.good_end``).  Raises ``CorruptMessage`` for damage below
        the stable offset and ``CorruptState`` for bytes past the log end of a segment
        of the other format."""
        active = self._active
        assert active is not None
        base = state.active_base_offset
        published = state.log_end_offset - base
        if self.foreign(active) and file_size > published:
            raise CorruptState(
                f"{active.path} holds {file_size - published} bytes past the log end that kl did not write; "
                "bring Kafka 0.7 data in with 'kl topics import'"
            )
        stable = state.stable_offset - base
        end, why = active.good_end(stable, state.last_append_offset - base, published)
        if end < stable:
            raise CorruptMessage(active.path, end, f"{why}; run 'kl recover'", offset=base + end)
        return end, why

    def _write_rolled(self, state: PartitionState, data: bytes, fsync: bool) -> Segment:
        """Close the active segment (cut to its exact size, fsynced) and write ``data``
        into a new segment at the log end, to be published with ``_make_active``: a
        failed write leaves the partition as it was."""
        old = self._active
        assert old is not None
        if not self.foreign(old):
            old.truncate_to(state.log_end_offset - state.active_base_offset)  # unpublished leftovers
        if state.flushed_offset < state.log_end_offset:
            self.fsync(old)
        self._remove_orphans(state)  # before they could fall inside a closed segment
        base = state.log_end_offset
        self._roll_mark(base)
        new = Segment.create(self.directory, base, self.config.max_message_bytes, self.suffix)
        try:
            if self._nfs:
                new.past_page_cache()
            new.append(data, 0)
            if fsync:
                self.fsync(new)
            fsync_dir(self.directory)
        except BaseException:
            new.close()
            with contextlib.suppress(OSError):
                os.unlink(new.path)
            raise
        return new

    def _make_active(self, new: Segment, state: PartitionState) -> None:
        """Publish ``state`` (durably), whose active segment is ``new``, and write to
        ``new`` from now on; if it cannot be published, ``new`` is closed and the old
        active segment stays."""
        try:
            self.publish(state, durable=True)
        except BaseException:
            new.close()
            raise
        assert self._active is not None
        self._active.close()
        self._active = new

    def _remove_orphans(self, state: PartitionState) -> None:
        """Delete the segments past the active one that a writer killed mid-roll made and
        never published, before a roll puts them inside a closed segment: the one the
        state file's roll mark names (each roll puts one up before it creates its
        segment: ``_roll_mark``), and at this handle's first roll any of this log's own
        suffix (made by a kl without marks, or whose mark a power cut lost), found by
        listing the directory, once.  Any other file there is not kl's: refuse to roll
        past it.  On NFS the fence is checked first: for a writer that lost its lock,
        such a segment may be the new holder's."""
        state_file = self._state_file
        assert state_file is not None
        if self._token is not None:
            self._check_fence(state_file)
        try:
            marked = state_file.read_roll_mark()
        except OSError as e:
            raise storage_error(e, "read", self.state_path) from None
        if self._orphans_listed:
            found = [] if marked is None else [(marked, segment_name(marked, self.suffix))]
        else:
            found = list_segments(self.directory)
        for base, name in found:
            if base <= state.active_base_offset:
                continue
            if not name.endswith(self.suffix):
                raise CorruptState(f"unknown segment file {name} in {self.directory}; run 'kl recover'")
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                continue
            log.warning("%s: removed unpublished segment %s", self.directory, name)
        self._orphans_listed = True

    def _roll_mark(self, base_offset: int) -> None:
        """Put up the roll mark before a segment at ``base_offset`` is created (see ``_remove_orphans``)."""
        assert self._state_file is not None
        try:
            self._state_file.write_roll_mark(base_offset)
        except OSError as e:
            raise storage_error(e, "write", self.state_path) from None

    def publish(self, state: PartitionState, *, durable: bool) -> None:
        """Write the state record (under the lock); ``durable`` fsyncs it."""
        self._published_raw = None
        state_file = self._state_file
        assert state_file is not None
        if self._token is not None:
            self._check_fence(state_file)
            state = state._replace(token=self._token)
        raw = state.encode()
        try:
            state_file.write(raw)
        except OSError as e:
            raise storage_error(e, "write", self.state_path) from None
        if durable or self._nfs:
            try:
                state_file.fsync()
            except OSError as e:
                self._fail(storage_error(e, "fsync", self.state_path))
        self._published, self._published_raw = state, raw
        if self._token is not None:
            self._record = raw

    def fsync(self, segment: Segment) -> None:
        """fsync a segment, or fail this ``Log`` for good (see ``_fail``)."""
        try:
            segment.flush()
        except OSError as e:
            self._fail(storage_error(e, "fsync", segment.path))

    def _fail(self, error: StorageError) -> None:
        """After an fsync error the page cache may have dropped the data, so nothing
        written through this handle may be acknowledged again."""
        error = self._explained(error)
        self._failed = f"{error}; no further appends through this handle (run 'kl recover')"
        raise error from None

    def _explained(self, error: StorageError) -> StorageError:
        """On NFS an I/O error on a data file this writer holds locked means the lock was
        lost (the host was cut off past its lease): the server refused the writes."""
        if self._nfs and error.errno == errno.EIO:
            return StorageError(f"{error}: {LOST_LOCK}", errno=error.errno)
        return error

    # ----------------------------------------------------------------- maintenance (under the lock)

    def truncate_to(self, offset: int) -> None:
        """Cut the active segment at ``offset`` and publish that as the log end (durably)."""
        state = self.state()
        base = state.active_base_offset
        with Segment.open(segment_path(self.directory, base), base, self.config.max_message_bytes, writable=True) as active:
            active.truncate_to(offset - base)
            self.fsync(active)
        if offset != state.log_end_offset:
            self.write_state(
                state._replace(
                    log_end_offset=offset,
                    log_end_count=UNKNOWN,
                    flushed_offset=min(state.flushed_offset, offset),
                    last_append_offset=min(state.last_append_offset, offset),
                    boot_id=BOOT_ID,
                )
            )
        self.close()

    def write_state(self, state: PartitionState) -> None:
        """Write the whole state record in place (created if missing), durably, and drop
        this handle's cached view: for recovery, which rebuilds or corrects it."""
        try:
            write_state(self.state_path, state)
        except OSError as e:
            raise storage_error(e, "write", self.state_path) from None
        self._keep_base_count(state)
        self.close()

    def start_at(self, offset: int, count: int = 0) -> None:
        """Make an empty partition begin at ``offset`` with Kafka offset ``count``: a new
        empty active segment there, published as its log start and end with ``count``
        messages before it, so the next append lands at ``offset`` and gets Kafka offset
        ``count`` (a copy of a partition whose start retention moved on).  The old empty
        segment files below it go.  Raises ``InvalidOffset`` unless the partition is
        empty and ends at or below ``offset``."""
        with self.locked():
            state = self.writable_state()
            if state.log_end_offset != state.log_start_offset or offset < state.log_end_offset:
                raise InvalidOffset(
                    f"cannot start {self.directory} at offset {offset}: it holds offsets "
                    f"{state.log_start_offset} to {state.log_end_offset} (only an empty partition can move ahead)"
                )
            if offset == state.log_end_offset:
                if count != state.log_end_count:
                    self.write_state(state._replace(active_base_count=count, log_end_count=count, boot_id=BOOT_ID))
                return
            Segment.create(self.directory, offset, self.config.max_message_bytes, self.suffix).close()  # an orphan is cut
            fsync_dir(self.directory)
            self.write_state(PartitionState.empty(offset, count))
            for base, name in list_segments(self.directory):
                if base < offset:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.directory, name))
            fsync_dir(self.directory)

    def renumber(self, offset: int, count: int) -> int:
        """Shift every message's Kafka offset alike so that the next one, at the log end
        ``offset``, gets ``count``; returns the shift.  For a mirror's copy whose numbers
        are not its source's (made before Kafka offsets were copied, or its state record
        rebuilt by recovery); nothing else renumbers.  Raises ``InvalidOffset`` unless
        ``offset`` is the log end, or the shift would number a message below 0."""
        with self.locked():
            state = self.writable_state()
            shift = count - state.log_end_count
            start = self.kafka_offsets(state)[0]
            if offset != state.log_end_offset or start + shift < 0:
                raise InvalidOffset(
                    f"cannot number {self.directory} from Kafka offset {count} at offset {offset}: it ends at "
                    f"{state.log_end_offset}, Kafka offset {state.log_end_count}, and starts at Kafka offset {start}"
                )
            if shift:
                base_count = state.active_base_count + shift
                renumbered = state._replace(active_base_count=base_count, log_end_count=count, boot_id=BOOT_ID)
                self.publish(renumbered, durable=True)
                self._keep_base_count(renumbered)
            return shift

    def start_within(self, offset: int) -> None:
        """Under the lock: make the message at ``offset`` (where a message of the log
        starts) the log start, for DeleteRecords.  Inside a segment, the rest of it is
        copied into a new segment beginning there, whole before it is renamed in (a
        ``.tmp`` file until then, which recovery removes), so that the files agree at
        every step: a reader of the old segment reads the same bytes past ``offset`` as
        one of the copy.  The new start is then published (the copy made the active
        segment where it is the active one's) and the segments below it set aside, as
        retention sets them aside.  Raises ``OffsetOutOfRange``."""
        state = self.counted(self.writable_state())
        self._check_range(offset, state)
        if offset == state.log_start_offset:
            self._appended_nothing(state)
            return
        segments = self.segments(state)
        holding = [s for s in segments if s.base_offset <= offset][-1]
        moved = state._replace(log_start_offset=offset, boot_id=BOOT_ID)
        copy = self._copy_tail(holding, offset) if holding.base_offset < offset else None
        if copy is not None and holding.base_offset == state.active_base_offset:
            moved = moved._replace(
                active_base_offset=offset,
                flushed_offset=state.log_end_offset,  # (the copy was fsynced)
                last_append_offset=max(state.last_append_offset, offset),
                active_base_count=self._kafka_offset(state, offset, 0),
            )
            if self._nfs:
                copy.past_page_cache()
                locks.lock_file(copy.fd, copy.path, self.lock_timeout)
            self._make_active(copy, moved)
            self._keep_base_count(moved)
        else:
            if copy is not None:
                copy.close()
            self.publish(moved, durable=True)
        gone = [s for s in segments if s.base_offset < offset]
        self._set_aside(gone)
        for segment in gone:  # caches: nobody reads them through an open handle
            timeindex.remove(segment.path)
            offsetindex.remove(segment.path)

    def _copy_tail(self, holding: SegmentInfo, offset: int) -> Segment:
        """A new segment at ``offset`` with the bytes of ``holding`` from there to its end
        (fsynced, renamed in whole), open for writing."""
        path = os.path.join(self.directory, segment_name(offset, self.suffix))
        tmp = os.path.join(self.directory, f".{os.path.basename(path)}.tmp")
        end = holding.size_in_bytes
        try:
            with Segment.open(holding.path, holding.base_offset, self.config.max_message_bytes) as source:
                fd = create_file(tmp)
                try:
                    position = offset - holding.base_offset
                    while position < end:
                        chunk = source.read(position, min(READ_CHUNK, end - position))
                        if not chunk:
                            raise StorageError(f"{holding.path} ends at {position}, before {end}")
                        write_all(fd, chunk)
                        position += len(chunk)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.rename(tmp, path)
            fsync_dir(self.directory)
            return Segment.open(path, offset, self.config.max_message_bytes, writable=True)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(e, OSError):
                raise storage_error(e, "copy the rest of", holding.path) from None
            raise

    def delete_segments(self, segments: list[SegmentInfo], log_start_offset: int) -> None:
        """Retention's deletion: publish ``log_start_offset`` first, so readers asking
        for older offsets get ``OffsetOutOfRange``, then rename ``segments`` aside (they
        are unlinked later, so a reader still inside one finishes it)."""
        state = self.writable_state()
        self.publish(state._replace(log_start_offset=log_start_offset, boot_id=BOOT_ID), durable=True)
        self._set_aside(segments)

    def _set_aside(self, segments: list[SegmentInfo]) -> None:
        """Rename ``segments``, below the published log start, aside."""
        for segment in segments:
            try:
                os.rename(segment.path, segment.path + DELETED_SUFFIX)
            except OSError as e:
                raise storage_error(e, "set aside", segment.path) from None
        fsync_dir(self.directory)


LATEST = -1
EARLIEST = -2


def append_all(appends: Sequence[tuple[Log, Checked]], *, fsync: bool = False) -> list[int]:
    """``Log.append`` of each (log, checked set), to distinct partitions, all at once:
    every partition's lock is taken (in the order of their paths, so that two of these
    never wait for each other), every set written, and only then is any published.  A
    failed lock, write or fsync publishes none (what was written is undone).  Only a
    failure while publishing, once others were published (an I/O error on a state
    record, or on NFS a lock lost past its lease), leaves a part in.  Returns the offset
    each set starts at."""
    order = sorted(range(len(appends)), key=lambda i: appends[i][0].lock_path)
    held: list[tuple[Log, locks.ProcessLock]] = []
    staged: dict[int, _Staged] = {}
    offsets = [0] * len(appends)
    try:
        for i in order:
            target = appends[i][0]
            held.append((target, target._hold()))
        for i in order:
            target, batch = appends[i]
            staged[i] = target._stage(batch.data, fsync)
        for i in order:  # a set whose publishing was tried may be published: it is not undone
            target, batch = appends[i]
            offsets[i] = target._publish_append(staged.pop(i), batch.count)[0]
    except BaseException:
        for i, undone in staged.items():
            appends[i][0]._unstage(undone)
        for target, _ in held:
            if target._nfs:
                target.close()  # a failed hold keeps nothing
        raise
    finally:
        for target, lock in reversed(held):
            target._unhold(lock)
    return offsets
