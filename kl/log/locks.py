"""Inter-process locks on permanent lock files, one registry per process.

POSIX record locks (fcntl) belong to the *process*: two lock objects on one path in one
process would both "acquire", and closing any descriptor of the file drops every lock
the process holds on it.  So this module is the only code that opens lock files, it
keeps exactly one lock per file per process (keyed by device and inode), closes the file
only while no thread of the process holds or waits for the lock (when the process's
budget of open files asks for it, see ``kl.log.openfiles``; the next acquire opens it
again), and it puts a thread lock in front so threads (and several producer objects) of
one process exclude each other.

How a wait works.  Uncontended, ``acquire`` is the thread lock and one non-blocking
``lockf``: two system calls.  When another process holds the lock, a helper thread makes
one blocking ``lockf`` (F_SETLKW), so the kernel hands the lock over the moment it is
released, with no polling; the waiting thread waits for the helper's outcome until its
timeout.  Because the lock belongs to the process, a helper's outcome is everybody's:
each lock has at most one helper, started by a waiting thread; a waiter that times out
leaves it behind, and the next thread to acquire waits for that helper rather than
locking on its own (its own lock would be the process's too, and the helper, finishing
later, could not tell it apart from its own and would release it).  A helper that gets
the lock when no thread waits for it releases it at once.  While a helper exists no
thread holds the lock, so that release never drops another thread's lock (the helper lets
it go before it counts as gone: a thread that sees no helper may take the lock at once).  After about
a second of waiting, ``acquire`` logs one warning on ``kl.log.locks`` naming the lock file.

Limits, stated plainly:

* Locks are advisory: only kl honours them.
* Locks are not reentrant.
* After ``fork()`` the child holds none of the parent's locks; the registry notices the
  fork and starts afresh.  Never fork while holding a lock.
* The kernel's deadlock detection sees processes, not threads, and can report a cycle
  between two multi-threaded processes that is none (EDEADLK): the helper then tries
  again every millisecond while someone waits.
* While the interpreter shuts down (``atexit`` handlers, finalizers) no helper thread
  can be started: a waiter then tries every millisecond itself.
* On NFS the locks are real only on mounts with working lockd/NFSv4 locking (not
  ``nolock`` or ``local_lock=``).  On NFSv4 a crashed or cut-off client keeps its locks
  until its lease expires (90 s by default): lock timeouts should be longer than that.
  NFSv3 (lockd) has no leases: such a client keeps them until it is back or reboots.
* Lock files are never deleted (deleting one while a process waits on it would let two
  processes "hold" it); they are created with mode 0664 so a group can share a root.

On NFS a writer also locks the data files it writes (``lock_file``: open file
description locks, which belong to one descriptor and survive the process closing
others): taking a lock is where an NFS client revalidates what it cached of a file, and a
lock held on the data fences a host that lost it (its writes fail with EIO once its
lease expired).  Readers take and drop a shared one (``revalidate``) to see fresh pages.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kl.errors import LockTimeout, StorageError
from kl.log import openfiles
from kl.log.fsutil import ensure_dir, open_file, storage_error

log = logging.getLogger(__name__)

WARN_AFTER = 1.0
"""Seconds of waiting after which ``acquire`` logs (once) that it is waiting."""
RETRY = 0.001
"""Seconds between attempts while the kernel reports a false deadlock, or when no helper
thread can be started."""


class ProcessLock:
    """The one lock on a file in this process: a thread lock, then the file lock."""

    __slots__ = ("path", "generation", "used", "_identity", "_thread_lock", "_fd", "_state", "_helper", "_wanted", "_outcome")

    def __init__(self, path: str, identity: tuple[int, int]):
        self.path = path
        self.generation = forks
        self._identity = identity
        self.used = True
        """Set at each attempt (``openfiles.Keeper``)."""
        self._thread_lock = threading.Lock()
        self._fd = -1
        self._state = threading.Condition(threading.Lock())
        """Guards the three fields below, and notifies the waiter of an outcome."""
        self._helper = False
        """A helper thread is in (or about to make) the blocking ``lockf``."""
        self._wanted = False
        """The thread holding the thread lock waits for the helper's outcome."""
        self._outcome: OSError | bool | None = None
        """The helper's result for the waiter: True (the lock is held) or its error."""

    def acquire(self, timeout: float) -> None:
        """Raises ``LockTimeout`` when the lock cannot be had within ``timeout`` seconds,
        ``StorageError`` when the file cannot be opened or locked."""
        if self._thread_lock.acquire(False):
            started = None
        else:
            started = self._wait_for_thread(timeout)
        try:
            helper = self._helper
            if helper or not self._try():
                self._wait_for_process(timeout, started, try_first=helper)
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _wait_for_thread(self, timeout: float) -> float:
        """Take the thread lock from another thread of this process; returns when the
        wait started."""
        started = time.monotonic()
        if self._thread_lock.acquire(timeout=max(min(timeout, WARN_AFTER), 0)):
            return started
        if timeout > WARN_AFTER:
            log.warning("waiting for the lock on %s (held by another thread of this process)", self.path)
            if self._thread_lock.acquire(timeout=timeout - WARN_AFTER):
                return started
        raise LockTimeout(f"lock {self.path} is held by another thread of this process (waited {timeout:g}s)")

    def close_idle(self) -> bool:
        """Close the lock file unless a thread of this process holds or waits for the
        lock (an ``openfiles.Keeper``).  A parent's lock is never closed in a child: that
        could drop the child's own lock on the file."""
        return self.generation != forks or self.if_idle(self._close)

    def if_idle(self, action: Callable[[], object]) -> bool:
        """Run ``action`` unless a thread of this process holds or waits for the lock;
        True when it ran."""
        if not self._thread_lock.acquire(False):
            return False
        try:
            with self._state:
                if self._helper:
                    return False
            action()
            return True
        finally:
            self._thread_lock.release()

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            openfiles.kept(self, 0)

    def _try(self) -> bool:
        """One non-blocking attempt (the file is opened on the first, and again after
        ``close_idle``)."""
        self.used = True
        if self._fd < 0:
            self._fd = self._reopen()
            openfiles.kept(self, 1)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held elsewhere
            return False
        except OSError as e:
            raise StorageError(f"cannot lock {self.path}: {e.strerror}") from None
        return True

    def _wait_for_process(self, timeout: float, started: float | None, try_first: bool) -> None:
        """With the thread lock held: wait for the helper's outcome (starting a helper
        if there is none) until ``timeout`` seconds after ``started``.  ``try_first``:
        no attempt was made, as a helper was there (it may have finished since)."""
        now = time.monotonic()
        warned = started is not None and now - started >= WARN_AFTER  # said while waiting for a thread
        if started is None:
            started = now
        state = self._state
        with state:
            if not self._helper:
                if try_first and self._try():
                    return
                if now - started >= timeout:
                    raise self._timed_out(timeout)
                if not self._start_helper():
                    self._poll(started, timeout)
                    return
            self._wanted = True
            try:
                while self._outcome is None:
                    now = time.monotonic()
                    left = started + timeout - now
                    if left <= 0:
                        raise self._timed_out(timeout)
                    if not warned:
                        if now - started >= WARN_AFTER:
                            log.warning("waiting for the lock on %s (held by another process)", self.path)
                            warned = True
                        else:
                            left = min(left, started + WARN_AFTER - now)
                    state.wait(left)
                outcome, self._outcome = self._outcome, None
            finally:
                self._wanted = False
                if self._outcome is True:  # interrupted (Ctrl-C) just as the helper got it
                    fcntl.lockf(self._fd, fcntl.LOCK_UN)
                self._outcome = None
        if isinstance(outcome, OSError):
            raise StorageError(f"cannot lock {self.path}: {outcome.strerror}") from None

    def _reopen(self) -> int:
        """The lock file, opened.  When the path names another file now (the root or the
        topic deleted and made again: lock files outlive neither), this lock becomes the
        new file's, as a fresh ``lock_for`` would give; ``StorageError`` if this process
        already has a lock on the new file (two would drop each other's locks)."""
        fd = _open(self.path)
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if identity != self._identity:
            with _registry_lock:
                other = _registry.get(identity)
                if other is not None and other is not self:
                    os.close(fd)
                    raise StorageError(f"lock file {self.path} was deleted and created again while in use; restart this process")
                if _registry.get(self._identity) is self:
                    del _registry[self._identity]
                _registry[identity] = self
                self._identity = identity
        return fd

    def _timed_out(self, timeout: float) -> LockTimeout:
        return LockTimeout(f"lock {self.path} is held by another process (waited {timeout:g}s)")

    def _start_helper(self) -> bool:
        """Start the helper thread; False when the interpreter is shutting down (an
        ``atexit`` handler, a finalizer), which starts no threads or hangs starting one."""
        if sys.is_finalizing():
            return False
        self._helper = True
        try:
            threading.Thread(target=self._wait_in_kernel, name=f"kl lock {self.path}", daemon=True).start()
        except RuntimeError:
            self._helper = False
            return False
        return True

    def _poll(self, started: float, timeout: float) -> None:
        """Try every millisecond until ``timeout`` seconds after ``started``: the wait
        when no helper thread can be started."""
        while not self._try():
            if time.monotonic() - started >= timeout:
                raise self._timed_out(timeout)
            time.sleep(RETRY)

    def _wait_in_kernel(self) -> None:
        """The helper thread: one blocking ``lockf``; the outcome goes to the thread
        waiting now, or the lock is released at once when none is."""
        while True:
            outcome: OSError | bool
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX)
                outcome = True
            except OSError as e:
                outcome = e
            with self._state:
                retry = isinstance(outcome, OSError) and outcome.errno == errno.EDEADLK and self._wanted
                if not retry:
                    if self._wanted:
                        self._outcome = outcome
                        self._state.notify()
                    elif outcome is True:  # before the helper is gone: a thread that sees it gone may lock at once
                        fcntl.lockf(self._fd, fcntl.LOCK_UN)
                    self._helper = False
            if not retry:
                return
            time.sleep(RETRY)


def _open(path: str) -> int:
    """Open the lock file, creating it (and its directory) if need be, with the modes of
    ``fsutil.open_file``."""
    try:
        return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)  # most opens: one there already
    except FileNotFoundError:
        pass
    except OSError as e:
        raise storage_error(e, "open lock file", path) from None
    ensure_dir(os.path.dirname(path))
    try:
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise storage_error(e, "open lock file", path) from None
    return fd


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
    with _registry_lock:
        key = _identity(path)
        if forks != _registry_forks:  # forked: the parent's locks are not ours
            _registry, _registry_forks = {}, forks
        lock = _registry.get(key)
        if lock is None:
            lock = _registry[key] = ProcessLock(path, key)
        return lock


def _identity(path: str) -> tuple[int, int]:
    """(device, inode) of the lock file, created if missing.

    Only a brand-new file is ever opened and closed here: closing a descriptor of a file
    this process has locked would drop that lock.  Called under the registry lock, so
    no other thread of this process can have locked the new file (it would have had to
    get its lock from :func:`lock_for` first) before the descriptor is closed.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        ensure_dir(os.path.dirname(path))
        try:
            fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileExistsError:
            pass
        except OSError as e:
            raise storage_error(e, "create lock file", path) from None
        else:
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


class Slots:
    """Exclusive locks on single bytes of one lock file, taken without waiting: one
    descriptor for any number of them (a mirror of 10,000 topics holds one per topic
    for its whole run).  A slot held by another thread of this process is refused too.
    The file stays open for the life of the process (closing it would drop every slot)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = -1
        self._held: set[int] = set()
        self._guard = threading.Lock()

    def try_lock(self, slot: int) -> bool:
        """Lock byte ``slot`` (0 to 2**62); False when it is held, here or elsewhere.
        Raises ``StorageError`` when the file cannot be opened or locked."""
        with self._guard:
            if slot in self._held:
                return False
            if self._fd < 0:
                self._fd = _open(self.path)
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, slot)
            except (BlockingIOError, PermissionError):
                return False
            except OSError as e:
                raise StorageError(f"cannot lock {self.path}: {e.strerror}") from None
            self._held.add(slot)
            return True

    def unlock(self, slot: int) -> None:
        with self._guard:
            if slot in self._held:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, slot)
                self._held.discard(slot)


