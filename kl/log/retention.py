"""Deleting old data one whole segment at a time (``kl retain``).

A segment's age comes from the data: its newest message, the largest timestamp in it
(Kafka's rule), whatever order the timestamps came in.  It is kept per closed segment
in a time summary (``kl.log.timeindex``), worked out by a scan the first time and believed
only while it still names the segment as it is.  So ``cp`` or ``rsync`` of a topic
neither makes old data immortal nor expires young data.  Messages without a timestamp
(magic 0 and 1) are dated by the segment file's modification time; a topic of format
0.7 stores no timestamps at all: there a segment's age is its file's modification
time, as Kafka 0.7 did.  The active segment is never deleted.

Deletion is done in steps so readers are never disturbed (PITFALLS, "Deletion while
reading"): the new log start is published first, so readers asking for older offsets get
``OffsetOutOfRange``; the segment is then renamed aside, and unlinked only after
``delete_delay`` seconds, so a reader still inside it finishes (on NFS, other clients
would otherwise get ESTALE).

"Now", for both the age and the delay, is the file system's clock (on NFS the server's,
``fsutil.file_time_ns``), not the clock of the host that runs retention: hosts' clocks
may be minutes apart, and one ahead would otherwise delete young data and unlink
set-aside segments under other hosts' readers.  Message timestamps are the producers'
(their hosts' clocks): a producer host whose clock is ahead by D makes its messages
look D younger, kept D longer; behind by D, D older.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field

from kl.errors import CorruptMessage, OffsetOutOfRange
from kl.log import timeindex
from kl.log.fsutil import file_time_ns
from kl.log.log import DELETED_SUFFIX, Log, SegmentInfo

logger = logging.getLogger(__name__)

DEFAULT_DELETE_DELAY = 60.0
__all__ = ["DELETED_SUFFIX", "DEFAULT_DELETE_DELAY", "RetentionReport", "retain"]


@dataclass
class RetentionReport:
    directory: str
    deleted: list[SegmentInfo] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    log_start_offset: int = 0
    unlinked: int = 0
    """Segments set aside and now removed for good (with ``dry_run``: that would be)."""
    unlinked_bytes: int = 0

    @property
    def deleted_bytes(self) -> int:
        return sum(s.size_in_bytes for s in self.deleted)


def retain(
    log: Log,
    *,
    max_age_ms: int | None = None,
    max_bytes: int | None = None,
    now_ms: int | None = None,
    dry_run: bool = False,
    delete_delay: float = DEFAULT_DELETE_DELAY,
) -> RetentionReport:
    """Delete the oldest closed segments older than ``max_age_ms`` or beyond ``max_bytes``
    in total (None takes the topic's setting; 0 switches a rule off).  ``now_ms``
    defaults to the file system's clock (see the module doc)."""
    log.refresh_config(keep=False)  # the settings as kl topics alter left them
    max_age_ms = log.config.retention_ms if max_age_ms is None else max_age_ms
    max_bytes = log.config.retention_bytes if max_bytes is None else max_bytes
    now_ms = file_time_ns(log.directory) // 1_000_000 if now_ms is None else now_ms
    report = RetentionReport(log.directory)
    dated: dict[int, int | None] = {}
    if max_age_ms:  # closed segments never change: date them before taking the lock (a first scan may be long)
        dated = {s.base_offset: _newest_ms(log, s, keep=not dry_run) for s in log.segments()[:-1]}
    with contextlib.nullcontext() if dry_run else log.locked():
        segments = log.segments()
        total = sum(s.size_in_bytes for s in segments)
        for segment in segments[:-1]:  # the active segment is never a candidate
            newest = None
            if max_age_ms:  # a segment closed since it was dated is dated now
                base = segment.base_offset
                newest = dated[base] if base in dated else _newest_ms(log, segment, keep=not dry_run)
            if max_age_ms and newest is not None and now_ms - newest > max_age_ms:
                report.reasons.append(f"older than {max_age_ms} ms (newest message {newest})")
            elif max_bytes and total > max_bytes:
                report.reasons.append(f"partition holds {total} bytes, over {max_bytes}")
            else:
                break
            report.deleted.append(segment)
            total -= segment.size_in_bytes
        report.log_start_offset = segments[0].base_offset if segments else log.state().log_start_offset
        if report.deleted and not dry_run:
            report.log_start_offset = segments[len(report.deleted)].base_offset
            log.delete_segments(report.deleted, report.log_start_offset)
            for segment in report.deleted:
                timeindex.remove(segment.path)  # a cache: nobody reads it through an open handle
    cutoff = file_time_ns(log.directory) - round(delete_delay * 1e9)  # after the renames: a delay of 0 takes them
    if dry_run:  # what the real run would unlink: old set-aside files, and at once what it sets aside now
        set_aside = [(e.path, e.stat(follow_symlinks=False).st_size) for e in _set_aside(log.directory, cutoff)]
        if delete_delay <= 0:
            set_aside += [(s.path, s.size_in_bytes) for s in report.deleted]
        report.unlinked, report.unlinked_bytes = len(set_aside), sum(size for _, size in set_aside)
    else:
        report.unlinked, report.unlinked_bytes = _unlink_set_aside(log.directory, cutoff)
        bases = {s.base_offset for s in segments[len(report.deleted) :]}
        for path in timeindex.orphans(log.directory, bases):  # written by a reader racing a deletion
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return report


def _newest_ms(log: Log, segment: SegmentInfo, *, keep: bool) -> int | None:
    """When the newest message of a closed segment was stamped: its largest timestamp
    (see ``Log.time_summary``), or the file's modification time where some or all of
    its messages carry none (format 0.7, magic 0 and 1) or they cannot be read.
    ``keep`` keeps a summary worked out afresh (not in a dry run, which changes nothing)."""
    mtime = log.mtime_ms(segment)
    if log.config.legacy:
        return mtime
    try:
        summary = log.time_summary(segment, keep=keep)
    except (FileNotFoundError, OffsetOutOfRange):  # deleted meanwhile (only a dry run takes no lock)
        return None
    except CorruptMessage as e:
        logger.warning("%s: dating it by its file time: %s", segment.path, e)
        return mtime
    newest = summary.newest
    if summary.untimed_messages or newest is None:
        return mtime if newest is None or mtime is None else max(newest, mtime)
    return newest


def _set_aside(directory: str, cutoff: int) -> list[os.DirEntry[str]]:
    """Segments set aside at or before ``cutoff`` (by their change time, in ns of the file
    system's clock); those another run unlinks meanwhile are left out."""
    found = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(DELETED_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    if entry.stat(follow_symlinks=False).st_ctime_ns <= cutoff:
                        found.append(entry)
    return found


def _unlink_set_aside(directory: str, cutoff: int) -> tuple[int, int]:
    """Remove segments set aside at or before ``cutoff``: (how many, their bytes)."""
    removed = freed = 0
    for entry in _set_aside(directory, cutoff):
        with contextlib.suppress(FileNotFoundError):
            size = entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
            removed, freed = removed + 1, freed + size
    return removed, freed
