"""Topics under a root directory: names, creation, listing, description, deletion.

Layout (see ``man/kl-format.5``)::

    ROOT/TOPIC/topic.json                       the topic's config
    ROOT/TOPIC/PARTITION/00000000000000000000.kl segments, named by base offset
    ROOT/TOPIC/PARTITION/state                  the published state record
    ROOT/.locks/TOPIC/PARTITION.lock            permanent lock files
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import threading
import uuid
from dataclasses import dataclass

from kl import locks
from kl.config import CONFIG_FILE, TopicConfig
from kl.errors import InvalidTopicName, KlError, TopicExists, TopicNotFound
from kl.fsutil import DIR_MODE, create_file, ensure_dir, fsync_dir, storage_error, write_atomic
from kl.log import DEFAULT_LOCK_TIMEOUT, Log
from kl.segment import segment_name
from kl.state import STATE_FILE, PartitionState, deleted_record

LOCKS_DIR = ".locks"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


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


@dataclass(frozen=True)
class TopicInfo:
    name: str
    config: TopicConfig
    partitions: list[PartitionInfo]

    @property
    def size_in_bytes(self) -> int:
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
        self._configs: dict[str, TopicConfig] = {}
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
        if not stat.S_ISDIR(mode):
            raise InvalidTopicName(f"invalid topic {name!r}: {path} is not a plain directory")
        if os.path.dirname(os.path.realpath(path)) != os.path.realpath(self.path):
            raise InvalidTopicName(f"invalid topic {name!r}: {path} is outside the root {self.path}")
        return path

    def _lock_path(self, name: str, partition: int | str) -> str:
        return os.path.join(self.path, LOCKS_DIR, name, f"{partition}.lock")

    # ----------------------------------------------------------------- topics

    def create_topic(self, name: str, config: TopicConfig | None = None) -> TopicConfig:
        """Create a topic with every partition, all at once (built aside, then renamed in).

        Raises ``TopicExists``, ``InvalidTopicName`` and ``StorageError``.
        """
        config = config or TopicConfig()
        path = self.topic_path(name)
        if os.path.lexists(path):
            raise TopicExists(f"topic {name!r} already exists in {self.path}")
        if not os.path.isdir(self.path):
            ensure_dir(self.path)
        tmp = os.path.join(self.path, f".creating-{uuid.uuid4().hex}")
        try:
            os.mkdir(tmp, DIR_MODE)
            os.chmod(tmp, DIR_MODE)
            write_atomic(os.path.join(tmp, CONFIG_FILE), config.to_json())
            for partition in range(config.partitions):
                self._create_partition(os.path.join(tmp, str(partition)))
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

    @staticmethod
    def _create_partition(directory: str) -> None:
        os.mkdir(directory, DIR_MODE)
        os.chmod(directory, DIR_MODE)
        os.close(create_file(os.path.join(directory, segment_name(0))))
        write_atomic(os.path.join(directory, STATE_FILE), PartitionState.empty().encode())

    def topics(self) -> list[str]:
        """Names of the topics under the root, sorted."""
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if not e.name.startswith(".") and _NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        )

    def config(self, name: str) -> TopicConfig:
        """The topic's config.  Raises ``TopicNotFound``."""
        config = self._configs.get(name)
        if config is None:
            path = os.path.join(self.topic_path(name), CONFIG_FILE)
            try:
                with open(path, "rb") as f:
                    config = TopicConfig.from_json(f.read(), path)
            except FileNotFoundError:
                raise TopicNotFound(f"topic {name!r} does not exist in {self.path}") from None
            except OSError as e:
                raise storage_error(e, "read", path) from None
            self._configs[name] = config
        return config

    def log(self, name: str, partition: int) -> Log:
        """The partition's log.  Raises ``TopicNotFound`` for an unknown topic or partition."""
        key = (name, partition)
        found = self._logs.get(key)
        if found is not None:
            return found
        config = self.config(name)
        if not isinstance(partition, int) or not 0 <= partition < config.partitions:
            raise TopicNotFound(f"topic {name!r} has partitions 0 to {config.partitions - 1}, not {partition!r}")
        with self._guard:
            found = self._logs.get(key)
            if found is None:
                directory = os.path.join(self.topic_path(name), str(partition))
                found = Log(directory, self._lock_path(name, partition), config, lock_timeout=self.lock_timeout)
                self._logs[key] = found
        return found

    def describe(self, name: str) -> TopicInfo:
        config = self.config(name)
        partitions = []
        for p in range(config.partitions):
            log = self.log(name, p)
            segments = log.segments()
            state = log.state()
            partitions.append(
                PartitionInfo(
                    p, len(segments), state.log_start_offset, state.log_end_offset, sum(s.size_in_bytes for s in segments)
                )
            )
        return TopicInfo(name, config, partitions)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (its lock files stay).  Waits for appends in
        progress by taking every partition lock first.  Raises ``TopicNotFound``."""
        config = self.config(name)
        path = self.topic_path(name)
        with contextlib.ExitStack() as held:
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

    def forget(self, name: str) -> None:
        """Drop cached configs and logs of ``name`` (after it was deleted or recreated)."""
        with self._guard:
            self._configs.pop(name, None)
            for key in [k for k in self._logs if k[0] == name]:
                self._logs.pop(key).close()

    def close(self) -> None:
        with self._guard:
            for log in self._logs.values():
                log.close()
            self._logs.clear()


def _mark_deleted(state_path: str) -> None:
    """Overwrite a partition's state with the deleted mark, for writers holding it open."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(state_path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(fd, deleted_record(), 0)
        finally:
            os.close(fd)
