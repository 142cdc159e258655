"""Running ``kl serve`` daemons, registered under the root: the seed's ``/brokers/ids``.

    ROOT/.brokers/ids/HOST:PORT:PID     a live daemon's registration, locked while it lives

A daemon writes its registration as a hidden temporary file, takes an open file
description lock on it, and renames it into place; it holds the lock while it serves
and deletes the file when it stops.  The kernel drops the lock when the process dies
(an NFS server, when the host's lease runs out), so a registration whose lock is free
is a dead daemon's: whoever lists the daemons ignores it and deletes it.  The file is
one JSON object (see ``BrokerInfo``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from kl.errors import KlError, LockTimeout, StorageError
from kl.log import locks
from kl.log.fsutil import ensure_dir, file_time_ns, fsync_dir, nfs_locking_problem, open_file, storage_error

BROKERS_DIR = os.path.join(".brokers", "ids")
LEFTOVER_AGE = 60.0
"""A temporary registration file unlocked this long is a crashed daemon's: deleted."""


@dataclass(frozen=True)
class BrokerInfo:
    """What a daemon registers: where to reach it and what it serves."""

    host: str
    """The name to connect to: the bind address, or this host's name when bound to all."""
    port: int | None
    """Kafka 0.7's port, which kl's own clients use (None: not served)."""
    bind: str
    pid: int
    since_ms: int
    topics: str | None
    """The ``--topics`` regex, or None for every topic."""
    produce: bool
    kafka: str | None = None
    """``HOST:PORT`` of today's Kafka protocol (None: not served): its node's name."""
    listeners: dict[str, str] | None = None
    """``HOST:PORT`` of its Kafka listener of each security protocol (PLAINTEXT, SSL,
    SASL_PLAINTEXT, SASL_SSL), as advertised; None: registered by a kl that had only one."""

    @property
    def address(self) -> str | None:
        """Where kl's clients connect (Kafka 0.7's protocol), or None."""
        return None if self.port is None else address_of(self.host, self.port)


def info_for(
    bind: str,
    port: int | None,
    topics: str | None,
    produce: bool,
    kafka: tuple[str, int] | None = None,
    listeners: dict[str, tuple[str, int]] | None = None,
) -> BrokerInfo:
    """This process's ``BrokerInfo`` for a daemon listening on ``bind``:``port`` and, for
    today's Kafka protocol, on ``kafka`` (the address it is bound to or advertises, and
    port) and ``listeners`` (the same, by security protocol)."""
    kafka_address = None if kafka is None else address_of(host_of(kafka[0]), kafka[1])
    advertised = {security: address_of(host_of(h), p) for security, (h, p) in (listeners or {}).items()} or None
    return BrokerInfo(host_of(bind), port, bind, os.getpid(), time.time_ns() // 1_000_000, topics, produce, kafka_address,
                      advertised)  # fmt: skip


def host_of(bind: str) -> str:
    """The name to reach a daemon bound to ``bind`` by: this host's, for all addresses."""
    return socket.getfqdn() if bind in ("0.0.0.0", "::") else bind


def address_of(host: str, port: int) -> str:
    """``HOST:PORT`` (``[HOST]:PORT`` for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def node_id(kafka_address: str) -> int:
    """The node id Kafka clients know the daemon at ``kafka_address`` by: the same on every
    daemon, and different for different addresses (a CRC-32 of it)."""
    return zlib.crc32(kafka_address.encode()) & 0x7FFFFFFF


def serves(info: BrokerInfo, topic: str) -> bool:
    """Whether the daemon ``info`` registers serves ``topic`` (its ``--topics``)."""
    return info.topics is None or re.fullmatch(info.topics, topic) is not None


def leader(topic: str, partition: int, daemons: Sequence[str]) -> str:
    """Which of ``daemons`` (Kafka addresses) leads the partition: the one whose hash
    with it is highest (rendezvous hashing), so every daemon that sees the same daemons
    names the same leader, and a partition moves only when its leader goes or a daemon
    that comes ranks higher for it.  The hash is BLAKE2b: a CRC's is linear, so with two
    daemons whole topics of a few partitions fell to one of them."""
    key = f"{topic}\0{partition}\0".encode()
    return max(daemons, key=lambda address: (hashlib.blake2b(key + address.encode(), digest_size=8).digest(), address))


class Registration:
    """A daemon's registration: the locked file, deleted by ``close``."""

    def __init__(self, fd: int, path: str, info: BrokerInfo):
        self.fd, self.path, self.info = fd, path, info

    def update(self, info: BrokerInfo) -> None:
        """Register ``info`` instead (its topics or produce changed): a new locked file
        renamed over this one, so a reader sees one or the other, never neither.  Raises
        ``StorageError`` (the registration as it was is kept)."""
        fd = _write(os.path.dirname(self.path), os.path.basename(self.path), info)
        os.close(self.fd)  # its file, renamed over, is gone already
        self.fd, self.info = fd, info

    def close(self) -> None:
        """Delete the registration, then let the lock go."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def register(root_path: str, info: BrokerInfo) -> Registration:
    """Register a daemon under the root; raises ``StorageError`` when it cannot (a
    read-only root, a mount without working locks)."""
    directory = os.path.join(root_path, BROKERS_DIR)
    ensure_dir(directory)
    problem = nfs_locking_problem(directory)
    if problem is not None:
        raise StorageError(problem)
    port = info.port if info.port is not None else (info.kafka or "").rpartition(":")[2]
    name = f"{socket.gethostname()}:{port}:{info.pid}"
    return Registration(_write(directory, name, info), os.path.join(directory, name), info)


def _write(directory: str, name: str, info: BrokerInfo) -> int:
    """Write ``info`` as ``directory/name``, locked: a hidden temporary file renamed into
    place; the descriptor holding its lock."""
    path, tmp = os.path.join(directory, name), os.path.join(directory, f".{name}.tmp")
    try:
        fd = open_file(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)
    except OSError as e:
        raise storage_error(e, "create", tmp) from None
    try:
        locks.lock_file(fd, tmp, 0)
        os.write(fd, json.dumps(asdict(info)).encode() + b"\n")
        os.fsync(fd)
        os.rename(tmp, path)
        fsync_dir(directory)
    except (OSError, KlError) as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise e if isinstance(e, KlError) else storage_error(e, "register in", directory) from None
    return fd


def live(root_path: str) -> list[BrokerInfo]:
    """The registered daemons still alive, sorted by address; dead registrations (and
    temporary files crashed daemons left) are deleted on the way, where the root allows."""
    directory = os.path.join(root_path, BROKERS_DIR)
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        raise storage_error(e, "list", directory) from None
    found = []
    now = file_time_ns(directory) / 1e9 if any(name.startswith(".") for name in names) else 0.0
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith("."):
            _read_if_live(path, now - LEFTOVER_AGE)
            continue
        info = _read_if_live(path)
        if info is not None:
            found.append(info)
    return sorted(found, key=lambda b: (b.host, b.port or 0, b.kafka or "", b.pid))


def _read_if_live(path: str, changed_before: float = float("inf")) -> BrokerInfo | None:
    """The registration in ``path`` if its lock is held; else delete the file (if it was
    last changed before ``changed_before``, a time by the file system's clock).  A shared
    lock probes it: a read-only root will do."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            locks.lock_file(fd, path, 0, shared=True)
        except LockTimeout:
            return _parse(os.pread(fd, 4096, 0))
        if os.fstat(fd).st_mtime < changed_before:
            with contextlib.suppress(OSError):
                os.unlink(path)  # nobody holds it: its daemon is gone
        return None
    except (OSError, StorageError):
        return None
    finally:
        os.close(fd)


def _parse(data: bytes) -> BrokerInfo | None:
    try:
        body = json.loads(data)
        return BrokerInfo(
            str(body["host"]),
            None if body["port"] is None else int(body["port"]),
            str(body["bind"]),
            int(body["pid"]),
            int(body["since_ms"]),
            None if body["topics"] is None else str(body["topics"]),
            bool(body["produce"]),
            None if body.get("kafka") is None else str(body["kafka"]),
            None if body.get("listeners") is None else {str(k): str(v) for k, v in body["listeners"].items()},
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # still being written, or not a registration
