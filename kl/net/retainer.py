"""``kl serve --retain-every``: the daemon runs retention (``kl.log.retention``, what
``kl retain`` does) over the root it serves, in a thread, every so often.

    ROOT/.retain.lock     held by the daemon running a round of retention

However many daemons serve a root, one at a time runs a round: each round begins with a
non-blocking open file description lock on ``ROOT/.retain.lock`` (``kl.log.locks``), and a
daemon that finds it taken skips that round (the other is at it).  A round goes over every
topic of the root, whatever ``--topics`` serves, as ``kl retain`` does: the topics'
own ``retention_ms`` and ``retention_bytes``, segments set aside before being unlinked
(``DEFAULT_DELETE_DELAY``), a partition that fails logged and the others done.  The lock
file is permanent (PITFALLS: lock files are never safely removable); ``kl retain`` run by
hand does not take it, and need not: retention is safe against itself.
"""

from __future__ import annotations

import logging
import os
import threading

from kl.errors import KlError, LockTimeout
from kl.log import locks
from kl.log.fsutil import open_file, storage_error
from kl.log.retention import retain
from kl.topic import Root

log = logging.getLogger("kl.serve")

LOCK_FILE = ".retain.lock"


class Retainer:
    """Runs a round of retention over ``root`` every ``interval`` seconds, the first at
    once, in a thread of its own (``start``, ``stop``); a round whose lock another
    process holds is skipped."""

    def __init__(self, root_path: str, interval: float):
        self.root = Root(root_path)
        """A root of its own: its partitions as another process would see them."""
        self.interval = interval
        self.path = os.path.join(root_path, LOCK_FILE)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kl-serve-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the partition under way (a round is not waited for past it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.round()
            except KlError as e:
                log.warning("retention: %s", e)
            except Exception as e:  # a bug: this round goes, the daemon stays
                log.error("retention: unexpected %s: %s", type(e).__name__, e)
            self._stop.wait(self.interval)

    def round(self) -> bool:
        """One round, if this process takes the lock: whether it did.  Raises ``KlError``
        when the lock file cannot be opened or the root listed."""
        try:
            fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as e:
            raise storage_error(e, "open", self.path) from None
        try:
            try:
                locks.lock_file(fd, self.path, 0)
            except LockTimeout:
                log.debug("retention: skipped this round: another daemon holds %s", self.path)
                return False
            self._retain_all()
            return True
        finally:
            os.close(fd)

    def _retain_all(self) -> None:
        deleted = partitions = 0
        for topic in self.root.topics():
            try:
                count = self.root.config(topic).partitions
            except KlError as e:
                log.warning("retention: %s: %s", topic, e)
                continue
            for partition in range(count):
                if self._stop.is_set():
                    return
                partitions += 1
                try:
                    report = retain(self.root.log(topic, partition))
                except (KlError, OSError) as e:
                    log.warning("retention: %s/%d: %s", topic, partition, e)
                    continue
                if report.deleted:
                    deleted += len(report.deleted)
                    log.info(
                        "retention: %s/%d: deleted %d segments (%d bytes); log starts at %d",
                        topic, partition, len(report.deleted), report.deleted_bytes, report.log_start_offset,
                    )  # fmt: skip
                if report.unlinked:
                    log.debug("retention: %s/%d: unlinked %d set-aside segments", topic, partition, report.unlinked)
        log.debug("retention: round done: %d partitions, %d segments deleted", partitions, deleted)
