"""A partition's log: a directory of segment files, a state record and a lock.

Writers append under the partition's inter-process lock: they read the state, repair a
torn tail a crashed writer left, write the message set at the end they found (never with
O_APPEND, which NFS does not honour), then publish the new end in the state record.
Readers take no lock: they read the state, then only bytes below its log end.

A ``Log`` object is safe to share between threads and across ``fork()``; several
processes on several hosts may append to one partition at once.
"""

from __future__ import annotations

import bisect
import errno
import contextlib
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from kl import locks
from kl.config import TopicConfig
from kl.errors import (
    CorruptMessage,
    CorruptState,
    InvalidOffset,
    OffsetOutOfRange,
    StorageError,
    TopicNotFound,
)
from kl.fsutil import create_file, fsync_dir, mount_of, nfs_locking_problem, pwrite_all, storage_error
from kl.message import LENGTH_SIZE, MIN_LENGTH, PREFIX
from kl.messageset import INCOMPLETE, MessageSet
from kl.segment import LEGACY_SUFFIX, list_segments, resync, scan, segment_path
from kl.state import SIZE as STATE_SIZE
from kl.state import STATE_FILE, PartitionState, read_state

log = logging.getLogger(__name__)

RECHECK_SECONDS = 1.0
"""How long a writer that was the last to append trusts its view of the files without
an fstat (a partition removed by hand, not by ``kl topics delete``, is noticed after it)."""
DEFAULT_LOCK_TIMEOUT = 120.0
"""Longer than the default NFSv4 lease (90 s) a crashed client's lock can outlive it by."""


class Segment(NamedTuple):
    base_offset: int
    path: str
    size_in_bytes: int


