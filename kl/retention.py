"""Deleting old data one whole segment at a time (``kl retain``).

A segment's age comes from the data: the timestamp of the first message of the segment
after it, which is no older than any message it holds (file times are used only where
messages carry none, as in magic 0 and 1).  So ``cp`` or ``rsync`` of a topic neither
makes old data immortal nor expires young data.  A topic of format 0.7 stores no
timestamps: there a segment's age is its file's modification time, as Kafka 0.7 did.
The active segment is never deleted.

Deletion is done in steps so readers are never disturbed (PITFALLS, "Deletion while
reading"): the new log start is published first, so readers asking for older offsets get
``OffsetOutOfRange``; the segment is then renamed aside, and unlinked only after
``delete_delay`` seconds, so a reader still inside it finishes (on NFS, other clients
would otherwise get ESTALE).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field

from kl.log import DELETED_SUFFIX, Log, SegmentInfo

DEFAULT_DELETE_DELAY = 60.0
__all__ = ["DELETED_SUFFIX", "DEFAULT_DELETE_DELAY", "RetentionReport", "retain"]


@dataclass
class RetentionReport:
    directory: str
    deleted: list[SegmentInfo] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    log_start_offset: int = 0
    unlinked: int = 0
    """Segments set aside by earlier runs and now removed for good."""

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
    in total (None takes the topic's setting; 0 switches a rule off)."""
    max_age_ms = log.config.retention_ms if max_age_ms is None else max_age_ms
    max_bytes = log.config.retention_bytes if max_bytes is None else max_bytes
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    report = RetentionReport(log.directory)
    with contextlib.nullcontext() if dry_run else log.locked():
        segments = log.segments()
        total = sum(s.size_in_bytes for s in segments)
        for segment, following in itertools.pairwise(segments):  # the active segment is never a candidate
            newest = _newest_ms(log, segment, following)
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
    if not dry_run:
        report.unlinked = _unlink_set_aside(log.directory, delete_delay)
    return report


def _newest_ms(log: Log, segment: SegmentInfo, following: SegmentInfo) -> int | None:
    """An upper bound on the timestamps in ``segment``: the next segment's first one, or
    without timestamps (format 0.7, magic 0 and 1) the segment file's modification time."""
    newest = None if log.config.legacy else log.first_timestamp(following)
    return log.mtime_ms(segment) if newest is None else newest


def _unlink_set_aside(directory: str, delay: float) -> int:
    """Remove segments set aside at least ``delay`` seconds ago (by their change time)."""
    removed = 0
    cutoff = time.time() - delay
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(DELETED_SUFFIX) and entry.stat(follow_symlinks=False).st_ctime <= cutoff:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed
