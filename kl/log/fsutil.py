"""Small filesystem helpers: modes, durable creation, atomic replace, error translation."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import stat
import time
from collections.abc import Callable

from kl.errors import StorageError

log = logging.getLogger(__name__)

FILE_MODE = 0o666
DIR_MODE = 0o777
"""The modes kl asks for: the umask takes away from them (see ``share``)."""
SHARED_FILE = 0o060
SHARED_DIR = stat.S_ISGID | 0o070
"""What kl adds to what the umask left in a shared root: the group reads and writes
(directories: and keep the setgid bit)."""

_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "I/O error",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def storage_error(e: OSError, action: str, path: str) -> StorageError:
    """A one-line ``StorageError`` for an ``OSError`` met while doing ``action`` on ``path``."""
    reason = _REASONS.get(e.errno or 0, e.strerror or str(e))
    return StorageError(f"cannot {action} {path}: {reason}", errno=e.errno)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_dir(path: str) -> list[str]:
    """The names in directory ``path``, in no order; none where it is missing or not a
    directory.  Raises ``StorageError`` when it cannot be read."""
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise storage_error(e, "list", path) from None


def shared(directory: str) -> bool:
    """Whether ``directory`` is in a shared root: it has the setgid bit (``chmod g+s
    ROOT``), which each directory made in it inherits."""
    try:
        return bool(os.stat(directory).st_mode & stat.S_ISGID)
    except OSError:
        return False


def share(target: int | str, directory: str, bits: int = SHARED_FILE) -> None:
    """Give the group ``bits`` on the file (a descriptor) or directory (a path) kl just
    created in ``directory``, if it is in a shared root and the umask took them away.
    The other bits stay as the umask left them; a file of another user is left as it is."""
    st = os.stat(target)
    if st.st_mode & bits == bits or st.st_uid != os.geteuid() or not shared(directory or "."):
        return
    with contextlib.suppress(PermissionError):
        os.chmod(target, stat.S_IMODE(st.st_mode) | bits)


def open_file(path: str, flags: int) -> int:
    """``os.open`` with the modes the umask allows, and in a shared root the group's
    read and write (see ``share``); returns the fd."""
    fd = os.open(path, flags, FILE_MODE)
    try:
        share(fd, os.path.dirname(path))
    except OSError:
        os.close(fd)
        raise
    return fd


def make_dir(path: str) -> None:
    """``os.mkdir`` with the modes the umask allows, and in a shared root the group's
    read, write and search and the setgid bit (see ``share``)."""
    os.mkdir(path, DIR_MODE)
    share(path, os.path.dirname(path), SHARED_DIR)


def ensure_dir(path: str) -> None:
    """Create ``path`` and its parents where missing (``make_dir``)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        ensure_dir(parent)
    try:
        make_dir(path)
    except FileExistsError:
        return
    except OSError as e:
        raise storage_error(e, "create directory", path) from None
    fsync_dir(parent or ".")


def write_atomic(
    path: str, data: bytes, *, before_rename: Callable[[], None] | None = None, durable: bool = True, mode: int | None = None
) -> None:
    """Replace ``path`` with ``data``: unique temp file (``.NAME.*.tmp``), fsync, rename,
    fsync the directory.  ``before_rename`` runs between the fsync and the rename.  Not
    ``durable``: no fsync (readers see the old file or the new one; after a crash the
    new one may be lost or empty).  ``mode``: the file's mode bits, from its creation
    on (the umask still applies; a shared root's group bits are not added); None:
    ``open_file``'s."""
    directory = os.path.dirname(path) or "."
    tmp = temp_path(path)
    try:
        fd = _write_temp(tmp, data, mode)
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        os.rename(tmp, path)
        if durable:
            fsync_dir(directory)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise storage_error(e, "write", path) from None


def write_cache(path: str, data: bytes, *, durable: bool = True) -> bool:
    """``write_atomic`` of a file that is a cache (a segment's time summary or offset
    index): False, logged, when it cannot be written (a reader without write access to
    the root, a full disk: whoever needs it next works it out again)."""
    try:
        write_atomic(path, data, durable=durable)
    except StorageError as e:
        log.debug("cannot keep %s: %s", path, e)
        return False
    return True