class Log:
    """One partition of a topic."""

    def __init__(self, directory: str, lock_path: str, config: TopicConfig, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        self.directory = directory
        self.lock_path = lock_path
        self.config = config
        self.lock_timeout = lock_timeout
        self.state_path = os.path.join(directory, STATE_FILE)
        self._bases: list[int] = []
        self._names: list[str] = []
        # Writer handles, used only under the lock.
        self._state_fd: int | None = None
        self._state_map: mmap.mmap | None = None
        self._active_fd: int | None = None
        self._active_base = -1
        self._active_file = ""
        self._tail_checked = False
        self._recheck_at = 0.0
        self._active_foreign = False
        self._published: PartitionState | None = None
        self._published_raw: bytes | None = None
        self._nfs: bool | None = None
        self._lock: locks.ProcessLock | None = None
        self._failed: str | None = None

    def __repr__(self) -> str:
        return f"Log({self.directory!r})"

    # ----------------------------------------------------------------- reading

    def state(self) -> PartitionState:
        """The published state.  Raises ``TopicNotFound`` when the partition is gone."""
        try:
            return read_state(self.state_path)
        except FileNotFoundError:
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        except OSError as e:
            raise storage_error(e, "read", self.state_path) from None

    @property
    def log_start_offset(self) -> int:
        return self.state().log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.state().log_end_offset

    def read(self, offset: int, max_bytes: int) -> MessageSet:
        """The complete messages in ``[offset, offset + max_bytes)``, as a lazily parsed set.

        A first message larger than ``max_bytes`` is still returned whole: the read grows
        up to the topic's maximum message size.  Raises ``OffsetOutOfRange`` outside
        ``[log start, log end]`` and ``InvalidOffset`` where no message starts at ``offset``.
        """
        state = self.state()
        self._check_range(offset, state)
        for _ in range(3):
            if offset == state.log_end_offset:
                return MessageSet(b"", offset, max_message_bytes=self.config.max_message_bytes)
            base, segment_end, stable = self._locate(offset, state)
            try:
                return self._read_segment(state, base, offset, max_bytes, segment_end, stable)
            except OSError as e:  # deleted by retention, or a stale listing: look again
                if e.errno not in (errno.ENOENT, errno.ESTALE):
                    raise storage_error(e, "read", segment_path(self.directory, base)) from None
                state = self.state()
                self._check_range(offset, state)
                self._bases = []
        raise TopicNotFound(f"segment for offset {offset} in {self.directory} keeps disappearing")

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
        if i < 0:
            raise OffsetOutOfRange(
                f"offset {offset} is out of range: no segment of {self.directory} holds it",
                offset=offset,
                log_start_offset=state.log_start_offset,
                log_end_offset=state.log_end_offset,
            )
        end = self._bases[i + 1] if i + 1 < len(self._bases) else state.active_base_offset
        return self._bases[i], end, end  # closed segments were fsynced when they rolled

    def refresh(self) -> None:
        try:
            found = list_segments(self.directory)
        except FileNotFoundError:
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        self._bases = [base for base, _ in found]
        self._names = [name for _, name in found]

    def _read_segment(
        self, state: PartitionState, base: int, offset: int, max_bytes: int, segment_end: int, stable: int
    ) -> MessageSet:
        limit = self.config.max_message_bytes
        position = offset - base
        path = segment_path(self.directory, base)
        with _reading(path) as fd:
            if base == state.active_base_offset and offset + max_bytes > state.last_append_offset:
                # The last append is all or nothing: check it whole before any of it is read.
                last = state.last_append_offset - base
                segment_end = base + self.good_end(fd, state, os.fstat(fd).st_size, start=max(last, stable - base))[0]
                if offset >= segment_end:  # stopped at a torn tail
                    return MessageSet(b"", offset, max_message_bytes=limit)
            size = min(max_bytes, segment_end - offset)
            data = os.pread(fd, size, position)
            head = data if len(data) >= PREFIX.size else os.pread(fd, PREFIX.size, position)
            if len(data) == size < segment_end - offset and len(head) >= PREFIX.size:
                length, magic = PREFIX.unpack_from(head)
                if magic < len(MIN_LENGTH) and size < LENGTH_SIZE + length <= limit:
                    size = min(LENGTH_SIZE + length, segment_end - offset)
                    data = os.pread(fd, size, position)  # one message larger than max_bytes
            if not data and offset < stable:
                raise CorruptMessage(path, position, f"file ends before offset {segment_end}", offset=offset)
            short = offset + len(data) == segment_end < stable  # the file ends before its committed end
            messages = MessageSet(
                data, offset, max_message_bytes=limit, stable_offset=stable, path=path, position=position,
                ends_at_eof=len(data) < size or short,
            )
            first = next(messages.entries(), None)
            if first is not None and first.problem is not None:
                cut_short = first.problem == INCOMPLETE and offset + len(data) < segment_end and not messages.ends_at_eof
                if not cut_short:
                    self._check_boundary(fd, base, offset)
        return messages

    def good_end(self, fd: int, state: PartitionState, file_size: int, start: int | None = None) -> tuple[int, str | None]:
        """Where the good published data of the active segment ends (a position), and why
        it ends there (None when it reaches the log end).

        Only the tail past the stable offset (or from ``start``, a message boundary in
        it) is examined.  A file that ends inside a
        message keeps the complete messages before it; a message failing its checks
        inside the last append drops that whole append; one failing before it (in
        unflushed data) ends the good data there.  A file shorter than the stable offset
        is corruption: the result is then ``file_size`` and the caller must not go on.
        """
        base = state.active_base_offset
        stable = state.stable_offset - base
        last = state.last_append_offset - base
        published = state.log_end_offset - base
        if file_size < stable:
            return file_size, f"file ends at offset {base + file_size}, before the committed end {base + stable}"
        end = stable if start is None else start
        for entry in scan(fd, end, min(file_size, published), self.config.max_message_bytes):
            if entry.problem is None:
                end = entry.position + entry.size
                continue
            where = base + entry.position
            if entry.problem == INCOMPLETE and file_size < published and entry.position + entry.size <= published:
                return end, f"file ends inside the message at offset {where}"
            if entry.position >= last:
                problem = "message runs past the log end" if entry.problem == INCOMPLETE else entry.problem
                return last, f"{problem} at offset {where} (drops the last append, from {base + last})"
            return entry.position, f"{entry.problem} at offset {where}"
        if end < published:
            return end, f"file ends at offset {base + end}, before the log end {base + published}"
        return end, None

    def check_offset(self, offset: int) -> None:
        """Make sure a message starts at ``offset`` by scanning its segment from the start.

        A read checks only the bytes at the offset, so an offset inside a value that
        itself holds a well-formed message would read that as one; call this for
        offsets a person typed.  Raises ``OffsetOutOfRange`` and ``InvalidOffset``.
        """
        state = self.state()
        self._check_range(offset, state)
        if offset == state.log_end_offset:
            return
        base, _, _ = self._locate(offset, state)
        with _reading(segment_path(self.directory, base)) as fd:
            self._check_boundary(fd, base, offset)

    def _check_boundary(self, fd: int, base: int, offset: int) -> None:
        """Raise ``InvalidOffset`` when a scan from the segment's start steps over ``offset``."""
        target, before, after = offset - base, 0, 0
        for entry in scan(fd, 0, os.fstat(fd).st_size, self.config.max_message_bytes):
            if entry.position >= target or entry.problem is not None:
                break
            before, after = entry.position, entry.position + entry.size
        if after > target:
            raise InvalidOffset(
                f"offset {offset} is not the start of a message in {self.directory}; "
                f"the nearest messages start at {base + before} and {base + after}"
            )

    def segments(self, state: PartitionState | None = None) -> list[Segment]:
        """The segments from the log start to the active one, oldest first, with sizes
        (as ``state`` has them; by default the published state)."""
        state = state or self.state()
        self.refresh()
        out = []
        for base, name in zip(self._bases, self._names):
            if state.log_start_offset <= base <= state.active_base_offset:
                path = os.path.join(self.directory, name)
                if base == state.active_base_offset:
                    size = state.log_end_offset - base
                else:
                    try:
                        size = os.stat(path).st_size
                    except FileNotFoundError:
                        continue
                out.append(Segment(base, path, size))
        return out

    def size_in_bytes(self) -> int:
        return sum(s.size_in_bytes for s in self.segments())

    def first_timestamp(self, segment: Segment) -> int | None:
        """Timestamp of a segment's first message (None if empty, gone, or magic 0/1)."""
        try:
            first = next(iter(self.read(segment.base_offset, 4096)), None)
        except OffsetOutOfRange:
            return None
        return None if first is None else first.timestamp

    def skip_corrupt(self, offset: int) -> int:
        """The offset of the first message after the damaged one at ``offset``: where a
        chain of valid messages starts that runs to its segment's end (or that end)."""
        state = self.state()
        base, end, _ = self._locate(offset, state)
        path = segment_path(self.directory, base)
        with _reading(path) as fd:
            found = resync(fd, offset - base + 1, end - base, self.config.max_message_bytes)
        return end if found is None else base + found

    def offsets_before(self, time_ms: int, max_offsets: int) -> list[int]:
        """Up to ``max_offsets`` segment start offsets at or before ``time_ms``, newest first.

        A segment counts as "before" when its first message's timestamp is at or before
        ``time_ms``; the log end is included when the whole log is.  ``LATEST`` (-1) and
        ``EARLIEST`` (-2) give the log end and the log start.
        """
        state = self.state()
        if time_ms == LATEST:
            return [state.log_end_offset][:max_offsets]
        if time_ms == EARLIEST:
            return [state.log_start_offset][:max_offsets]
        found = []
        for segment in self.segments():
            ts = self.first_timestamp(segment)
            if ts is not None and ts <= time_ms:
                found.append(segment.base_offset)
        if state.log_end_offset > state.active_base_offset and time_ms >= time.time_ns() // 1_000_000:
            found.append(state.log_end_offset)
        return found[::-1][:max_offsets]

    def offset_for_time(self, time_ms: int) -> int:
        """The offset of the first message with a timestamp at or after ``time_ms``
        (the log end if there is none).  Assumes timestamps rise within the partition."""
        segments = self.segments()
        start = segments[0].base_offset if segments else self.state().log_start_offset
        for segment in segments:
            ts = self.first_timestamp(segment)
            if ts is not None and ts <= time_ms:
                start = segment.base_offset
        offset = start
        end = self.state().log_end_offset
        while offset < end:
            messages = self.read(offset, 1 << 20)
            progressed = False
            for msg in messages:
                if msg.timestamp is not None and msg.timestamp >= time_ms:
                    return msg.offset
                offset, progressed = msg.next_offset, True
            if not progressed:
                break
        return offset

    def offset_back(self, count: int) -> int:
        """The offset from which the last ``count`` messages can be read (the log start
        when there are fewer); a compressed batch is read whole, so it may give more."""
        state = self.state()
        if count <= 0:
            return state.log_end_offset
        needed = count
        for segment in reversed(self.segments()):
            recent: deque[int] = deque(maxlen=needed)
            with _reading(segment.path) as fd:
                for entry in scan(fd, 0, segment.size_in_bytes, self.config.max_message_bytes):
                    if entry.problem is not None:
                        break
                    recent.append(segment.base_offset + entry.position)
            for offset in reversed(recent):
                needed -= sum(1 for _ in self.read(offset, 1))
                if needed <= 0:
                    return offset
        return state.log_start_offset

    # ----------------------------------------------------------------- writing

    def append(self, data: bytes, count: int, *, fsync: bool = False) -> int:
        """Append a framed message set of ``count`` messages; returns the offset it starts at.

        The set is written whole at the end of the active segment and then published.
        With ``fsync`` the data and state are flushed before this returns; otherwise the
        topic's flush policy decides.  Raises ``LockTimeout``, ``StorageError`` (the log is
        left as it was) and ``CorruptMessage`` when the tail is damaged below its
        committed end (run ``kl recover``).
        """
        if self._failed:
            raise StorageError(self._failed)
        lock = self._lock
        if lock is None or lock.generation != locks.forks:
            lock = self._process_lock()
        lock.acquire(self.lock_timeout)
        try:
            state = self.writable_state()
            fsync = fsync or self._nfs
            size = state.log_end_offset - state.active_base_offset
            if size and (size + len(data) > self.config.segment_bytes or self._active_foreign):
                return self._append_rolled(state, data, count, fsync)
            start = state.log_end_offset
            position = start - state.active_base_offset
            self._write(self._active_fd, data, position, self._active_file)
            now = time.time_ns() // 1_000_000
            end = start + len(data)
            unflushed = state.unflushed_messages + count
            cfg = self.config
            if (
                fsync
                or (cfg.flush_messages and unflushed >= cfg.flush_messages)
                or (cfg.flush_ms and now - state.flushed_at_ms >= cfg.flush_ms)
            ):
                self.fsync(self._active_fd, self._active_file)
                new = PartitionState(state.log_start_offset, state.active_base_offset, end, end, start, 0, now)
                self.publish(new, durable=True)
            else:
                new = PartitionState(
                    state.log_start_offset, state.active_base_offset, end, state.flushed_offset, start, unflushed,
                    state.flushed_at_ms,
                )
                self.publish(new, durable=False)
            return start
        finally:
            lock.release()

    def flush(self) -> None:
        """fsync the active segment and the state, if anything is unflushed."""
        if self._failed:
            raise StorageError(self._failed)
        with self.locked():
            state = self.writable_state()
            if state.flushed_offset < state.log_end_offset:
                self.fsync(self._active_fd, self._active_file)
                now = time.time_ns() // 1_000_000
                self.publish(
                    state._replace(flushed_offset=state.log_end_offset, unflushed_messages=0, flushed_at_ms=now),
                    durable=True,
                )

    def close(self) -> None:
        """Close the writer's file descriptors (reading needs none)."""
        if self._state_map is not None:
            self._state_map.close()
            self._state_map = None
        for fd in (self._state_fd, self._active_fd):
            if fd is not None:
                os.close(fd)
        self._state_fd = self._active_fd = None
        self._active_base = -1
        self._tail_checked = False
        self._published_raw = None

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
        finally:
            lock.release()

    def writable_state(self, reopened: bool = False) -> PartitionState:
        """Under the lock: the state, with the active segment open and its tail sound.

        On NFS the state file is opened afresh (close-to-open consistency): the lock
        revalidates only the lock file's cache, not the state's.
        """
        if self._nfs is None:
            problem = nfs_locking_problem(self.directory)
            if problem:
                raise StorageError(f"cannot append to {self.directory}: {problem}")
            self._nfs = mount_of(self.directory)[1].startswith("nfs")
        if self._nfs and self._state_fd is not None:
            self.close()
        try:
            if self._state_fd is None:
                self._state_fd = os.open(self.state_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                if not self._nfs:  # on local disks the record is mapped: no system calls for it
                    try:
                        self._state_map = mmap.mmap(self._state_fd, STATE_SIZE)
                    except ValueError:
                        self.close()
                        raise CorruptState(f"partition state {self.state_path} is short; run 'kl recover'") from None
            raw = self._state_map[:STATE_SIZE] if self._state_map is not None else os.pread(self._state_fd, STATE_SIZE, 0)
            if raw == self._published_raw and time.monotonic() < self._recheck_at:
                return self._published  # nobody appended since we did: the tail is ours
            try:
                state = PartitionState.decode(raw, self.state_path)
            except TopicNotFound:  # deleted with kl topics delete: maybe created again
                self.close()
                if reopened:
                    raise
                return self.writable_state(reopened=True)
            if state.active_base_offset != self._active_base:
                if self._active_fd is not None:
                    os.close(self._active_fd)
                    self._active_fd = None
                path = segment_path(self.directory, state.active_base_offset)
                self._active_fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                self._active_base, self._active_file = state.active_base_offset, path
                self._active_foreign = path.endswith(LEGACY_SUFFIX)  # Kafka 0.7's: read, never written
            stat = os.fstat(self._active_fd)
        except FileNotFoundError:
            self.close()
            raise TopicNotFound(f"partition {self.directory} does not exist") from None
        except OSError as e:
            self.close()
            raise storage_error(e, "open", self.directory) from None
        if stat.st_nlink == 0:  # removed by hand, maybe created again: start afresh from the paths
            self.close()
            if reopened:
                raise TopicNotFound(f"partition {self.directory} was deleted")
            return self.writable_state(reopened=True)
        self._recheck_at = time.monotonic() + RECHECK_SECONDS
        if not self._tail_checked or stat.st_size != state.log_end_offset - state.active_base_offset:
            state = self._repair_tail(state, stat.st_size)
            self._tail_checked = True
        return state

    def _repair_tail(self, state: PartitionState, file_size: int) -> PartitionState:
        """Make the active segment end exactly where its good published data does.

        Bytes past the log end were never published (a writer died first) and are cut,
        never adopted.  A damaged tail past the stable offset moves the log end back (see
        ``good_end``).  Below the stable offset nothing is touched: a file short of it
        raises ``CorruptMessage`` for ``kl recover``.
        """
        path = self._active_file
        end, why = self.good_end(self._active_fd, state, file_size)
        if end < state.stable_offset - state.active_base_offset:
            raise CorruptMessage(path, end, f"{why}; run 'kl recover'", offset=state.active_base_offset + end)
        if end < file_size:
            try:
                os.ftruncate(self._active_fd, end)
            except OSError as e:
                raise storage_error(e, "truncate", path) from None
            log.warning("%s: cut %d bytes at position %d: %s", path, file_size - end, end, why or "never published")
        if end == state.log_end_offset - state.active_base_offset:
            return state
        log_end = state.active_base_offset + end
        repaired = state._replace(
            log_end_offset=log_end,
            flushed_offset=min(state.flushed_offset, log_end),
            last_append_offset=min(state.last_append_offset, log_end),
        )
        self.publish(repaired, durable=True)
        return repaired

    def _append_rolled(self, state: PartitionState, data: bytes, count: int, fsync: bool) -> int:
        """Close the active segment (cut to its exact size, fsynced), write ``data`` into a
        new segment at the log end, and only then publish both: a failed write leaves
        the partition as it was."""
        old_path = self._active_file
        try:
            os.ftruncate(self._active_fd, state.log_end_offset - state.active_base_offset)  # unpublished leftovers
        except OSError as e:
            raise storage_error(e, "truncate", old_path) from None
        if state.flushed_offset < state.log_end_offset:
            self.fsync(self._active_fd, old_path)
        self._remove_orphans(state.active_base_offset)  # before they could fall inside a closed segment
        base = state.log_end_offset
        path = segment_path(self.directory, base)
        try:
            fd = create_file(path)
        except OSError as e:
            raise storage_error(e, "create segment", path) from None
        try:
            self._write(fd, data, 0, path)
            if fsync:
                self.fsync(fd, path)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        now = time.time_ns() // 1_000_000
        end = base + len(data)
        rolled = PartitionState(state.log_start_offset, base, end, end if fsync else base, base, 0 if fsync else count, now)
        try:
            self.publish(rolled, durable=True)
        except StorageError:
            os.close(fd)
            raise
        os.close(self._active_fd)
        self._active_fd, self._active_base, self._active_file = fd, base, path
        return base

    def _write(self, fd: int, data: bytes, position: int, path: str) -> None:
        """Write all of ``data`` at ``position``; on failure cut the file back to it."""
        try:
            written = os.pwrite(fd, data, position)
            if written != len(data):
                pwrite_all(fd, memoryview(data)[written:], position + written)
        except OSError as e:
            try:
                os.ftruncate(fd, position)
            except OSError as undo:
                log.error("%s: could not cut a failed write back to %d: %s", path, position, undo)
            raise storage_error(e, f"append {len(data)} bytes to", path) from None

    def _remove_orphans(self, active_base: int) -> None:
        """Delete segments past the active one: a writer killed mid-roll made them and
        never published them."""
        for base, name in list_segments(self.directory):
            if base > active_base:
                log.warning("%s: removing unpublished segment %s", self.directory, name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.directory, name))

    def publish(self, state: PartitionState, *, durable: bool) -> None:
        """Write the state record (under the lock); ``durable`` fsyncs it."""
        raw = state.encode()
        self._published_raw = None
        try:
            if self._state_map is not None:
                self._state_map[:STATE_SIZE] = raw
            elif os.pwrite(self._state_fd, raw, 0) != len(raw):
                pwrite_all(self._state_fd, raw, 0)
        except OSError as e:
            raise storage_error(e, "write", self.state_path) from None
        if durable or self._nfs:
            self.fsync(self._state_fd, self.state_path)
        self._published, self._published_raw = state, raw

    def fsync(self, fd: int, path: str) -> None:
        """fsync, or fail this ``Log`` for good: after an fsync error the page cache may
        have dropped the data, so nothing written here may be acknowledged again."""
        try:
            os.fsync(fd)
        except OSError as e:
            error = storage_error(e, "fsync", path)
            self._failed = f"{error}; no further appends through this handle (run 'kl recover')"
            raise error from None


@contextlib.contextmanager
def _reading(path: str) -> Iterator[int]:
    """A read-only descriptor of the segment at ``path``, closed afterwards."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


LATEST = -1
EARLIEST = -2
