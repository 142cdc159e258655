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
  fork and starts afresh.  Never fork while holding a lock.
* On NFS the locks are real only on mounts with working lockd/NFSv4 locking (not
  ``nolock`` or ``local_lock=``), and a crashed client keeps its locks until its lease
  expires (90 s by default): lock timeouts should be longer than that.
* Lock files are never deleted (deleting one while a process waits on it would let two
  processes "hold" it); they are created with mode 0664 so a group can share a root.
"""

from __future__ import annotations

import fcntl
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


class ProcessLock:
    """The one lock on a path in this process: a thread lock, then the file lock."""

    __slots__ = ("path", "generation", "_thread_lock", "_file_lock", "_fd")

    def __init__(self, path: str):
        self.path = path
        self.generation = forks
        self._thread_lock = threading.Lock()
        self._file_lock = _HeldOpenLock(path)
        self._fd = -1

    def acquire(self, timeout: float) -> None:
        """Raises ``LockTimeout`` when the lock cannot be had within ``timeout`` seconds."""
        started = None
        thread_lock = self._thread_lock
        if not thread_lock.acquire(False):
            started = time.monotonic()
            if not thread_lock.acquire(timeout=max(timeout, 0)):
                raise LockTimeout(f"lock {self.path} is held by another thread of this process (waited {timeout:g}s)")
        try:
            if self._fd < 0:
                self._file_lock._do_open()
                self._fd = self._file_lock.lockfile.fileno()
            if not self._try():
                waited = 0.0 if started is None else time.monotonic() - started
                if not self._file_lock.acquire(timeout=max(timeout - waited, 0)):
                    raise LockTimeout(f"lock {self.path} is held by another process (waited {timeout:g}s)")
        except BaseException:
            thread_lock.release()
            raise

    def release(self) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            self._file_lock.acquired = False
        finally:
            self._thread_lock.release()

    def _try(self) -> bool:
        """One non-blocking attempt, straight to fcntl: the uncontended path costs two
        system calls; fasteners' own acquire (with its timeout) takes the contended one."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held elsewhere
            return False
        except OSError as e:
            raise StorageError(f"cannot lock {self.path}: {e.strerror}") from None
        self._file_lock.acquired = True
        return True


_registry: dict[tuple[int, int], ProcessLock] = {}
_registry_lock = threading.Lock()
forks = 0
"""How many times this process's line of ancestors forked: a lock made under an older
count belongs to a parent (cheaper to compare than calling getpid on every append)."""
_registry_forks = 0


def _forked() -> None:
    global forks
    forks += 1


os.register_at_fork(after_in_child=_forked)


def lock_for(path: str) -> ProcessLock:
    """This process's lock on the file at ``path`` (a fresh registry after ``fork()``).

    Keyed by the file's device and inode, so two spellings of one path (a symlink, a
    bind mount) still share one lock.  Holders must call again when
    ``lock.generation != locks.forks``.
    """
    global _registry, _registry_forks
    key = _identity(path)
    with _registry_lock:
        if forks != _registry_forks:  # forked: the parent's locks are not ours
            _registry, _registry_forks = {}, forks
        lock = _registry.get(key)
        if lock is None:
            lock = _registry[key] = ProcessLock(path)
        return lock


def _identity(path: str) -> tuple[int, int]:
    """(device, inode) of the lock file, created if missing.

    Only a brand-new file is ever opened and closed here: closing a descriptor of a file
    this process has locked would drop that lock.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        ensure_dir(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            pass
        except OSError as e:
            raise storage_error(e, "create lock file", path) from None
        else:
            os.fchmod(fd, FILE_MODE)
            os.close(fd)
        st = os.stat(path)
    except OSError as e:
        raise storage_error(e, "open lock file", path) from None
    return st.st_dev, st.st_ino


@contextmanager
def locked(path: str, timeout: float) -> Iterator[None]:
    """Hold the lock on ``path`` for the ``with`` block.  Raises ``LockTimeout``."""
    lock = lock_for(path)
    lock.acquire(timeout)
    try:
        yield
    finally:
        lock.release()
