"""Topics under a root directory: names, creation, listing, description, deletion.

Layout (see ``man/kl-format.5``)::

    ROOT/TOPIC/topic.json                       the topic's config
    ROOT/TOPIC/PARTITION/00000000000000000000.kl segments, named by base offset
                                                (.kafka in a topic of format 0.7)
    ROOT/TOPIC/PARTITION/state                  the published state record
    ROOT/.locks/TOPIC/PARTITION.lock            permanent lock files
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kl.errors import InvalidTopicName, KlError, LockTimeout, RootNotFound, StorageError, TopicExists, TopicNotFound
from kl.log import locks
from kl.log.config import CONFIG_FILE, TopicConfig, config_generation, forget_config, new_topic_id
from kl.log.fsutil import create_file, ensure_dir, file_time_ns, fsync_dir, list_dir, make_dir, storage_error, write_atomic
from kl.log.log import DEFAULT_LOCK_TIMEOUT, Log, append_all
from kl.log.recovery import LEFTOVER_MIN_AGE, TEMPORARY, TEMPORARY_SUFFIX
from kl.log.segment import LEGACY_SUFFIX, SUFFIX, segment_name
from kl.log.state import STATE_FILE, PartitionState, deleted_record
from kl.log.validate import Checked

GROUPS_DIR = ".groups"
"""Consumer groups' files under the root (kl/registry.py)."""

LOCKS_DIR = ".locks"
CONFIG_LOCK = "config.lock"
"""``ROOT/.locks/TOPIC/config.lock``: held while a topic of an older kl is given its id,
and while ``Root.alter_topic`` changes the topic's settings."""
CONFIG_RECHECK_SECONDS = 1.0
"""How long ``Root.config`` trusts what it read of a topic's config before it looks at
``topic.json`` again (an open and a stat) for changes made by ``Root.alter_topic``."""
ADDING_PREFIX = ".adding-"
"""``ROOT/TOPIC/.adding-*``: a partition ``Root.alter_topic`` is building, renamed to its
number once whole."""
log = logging.getLogger(__name__)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
LEFTOVERS = {".creating-": "left by an interrupted topic create", ".deleting-": "left by an interrupted topic delete"}
"""Prefixes of the directories ``create_topic`` and ``delete_topic`` work in, and what
one that stays behind means."""


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid topic name, else raise ``InvalidTopicName``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("."):
        raise InvalidTopicName(
            f"invalid topic name {name!r}: use 1-249 characters from A-Z a-z 0-9 . _ - not starting with a dot"
        )
    return name


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    segments: int
    log_start_offset: int
    log_end_offset: int
    size_in_bytes: int


class _Cached(NamedTuple):
    config: TopicConfig
    generation: int
    recheck_at: float


@dataclass(frozen=True)
class TopicInfo:
    name: str
    config: TopicConfig
    partitions: list[PartitionInfo]

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the topic's segment files."""
        return sum(p.size_in_bytes for p in self.partitions)