_slots: dict[tuple[int, int], Slots] = {}
_slots_forks = 0


def slots_for(path: str) -> Slots:
    """This process's ``Slots`` on the file at ``path`` (a fresh registry after ``fork()``),
    keyed as ``lock_for`` keys its locks; the file must be one ``lock_for`` never locks."""
    global _slots, _slots_forks
    with _registry_lock:
        key = _identity(path)
        if forks != _slots_forks:
            _slots, _slots_forks = {}, forks
        found = _slots.get(key)
        if found is None:
            found = _slots[key] = Slots(path)
        return found


# ----------------------------------------------------------------- locks on data files (NFS)

_FLOCK = struct.Struct("hhqqi4x")
"""struct flock on Linux: type, whence, start, length, pid (0 for open file description locks)."""
FILE_LOCK_POLL = 0.01


def lock_file(fd: int, path: str, timeout: float, *, shared: bool = False, start: int = 0, length: int = 0) -> None:
    """Take an open file description lock on the whole file ``fd`` refers to (or on its
    ``length`` bytes from ``start``, when ``length`` is not 0).

    Used on NFS, where taking a lock on a file makes the client revalidate its cached
    attributes and pages (a cache coherency point), and where a lock held on the data
    itself fences a host that lost it: once its lease expired, its writes through ``fd``
    fail with EIO.  Open file description locks belong to this descriptor, not the
    process: other descriptors of the file opened and closed meanwhile leave it alone.
    It goes when ``fd`` is closed.  Raises ``LockTimeout`` and ``StorageError``.
    """
    request = _FLOCK.pack(fcntl.F_RDLCK if shared else fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    deadline = time.monotonic() + timeout
    pause = FILE_LOCK_POLL / 10
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
            return
        except (BlockingIOError, PermissionError):
            if time.monotonic() >= deadline:
                what = f"{path} (bytes {start} to {start + length})" if length else path
                raise LockTimeout(f"{what} is locked by another host or process (waited {timeout:g}s)") from None
            time.sleep(pause)
            pause = min(pause * 2, FILE_LOCK_POLL)
        except OSError as e:
            raise storage_error(e, "lock", path) from None


def unlock_file(fd: int, path: str, *, start: int = 0, length: int = 0) -> None:
    """Drop the lock ``lock_file`` took on ``fd`` (on those bytes)."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, start, length, 0))
    except OSError as e:
        raise storage_error(e, "unlock", path) from None


def locked_elsewhere(fd: int, path: str, *, start: int = 0, length: int = 0) -> bool:
    """Whether another open file description holds a lock on the file ``fd`` refers to
    (on those bytes, as for ``lock_file``; asked with F_OFD_GETLK: nothing is taken)."""
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, length, 0))
    except OSError as e:
        raise storage_error(e, "test the lock of", path) from None
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)


def revalidate(fd: int, path: str, timeout: float) -> None:
    """Make an NFS client drop what it cached of the file: take a shared lock and let it
    go (waits while a writer holds the file for an append)."""
    lock_file(fd, path, timeout, shared=True)
    unlock_file(fd, path)
