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
import datetime
import logging
import os
from dataclasses import dataclass, field

from kl.errors import CorruptMessage, OffsetOutOfRange
from kl.log import offsetindex, timeindex
from kl.log.fsutil import file_time_ns
from kl.log.log import DELETED_SUFFIX, Log, SegmentInfo

logger = logging.getLogger(__name__)

DEFAULT_DELETE_DELAY = 60.0
__all__ = ["DELETED_SUFFIX", "DEFAULT_DELETE_DELAY", "Hold", "RetentionReport", "retain"]


@dataclass(frozen=True)
class Hold:
    """Where the age rule stopped although later closed segments are older than the limit:
    one young (or future) message keeps every segment after its own."""

    segment: SegmentInfo
    offset: int | None
    """The message stamped ``newest`` (None when that is the file's modification time)."""
    newest: int
    """The segment's newest time (ms), as retention dates it."""
    later: int
    """Closed segments after it older than the limit, kept because of it."""
    later_bytes: int
    reason: str


@dataclass
class RetentionReport:
    directory: str
    deleted: list[SegmentInfo] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    held: Hold | None = None
    """Set when the age rule stopped at a segment younger than segments after it."""
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
    keep = not dry_run
    segments = log.segments()
    if now_ms is None and max_age_ms and len(segments) > 1:  # read only where there is a segment to date
        now_ms = file_time_ns(log.directory) // 1_000_000
    # closed segments never change: date them, and choose, before taking the lock (a first scan may be long)
    dated = {s.base_offset: _newest_ms(log, s, keep=keep) for s in segments[:-1]} if max_age_ms else {}
    report = _choose(log, segments, dated, now_ms, max_age_ms, max_bytes, keep)
    if report.deleted and not dry_run:  # chosen again under the lock, from the segments as they are then
        with log.locked():
            segments = log.segments()
            if now_ms is None and max_age_ms:
                now_ms = file_time_ns(log.directory) // 1_000_000
            report = _choose(log, segments, dated, now_ms, max_age_ms, max_bytes, keep)
            if report.deleted:
                log.delete_segments(report.deleted, report.log_start_offset)
                for segment in report.deleted:  # caches: nobody reads them through an open handle
                    timeindex.remove(segment.path)
                    offsetindex.remove(segment.path)
    names: list[str] = []
    with contextlib.suppress(FileNotFoundError), os.scandir(log.directory) as entries:
        names = [e.name for e in entries if e.name.endswith((DELETED_SUFFIX, timeindex.SUFFIX, offsetindex.SUFFIX))]
    set_aside = _set_aside(log.directory, names, delete_delay)  # after the renames: a delay of 0 takes them
    if dry_run:  # what the real run would unlink: old set-aside files, and at once what it sets aside now
        found = set_aside + ([(s.path, s.size_in_bytes) for s in report.deleted] if delete_delay <= 0 else [])
        report.unlinked, report.unlinked_bytes = len(found), sum(size for _, size in found)
    else:
        report.unlinked, report.unlinked_bytes = _unlink(set_aside)
        bases = {s.base_offset for s in segments[len(report.deleted) :]}
        for suffix in (timeindex.SUFFIX, offsetindex.SUFFIX):  # written by a reader racing a deletion
            for path in timeindex.orphans(log.directory, bases, names, suffix):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
    return report


def _choose(
    log: Log,
    segments: list[SegmentInfo],
    dated: dict[int, int | None],
    now_ms: int | None,
    max_age_ms: int,
    max_bytes: int,
    keep: bool,
) -> RetentionReport:
    """What to delete of ``segments``, oldest first, and where the rules stopped; the
    segments not in ``dated`` (closed since) are dated now."""
    report = RetentionReport(log.directory)
    total = sum(s.size_in_bytes for s in segments)
    for i, segment in enumerate(segments[:-1]):  # the active segment is never a candidate
        newest = None
        if max_age_ms and now_ms is not None:  # a segment closed since it was dated is dated now
            base = segment.base_offset
            newest = dated[base] if base in dated else _newest_ms(log, segment, keep=keep)
        if now_ms is not None and _expired(newest, now_ms, max_age_ms):
            report.reasons.append(f"older than {max_age_ms} ms (newest message {newest})")
        elif max_bytes and total > max_bytes:
            report.reasons.append(f"partition holds {total} bytes, over {max_bytes}")
        else:
            if newest is not None and now_ms is not None:
                old = [s for s in segments[i + 1 : -1] if _expired(dated.get(s.base_offset), now_ms, max_age_ms)]
                report.held = _hold(log, segment, newest, now_ms, max_age_ms, old) if old else None
            break
        report.deleted.append(segment)
        total -= segment.size_in_bytes
    report.log_start_offset = segments[0].base_offset if segments else log.state().log_start_offset
    if report.deleted:
        report.log_start_offset = segments[len(report.deleted)].base_offset
    return report


def _expired(newest: int | None, now_ms: int, max_age_ms: int) -> bool:
    return newest is not None and now_ms - newest > max_age_ms


def _hold(log: Log, segment: SegmentInfo, newest: int, now_ms: int, max_age_ms: int, old: list[SegmentInfo]) -> Hold:
    """The ``Hold`` of ``segment``, dated ``newest``, over the expired segments ``old``
    after it; the message stamped ``newest`` is looked for in the segment (one scan)."""
    offset = None
    with contextlib.suppress(FileNotFoundError, OffsetOutOfRange, CorruptMessage):  # deleted meanwhile, damaged
        end = segment.base_offset + segment.size_in_bytes
        offset = next((msg.offset for msg in log.messages(segment.base_offset, end) if msg.timestamp == newest), None)
    what = "its file was last modified at" if offset is None else f"its newest message, at offset {offset}, is stamped"
    stamp = datetime.datetime.fromtimestamp(newest / 1000, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    gap = abs(newest - now_ms)
    when = f"{gap} ms ({gap / 86_400_000:.1f} days) {'in the future' if newest > now_ms else 'ago'}"
    later_bytes = sum(s.size_in_bytes for s in old)
    reason = (
        f"{what} {newest} ({stamp}), {when}: it keeps the {_count(len(old), 'later segment')} ({later_bytes} bytes) "
        f"older than {max_age_ms} ms"
    )
    return Hold(segment, offset, newest, len(old), later_bytes, reason)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


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


def _set_aside(directory: str, names: list[str], delete_delay: float) -> list[tuple[str, int]]:
    """(path, size) of the segments among ``names`` set aside at least ``delete_delay``
    seconds ago (by their change time and the file system's clock, read only when there
    is one); those another run unlinks meanwhile are left out."""
    found: list[tuple[str, int]] = []
    names = [name for name in names if name.endswith(DELETED_SUFFIX)]
    if not names:
        return found
    cutoff = file_time_ns(directory) - round(delete_delay * 1e9)
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if st.st_ctime_ns <= cutoff:
                found.append((path, st.st_size))
    return found


def _unlink(set_aside: list[tuple[str, int]]) -> tuple[int, int]:
    """Remove the set-aside segments listed: (how many, their bytes)."""
    removed = freed = 0
    for path, size in set_aside:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed, freed = removed + 1, freed + size
    return removed, freed
