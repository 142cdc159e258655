"""Segment files: naming, listing, and one file's verbs (Kafka's ``LogSegment``).

A segment is a message set in a file named by its base offset.  ``Segment`` wraps one
open descriptor of it and knows nothing of the partition around it: the caller (a
``Log``) says where the file's data must end.  Positions are bytes inside the file;
offsets are ``base_offset + position``.

Finding the rest of a segment after damage (``Segment.resync``) accepts a position only
when it is *proven*: valid messages chain from it exactly to the end the caller trusts
(the next segment's base, the published end), or to a damaged message whose own length
field leads on to a proven position.  A message that merely looks valid (one inside a
damaged message's value, say) is never taken for data on its own.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
from collections import deque
from collections.abc import Callable, Iterator
from typing import NamedTuple

from kl.errors import StorageError
from kl.log import core
from kl.log import message as m
from kl.log.fsutil import create_file, mount_of, pwrite_all, start_writeback, storage_error
from kl.log.messageset import INCOMPLETE, Corruption, Entry, Kind, MessageSet, check, walk

SUFFIX = ".kl"
LEGACY_SUFFIX = ".kafka"
NAME_DIGITS = 20
"""Base offsets are zero-padded to 20 digits so that ``ls`` sorts segments numerically."""
SCAN_CHUNK = 1 << 20
WRITEBACK_BYTES = 4 << 20
"""Bytes appended through one ``Segment`` after which the disk is asked to start writing them."""
PAD_CHUNK = 4 << 20
"""Bytes of padding messages written at a time."""
_NONZERO = re.compile(rb"[^\0]")


def segment_name(base_offset: int, suffix: str = SUFFIX) -> str:
    """The file name of the segment at ``base_offset``: kl's, or with ``LEGACY_SUFFIX`` Kafka 0.7's."""
    return f"{base_offset:0{NAME_DIGITS}d}{suffix}"


def segment_path(directory: str, base_offset: int) -> str:
    """The segment's path: kl's name, or Kafka 0.7's where only that one exists."""
    path = os.path.join(directory, segment_name(base_offset))
    if not os.path.lexists(path):
        legacy = os.path.join(directory, f"{base_offset:0{NAME_DIGITS}d}{LEGACY_SUFFIX}")
        if os.path.lexists(legacy):
            return legacy
    return path


def parse_name(name: str) -> int | None:
    """The base offset a segment file name encodes, or None for any other file."""
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix in (SUFFIX, LEGACY_SUFFIX) and len(stem) == NAME_DIGITS and stem.isdigit():
        return int(stem)
    return None


def list_segments(directory: str) -> list[tuple[int, str]]:
    """(base offset, file name) of every segment in ``directory``, oldest first.

    Other files (the state, NFS ``.nfsXXXX`` leftovers, files set aside) are ignored.
    """
    found = []
    with os.scandir(directory) as it:
        for entry in it:
            base = parse_name(entry.name)
            if base is not None:
                found.append((base, entry.name))
    found.sort()
    return found


def padding_min(legacy: bool) -> int:
    """The smallest padding message: a magic 1 one (``legacy``) or a magic 2 one."""
    return m.LEGACY_HEADER_SIZE if legacy else m.HEADER_SIZE


def scan(fd: int, position: int, end: int, max_message_bytes: int) -> Iterator[Entry]:
    """Every message of the file from ``position`` to ``end``, read in chunks.

    Entries carry file positions; the last one yielded is the first with a problem, if
    any (kind ``INCOMPLETE`` where the file ends inside a message).
    """
    need = SCAN_CHUNK
    while position < end:
        want = min(max(SCAN_CHUNK, need), end - position)
        buf = os.pread(fd, want, position)
        more = len(buf) == want and position + want < end
        pos, size = 0, len(buf)
        while pos < size:
            entry = check(buf, pos, size, max_message_bytes, position)
            if entry.problem is not None and entry.problem.kind is INCOMPLETE and more:
                need = entry.size
                break
            yield entry
            if entry.problem is not None:
                return
            pos += entry.size
        if not buf:
            return
        position += pos


class Damage(NamedTuple):
    """A damaged region ``[start, end)`` of a segment and what is wrong at its start.

    ``resumed`` says valid data was proven to follow at ``end``; otherwise the region
    runs to the end the segment should have and nothing valid follows."""

    start: int
    end: int
    problem: Corruption
    resumed: bool


