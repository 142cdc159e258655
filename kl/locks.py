"""Inter-process locks on permanent lock files, one registry per process.

POSIX record locks (fcntl, through fasteners) belong to the *process*: two lock objects
on one path in one process would both "acquire", and closing any descriptor of the file
drops every lock the process holds on it.  So this module is the only code that opens
lock files, it keeps exactly one lock per path per process, and it puts a thread lock in
front of it so threads (and several producer objects) of one process exclude each other.

Limits, stated plainly:

* Locks are advisory: only kl honours them.
* Locks are not reentrant.
* After ``fork()`` the child holds none of the parent's locks; the registry notices the
  new pid and starts afresh.  Never fork while holding a lock.
* On NFS the locks are real only on mounts with working lockd/NFSv4 locking (not
  ``nolock`` or ``local_lock=``), and a crashed client keeps its locks until its lease
  expires (90 s by default): lock timeouts should be longer than that.
* Lock files are never deleted (deleting one while a process waits on it would let two
  processes "hold" it); they are created with mode 0664 so a group can share a root.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import fasteners

from kl.errors import LockTimeout, StorageError
from kl.fsutil import FILE_MODE, ensure_dir, storage_error


class _HeldOpenLock(fasteners.InterProcessLock):
    """fasteners' fcntl lock on a file opened once, with kl's mode, and kept open.

    fasteners opens and closes the lock file on every acquire (about 50 µs, and with a
    umask-dependent mode); kl keeps the one descriptor for the life of the process.
    """

    def _do_open(self) -> None:
        if self.lockfile is None:
            path = os.fsdecode(self.path)
            ensure_dir(os.path.dirname(path))
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
            except OSError as e:
                raise storage_error(e, "open lock file", path) from None
            if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
                try:
                    os.fchmod(fd, FILE_MODE)
                except PermissionError:
                    pass  # created by another user of the group; its mode is theirs to set
            self.lockfile = os.fdopen(fd, "a")

    def _do_close(self) -> None:
        """Keep the file open: closing it would drop the process's lock."""


class _Entry:
    __slots__ = ("thread_lock", "file_lock")

    def __init__(self, path: str):
        self.thread_lock = threading.Lock()
        self.file_lock = _HeldOpenLock(path)


_registry: dict[str, _Entry] = {}
_registry_lock = threading.Lock()
_registry_pid = os.getpid()


def _entry(path: str) -> _Entry:
    global _registry, _registry_pid
    pid = os.getpid()
    with _registry_lock:
        if pid != _registry_pid:  # forked: the parent's locks are not ours
            _registry, _registry_pid = {}, pid
        entry = _registry.get(path)
        if entry is None:
            entry = _registry[path] = _Entry(path)
        return entry


@contextmanager
def locked(path: str, timeout: float) -> Iterator[None]:
    """Hold the lock on ``path`` (thread lock, then file lock) for the ``with`` block.

    Raises ``LockTimeout`` when it cannot be had within ``timeout`` seconds.
    """
    entry = _entry(path)
    deadline = time.monotonic() + timeout
    if not entry.thread_lock.acquire(timeout=max(timeout, 0)):
        raise LockTimeout(f"lock {path} is held by another thread of this process (waited {timeout:g}s)")
    try:
        file_lock = entry.file_lock
        file_lock._do_open()
        if not _try(file_lock) and not file_lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise LockTimeout(f"lock {path} is held by another process (waited {timeout:g}s)")
        try:
            yield
        finally:
            file_lock.release()
    finally:
        entry.thread_lock.release()


def _try(file_lock: _HeldOpenLock) -> bool:
    """One non-blocking attempt: the uncontended path costs two system calls, not fifty µs."""
    try:
        file_lock.trylock()
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held elsewhere
        return False
    except OSError as e:
        raise StorageError(f"cannot lock {os.fsdecode(file_lock.path)}: {e.strerror}") from None
    file_lock.acquired = True
    return True