def remove_file(path: str) -> bool:
    """Unlink ``path``; False when there was none.  Raises ``StorageError``."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise storage_error(e, "remove", path) from None
    return True


def temp_path(path: str) -> str:
    """A unique temporary file's path beside ``path``: ``.NAME.PID.RANDOM.tmp``."""
    directory, name = os.path.split(path)
    return os.path.join(directory or ".", f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _write_temp(tmp: str, data: bytes, mode: int | None = None) -> int:
    """Create ``tmp`` (``open_file``, or with ``mode``) holding ``data``; returns its open descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = open_file(tmp, flags) if mode is None else os.open(tmp, flags, mode)
    try:
        write_all(fd, data)
    except OSError:
        os.close(fd)
        raise
    return fd


def file_time_ns(directory: str) -> int:
    """Now, by the clock that stamps the modification and change times of the files in
    ``directory``: on NFS the server's, the same for every host, whose own clocks may be
    minutes apart.  Read off a hidden file made there, set to the file system's time and
    removed; where none can be made (a read-only root), this host's clock."""
    path = os.path.join(directory, f".now.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError:
        return time.time_ns()
    try:
        os.utime(fd)  # the file system's own time (NFS: SET_TO_SERVER_TIME)
        return os.fstat(fd).st_mtime_ns
    except OSError:
        return time.time_ns()
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def create_file(path: str) -> int:
    """Create (or truncate) ``path`` for reading and writing (``open_file``); returns the fd."""
    return open_file(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of ``data`` at the descriptor's position, or its end with ``O_APPEND``
    (write may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pwrite_all(fd: int, data: bytes | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position`` (pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):  # not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, position: int, length: int) -> None:
    """Have the kernel start writing ``length`` bytes of ``fd`` from ``position`` to the
    disk, without waiting for them (Linux's ``sync_file_range``): a later fsync has that
    much less to wait for.  Durability is unchanged: only an fsync makes data durable.
    Does nothing where the call is missing; its errors are the fsync's to report."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, position, length, _SYNC_FILE_RANGE_WRITE)


MOUNT_RECHECK_SECONDS = 1.0
"""How long ``mount_of`` answers for a filesystem (a device number) from what it found
there before, without reading the mount table again."""
_mounts: dict[int, tuple[float, tuple[str, str, set[str]]]] = {}


def mount_of(path: str) -> tuple[str, str, set[str]]:
    """(mount point, filesystem type, mount options) of the filesystem holding ``path``.

    The mount table (``/proc/self/mountinfo``, read and searched: about 0.1 ms, more with
    many mounts) is read again for a filesystem once ``MOUNT_RECHECK_SECONDS`` have passed
    since it was last read for it: opening the 10,000 partitions of a root reads it once,
    not 10,000 times.  A filesystem is known by its device number, so within that second
    another path on it (a bind mount) gets the mount point found first."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return _mount_of(path)
    now = time.monotonic()
    found = _mounts.get(device)
    if found is None or now >= found[0]:
        found = _mounts[device] = (now + MOUNT_RECHECK_SECONDS, _mount_of(path))
    return found[1]


def _mount_of(path: str) -> tuple[str, str, set[str]]:
    real = os.path.realpath(path)
    best: tuple[str, str, set[str]] = ("/", "", set())
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, tail[0], set(fields[5].split(",")) | set(tail[2].split(",")))
    return best


def nfs_locking_problem(path: str) -> str | None:
    """Why kl's locks would not work on the NFS mount holding ``path`` (None if fine or not NFS)."""
    point, fstype, options = mount_of(path)
    if not fstype.startswith("nfs"):
        return None
    for bad in ("nolock", "local_lock=all", "local_lock=posix", "local_lock=flock"):
        if bad in options:
            return f"{point} is an NFS mount with {bad}: locks would not exclude other hosts; remount without it"
    return None