class Segment:
    """One open segment file.  Not thread-safe: each reader opens its own; a ``Log``
    keeps one for its active segment and uses it under the partition lock."""

    __slots__ = ("path", "base_offset", "max_message_bytes", "fd", "_writeback_from")

    def __init__(self, path: str, base_offset: int, max_message_bytes: int, fd: int):
        self.path = path
        self.base_offset = base_offset
        self.max_message_bytes = max_message_bytes
        self.fd = fd
        self._writeback_from = -1
        """Where the appended bytes not yet handed to ``start_writeback`` begin (-1: none appended)."""

    @classmethod
    def open(cls, path: str, base_offset: int, max_message_bytes: int, *, writable: bool = False) -> Segment:
        """Open an existing segment; raises ``FileNotFoundError`` when it is gone and
        ``StorageError`` for a symlink (kl follows none inside a root) or another failure."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            raise
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise StorageError(f"{path} is a symbolic link: kl follows no links inside a root") from None
            if e.errno == errno.ESTALE:
                raise FileNotFoundError(errno.ENOENT, "stale file handle", path) from None
            raise storage_error(e, "open", path) from None
        return cls(path, base_offset, max_message_bytes, fd)

    @classmethod
    def create(cls, directory: str, base_offset: int, max_message_bytes: int, suffix: str = SUFFIX) -> Segment:
        """A new, empty segment named with ``suffix`` (not yet durable: fsync the directory)."""
        path = os.path.join(directory, segment_name(base_offset, suffix))
        try:
            fd = create_file(path)
        except OSError as e:
            raise storage_error(e, "create segment", path) from None
        return cls(path, base_offset, max_message_bytes, fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Segment({self.path!r})"

    def size_in_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    def where(self, position: int) -> str:
        return f"offset {self.base_offset + position}"

    # ----------------------------------------------------------------- reading

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    def message_set(self, position: int, size: int, *, stable: int, end: int) -> MessageSet:
        """The bytes ``[position, position + size)`` as a set read from this file.

        ``stable`` and ``end`` are positions: below ``stable`` a bad message is
        corruption; ``end`` is where the file's data must end.
        """
        data = os.pread(self.fd, size, position)
        return MessageSet(
            data,
            self.base_offset + position,
            max_message_bytes=self.max_message_bytes,
            stable_offset=self.base_offset + stable,
            path=self.path,
            position=position,
            ends_at_eof=len(data) < size or position + len(data) == end < stable,
        )

    def scan(self, start: int, end: int) -> Iterator[Entry]:
        return scan(self.fd, start, end, self.max_message_bytes)

    def first_problem(self, start: int, end: int) -> Entry | None:
        """The first message in ``[start, end)`` that fails its checks (None: all valid)."""
        stop, _ = self.chain(start, end)
        if stop >= min(end, self.size_in_bytes()):
            return None
        return self.problem_at(stop, end)

    def problem_at(self, position: int, end: int) -> Entry:
        """The entry at ``position``, where a chain of valid messages stopped before ``end``."""
        return next(e for e in self.scan(position, end) if e.problem is not None)

    def chain(self, start: int, end: int) -> tuple[int, int]:
        """(where valid messages from ``start`` stop, how many) within ``[start, end)``;
        the file's end counts as a stop too.  Runs at the parse rate."""
        count = 0

        def follow(buf: bytes, _: int) -> int:
            nonlocal count
            stop, n = walk(buf, 0, len(buf), self.max_message_bytes)
            count += n
            return stop

        return self.chained(start, end, follow), count

    def chained(self, start: int, end: int, follow: Callable[[bytes, int], int]) -> int:
        """Where valid messages from ``start`` stop within ``[start, end)`` (the file's end
        counts as a stop too), reading chunks: ``follow(chunk, its position)`` gives where
        the chain stops in each, from its start; a message cut off by a chunk's end is
        read again whole with the next."""
        end = min(end, self.size_in_bytes())
        position, need = start, SCAN_CHUNK
        while position < end:
            want = min(max(SCAN_CHUNK, need), end - position)
            buf = os.pread(self.fd, want, position)
            if not buf:
                break
            stop = follow(buf, position)
            position += stop
            if stop == len(buf):
                continue
            entry = check(buf, stop, len(buf), self.max_message_bytes)
            if entry.problem is not None and entry.problem.kind is INCOMPLETE and position + len(buf) - stop < end:
                need = entry.size  # a message longer than what was read: read it whole
                continue
            break
        return position

    def boundary(self, position: int) -> tuple[int, int]:
        """The message starts nearest ``position`` from a scan of the file's start:
        (start at or before it, start after it); equal when a message starts there."""
        before = after = 0
        for entry in self.scan(0, self.size_in_bytes()):
            if entry.position > position or entry.problem is not None:
                break
            before, after = entry.position, entry.position + entry.size
            if before == position:
                return position, position
        if after <= position:
            return after, after
        return before, after

    def back(self, count: int, end: int) -> tuple[int | None, int]:
        """Where the last ``count`` messages before ``end`` start, in one scan, and how
        many messages of the batch there come before them (its first inner messages,
        when the last ``count`` begin inside a compressed batch); or None when there are
        fewer, with how many are still wanted before this segment.  A compressed batch
        counts its inner messages; padding counts none."""
        recent: deque[tuple[int, int, int]] = deque()
        held = 0

        def follow(buf: bytes, at: int) -> int:
            nonlocal held
            stop, entries = core.recent(buf, 0, len(buf), self.max_message_bytes, count)
            for position, size, attrs in entries:
                recent.append((at + position, size, attrs))
                held += not attrs & m.ATTR_PADDING
            while held > count or (held == count and recent[0][2] & m.ATTR_PADDING):
                held -= not recent.popleft()[2] & m.ATTR_PADDING
            return stop

        self.chained(0, end, follow)
        for position, size, attrs in reversed(recent):
            if attrs & m.ATTR_PADDING:
                continue
            if attrs & m.CODEC_MASK:
                count -= sum(1 for _ in self.message_set(position, size, stable=end, end=end))
            else:
                count -= 1
            if count <= 0:
                return position, -count
        return None, count

    def good_end(self, stable: int, last: int, published: int, start: int | None = None) -> tuple[int, str | None]:
        """Where the good published data of the active segment ends (a position), and why
        it ends there (None when it reaches the published end).

        Only the tail from ``stable`` (or from ``start``, a message boundary past it) is
        examined: what a crash may have torn.  A file that ends inside a message keeps
        the complete messages before it; a message failing its checks inside the last
        append (from ``last``, when none of it was flushed) drops that whole append; one
        failing before it ends the good data there.  A file shorter than ``stable`` is
        corruption: the result is then the file size and the caller must not go on.
        """
        file_size = self.size_in_bytes()
        if file_size < stable:
            return file_size, f"file ends at {self.where(file_size)}, before the committed end {self.base_offset + stable}"
        end = stable if start is None else start
        for entry in self.scan(end, min(file_size, published)):
            if entry.problem is None:
                end = entry.position + entry.size
                continue
            where = self.where(entry.position)
            if entry.problem.kind is INCOMPLETE and file_size < published and entry.position + entry.size <= published:
                return end, f"file ends inside the message at {where}"
            if entry.position >= last >= stable:
                problem = "message runs past the log end" if entry.problem.kind is INCOMPLETE else entry.problem.reason
                return last, f"{problem} at {where} (drops the last append, from {self.base_offset + last})"
            return entry.position, f"{entry.problem.reason} at {where}"
        if end < published:
            return end, f"file ends at {self.where(end)}, before the log end {self.base_offset + published}"
        return end, None

    def damage(self, start: int, expected: int) -> Iterator[Damage]:
        """Every damaged region between ``start`` (a message boundary) and ``expected``
        (where the file's data must end), stepping over each to the proven resync point.

        A file longer than ``expected`` ends with a ``LONG_FILE`` region past it.
        """
        position = start
        size = self.size_in_bytes()
        failed: set[int] = set()
        while position < expected:
            stop, _ = self.chain(position, expected)
            if stop >= expected:
                break
            if stop >= size:
                reason = f"file ends at {self.where(size)}, before the segment's end {self.base_offset + expected}"
                yield Damage(stop, expected, Corruption(Kind.SHORT_FILE, reason), False)
                return
            entry = self.problem_at(stop, expected)
            problem = entry.problem
            assert problem is not None
            if problem.kind is INCOMPLETE and stop + entry.size > expected:
                problem = Corruption(Kind.INCOMPLETE, f"message runs past the segment's end {self.base_offset + expected}")
            resume = self.resync(entry, expected, failed)
            yield Damage(stop, expected if resume is None else resume, problem, resume is not None)
            if resume is None:
                return
            position = resume
        if size > expected:
            zeros = not any(self.read(expected, size - expected).strip(b"\0")) if size - expected <= SCAN_CHUNK else False
            reason = f"{size - expected} {'zero ' if zeros else ''}bytes past the segment's end {self.base_offset + expected}"
            yield Damage(expected, size, Corruption(Kind.LONG_FILE, reason), False)

    def resync(self, bad: Entry, expected: int, failed: set[int] | None = None) -> int | None:
        """The first proven position after the damaged message ``bad``, or None.

        The damaged message's own length is tried first (when only its value is bad,
        that skips it whole, with anything that looks like a message inside it), then
        every byte after its start.  ``failed`` remembers message starts already shown
        not to be proven, so scanning a segment stays linear.
        """
        failed = set() if failed is None else failed
        after = bad.position + bad.size
        if bad.size > 0 and (after == expected or after < expected and self._proven(after, expected, failed)):
            return after
        for position in self.starts(bad.position + 1, min(expected, self.size_in_bytes())):
            if position not in failed and self._proven(position, expected, failed):
                return position
        return None

    def starts(self, start: int, end: int) -> Iterator[int]:
        """Every position in ``[start, end)`` where a message that passes its checks begins
        (whatever follows it), trying each byte; runs of zero bytes are skipped at once."""
        if end - start < m.HEADER_SIZE:
            return
        with mmap.mmap(self.fd, end, access=mmap.ACCESS_READ) as buf:
            position = start
            while position <= end - m.HEADER_SIZE:
                if not any(buf[position : position + m.LENGTH_SIZE]):  # a zero length starts nothing
                    found = _NONZERO.search(buf, position + m.LENGTH_SIZE)
                    if found is None:
                        return
                    position = found.start() - m.LENGTH_SIZE + 1
                    continue
                if check(buf, position, end, self.max_message_bytes).problem is None:
                    yield position
                position += 1

    def _proven(self, position: int, expected: int, failed: set[int]) -> bool:
        """Valid messages chain from ``position`` exactly to ``expected``, or to a damaged
        message whose claimed length leads on to such a chain."""
        passed = []
        while True:
            bad = None
            stop = position
            for entry in self.scan(position, expected):
                if entry.problem is not None:
                    bad = entry
                    break
                passed.append(entry.position)
                stop = entry.position + entry.size
            if bad is None and stop == expected:
                return True
            if bad is None or bad.size <= 0:
                break
            position = bad.position + bad.size
            if position == expected:
                return True
            if position > expected or position in failed:
                break
        failed.update(passed)
        return False

    # ----------------------------------------------------------------- writing

    def append(self, data: bytes, position: int) -> None:
        """Write all of ``data`` at ``position``; on failure cut the file back to it.
        Every ``WRITEBACK_BYTES`` appended, the disk starts writing them (the fsync that
        comes later waits for less)."""
        try:
            written = os.pwrite(self.fd, data, position)
            if written != len(data):
                pwrite_all(self.fd, memoryview(data)[written:], position + written)
        except OSError as e:
            try:
                os.ftruncate(self.fd, position)
            except OSError:
                pass  # the state was not published: the next writer cuts it
            raise storage_error(e, f"append {len(data)} bytes to", self.path) from None
        end = position + len(data)
        if not 0 <= self._writeback_from <= position:  # the first append here, or the file was cut
            self._writeback_from = position
        if end - self._writeback_from >= WRITEBACK_BYTES:
            start_writeback(self.fd, self._writeback_from, end - self._writeback_from)
            self._writeback_from = end

    def past_page_cache(self) -> None:
        """On NFS, read and write past this host's page cache, straight to the server
        (``O_DIRECT``, which NFS takes at any offset and size; elsewhere, or where it is
        refused, the file stays buffered).  A buffered write that ends inside a page makes
        the NFS client read that page from the server first unless it holds it, and after
        another host's append it does not: each contended append cost a round trip more.
        A buffered read can see a page as it was before another host's append, though a
        lock revalidated the file (``Log.open_segment``)."""
        if not mount_of(self.path)[1].startswith("nfs"):
            return
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:  # EINVAL: no direct I/O here, which only costs the round trip
                raise storage_error(e, "open for direct I/O", self.path) from None

    def flush(self) -> None:
        """fsync the file; raises ``OSError`` (the caller decides what a failure means)."""
        os.fsync(self.fd)

    def truncate_to(self, position: int) -> None:
        try:
            os.ftruncate(self.fd, position)
        except OSError as e:
            raise storage_error(e, "truncate", self.path) from None

    def pad(self, start: int, end: int, *, legacy: bool = False) -> int:
        """Overwrite ``[start, end)`` with padding messages kl's readers skip, each within
        the size limit; returns how many.  ``legacy`` writes magic 1 ones, which Kafka 0.7
        clients can parse (they see zero bytes as the value).  The region must be at least
        ``padding_min(legacy)`` bytes."""
        gap = end - start
        header = padding_min(legacy)
        if gap < header:
            raise ValueError(f"{gap} bytes are too few for a padding message")
        count = -(-gap // self.max_message_bytes)
        sizes = [gap // count + (1 if i < gap % count else 0) for i in range(count)]
        position, batch = start, []
        try:
            for size in sizes:
                zeros = bytes(size - header)
                batch.append(m.encode_v1(zeros, m.ATTR_PADDING) if legacy else m.encode(zeros, None, 0, m.ATTR_PADDING))
                if sum(map(len, batch)) >= PAD_CHUNK:
                    data = b"".join(batch)
                    pwrite_all(self.fd, data, position)
                    position, batch = position + len(data), []
            pwrite_all(self.fd, b"".join(batch), position)
        except OSError as e:
            raise storage_error(e, "repair", self.path) from None
        return count
