"""The background flush: the flush policy's fsyncs, off the appending thread.

An append that finds a flush due hands it here (``flush_soon``), so the appender goes on
while one daemon thread per process fsyncs (``Log.flush``: fsync outside the lock, then
publish the flushed offset).  The policy is checked at each append, so without help the
data a producer appended last would stay unflushed until it appended again or closed:
a ``Log`` that publishes unflushed data also schedules itself for when its time rule
(``flush_ms``) comes due.  An exit handler flushes what is still pending when the
interpreter exits.

Fork-safe: a forked child starts with nothing scheduled and starts its own thread when
it first needs one (the parent flushes what it wrote).
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Protocol

from kl.errors import KlError, TopicNotFound


class Flushable(Protocol):
    """What the flusher flushes: a ``Log`` (kl.log.log), which imports this module."""

    directory: str
    flush_scheduled: bool

    def flush(self) -> None: ...


log = logging.getLogger(__name__)

_cond = threading.Condition()
_queue: list[tuple[float, int, Flushable]] = []
_tie = itertools.count()
_thread: threading.Thread | None = None


def schedule(target: Flushable, delay: float) -> None:
    """Flush ``target`` in ``delay`` seconds (once, however often asked meanwhile)."""
    with _cond:
        if not target.flush_scheduled:
            _push(target, time.monotonic() + max(delay, 0.0))


def flush_soon(target: Flushable) -> None:
    """Flush ``target`` now, in the background (the flush policy found it due)."""
    with _cond:
        _push(target, time.monotonic())


def _push(target: Flushable, due: float) -> None:
    global _thread
    target.flush_scheduled = True
    heapq.heappush(_queue, (due, next(_tie), target))
    if _thread is None:
        _thread = threading.Thread(target=_run, name="kl-flusher", daemon=True)
        _thread.start()
    _cond.notify()


def _run() -> None:
    while True:
        with _cond:
            while not _queue or _queue[0][0] > time.monotonic():
                _cond.wait(None if not _queue else _queue[0][0] - time.monotonic())
            _, _, target = heapq.heappop(_queue)
            target.flush_scheduled = False
        _flush(target)


def _flush(target: Flushable) -> None:
    try:
        target.flush()
    except TopicNotFound:
        pass  # deleted meanwhile: nothing left to flush
    except KlError as e:
        log.warning("background flush of %s failed: %s", target.directory, e)
    except Exception:  # the thread must live on for every other log of the process
        log.exception("background flush of %s failed", target.directory)


def flush_pending() -> None:
    """Flush every scheduled log now (at interpreter exit)."""
    with _cond:
        pending = [target for _, _, target in _queue]
        _queue.clear()
        for target in pending:
            target.flush_scheduled = False
    for target in pending:
        _flush(target)


def _forked() -> None:
    global _thread, _cond
    _cond = threading.Condition()
    for _, _, target in _queue:
        target.flush_scheduled = False
    _queue.clear()
    _thread = None


os.register_at_fork(after_in_child=_forked)
atexit.register(flush_pending)
