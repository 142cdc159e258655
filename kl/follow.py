"""Waking a follower when a partition it watches may have grown (``Watch``).

A follower that has read every partition to its end waits for more.  Polling the state
records would cost a read per partition per interval and up to an interval of latency;
on local disks kl waits on Linux inotify instead, and polls only as a backstop.

What inotify sees.  A writer appends with pwrite to the active segment, then publishes
the new end in the partition's state record.  On local disks that record is written
through a shared mmap, which inotify does not report; the data write is reported
(IN_MODIFY).  So a ``Watch`` watches each partition's directory: one watch covers every
segment, including the one a roll creates (IN_CREATE) or an import moves in
(IN_MOVED_TO), and the state record when recovery or ``kl topics delete`` rewrite it.  On
an event it reads the state, and reports a change only when the published end moved.
The data write comes just before its publish, so the state can still show the old end:
then it reads the state again after 0.1 ms, 0.2 ms, 0.4 ms and so on (while still
listening for events) until the end moves or the wait's time is up.  Writers do nothing
extra: the producer's hot path is untouched.

Polling.  ``wait`` returns after at most the poll interval in every case, so the caller
reads again at least that often.  On NFS that is all there is (inotify sees nothing
that other hosts write); likewise where inotify is unavailable: not Linux, or the
per-user limits on instances (``fs.inotify.max_user_instances``) or watches
(``fs.inotify.max_user_watches``) are used up, which is logged once.  On local disks it
is a backstop: for a publish later than the wait's re-reads (an fsync between a write and
its publish that outlasts the poll interval), and for writers inotify cannot see
(another host writing to a network filesystem that is not NFS).

Why ctypes and not a package from PyPI: inotify is three libc calls
(``inotify_init1``, ``inotify_add_watch``, ``inotify_rm_watch``) and a fixed event
header; the descriptor is read with ``os.read`` and waited on with ``select.poll`` (or by
an event loop, ``Watch.steps``: ``kl.aio``).  A
package (``inotify_simple``, itself ctypes over the same calls) would add a dependency to
every install for some thirty lines.

Figures (``scripts/bench-follow``: ext4, 2 cores shared with other work, one producer
process sending single messages 1-20 ms apart, the follower in another process): a new
message reaches a library follower after 0.4 ms at the median and 1.3-2.3 ms at p99
(``kl consume --follow`` read from a pipe: 0.5 ms, p99 1.1 ms on a quiet run), against
51 ms and 100 ms with the fixed 0.1 s poll kl used before.  An idle follower uses about
0.2-0.3% of a core, nearly all of it the backstop's read every 0.1 s.

A topic deleted and created again.  A follower's position is a byte offset in one creation
of a topic; read in the next one it would skip its first messages, or fail on a position
that is no message boundary.  Deleted while the follower waits, the topic is gone when it
reads (``TopicNotFound``); but deleted and created again while the follower is stopped
or slow, the same paths hold the new topic.  So each ``wait``, before it returns, reads
the topic id (kl/log/config.py) of every watched topic and raises ``TopicRecreated`` when it
is not the one the partition's ``Log`` was opened with: a follower never goes on reading
the new topic from the old position, it fails with one line, as it does when the topic is
deleted.  (Restarting at the new topic's start instead would splice two topics into one
stream without a word; whoever follows decides, and ``kl consume --follow`` run again
reads the new one from its start.)  ``wait`` checks when a follower has caught up; a
follower stopped in the middle of a backlog (or blocked writing to a full pipe) reads on
before it waits again, so a reader calls ``check`` after each read, before it hands out
what it read.

Limits: a ``Watch`` is for one thread; it holds one file descriptor (the inotify
instance, opened with the first local partition) until ``close``.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import math
import os
import select
import struct
import sys
import time
from collections.abc import Generator
from typing import NamedTuple

from kl.errors import InvalidConfig, KlError, TopicRecreated
from kl.log.config import CONFIG_FILE, TopicConfig
from kl.log.log import Log

log = logging.getLogger(__name__)

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
WATCH_MASK = IN_MODIFY | IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
"""The watched directory itself was removed or moved: its watch is no use any more."""
EVENT = struct.Struct("iIII")
"""struct inotify_event: watch descriptor, mask, cookie, length of the name that follows."""
READ_SIZE = 1 << 16
FIRST_RECHECK = 0.0001
"""Seconds before a state that an event left unchanged is read again (then doubling)."""

_warned: set[int] = set()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library with its inotify calls typed, or None where it has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add, rm = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
    except (OSError, AttributeError):
        return None
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    rm.argtypes, rm.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def _fall_back(error: int, what: str) -> None:
    """Log, once per process and error, that some partitions are polled."""
    if error not in _warned:
        _warned.add(error)
        log.warning("%s failed (%s): following those partitions by polling", what, os.strerror(error))


class CaughtUp(NamedTuple):
    """What ``Consumer.follow_steps`` yields where ``consume`` would wait: every partition
    is caught up; wait on ``watch`` for up to ``timeout`` seconds (``Watch.steps``), then
    go on."""

    watch: Watch
    timeout: float | None


class Watch:
    """Wakes a follower when a watched partition's published end may have moved.

    ``add`` each partition before reading it to its end; then, each time every partition
    is caught up, ``wait``.  With ``detect_recreation`` (the default), ``wait`` raises
    ``TopicRecreated`` once a watched topic was deleted and created again.  Usable as a
    context manager (``close`` on exit).
    """

    def __init__(self, poll_interval: float = 0.1, *, detect_recreation: bool = True) -> None:
        if not poll_interval >= 0:
            raise InvalidConfig(f"poll_interval must be 0 or more seconds, not {poll_interval!r}")
        self.poll_interval = poll_interval
        self._fd = -1
        self._poll = select.poll()
        self._logs: dict[Log, int | None] = {}
        """Every log added -> its watch descriptor (None: polled)."""
        self._watched: dict[int, list[Log]] = {}
        """Watch descriptor -> the logs of that directory."""
        self._ends: dict[Log, int | None] = {}
        """Watched log -> the end it had when last looked at (None: unreadable)."""
        self._detect_recreation = detect_recreation
        self._topic_ids: dict[str, str] = {}
        """Topic directory -> the topic id its logs were opened with."""
        self._configs: dict[str, bytes] = {}
        """Topic directory -> its ``topic.json`` as last found to hold that id."""

    def __repr__(self) -> str:
        return f"Watch({len(self._logs)} logs, {len(self._watched)} watched)"

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, log: Log) -> None:
        """Watch ``log`` (with inotify unless it is on NFS or inotify is unavailable)."""
        if log in self._logs:
            return
        wd = None if log.on_nfs() else self._add_watch(log.directory)
        self._logs[log] = wd
        if self._detect_recreation and log.config.topic_id:  # none: a root kl cannot write to
            self._topic_ids.setdefault(os.path.dirname(log.directory), log.config.topic_id)
        if wd is not None:
            self._watched.setdefault(wd, []).append(log)
            self._ends[log] = _end(log)

    def remove(self, log: Log) -> None:
        """Stop watching ``log`` (nothing happens if it is not watched)."""
        wd = self._logs.pop(log, None)
        self._ends.pop(log, None)
        topic = os.path.dirname(log.directory)
        if all(os.path.dirname(other.directory) != topic for other in self._logs):
            self._topic_ids.pop(topic, None)
            self._configs.pop(topic, None)
        if wd is None:
            return
        logs = self._watched[wd]
        logs.remove(log)
        if not logs:
            del self._watched[wd]
            libc = _libc()
            assert libc is not None
            libc.inotify_rm_watch(self._fd, wd)  # fails only when the kernel dropped it already

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a watched partition's published end moved (True; spurious wake-ups
        happen) or ``timeout`` seconds passed (False); never longer than the poll
        interval, after which the caller reads every partition again.  Raises
        ``TopicRecreated`` (see ``__init__``)."""
        steps = self.steps(timeout)
        try:
            while True:
                self._ready(next(steps))
        except StopIteration as done:
            moved: bool = done.value
        self.check()
        return moved

    def fileno(self) -> int:
        """The inotify descriptor ``steps`` waits on, or -1 while every partition is polled."""
        return self._fd if self._watched else -1

    def steps(self, timeout: float | None = None) -> Generator[float, None, bool]:
        """``wait`` (without its ``check``) for a caller that waits itself, on an event
        loop say: each step yields how many seconds to wait until ``fileno()`` is readable
        (the whole time when it is -1); the caller waits, at most that long, and steps
        on; the generator returns ``wait``'s result.  Reading the events never blocks."""
        limit = self.poll_interval if timeout is None else max(0.0, min(timeout, self.poll_interval))
        deadline = time.monotonic() + limit
        if not self._watched:
            yield limit
            return False
        pending: set[Log] = set()  # logs with events but the old end: their writers have still to publish
        recheck = FIRST_RECHECK
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            rechecking = bool(pending) and recheck < left
            yield recheck if rechecking else left
            woken = self._events()
            if woken is None:
                return True
            if not woken and not rechecking:
                continue  # woken early without events, or the time is up: the deadline tells
            if rechecking:
                recheck *= 2
            pending |= woken
            if [log for log in pending if self._moved(log)]:  # every one looked at: each keeps its end
                return True

    def close(self) -> None:
        """Free the inotify descriptor; the watch is empty afterwards."""
        if self._fd >= 0:
            self._poll.unregister(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._logs.clear()
        self._watched.clear()
        self._ends.clear()
        self._topic_ids.clear()
        self._configs.clear()

    def check(self) -> None:
        """Raise ``TopicRecreated`` when a watched topic's id is not the one its logs were
        opened with (a topic that is missing or unreadable is left to the reads).  ``wait``
        checks before it returns; a reader that checks after each read too (before handing
        out what it read) hands out nothing of a new topic at all."""
        for directory, topic_id in self._topic_ids.items():
            path = os.path.join(directory, CONFIG_FILE)
            try:
                with open(path, "rb") as f:
                    data = f.read()
                if data == self._configs.get(directory):
                    continue  # the same bytes, the same id: parsed once (a check costs a few microseconds)
                now = TopicConfig.from_json(data, path).topic_id
            except (OSError, KlError):
                continue
            if now == topic_id:
                self._configs[directory] = data
            elif now:
                raise TopicRecreated(
                    os.path.basename(directory), topic_id, now, "follower started", "follow it again to read the new one"
                )

    def _add_watch(self, directory: str) -> int | None:
        """A watch descriptor on ``directory``, or None when inotify cannot give one."""
        libc = _libc()
        if libc is None:
            return None
        if self._fd < 0:
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                _fall_back(ctypes.get_errno(), "inotify_init1")
                return None
            self._fd = fd
            self._poll.register(fd, select.POLLIN)
        wd = libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            error = ctypes.get_errno()
            if error != errno.ENOENT:  # a missing partition: the reads say so
                _fall_back(error, f"inotify_add_watch on {directory}")
            return None
        return wd

    def _ready(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the descriptor to be readable (sleeping for
        timeouts under a millisecond, poll's unit, and the whole time without one)."""
        if self.fileno() < 0 or timeout < 0.001:
            time.sleep(timeout)
        else:
            self._poll.poll(math.ceil(timeout * 1000))

    def _events(self) -> set[Log] | None:
        """The logs whose directories had events since the last call (reading without
        blocking), or None when every log should be read again (the event queue
        overflowed, a directory went away)."""
        try:
            data = os.read(self._fd, READ_SIZE)
        except BlockingIOError:
            return set()
        woken: set[Log] = set()
        again = False
        position = 0
        while position < len(data):
            wd, mask, _, size = EVENT.unpack_from(data, position)
            position += EVENT.size + size
            if mask & IN_Q_OVERFLOW:
                again = True
            logs = self._watched.get(wd)
            if logs is None:
                continue
            woken.update(logs)
            if mask & GONE:
                again = True
                del self._watched[wd]
                for gone in logs:
                    self._logs[gone] = None
                    self._ends.pop(gone, None)
                if not mask & IN_IGNORED:
                    libc = _libc()
                    assert libc is not None
                    libc.inotify_rm_watch(self._fd, wd)
        return None if again else woken

    def _moved(self, log: Log) -> bool:
        """``log``'s end differs from when it was last looked at (or it cannot be read)."""
        if log not in self._ends:
            return True
        end = _end(log)
        if end is not None and end == self._ends[log]:
            return False
        self._ends[log] = end
        return True


def _end(log: Log) -> int | None:
    """The published end, or None when it cannot be read (the reader will say why)."""
    try:
        return log.log_end_offset
    except KlError:
        return None