class Root:
    """A directory holding topics; the handle producers and consumers share.

    Safe across processes and threads.  ``lock_timeout`` bounds every wait for a
    partition lock (``LockTimeout`` after it).
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        self.path = os.path.abspath(os.fspath(path))
        self.lock_timeout = lock_timeout
        self._logs: dict[tuple[str, int], Log] = {}
        self._configs: dict[str, _Cached] = {}
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"Root({self.path!r})"

    def topic_path(self, name: str) -> str:
        """The topic's directory; raises ``InvalidTopicName`` if it would not be a plain
        directory directly under the root (a symlink planted there included)."""
        path = os.path.join(self.path, validate_name(name))
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = stat.S_IFDIR
        if not stat.S_ISDIR(mode):  # so it is no link either: a valid name is one entry, so it is inside the root
            raise InvalidTopicName(f"invalid topic {name!r}: {path} is not a plain directory")
        return path

    def _lock_path(self, name: str, partition: int | str) -> str:
        return os.path.join(self.path, LOCKS_DIR, name, f"{partition}.lock")

    # ----------------------------------------------------------------- topics

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Create a topic with every partition, all at once (built aside, then renamed in).
        It gets a new topic id unless ``config`` names one (a mirror's copy keeps its
        source's).  Returns the config written.

        Raises ``TopicExists``, ``InvalidTopicName`` and ``StorageError``.
        """
        config = config or TopicConfig()
        if not config.topic_id:
            config = dataclasses.replace(config, topic_id=new_topic_id())
        if config.headers is None:
            config = dataclasses.replace(config, headers=not config.legacy)
        path = self.topic_path(name)
        if os.path.lexists(path):
            raise TopicExists(f"topic {name!r} already exists in {self.path}")
        if not os.path.isdir(self.path):
            ensure_dir(self.path)
        tmp = os.path.join(self.path, f".creating-{uuid.uuid4().hex}")
        try:
            make_dir(tmp)
            write_atomic(os.path.join(tmp, CONFIG_FILE), config.to_json())
            suffix = LEGACY_SUFFIX if config.legacy else SUFFIX
            for partition in range(config.partitions):
                self._create_partition(os.path.join(tmp, str(partition)), suffix)
            fsync_dir(tmp)
            os.rename(tmp, path)
            fsync_dir(self.path)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if os.path.lexists(path):
                raise TopicExists(f"topic {name!r} already exists in {self.path}") from None
            raise storage_error(e, "create topic", path) from None
        except KlError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return config

    def alter_topic(self, name: str, **changes: int) -> TopicConfig:
        """Change settings of an existing topic: those of ``config.ALTERABLE``, partitions
        and ``max_message_bytes`` upward only (``TopicConfig.altered``).  Returns the
        config written; the topic keeps its id (readers, groups and loads see the same
        topic, not a new creation).

        Under the topic's config lock, new partitions are built aside and renamed in,
        empty as ``create_topic`` makes them and never touching the existing ones; then
        ``topic.json`` is replaced atomically (temp file, fsync, rename, fsync of the
        directory).  Nothing is written when a change is refused.  Processes that have the
        topic open take the change up without a restart: every append that begins
        after this returns obeys it (``Log.refresh_config``, under the partition lock),
        and ``config`` (the partitions producers and groups spread over) sees it within
        ``CONFIG_RECHECK_SECONDS``.  Keyed messages then hash over the new number of
        partitions: a key's later messages may go to another partition than its earlier
        ones, so their order across the change is not kept.

        Raises ``ConfigNotAlterable``, ``InvalidConfig``, ``TopicNotFound``,
        ``LockTimeout`` and ``StorageError``.
        """
        self.read_config(name).altered(**changes)  # refused before anything, a lock file included, is written
        topic_path = self.topic_path(name)
        path = os.path.join(topic_path, CONFIG_FILE)
        with locks.locked(os.path.join(self.path, LOCKS_DIR, name, CONFIG_LOCK), self.lock_timeout):
            old = self._read_config_file(name)
            new = old.altered(**changes)
            if new != old:
                self._remove_unfinished_partitions(topic_path, old.partitions)
                suffix = LEGACY_SUFFIX if new.legacy else SUFFIX
                for partition in range(old.partitions, new.partitions):
                    self._add_partition(topic_path, partition, suffix)
                if new.partitions > old.partitions:
                    fsync_dir(topic_path)
                write_atomic(path, new.to_json())
            generation = config_generation(path, fresh=True)  # of the file written: nobody else writes it meanwhile
        self._configs[name] = _Cached(new, generation, time.monotonic() + CONFIG_RECHECK_SECONDS)
        log.info("topic %s altered: %s", name, ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
        return new

    def _remove_unfinished_partitions(self, topic_path: str, partitions: int) -> None:
        """Under the config lock: remove what an alter that stopped half-way left (see
        :func:`_unfinished`); a directory past the partitions that holds data is refused."""
        for path, what, removable in _unfinished(topic_path, partitions):
            if not removable:
                raise StorageError(f"{path} is {what}")
            _remove(path)

    def remove_unfinished(
        self, name: str, *, partitions: int | None = None, dry_run: bool = False
    ) -> list[tuple[str, str, bool]]:
        """Remove what an alter of ``name`` killed half-way left in the topic's directory
        (see :func:`_unfinished`), under the topic's config lock; nothing while another
        process holds it (an alter under way removes them itself).  Returns (path, what it
        is, whether it was removed) of each, sorted (with ``dry_run``: whether it would be;
        a dry run takes no lock and lists what it finds).  A directory past the partitions
        that holds data is only reported.  ``partitions``: how many ``topic.json`` names,
        as the caller just read it (read now when None; under the lock, always).  Raises
        ``TopicNotFound`` and ``StorageError``."""
        topic_path = self.topic_path(name)
        found = _unfinished(topic_path, self._read_config_file(name).partitions if partitions is None else partitions)
        if not found or dry_run:  # one listing of the directory when all is well
            return found
        try:
            with locks.locked(os.path.join(self.path, LOCKS_DIR, name, CONFIG_LOCK), 0):
                found = _unfinished(topic_path, self._read_config_file(name).partitions)
                for path, _, removable in found:
                    if removable:
                        _remove(path)
        except LockTimeout:
            return []
        return found

    def _add_partition(self, topic_path: str, partition: int, suffix: str) -> None:
        tmp = os.path.join(topic_path, f"{ADDING_PREFIX}{uuid.uuid4().hex}")
        target = os.path.join(topic_path, str(partition))
        try:
            self._create_partition(tmp, suffix)
            fsync_dir(tmp)
            os.rename(tmp, target)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise storage_error(e, "create partition", target) from None

    @staticmethod
    def _create_partition(directory: str, suffix: str) -> None:
        make_dir(directory)
        os.close(create_file(os.path.join(directory, segment_name(0, suffix))))
        write_atomic(os.path.join(directory, STATE_FILE), PartitionState.empty().encode())

    def topics(self) -> list[str]:
        """Names of the topics under the root, sorted: the directories holding a
        ``topic.json`` (what else is there, see :meth:`strays`).  Raises ``RootNotFound``."""
        return sorted(e.name for e in self._entries() if not e.name.startswith(".") and _stray_reason(e) is None)

    def strays(self) -> list[tuple[str, str]]:
        """(name, reason) of each entry of the root that is not a topic, sorted: a
        directory without ``topic.json``, a file, a symlink, a name kl would not give a
        topic.  Hidden entries (``.locks``, leftovers, NFS's ``.nfsXXXX``) are not
        listed.  Raises ``RootNotFound``."""
        return self.listing()[1]

    def listing(self) -> tuple[list[str], list[tuple[str, str]]]:
        """:meth:`topics` and :meth:`strays` from one listing of the root (one look at
        each entry, not two).  Raises ``RootNotFound``."""
        topics, strays = [], []
        for entry in self._entries():
            if not entry.name.startswith("."):
                reason = _stray_reason(entry)
                if reason is None:
                    topics.append(entry.name)
                else:
                    strays.append((entry.name, reason))
        return sorted(topics), sorted(strays)

    def remove_leftovers(self, *, min_age: float = LEFTOVER_MIN_AGE, dry_run: bool = False) -> list[tuple[str, str]]:
        """Remove the directories an interrupted ``create_topic`` or ``delete_topic``
        left behind (``.creating-*``, ``.deleting-*``), and temporary files of killed
        writes (``.*.tmp``, see ``fsutil.write_atomic``), once unchanged for ``min_age``
        seconds by the file system's clock (a host whose own clock runs ahead must not
        take a create under way on another host for an old leftover).  Returns (name,
        what it was) of each one removed (with ``dry_run``: each one that would be),
        sorted.  Raises ``RootNotFound`` and ``StorageError``."""
        entries = sorted(self._entries(), key=lambda e: e.name)
        now = file_time_ns(self.path) / 1e9
        removed = []
        for entry in entries:
            kind = next((what for prefix, what in LEFTOVERS.items() if entry.name.startswith(prefix)), None)
            if kind is None and entry.name.startswith(".") and entry.name.endswith(TEMPORARY_SUFFIX):
                if not entry.is_file(follow_symlinks=False):
                    continue
                kind = TEMPORARY
            elif kind is None or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if now - max(st.st_mtime, st.st_ctime) < min_age:
                continue
            if not dry_run:
                _remove(entry.path)  # one another process removes meanwhile is no error
            removed.append((entry.name, kind))
        return removed

    def _entries(self) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(self.path) as entries:
                return list(entries)
        except (FileNotFoundError, NotADirectoryError):
            raise self._missing() from None
        except OSError as e:
            raise storage_error(e, "list", self.path) from None

    def _missing(self) -> RootNotFound:
        if os.path.exists(self.path):
            return RootNotFound(f"root {self.path} is not a directory")
        return RootNotFound(f"root {self.path} does not exist (is it mounted?)")

    def config(self, name: str) -> TopicConfig:
        """The topic's config as this handle read it, with the changes ``alter_topic`` made
        since (looked for at most every ``CONFIG_RECHECK_SECONDS``).  A config of another
        creation of the topic is not taken up: users of the handle detect those by the
        topic id.  Raises ``TopicNotFound``, ``RootNotFound`` and ``InvalidConfig``."""
        cached = self._configs.get(name)
        if cached is not None and time.monotonic() < cached.recheck_at:
            return cached.config
        return self.refresh_config(name)

    def refresh_config(self, name: str) -> TopicConfig:
        """:meth:`config`, looking at ``topic.json`` now."""
        cached = self._configs.get(name)
        try:
            path = os.path.join(self.topic_path(name), CONFIG_FILE)
        except NotADirectoryError:
            raise self._missing() from None
        generation = config_generation(path, fresh=True)  # on NFS: not what the attribute cache holds
        recheck_at = time.monotonic() + CONFIG_RECHECK_SECONDS
        if cached is None:
            self._configs[name] = cached = _Cached(self.read_config(name, path), generation, recheck_at)
            return cached.config
        config = cached.config
        if generation and generation != cached.generation:
            try:
                found = self._read_config_file(name)
            except KlError:  # gone or damaged: left to the reads and writes that meet it
                found = config
            if found.same_topic(config):
                config = found
        self._configs[name] = _Cached(config, generation, recheck_at)
        return config

    def read_config(self, name: str, path: str | None = None) -> TopicConfig:
        """The topic's config as it is on disk now (no cache).  A topic written by a kl
        before topic ids is given one here, once: under the topic's config lock, so that
        processes opening it at once agree on one id.  Where the root cannot be written
        the id stays empty (logged).  ``path``: its ``topic.json``, when the caller just
        found it under a plain directory (``topic_path``).  Raises like :meth:`config`."""
        config = self._read_config_file(name, path)
        if config.topic_id:
            return config
        path = os.path.join(self.topic_path(name), CONFIG_FILE)
        with locks.locked(os.path.join(self.path, LOCKS_DIR, name, CONFIG_LOCK), self.lock_timeout):
            config = self._read_config_file(name)
            if config.topic_id:
                return config
            config = dataclasses.replace(config, topic_id=new_topic_id())
            try:
                write_atomic(path, config.to_json())
            except StorageError as e:
                log.warning("topic %s has no topic id and none can be written: %s", name, e)
                return dataclasses.replace(config, topic_id="")
        log.info("topic %s was given the topic id %s", name, config.topic_id)
        return config

    def topic_id(self, name: str) -> str:
        """The id of the topic's current creation, read now (see :meth:`read_config`)."""
        return self.read_config(name).topic_id

    def _read_config_file(self, name: str, path: str | None = None) -> TopicConfig:
        try:
            path = path or os.path.join(self.topic_path(name), CONFIG_FILE)
        except NotADirectoryError:
            raise self._missing() from None
        try:
            with open(path, "rb") as f:
                return TopicConfig.from_json(f.read(), path)
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.isdir(self.path):
                raise self._missing() from None
            raise TopicNotFound(f"topic {name!r} does not exist in {self.path}") from None
        except OSError as e:
            raise storage_error(e, "read", path) from None

    def append_all(self, appends: Sequence[tuple[Log, Checked]], *, fsync: bool = False) -> list[int]:
        """``Log.append`` of each (log, checked set) at once, all or none (``kl.log.log.append_all``)."""
        return append_all(appends, fsync=fsync)

    def log(self, name: str, partition: int) -> Log:
        """The partition's log.  Raises ``TopicNotFound`` for an unknown topic or partition."""
        key = (name, partition)
        found = self._logs.get(key)
        if found is not None:
            return found
        config = self.config(name)
        if isinstance(partition, int) and partition >= config.partitions:
            config = self.refresh_config(name)  # added since it was read?
        if not isinstance(partition, int) or not 0 <= partition < config.partitions:
            raise TopicNotFound(f"topic {name!r} has partitions 0 to {config.partitions - 1}, not {partition!r}")
        with self._guard:
            found = self._logs.get(key)
            if found is None:
                directory = os.path.join(self.topic_path(name), str(partition))
                lock_path = self._lock_path(name, partition)
                for path in (directory, os.path.dirname(os.path.dirname(lock_path)), os.path.dirname(lock_path)):
                    if os.path.islink(path):
                        raise StorageError(f"{path} is a symbolic link: kl follows no links inside a root")
                cached = self._configs.get(name)
                generation = cached.generation if cached is not None and cached.config is config else 0
                found = Log(directory, lock_path, config, lock_timeout=self.lock_timeout, config_generation=generation)
                self._logs[key] = found
        return found

    def open_logs(self) -> list[Log]:
        """The partitions' logs this root has opened (``log``) and not forgotten since."""
        with self._guard:
            return list(self._logs.values())

    def describe(self, name: str) -> TopicInfo:
        """The topic's config and each partition's offsets, segments and size (``kl topics
        describe``).  Raises ``TopicNotFound``."""
        config = self.config(name)
        partitions = []
        for p in range(config.partitions):
            log = self.log(name, p)
            state = log.state()
            segments = log.segments(state)
            partitions.append(
                PartitionInfo(
                    p, len(segments), state.log_start_offset, state.log_end_offset, sum(s.size_in_bytes for s in segments)
                )
            )
        return TopicInfo(name, config, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (its lock files stay), then every group's committed
        offsets of it (what a member commits meanwhile stays, of the old topic id: stale).
        Waits for an alter and appends in progress by taking the config lock and every
        partition lock first (an alter must not write the old topic's id into one created
        again meanwhile).  Raises ``TopicNotFound``."""
        path = self.topic_path(name)
        self._read_config_file(name)  # TopicNotFound before a lock file is made
        with contextlib.ExitStack() as held:
            held.enter_context(locks.locked(os.path.join(self.path, LOCKS_DIR, name, CONFIG_LOCK), self.lock_timeout))
            config = self._read_config_file(name)
            for p in range(config.partitions):
                held.enter_context(locks.locked(self._lock_path(name, p), self.lock_timeout))
                _mark_deleted(os.path.join(path, str(p), STATE_FILE))
            doomed = os.path.join(self.path, f".deleting-{uuid.uuid4().hex}")
            try:
                os.rename(path, doomed)
                fsync_dir(self.path)
            except FileNotFoundError:
                raise TopicNotFound(f"topic {name!r} does not exist in {self.path}") from None
            except OSError as e:
                raise storage_error(e, "delete topic", path) from None
            shutil.rmtree(doomed)
        self.forget(name)
        forget_config(os.path.join(path, CONFIG_FILE))
        groups = os.path.join(self.path, GROUPS_DIR)
        for group in os.listdir(groups) if os.path.isdir(groups) else []:  # its committed offsets (kl.registry)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(groups, group, "commits", name))
            shutil.rmtree(os.path.join(groups, group, "offsets", name), ignore_errors=True)

    def forget(self, name: str) -> None:
        """Drop cached configs and logs of ``name`` (after it was deleted or recreated)."""
        with self._guard:
            self._configs.pop(name, None)
            for key in [k for k in self._logs if k[0] == name]:
                self._logs.pop(key).close()

    def close(self) -> None:
        """Close every file this root's logs keep open (their writer handles and lock
        files, unless in use); the root stays usable and opens them again as needed."""
        with self._guard:
            for log in self._logs.values():
                log.close()
                log.close_lock_file()
            for name in {name for name, _ in self._logs}:
                forget_config(os.path.join(self.path, name, CONFIG_FILE))  # reopened by the next append
            self._logs.clear()


def _stray_reason(entry: os.DirEntry[str]) -> str | None:
    """Why a root entry is not a topic, or None when it is one."""
    if not _NAME.fullmatch(entry.name):
        return "not a valid topic name"
    if entry.is_symlink():
        return "a symbolic link"
    if not entry.is_dir(follow_symlinks=False):
        return "not a directory"
    try:
        mode = os.lstat(os.path.join(entry.path, CONFIG_FILE)).st_mode
    except FileNotFoundError:
        return f"no {CONFIG_FILE}"
    except OSError as e:
        return f"{CONFIG_FILE} cannot be read: {e.strerror}"
    if not stat.S_ISREG(mode):
        return f"{CONFIG_FILE} is not a regular file"
    return None


def _unfinished(topic_path: str, partitions: int) -> list[tuple[str, str, bool]]:
    """(path, what it is, whether it may be removed) of each thing an alter that stopped
    half-way leaves in a topic's directory, sorted: partitions being built (``.adding-*``),
    ones renamed in that ``topic.json`` (naming ``partitions``) does not name yet (nobody
    appends to those; one holding data may not be removed), and temporary files of a
    ``topic.json`` being written.  Dead only under the config lock."""
    found = []
    for entry in sorted(list_dir(topic_path)):
        path = os.path.join(topic_path, entry)
        if entry.startswith(ADDING_PREFIX):
            found.append((path, "a partition an interrupted kl topics alter was building", True))
        elif entry.startswith(f".{CONFIG_FILE}.") and entry.endswith(".tmp"):
            found.append((path, f"temporary file of an interrupted write of {CONFIG_FILE}", True))
        elif entry.isdigit() and int(entry) >= partitions:
            if os.path.islink(path) or not os.path.isdir(path) or _holds_data(path):
                what = f"not a partition of the topic ({partitions} partitions) and holds data: move it away"
                found.append((path, what, False))
            else:
                what = f"partition {entry} of an interrupted kl topics alter ({CONFIG_FILE} names {partitions})"
                found.append((path, what, True))
    return found


def _remove(path: str) -> None:
    """Remove a file or a directory tree; one already gone is no error."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise storage_error(e, "remove", path) from None


def _holds_data(directory: str) -> bool:
    """Whether a partition directory holds anything but an empty segment and a state."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name == STATE_FILE or entry.name.startswith("."):
                continue
            if not entry.name.endswith((SUFFIX, LEGACY_SUFFIX)) or entry.stat(follow_symlinks=False).st_size:
                return True
    return False


def _mark_deleted(state_path: str) -> None:
    """Overwrite a partition's state with the deleted mark, for writers holding it open."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(state_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(fd, deleted_record(), 0)
        finally:
            os.close(fd)
